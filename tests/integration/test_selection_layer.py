"""The model selection layer through real frontends and containers: policies set through the
admin API, feedback, per-user state across a restart, confidence, stragglers, online learning."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from clipper import Clipper
from clipper.selection import POLICIES
from tests.integration import models
from tests.integration.helpers import post_json, predict_ok, request, wait_for

pytestmark = pytest.mark.integration


async def feedback(c: Clipper, app: str, doc: dict[str, Any]) -> None:
    resp = await post_json(f"{c.query_url}/{app}/update", doc)
    assert resp.status == 200, resp.body
    assert resp.body == b"Feedback received? 1"
    assert resp.headers["content-type"] == "text/plain; charset=utf-8"


async def deploy(c: Clipper, *pairs: tuple[str, Any]) -> None:
    await asyncio.gather(*(c.deploy_model(n, "1", m, input_type="doubles") for n, m in pairs))


@pytest.fixture
async def clipper() -> Any:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        yield c


async def test_every_policy_is_selectable_through_the_admin_api(clipper: Clipper) -> None:
    c = clipper
    await deploy(c, ("right", models.label_of), ("wrong", models.off_by_one))
    for policy in POLICIES:
        app = f"app-{policy.replace('_', '-')}"
        params = {"weights": {"right": 1, "wrong": 1}} if policy == "ab_split" else {}
        body = {
            "name": app, "input_type": "doubles", "default_output": "-1",
            "latency_slo_micros": 2_000_000, "policy": policy, "policy_params": params,
        }  # fmt: skip
        resp = await post_json(f"{c.admin_url}/admin/add_app", body)
        assert resp.status == 200, resp.body
        links = ["right"] if policy == "single" else ["right", "wrong"]
        for model in links:
            resp = await post_json(
                f"{c.admin_url}/admin/add_model_links", {"app_name": app, "model_names": [model]}
            )
            assert resp.status == 200, resp.body
        doc = await predict_ok(c.query_url, app, {"input": [3.0]})
        assert doc["default"] is False and doc["output"] in (3, 4)
        if policy != "single":
            assert set(doc["models"]) <= {"right", "wrong"} and 0 < doc["confidence"] <= 1
            got = (await post_json(f"{c.admin_url}/admin/get_application", {"name": app})).json()
            assert got["policy"] == policy
    # the single policy keeps the original rule: one model per application
    resp = await post_json(
        f"{c.admin_url}/admin/add_model_links", {"app_name": "app-single", "model_names": ["wrong"]}
    )
    assert resp.status == 400 and b"at most one model" in resp.body
    resp = await post_json(
        f"{c.admin_url}/admin/add_app",
        {"name": "bad", "input_type": "doubles", "default_output": "-1",
         "latency_slo_micros": 1000, "policy": "nope"},
    )  # fmt: skip
    assert resp.status == 400 and b"single" in resp.body  # names the policies there are


async def test_feedback_teaches_the_policy_which_model_is_right(clipper: Clipper) -> None:
    c = clipper
    await deploy(c, ("right", models.label_of), ("wrong", models.off_by_one))
    await c.register_application(
        "learn", "doubles", "-1", 2_000_000,
        policy="epsilon_greedy", policy_params={"epsilon": 0.0},
    )  # fmt: skip
    await c.link_model_to_app("learn", "right")
    await c.link_model_to_app("learn", "wrong")
    for k in range(1, 9):
        await feedback(c, "learn", {"input": [float(k)], "label": k})
    answers = [await predict_ok(c.query_url, "learn", {"input": [float(k)]}) for k in range(20, 30)]
    assert [a["models"] for a in answers] == [["right"]] * 10
    assert [a["output"] for a in answers] == list(range(20, 30))


async def test_bad_feedback_is_a_clear_error(clipper: Clipper) -> None:
    c = clipper
    await c.register_application("fb", "doubles", "-1", 1_000_000, policy="exp3")
    for body, status, fragment in (
        (b"{", 400, b"Error parsing JSON"),
        (b'{"input": [1.0]}', 400, b"needs keys input and label"),
        (b'{"input": [1.0], "label": null}', 400, b"is null; a label is the true output"),
        (b'{"input": "x", "label": 1}', 400, b"array of numbers"),
        (b'{"input": [1.0], "label": 1, "uid": [1]}', 400, b"uid"),
        (b'{"input": [1.0], "label": 1}', 400, b"no linked model"),
    ):
        resp = await request(f"{c.query_url}/fb/update", "POST", body)
        assert resp.status == status and fragment in resp.body, resp.body
    resp = await request(f"{c.query_url}/nope/update", "POST", b'{"input": [1.0], "label": 1}')
    assert resp.status == 404


async def test_per_user_state_survives_a_restart(tmp_path: Path) -> None:
    settings: dict[str, Any] = {
        "query_port": 0, "rpc_port": 0, "admin_port": 0,
        "state_dir": tmp_path, "store": f"sqlite:///{tmp_path}",
    }  # fmt: skip
    async with Clipper(**settings) as c:
        await deploy(c, ("plus1", models.off_by_one), ("plus2", models.off_by_two))
        await c.register_application(
            "users", "doubles", "-1", 2_000_000, cache=False,
            policy="epsilon_greedy", policy_params={"epsilon": 0.0},
        )  # fmt: skip
        await c.link_model_to_app("users", "plus1")
        await c.link_model_to_app("users", "plus2")
        for k in range(5):  # alice's labels are x+2, bob's x+1
            await feedback(c, "users", {"input": [float(k)], "label": k + 2, "uid": "alice"})
            await feedback(c, "users", {"input": [float(k)], "label": k + 1, "uid": "bob"})
        alice = await predict_ok(c.query_url, "users", {"input": [10.0], "uid": "alice"})
        assert alice["models"] == ["plus2"]
    async with Clipper(**settings) as c:
        await c.wait_for_replicas("plus1", "1", 1)
        await c.wait_for_replicas("plus2", "1", 1)
        alice = await predict_ok(c.query_url, "users", {"input": [10.0], "uid": "alice"})
        bob = await predict_ok(c.query_url, "users", {"input": [10.0], "uid": "bob"})
        assert (alice["models"], alice["output"]) == (["plus2"], 12)
        assert (bob["models"], bob["output"]) == (["plus1"], 11)


async def test_low_confidence_answers_the_default_with_the_reason(clipper: Clipper) -> None:
    c = clipper
    await deploy(c, ("a", models.label_of), ("b", models.label_of), ("c", models.off_by_one))
    await c.register_application(
        "vote", "doubles", "-1", 2_000_000, policy="exp4", min_confidence=0.9
    )
    await c.register_application("vote-lax", "doubles", "-1", 2_000_000, policy="exp4")
    for app in ("vote", "vote-lax"):
        for m in ("a", "b", "c"):
            await c.link_model_to_app(app, m)
    strict = await predict_ok(c.query_url, "vote", {"input": [5.0]})
    assert strict["default"] is True and strict["output"] == -1
    assert strict["default_explanation"].startswith("Confidence 0.67 is below")
    assert strict["confidence"] == pytest.approx(2 / 3)
    lax = await predict_ok(c.query_url, "vote-lax", {"input": [5.0]})
    assert (lax["default"], lax["output"]) == (False, 5)
    assert sorted(lax["models"]) == ["a", "b", "c"]
    metrics = (await request(f"{c.query_url}/metrics?format=prometheus")).body.decode()
    assert 'clipper_app_default_outputs_total{app="vote",reason="low_confidence"} 1.0' in metrics


async def test_stragglers_are_left_out_at_the_deadline(clipper: Clipper) -> None:
    c = clipper
    await deploy(c, ("fast", models.label_of), ("slow", models.slow_label_of))
    await c.register_application("race", "doubles", "-1", 150_000, policy="exp4", cache=False)
    await c.link_model_to_app("race", "fast")
    await c.link_model_to_app("race", "slow")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    doc = await predict_ok(c.query_url, "race", {"input": [7.0]})
    elapsed = loop.time() - t0
    assert 0.14 <= elapsed < 0.4  # at the 150 ms deadline, not after the slow model's 500 ms
    assert (doc["default"], doc["output"], doc["models"]) == (False, 7, ["fast"])
    assert doc["confidence"] == pytest.approx(0.5)
    metrics = (await request(f"{c.query_url}/metrics?format=prometheus")).body.decode()
    assert 'clipper_model_missing_contributions_total{app="race",model="slow"} 1.0' in metrics


async def test_online_learning_sends_feedback_to_models_with_update(clipper: Clipper) -> None:
    c = clipper
    await c.deploy_model("counter", "1", models.Counter(), input_type="doubles")
    await c.register_application(
        "online", "doubles", "-1", 2_000_000, cache=False, policy="exp3", online_learning=True
    )
    await c.link_model_to_app("online", "counter")
    assert (await predict_ok(c.query_url, "online", {"input": [1.0]}))["output"] == 0
    for k in range(3):
        await feedback(c, "online", {"input": [float(k)], "label": k})

    async def seen() -> bool:
        doc = await predict_ok(c.query_url, "online", {"input": [9.0]})
        return bool(doc["output"] == 3)

    await wait_for(seen, what="the model to have learnt from 3 labels")

"""Bandit feedback through real frontends and containers: feedback for an exp3 application
evaluates only the model its query drew (none when the cache still has that output), a
full-information application evaluates every model, and forgetting parameters are validated
by the admin API."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from clipper import Clipper
from tests.integration import models
from tests.integration.helpers import post_json, predict_ok, request

pytestmark = pytest.mark.integration

MODELS = ("right", "plus1", "plus2")
_BATCH_SUM = re.compile(r"^clipper_model_batch_size_sum\{([^}]*)\} (\S+)$", re.MULTILINE)


async def evaluations(c: Clipper) -> dict[str, float]:
    """Inputs sent to each model's replicas so far (the batch-size histogram's sum)."""
    text = (await request(f"{c.query_url}/metrics?format=prometheus")).body.decode()
    out = dict.fromkeys(MODELS, 0.0)
    for labels, value in _BATCH_SUM.findall(text):
        model = re.search(r'model="([^"]*)"', labels)
        if model is not None and model.group(1) in out:
            out[model.group(1)] += float(value)
    return out


async def evaluated_by(c: Clipper, before: dict[str, float]) -> dict[str, float]:
    now = await evaluations(c)
    return {m: now[m] - before[m] for m in MODELS}


async def feedback(c: Clipper, app: str, doc: dict[str, Any]) -> None:
    resp = await post_json(f"{c.query_url}/{app}/update", doc)
    assert resp.status == 200, resp.body


@pytest.fixture
async def clipper() -> Any:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await asyncio.gather(
            c.deploy_model("right", "1", models.label_of, input_type="doubles"),
            c.deploy_model("plus1", "1", models.off_by_one, input_type="doubles"),
            c.deploy_model("plus2", "1", models.off_by_two, input_type="doubles"),
        )
        yield c


async def app_over_all(c: Clipper, name: str, **settings: Any) -> None:
    await c.register_application(name, "doubles", "-1", 2_000_000, policy="exp3", **settings)
    for m in MODELS:
        await c.link_model_to_app(name, m)


async def test_exp3_feedback_evaluates_only_the_model_the_query_drew(clipper: Clipper) -> None:
    c = clipper
    await app_over_all(c, "bandit", cache=False)
    await app_over_all(c, "full", cache=False, policy_params={"feedback": "full"})

    before = await evaluations(c)
    doc = await predict_ok(c.query_url, "bandit", {"input": [4.0]})
    (drawn,) = doc["models"]
    one = {m: float(m == drawn) for m in MODELS}
    assert await evaluated_by(c, before) == one

    # no cache: the drawn model is asked again, and no other
    before = await evaluations(c)
    await feedback(c, "bandit", {"input": [4.0], "label": 4})
    assert await evaluated_by(c, before) == one

    # feedback for an input no query drew: one model, drawn now
    before = await evaluations(c)
    await feedback(c, "bandit", {"input": [5.0], "label": 5})
    assert sum((await evaluated_by(c, before)).values()) == 1.0

    # full-information updates, when asked for: every linked model
    before = await evaluations(c)
    await feedback(c, "full", {"input": [6.0], "label": 6})
    assert await evaluated_by(c, before) == dict.fromkeys(MODELS, 1.0)


async def test_with_the_cache_feedback_after_a_query_evaluates_nothing(clipper: Clipper) -> None:
    c = clipper
    await app_over_all(c, "cached")
    for x in (10.0, 11.0, 12.0):
        await predict_ok(c.query_url, "cached", {"input": [x], "uid": "u1"})
    before = await evaluations(c)
    for x in (10.0, 11.0, 12.0):
        await feedback(c, "cached", {"input": [x], "label": int(x), "uid": "u1"})
    assert await evaluated_by(c, before) == dict.fromkeys(MODELS, 0.0)


async def test_bandit_feedback_teaches_exp3_the_right_model(clipper: Clipper) -> None:
    c = clipper
    await app_over_all(c, "learn", policy_params={"eta": 5, "floor": 0})
    for k in range(25):  # a wrong draw at p >= 1/3 costs it e^-15 of its weight at least
        x = float(100 + k)
        await predict_ok(c.query_url, "learn", {"input": [x]})
        await feedback(c, "learn", {"input": [x], "label": int(x)})
    answers = [await predict_ok(c.query_url, "learn", {"input": [float(k)]}) for k in range(10)]
    assert [a["models"] for a in answers] == [["right"]] * 10


async def test_bad_forgetting_params_are_a_400_and_change_nothing(clipper: Clipper) -> None:
    c = clipper
    base = {"input_type": "doubles", "default_output": "-1", "latency_slo_micros": 1_000_000}
    for policy, params, fragment in (
        ("exp3", {"feedback": "partial"}, b'\'feedback\' must be one of "bandit", "full"'),
        ("exp3", {"floor": 2}, b"'floor' must be a number >= 0 and <= 1"),
        ("exp4", {"share": -1}, b"'share' must be a number >= 0 and <= 1"),
        ("ucb1", {"discount": 0}, b"'discount' must be a number > 0 and <= 1"),
        ("exp4", {"feedback": "full"}, b"does not accept parameter 'feedback'"),
    ):
        body = {"name": "bad", **base, "policy": policy, "policy_params": params}
        resp = await post_json(f"{c.admin_url}/admin/add_app", body)
        assert resp.status == 400 and fragment in resp.body, resp.body
    assert (await post_json(f"{c.admin_url}/admin/get_application", {"name": "bad"})).json() == {}

    body = {"name": "good", **base, "policy": "thompson", "policy_params": {"discount": 0.9}}
    assert (await post_json(f"{c.admin_url}/admin/add_app", body)).status == 200
    resp = await post_json(
        f"{c.admin_url}/admin/update_app", {"name": "good", "policy_params": {"discount": 7}}
    )
    assert resp.status == 400 and b"'discount' must be a number > 0 and <= 1" in resp.body
    got = (await post_json(f"{c.admin_url}/admin/get_application", {"name": "good"})).json()
    assert got["policy_params"] == {"discount": 0.9}

"""Canary splits and shadows between versions of one model, with real frontends and containers."""

from __future__ import annotations

import asyncio
import collections
import math
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from clipper import Clipper
from clipper.cli import main
from tests.integration.helpers import post_json, predict_ok, request, versioned_client, wait_for
from tests.integration.models import (
    row_sums,
    sleepy_sums,
    steady_sums,
    sums_off_when_odd,
    version_one,
    version_two,
)

pytestmark = pytest.mark.integration

PORTS: dict[str, Any] = {"query_port": 0, "rpc_port": 0, "admin_port": 0}


def within_binomial(hits: int, n: int, p: float) -> bool:
    """``hits`` out of ``n`` is within 4.5 standard deviations of a share ``p``."""
    return abs(hits - p * n) <= 4.5 * math.sqrt(n * p * (1 - p))


async def two_versions(c: Clipper, app: str, *, slo_micros: int = 1_000_000) -> None:
    """``app`` linked to model m; version 2 current, version 1 retired (not running)."""
    await c.register_application(app, "doubles", "-1", slo_micros, cache=False)
    await c.deploy_model("m", "1", version_one, input_type="doubles")
    await c.link_model_to_app(app, "m")
    await c.deploy_model("m", "2", version_two, input_type="doubles")
    await wait_for(lambda: not c.manager.replicas("m", "1"), what="version 1 to retire")


async def versions_of(c: Clipper, app: str, docs: list[dict[str, Any]]) -> list[int]:
    """The version that answered each query, 8 in flight at a time (a client that sends
    hundreds at once is shed when the event loop falls behind, which is not under test)."""
    answers: list[Any] = []
    for k in range(0, len(docs), 8):
        chunk = docs[k : k + 8]
        answers += await asyncio.gather(*(predict_ok(c.query_url, app, d) for d in chunk))
    defaulted = [a for a in answers if a["default"]]
    assert defaulted == [], defaulted[:3]
    return [a["output"]["version"] for a in answers]


async def test_split_shares_sticky_users_and_live_changes_lose_nothing() -> None:
    async with Clipper(**PORTS) as c:
        await two_versions(c, "v")
        # Over the admin API: version 1 starts again, and the answer comes once it is up.
        resp = await post_json(
            f"{c.admin_url}/admin/set_traffic_split",
            {"model_name": "m", "split": {"1": 80, "2": 20}},
            limit_s=60,
        )
        assert resp.status == 200, resp.body
        assert resp.json()["shares"] == {"1": 0.8, "2": 0.2}
        assert len(c.schedulers[("m", "1")].replicas) == 1

        n = 400
        got = collections.Counter(
            await versions_of(c, "v", [{"input": [float(i)]} for i in range(n)])
        )
        assert within_binomial(got[1], n, 0.8), got
        assert got[1] + got[2] == n
        sample = c.metrics.registry.get_sample_value
        assert sample("clipper_split_requests_total", {"model": "m", "version": "1"}) == got[1]
        # The V2 protocol's answers name the version the split chose.
        for i in range(20):
            resp = await post_json(
                f"{c.query_url}/v2/models/v/infer",
                {"inputs": [{"name": "input", "shape": [1, 1], "datatype": "FP64", "data": [i]}]},
            )
            assert resp.status == 200, resp.body
            doc = resp.json()
            answered = orjson.loads(doc["outputs"][0]["data"][0])["version"]
            assert doc["model_version"] == str(answered), doc

        # Sticky: a user's queries all go to the version the hash of its uid picks.
        await c.set_traffic_split("m", {"1": 50, "2": 50}, sticky=True)
        rollout = c.registry.rollouts["m"]
        for k in range(30):
            uid = f"user-{k}"
            seen = await versions_of(c, "v", [{"input": [float(i)], "uid": uid} for i in range(4)])
            assert set(seen) == {int(rollout.pick(uid, random.Random()))}, (uid, seen)

        # Live changes under a closed-loop client: nothing fails, nothing is defaulted.
        outcomes: collections.Counter[str] = collections.Counter()
        recent: collections.deque[int] = collections.deque(maxlen=40)
        stop = asyncio.Event()

        async def answered(more: int) -> None:
            target = sum(outcomes.values()) + more
            await wait_for(lambda: sum(outcomes.values()) >= target, what=f"{more} answers")

        clients = [
            asyncio.create_task(
                versioned_client(c.query_url, "v", k, stop=stop, outcomes=outcomes, versions=recent)
            )
            for k in range(4)
        ]
        try:
            for weights in ({"1": 80, "2": 20}, {"1": 20, "2": 80}, {"1": 1}):
                await c.set_traffic_split("m", weights)
                await answered(60)
            await wait_for(lambda: list(recent) == [1] * 40, what="all traffic on version 1")
            await c.set_traffic_split("m", None)  # back to the current version only
            await wait_for(lambda: list(recent) == [2] * 40, what="all traffic back on version 2")
            await wait_for(lambda: not c.manager.replicas("m", "1"), what="version 1 to stop")
        finally:
            stop.set()
            await asyncio.gather(*clients)
        failures = {k: v for k, v in outcomes.items() if not k.startswith("v")}
        assert failures == {}, failures
        assert outcomes["v1"] > 60 and outcomes["v2"] > 60
        assert "m" not in c.registry.rollouts


async def test_a_shadow_is_compared_and_never_answers() -> None:
    async with Clipper(**PORTS) as c:
        await c.register_application("s", "doubles", "-1", 1_000_000)
        await c.deploy_model("m", "2", sums_off_when_odd, input_type="doubles")
        await c.link_model_to_app("s", "m")
        await c.deploy_model("m", "1", row_sums, input_type="doubles")
        await wait_for(lambda: not c.manager.replicas("m", "2"), what="version 2 to retire")
        await c.set_shadow("m", "2", 1.0)
        assert len(c.schedulers[("m", "2")].replicas) == 1

        n = 100
        docs = [{"input": [float(i), 0.5]} for i in range(n)]
        answers = [await predict_ok(c.query_url, "s", d) for d in docs]
        # Every answer is the real version's (row_sums), never the shadow's (1 more when odd).
        assert [a["output"] for a in answers] == [i + 0.5 for i in range(n)]
        assert not any(a["default"] for a in answers)

        def shadow_view() -> dict[str, Any]:
            view: dict[str, Any] = c.traffic_of("m")["stats"]["shadow"]["2"]
            return view

        await wait_for(lambda: shadow_view()["compared"] == n, what="every copy compared")
        view = shadow_view()
        assert view["sent"] == n and view["agreements"] == n // 2
        assert view["agreement_rate"] == 0.5 and view["errors"] == {} and view["dropped"] == 0
        assert view["latency_ms"]["real"]["p50"] is not None
        assert view["latency_ms"]["shadow"]["p50"] is not None
        # The copies bypassed the cache: nothing was stored under the shadow version either.
        assert c.metrics.registry.get_sample_value(
            "clipper_cache_misses_total", {"model": "m", "version": "2"}
        ) in (None, 0.0)
        metrics = (await request(f"{c.query_url}/metrics")).body.decode()
        assert 'clipper_shadow_agreements_total{model="m",version="2"} 50.0' in metrics
        assert 'clipper_shadow_disagreements_total{model="m",version="2"} 50.0' in metrics
        resp = await post_json(f"{c.admin_url}/admin/get_traffic", {"model_name": "m"})
        assert resp.status == 200
        assert resp.json()["shadow"] == {"version": "2", "share": 1.0}

        # A query pinned to a version is not shadowed.
        pinned = await predict_ok(c.query_url, "s", {"input": [3.0, 0.5], "version": "1"})
        assert pinned["output"] == 3.5
        assert shadow_view()["sent"] == n

        # An application with a selection policy over the model is shadowed the same way.
        await c.register_application("e", "doubles", "-1", 1_000_000, policy="exp4")
        await c.link_model_to_app("e", "m")
        votes = [await predict_ok(c.query_url, "e", {"input": [1.0, 0.5]}) for _ in range(5)]
        assert [v["output"] for v in votes] == [1.5] * 5  # version 1's answer, not the shadow's
        await wait_for(lambda: shadow_view()["compared"] == n + 5, what="the ensemble's copies")
        assert shadow_view()["agreements"] == n // 2  # 1.5 vs 2.5: each copy disagreed

        await c.set_shadow("m", None)
        await wait_for(lambda: not c.manager.replicas("m", "2"), what="the shadow to stop")


async def test_a_shadow_slower_than_the_slo_never_delays_the_real_answers() -> None:
    async with Clipper(**PORTS) as c:
        # An SLO with room for this shared machine's stalls; the shadow takes 2 s a batch.
        await c.register_application("fast", "doubles", "-1", 800_000, cache=False)
        await c.deploy_model("m", "1", steady_sums, input_type="doubles")
        await c.link_model_to_app("fast", "m")
        await c.deploy_model("m", "slow", sleepy_sums, input_type="doubles", set_current=False)
        await c.set_shadow("m", "slow", 1.0)

        async def client(k: int) -> list[dict[str, Any]]:
            return [
                await predict_ok(c.query_url, "fast", {"input": [float(k), float(i)]})
                for i in range(40)
            ]

        runs = await asyncio.gather(*(client(k) for k in range(4)))
        answers = [a for run in runs for a in run]
        assert len(answers) == 160
        assert [a for a in answers if a["default"]] == []
        defaulted = [
            (s.labels, s.value)
            for family in c.metrics.defaults.collect()
            for s in family.samples
            if s.name.endswith("_total") and s.value
        ]
        assert defaulted == []
        view = c.traffic_of("m")["stats"]["shadow"]["slow"]
        # The shadow could not keep up: its copies expired or were shed, on its own queue.
        assert view["sent"] + view["dropped"] == 160
        assert sum(view["errors"].values()) >= 1, view
        assert view["compared"] < 160


async def test_bad_rollouts_are_refused_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    durable: dict[str, Any] = {**PORTS, "state_dir": tmp_path, "store": f"sqlite:///{tmp_path}"}
    async with Clipper(**durable) as c:
        await two_versions(c, "v")
        admin = c.admin_url
        ok = await post_json(
            f"{admin}/admin/set_traffic_split", {"model_name": "m", "split": {"1": 90, "2": 10}}
        )
        assert ok.status == 200, ok.body
        kept = c.registry.rollouts["m"]
        stored = (await c.store.load())["rollout"]
        split, shadow = f"{admin}/admin/set_traffic_split", f"{admin}/admin/set_shadow"
        cases = [
            (split, {"model_name": "m", "split": {"1": 90, "9": 10}}, "has no version '9'"),
            (split, {"model_name": "m", "split": {"1": 0, "2": 10}}, "finite number > 0"),
            (split, {"model_name": "m", "split": {"1": -1}}, "finite number > 0"),
            (split, {"model_name": "m", "split": {"1": "a"}}, "must be a number > 0"),
            (split, {"model_name": "m", "split": [1, 2]}, "expected type object or null"),
            (split, {"model_name": "nope", "split": {"1": 1}}, "No model with name 'nope'"),
            (split, {"model_name": "m"}, "does not have required key: split"),
            (split, {"model_name": "m", "split": {"1": 1}, "x": 1}, "unknown keys ['x']"),
            (shadow, {"model_name": "m", "version": "2", "share": 1.5}, "share must be in [0, 1]"),
            (shadow, {"model_name": "m", "version": "2", "share": -0.1}, "share must be in [0, 1]"),
            (shadow, {"model_name": "m", "version": "1"}, "cannot shadow queries and answer"),
            (shadow, {"model_name": "m", "version": "9"}, "has no version '9'"),
            (shadow, {"model_name": "m", "version": 3}, "expected type string or null"),
            (
                f"{admin}/admin/delete_versioned_model",
                {"model_name": "m", "model_version": "1"},
                "'1' of model 'm' is in its split",
            ),
        ]
        for url, body, message in cases:
            resp = await post_json(url, body)
            assert resp.status == 400, (body, resp.status, resp.body)
            assert message in resp.body.decode(), (body, resp.body)
            assert c.registry.rollouts["m"] == kept
            assert (await c.store.load())["rollout"] == stored
        assert "1" in c.registry.models["m"]

        # The CLI: a good split, then a bad one (refused: exit 1) and bad usage (exit 2).
        urls = ["--admin-url", admin, "--url", c.query_url]
        cli = ["model", "split", "m", "1=50", "2=50", "--sticky", "--json", *urls]
        assert await asyncio.to_thread(main, cli) == 0
        assert orjson.loads(capsys.readouterr().out)["shares"] == {"1": 0.5, "2": 0.5}
        assert await asyncio.to_thread(main, ["model", "split", "m", "9=1", *urls]) == 1
        assert "has no version '9'" in capsys.readouterr().err
        assert await asyncio.to_thread(main, ["model", "split", "m", "1=x", *urls]) == 2
        assert await asyncio.to_thread(main, ["model", "shadow", "m", *urls]) == 2
        assert await asyncio.to_thread(main, ["model", "shadow", "m", "--off", *urls]) == 0
        assert "shadow: none" in capsys.readouterr().out
        assert await asyncio.to_thread(main, ["model", "traffic", "m", *urls]) == 0
        assert "split: 1 50.0%, 2 50.0% (sticky per uid)" in capsys.readouterr().out
        expected = c.registry.rollouts["m"]
        assert expected.sticky and expected.shares() == {"1": 0.5, "2": 0.5}

    # A restart serves the same split, both versions running, with no manual step.
    async with Clipper(**durable) as c:
        assert c.registry.rollouts["m"] == expected
        await c.wait_for_replicas("m", "1", 1, ready_timeout_s=30)
        await c.wait_for_replicas("m", "2", 1, ready_timeout_s=30)
        uids = [f"u{k}" for k in range(40)]
        seen = await versions_of(c, "v", [{"input": [1.0], "uid": u} for u in uids])
        assert seen == [int(expected.pick(u, random.Random())) for u in uids]


async def test_a_sticky_split_is_the_same_on_two_frontends_sharing_redis(
    redis_url: str, tmp_path: Path
) -> None:
    common: dict[str, Any] = {**PORTS, "store": redis_url}
    async with (
        Clipper(state_dir=tmp_path / "a", **common) as a,
        Clipper(state_dir=tmp_path / "b", **common) as b,
    ):
        await a.register_application("v", "doubles", "-1", 1_000_000, cache=False)
        await a.deploy_model("m", "1", version_one, input_type="doubles")
        await a.link_model_to_app("v", "m")
        await a.deploy_model("m", "2", version_two, input_type="doubles")
        await a.set_traffic_split("m", {"1": 50, "2": 50}, sticky=True)
        await wait_for(lambda: "m" in b.registry.rollouts, what="the split on b")
        assert b.registry.rollouts["m"] == a.registry.rollouts["m"]
        await b.wait_for_replicas("m", "1", 1, ready_timeout_s=30)
        await b.wait_for_replicas("m", "2", 1, ready_timeout_s=30)
        docs = [{"input": [1.0], "uid": f"user-{k}"} for k in range(30)]
        on_a = await versions_of(a, "v", docs)
        on_b = await versions_of(b, "v", docs)
        assert on_a == on_b and set(on_a) == {1, 2}
        await a.set_traffic_split("m", None)
        await wait_for(lambda: "m" not in b.registry.rollouts, what="the split gone on b")

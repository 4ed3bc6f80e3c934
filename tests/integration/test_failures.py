"""Failures on the query path: slow models, model errors, dead replicas, overload, scale-down,
shutdown. Every query must still get an answer, by its deadline."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
from typing import Any

import pytest

from clipper import BatchingConfig, Clipper, RegistryError
from clipper.batching.scheduler import Replica
from clipper.managers.base import ReplicaStatus
from clipper.query.prediction import NO_MODELS, SLO_MISSED
from tests.integration import models
from tests.integration.helpers import Response, pid_alive, predict, predict_ok, request, wait_for

pytestmark = pytest.mark.integration

URL_TIMEOUT = 10.0


def frontend(**settings: Any) -> Clipper:
    return Clipper(query_port=0, rpc_port=0, admin_port=0, **settings)


async def metrics_json(c: Clipper) -> dict[str, float]:
    resp = await request(f"{c.query_url}/metrics", headers={"Accept": "application/json"})
    assert resp.status == 200
    doc: dict[str, float] = resp.json()
    return doc


async def test_slow_model_answers_the_default_at_the_slo() -> None:
    async with frontend() as c:
        await c.deploy_model("slow", "1", models.slow_sums, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 50_000)  # 50 ms; the model takes 300
        await c.link_model_to_app("app", "slow")

        resp = await predict(c.query_url, "app", {"input": [2.0]})
        assert resp.status == 200
        doc = resp.json()
        assert doc["default"] is True
        assert doc["output"] == -1.0
        assert doc["default_explanation"] == SLO_MISSED
        assert SLO_MISSED == (
            "Failed to retrieve a prediction response within the specified latency SLO"
        )
        # Answered at the deadline: not before it, and not when the model finally answers.
        assert 0.045 <= resp.elapsed < 0.25, resp.elapsed

        # The late result still lands in the cache, so the next identical query is the model's.
        key = ("slow", "1", struct.pack("<d", 2.0))
        await wait_for(lambda: c.cache.peek(key) is not None, limit_s=5, what="late result")
        again = await predict_ok(c.query_url, "app", {"input": [2.0]})
        assert again["default"] is False
        assert again["output"] == 2.0
        stats = await metrics_json(c)
        assert stats['clipper_app_default_outputs_total{app="app",reason="slo"}'] == 1


async def test_model_exception_answers_the_default_and_the_model_keeps_serving() -> None:
    async with frontend() as c:
        await c.deploy_model("fragile", "1", models.fragile_sums, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 2_000_000)
        await c.link_model_to_app("app", "fragile")

        bad = await predict_ok(c.query_url, "app", {"input": [-1.0, 5.0]})
        assert bad["default"] is True
        assert bad["output"] == -1.0
        assert "boom: negative input" in bad["default_explanation"]
        assert "ValueError" in bad["default_explanation"]
        assert bad["default_explanation"].startswith("The model fragile raised an error")

        good = await predict_ok(c.query_url, "app", {"input": [1.0, 5.0]})
        assert good == {"query_id": good["query_id"], "output": 6.0, "default": False}

        # Errors are not cached: the same bad input is evaluated (and fails) again.
        again = await predict_ok(c.query_url, "app", {"input": [-1.0, 5.0]})
        assert again["default"] is True
        assert "boom: negative input" in again["default_explanation"]
        stats = await metrics_json(c)
        assert stats['clipper_model_errors_total{model="fragile",version="1"}'] == 2
        assert stats['clipper_app_default_outputs_total{app="app",reason="model_error"}'] == 2


async def test_replica_killed_under_load_loses_no_query_and_is_restarted() -> None:
    slo_s = 0.5
    margin_s = 0.5
    n_queries, concurrency, kill_after = 200, 8, 60
    async with frontend(heartbeat_interval_s=0.2, replica_timeout_s=1.0) as c:
        await c.deploy_model(
            "steady", "1", models.steady_sums, input_type="doubles", num_replicas=2
        )
        await c.register_application("app", "doubles", "-1.0", int(slo_s * 1e6))
        await c.link_model_to_app("app", "steady")
        sched = c.schedulers[("steady", "1")]
        assert len(sched.replicas) == 2
        todo = list(range(n_queries))
        results: list[tuple[int, Response]] = []
        midway = asyncio.Event()

        async def client() -> None:
            while todo:
                i = todo.pop()
                resp = await predict(c.query_url, "app", {"input": [float(i), 0.5]})
                results.append((i, resp))
                if len(results) >= kill_after:
                    midway.set()

        killed: list[tuple[ReplicaStatus, int, Replica, int]] = []

        async def killer() -> None:
            await midway.wait()
            # Kill a replica while it holds a batch, so that batch must go to the other one.
            await wait_for(
                lambda: any(r.in_flight for r in sched.replicas), limit_s=5, interval=0.0005
            )
            replica = next(r for r in sched.replicas if r.in_flight)
            # The process serving it, tied to the connection by its slot token.
            proc = next(p for p in c.manager.replicas("steady", "1") if p.token == replica.address)
            assert proc.pid is not None
            lost = sum(len(tasks) for tasks, *_ in replica.in_flight.values())
            killed.append((proc, proc.pid, replica, lost))
            os.kill(proc.pid, signal.SIGKILL)

        await asyncio.gather(killer(), *(client() for _ in range(concurrency)))
        assert not todo
        assert len(results) == n_queries
        assert len(killed) == 1
        victim, victim_pid, victim_replica, lost = killed[0]
        assert lost >= 1
        assert victim_replica not in sched.replicas

        answered = 0
        for i, resp in results:
            assert resp.status == 200, resp.body
            assert resp.elapsed < slo_s + margin_s, (i, resp.elapsed)
            doc = resp.json()
            if doc["default"]:
                assert doc["default_explanation"] == SLO_MISSED, doc
            else:
                assert doc["output"] == i + 0.5
                answered += 1
        # A dead replica's batches go to the live one: (almost) nothing falls to the default.
        assert answered >= n_queries - 5, answered

        # The manager restarts the killed process and it reconnects.
        await wait_for(
            lambda: victim.restarts >= 1 and len(sched.replicas) == 2,
            limit_s=20,
            what="the killed replica to be restarted and reconnected",
        )
        assert victim.pid is not None
        assert victim.pid != victim_pid
        assert not pid_alive(victim_pid)
        doc = await predict_ok(c.query_url, "app", {"input": [1000.0]})
        assert doc["output"] == 1000.0


async def test_only_replica_killed_answers_no_replica_then_recovers() -> None:
    async with frontend() as c:
        await c.deploy_model("m", "1", models.row_sums, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 2_000_000)
        await c.link_model_to_app("app", "m")
        sched = c.schedulers[("m", "1")]
        proc = c.manager.replicas("m", "1")[0]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        # Removed as soon as the manager sees the exit, long before any heartbeat timeout.
        await wait_for(lambda: not sched.replicas, limit_s=2, what="the replica's removal")
        doc = await predict_ok(c.query_url, "app", {"input": [1.0]})
        assert doc["default"] is True
        assert doc["default_explanation"].startswith("No replica of model m:1 is alive")
        await wait_for(lambda: len(sched.replicas) == 1, limit_s=20, what="the restart")
        assert proc.restarts == 1
        doc = await predict_ok(c.query_url, "app", {"input": [1.0]})
        assert doc["default"] is False
        assert doc["output"] == 1.0


async def test_overload_sheds_with_default_or_rejects_with_503() -> None:
    capacity = 2
    n = 10
    async with frontend(queue_capacity=capacity) as c:
        one_at_a_time = BatchingConfig(controller="fixed", max_batch_size=1, max_wait_micros=0)
        await c.deploy_model(
            "slow", "1", models.slow_sums, input_type="doubles", batching=one_at_a_time
        )
        await c.register_application("shed", "doubles", "-1.0", 5_000_000)
        await c.register_application("reject", "doubles", "-1.0", 5_000_000, overload="reject")
        await c.link_model_to_app("shed", "slow")
        await c.link_model_to_app("reject", "slow")

        # One batch in flight, `capacity` queued; the rest are shed on arrival.
        shed = await asyncio.gather(
            *(predict(c.query_url, "shed", {"input": [float(i)]}) for i in range(n))
        )
        served = [r for r in shed if not r.json()["default"]]
        dropped = [r for r in shed if r.json()["default"]]
        assert len(served) == 1 + capacity
        assert len(dropped) == n - 1 - capacity
        for i, r in enumerate(shed):
            if not r.json()["default"]:
                assert r.json()["output"] == float(i)
        for r in dropped:
            assert r.status == 200
            doc = r.json()
            assert doc["output"] == -1.0
            assert doc["default_explanation"].startswith("Query shed under overload"), doc
            assert "queue is full (2 queries)" in doc["default_explanation"]
            assert r.elapsed < 0.2, r.elapsed  # at once, not at the deadline
        assert max(r.elapsed for r in served) >= 0.3 * (1 + capacity) - 0.05

        rejected = await asyncio.gather(
            *(predict(c.query_url, "reject", {"input": [100.0 + i]}) for i in range(n))
        )
        ok = [r for r in rejected if r.status == 200]
        refused = [r for r in rejected if r.status == 503]
        assert len(ok) == 1 + capacity
        assert len(refused) == n - 1 - capacity
        for r in ok:
            assert r.json()["default"] is False
        for r in refused:
            doc = r.json()
            assert doc["error"] == "Service unavailable"
            assert "queue is full" in doc["cause"]
            assert r.elapsed < 0.2, r.elapsed
        stats = await metrics_json(c)
        assert stats['clipper_app_default_outputs_total{app="shed",reason="overload"}'] == (
            n - 1 - capacity
        )


async def test_a_query_joining_an_in_flight_input_keeps_its_own_deadline() -> None:
    """Two apps with different SLOs share a model and its cache. A query of the loose app that
    joins the pending evaluation of a tight-app query must not inherit the tight deadline."""
    async with frontend() as c:
        one_at_a_time = BatchingConfig(controller="fixed", max_batch_size=1, max_wait_micros=0)
        await c.deploy_model(
            "slow", "1", models.slow_sums, input_type="doubles", batching=one_at_a_time
        )
        await c.register_application("tight", "doubles", "-1.0", 100_000)
        await c.register_application("loose", "doubles", "-1.0", 3_000_000)
        await c.link_model_to_app("tight", "slow")
        await c.link_model_to_app("loose", "slow")
        sched = c.schedulers[("slow", "1")]

        # Keep the only replica busy for 300 ms.
        busy = asyncio.create_task(predict(c.query_url, "loose", {"input": [1.0]}))
        await wait_for(lambda: any(r.in_flight for r in sched.replicas), what="a busy replica")
        # A tight query (100 ms) for input 2.0 waits in the queue...
        tight = asyncio.create_task(predict(c.query_url, "tight", {"input": [2.0]}))
        key = ("slow", "1", struct.pack("<d", 2.0))
        await wait_for(lambda: c.cache.pending_waiters(key) == 1, what="the tight query")
        # ...and a loose query (3 s) for the same input joins its evaluation.
        loose = await predict(c.query_url, "loose", {"input": [2.0]})

        tight_doc = (await tight).json()
        assert tight_doc["default"] is True
        assert tight_doc["default_explanation"] == SLO_MISSED
        assert (await busy).json()["output"] == 1.0
        doc = loose.json()
        # The loose query had 3 s: the model answers it (about 600 ms), no SLO default.
        assert doc["default"] is False, (loose.elapsed, doc)
        assert doc["output"] == 2.0


async def test_refused_redeploy_of_an_existing_version_changes_nothing() -> None:
    async with frontend() as c:
        await c.deploy_model("m", "1", models.version_one, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 2_000_000)
        await c.link_model_to_app("app", "m")
        doc = await predict_ok(c.query_url, "app", {"input": [1.0]})
        assert doc["output"] == {"version": 1, "sum": 1.0}

        with pytest.raises(RegistryError, match="already exists"):
            await c.deploy_model("m", "1", models.version_two, input_type="doubles")

        # Whatever restarts the replica, version 1 must still run the model deployed as 1.
        sched = c.schedulers[("m", "1")]
        proc = c.manager.replicas("m", "1")[0]
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        await wait_for(
            lambda: proc.restarts >= 1 and len(sched.replicas) == 1,
            limit_s=20,
            what="the replica's restart",
        )
        doc = await predict_ok(c.query_url, "app", {"input": [5.0]})
        assert doc["output"] == {"version": 1, "sum": 5.0}


async def test_scaling_to_zero_answers_no_connected_models() -> None:
    async with frontend() as c:
        await c.deploy_model("m", "1", models.row_sums, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 2_000_000)
        await c.link_model_to_app("app", "m")
        assert (await predict_ok(c.query_url, "app", {"input": [2.0]}))["output"] == 2.0
        pid = c.manager.replicas("m", "1")[0].pid
        assert pid is not None

        await c.set_num_replicas("m", 0)
        doc = await predict_ok(c.query_url, "app", {"input": [3.0]})
        assert doc["default"] is True
        assert doc["output"] == -1.0
        assert doc["default_explanation"] == NO_MODELS
        await wait_for(lambda: not pid_alive(pid), limit_s=5, what="the replica to exit")
        ready = await request(f"{c.query_url}/ready")
        assert ready.status == 200  # zero replicas configured is not "unready"

        await c.set_num_replicas("m", 1)
        doc = await predict_ok(c.query_url, "app", {"input": [3.0]})
        assert doc["default"] is False
        assert doc["output"] == 3.0


async def test_deleting_the_model_version_answers_no_connected_models() -> None:
    async with frontend() as c:
        await c.deploy_model("m", "1", models.row_sums, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 2_000_000)
        await c.link_model_to_app("app", "m")
        assert (await predict_ok(c.query_url, "app", {"input": [2.0]}))["default"] is False
        pid = c.manager.replicas("m", "1")[0].pid
        assert pid is not None

        await c.stop_model("m", "1")
        assert ("m", "1") not in c.schedulers
        doc = await predict_ok(c.query_url, "app", {"input": [2.0]})
        assert doc["default"] is True
        assert doc["default_explanation"] == NO_MODELS
        pinned = await predict(c.query_url, "app", {"input": [2.0], "version": "1"})
        assert pinned.status == 400
        assert pinned.json()["cause"] == "Requested version: 1 does not exist for model: m"
        assert not pid_alive(pid)


async def test_stop_leaves_no_container_process() -> None:
    c = frontend()
    async with c:
        await c.deploy_model("m", "1", models.row_sums, input_type="doubles", num_replicas=2)
        await c.deploy_model("n", "1", models.shout, input_type="strings")
        pids = [p.pid for p in c.manager.all_replicas()]
        assert len(pids) == 3
        assert all(p is not None and pid_alive(p) for p in pids)
        url = c.query_url
    t0 = time.monotonic()
    await wait_for(
        lambda: not any(p is not None and pid_alive(p) for p in pids),
        limit_s=5,
        what="every container to exit",
    )
    assert time.monotonic() - t0 < 5
    with pytest.raises(OSError):
        await request(f"{url}/health", limit_s=URL_TIMEOUT)

"""Autoscaling with the local manager and real container processes under an offered-load ramp.

A model that sleeps 5 ms per batch and 20 ms per input (about 45 inputs/s per replica within
the SLO) gets 20 queries/s, then 75, then 20 again, open loop, through the frontend's query
router. The autoscaler (short windows, for the test) must take it from 1 replica to several and
back to 1, never up again once on the way down; once the count has settled under the high
load, p99 latency and the share of default answers are read from the server's own histogram
and counters, over that stretch only.

Also the client and the CLI: settings through ``clipper.Client`` and ``clipper model
autoscale``, and the table ``clipper status`` prints.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from clipper.client import Client
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from clipper.server import Clipper
from tests.inprocess import InProcessFrontend, in_process_frontend
from tests.integration import models
from tests.integration.helpers import wait_for
from tests.integration.redis_server import REDIS_SERVER, start_redis, stop_redis
from tests.integration.test_client_cli import clipper_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SLO_S = 0.5
LOW_QPS, HIGH_QPS = 20.0, 75.0  # 75/s needs 3 replicas at 0.7 whether capacity is 38 or 48
INTERVAL_S, UP_S, DOWN_S = 0.5, 3.0, 4.0  # short windows, for the test


def histogram(c: Clipper, app: str) -> Buckets:
    """The app's latency histogram: (upper bound, cumulative count), ascending."""
    return sorted(
        (float(s.labels["le"]), s.value)
        for family in c.metrics.latency.collect()
        for s in family.samples
        if s.name.endswith("_bucket") and s.labels["app"] == app
    )


def defaults(c: Clipper, app: str) -> float:
    total = 0.0
    for family in c.metrics.defaults.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.labels["app"] == app:
                total += s.value
    return total


Buckets = list[tuple[float, float]]


def quantile(q: float, before: Buckets, after: Buckets) -> float:
    """``histogram_quantile(q, ...)`` over what was observed between two snapshots."""
    buckets = [(le, b - a) for (le, b), (_, a) in zip(after, before, strict=True)]
    rank = q * buckets[-1][1]
    lower = below = 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper) or count == below:
                return lower if math.isinf(upper) else upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


class Load:
    """Open-loop queries at ``rate`` per second, each with an input never seen before."""

    def __init__(self, fe: InProcessFrontend, app: str) -> None:
        self.fe = fe
        self.app = app
        self.rate = LOW_QPS
        self.sent = 0
        self._ids = itertools.count()
        self._inflight: set[asyncio.Task[Any]] = set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            i = next(self._ids)
            task = loop.create_task(
                self.fe.query.post(f"/{self.app}/predict", json={"input": [float(i), 0.5]})
            )
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
            self.sent += 1
            next_at += 1.0 / self.rate
            await asyncio.sleep(max(next_at - loop.time(), 0.0))  # pacing the offered load

    async def drain(self) -> None:
        await asyncio.gather(*self._inflight, return_exceptions=True)


@pytest.mark.slow
async def test_replicas_follow_the_load_up_and_back_and_p99_meets_the_slo(
    tmp_path: Path,
) -> None:
    async with in_process_frontend(state_dir=tmp_path) as fe:
        c = fe.clipper
        await c.register_application("paced", "doubles", "-1", int(SLO_S * 1e6))
        await c.deploy_model("paced", "1", models.paced_sums, input_type="doubles")
        await c.link_model_to_app("paced", "paced")
        await c.set_autoscale(
            "paced", min_replicas=1, max_replicas=4, target_utilization=0.7,
            interval_s=INTERVAL_S, up_window_s=UP_S, down_window_s=DOWN_S,
        )  # fmt: skip
        counts = [1]

        def count() -> int:
            return c.registry.models["paced"]["1"].num_replicas

        def connected() -> int:
            sched = c.schedulers.get(("paced", "1"))
            return len(sched.replicas) if sched is not None else 0

        async def watch() -> None:
            while True:
                if count() != counts[-1]:
                    counts.append(count())
                await asyncio.sleep(0.02)

        def status() -> dict[str, Any]:
            return c.autoscaler.status("paced", "1") or {}  # {}: not sampled yet

        load = Load(fe, "paced")
        tasks = [asyncio.create_task(load.run()), asyncio.create_task(watch())]
        try:
            # low load: the capacity gets measured, and one replica is enough
            await wait_for(
                lambda: float(str(status().get("replica_capacity_rps", 0))) > 0 and load.sent > 60,
                limit_s=20,
                what="a measured capacity",
            )
            capacity = float(str(status()["replica_capacity_rps"]))
            # 5 ms + 20 ms per input: ~45/s, less while a cold replica's first slow batches
            # weigh in its latency estimate
            assert 15 < capacity < 80, capacity
            # high load: more replicas, connected, and then no more changes for a while
            load.rate = HIGH_QPS
            await wait_for(lambda: count() >= 2, limit_s=20, what="a scale-up")
            settled_at = asyncio.get_running_loop().time()
            seen = len(counts)

            def settled() -> bool:
                nonlocal settled_at, seen
                now = asyncio.get_running_loop().time()
                if len(counts) != seen or connected() != count() or status().get("scaling"):
                    settled_at, seen = now, len(counts)
                # a count one above what the load needs comes down after a down window
                return now - settled_at >= DOWN_S + 2 * INTERVAL_S

            await wait_for(settled, limit_s=30, what="the count to settle under high load")
            peak = count()
            before, defaults_before = histogram(c, "paced"), defaults(c, "paced")
            sent_before = load.sent
            await asyncio.sleep(3.0)  # the converged stretch whose latencies are measured
            after, defaults_after = histogram(c, "paced"), defaults(c, "paced")
            answered = after[-1][1] - before[-1][1]
            assert count() == peak, (counts, status())  # converged: no change meanwhile
            assert answered >= 0.8 * (load.sent - sent_before) - HIGH_QPS * SLO_S
            p99 = quantile(0.99, before, after)
            assert p99 <= SLO_S, (p99, before, after)
            assert defaults_after - defaults_before <= 0.01 * answered, (
                defaults_after - defaults_before,
                answered,
            )
            # low load again: one replica at a time, down to one
            load.rate = LOW_QPS
            await wait_for(lambda: count() == 1, limit_s=40, what="scaling back to 1")
            if counts[-1] != 1:
                counts.append(1)  # the watcher polls; this is where it would have seen it
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await load.drain()
        assert counts[0] == 1 and counts[-1] == 1 and max(counts) >= 2, counts
        top = counts.index(max(counts))
        assert counts[: top + 1] == sorted(counts[: top + 1]), counts  # up, then
        assert counts[top:] == sorted(counts[top:], reverse=True), counts  # only down
        assert all(a - b == 1 for a, b in itertools.pairwise(counts[top:])), counts
        last = status()["last_decision"]
        assert isinstance(last, dict) and last["reason"] == "quiet", last
        labels = {"model": "paced", "version": "1"}
        sample = c.metrics.registry.get_sample_value
        assert sample("clipper_autoscale_desired_replicas", labels) == 1.0
        assert sample("clipper_autoscale_last_decision", {**labels, "reason": "quiet"}) == 1.0
        ups = sum(
            sample("clipper_autoscale_decisions_total", {**labels, "reason": r}) or 0.0
            for r in ("utilization", "shedding")
        )
        assert ups == top  # one decision per step up (the first may skip counts), none after


async def test_client_and_cli_set_autoscaling_and_status_shows_it(tmp_path: Path) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path) as c:
        # registered, not current: no replica runs, so nothing is decided here
        idle = ModelVersion("summer", "1", InputType.DOUBLES, artifact="/models/s", num_replicas=0)
        await c.control.register_model(idle, set_current=False)
        client = Client(c.admin_url, c.query_url)
        view = await asyncio.to_thread(
            client.set_autoscale, "summer", "1", min_replicas=2, max_replicas=5
        )
        assert (view["min_replicas"], view["max_replicas"], view["num_replicas"]) == (2, 5, 2)
        code, out, err = await clipper_cli(
            c, "model", "autoscale", "summer", "--version", "1", "--max", "3", "--target", "0.6",
            "--down-window", "300",
        )  # fmt: skip
        assert code == 0, err
        assert out.strip() == "summer: autoscaling on, 2 to 3 replicas at 60% utilisation; 2 now"
        code, out, err = await clipper_cli(c, "model", "autoscale", "summer", "--version", "1",
                                           "--min", "4", "--max", "3")  # fmt: skip
        assert code == 1 and "min_replicas <= max_replicas" in err
        code, out, err = await clipper_cli(
            c, "model", "autoscale", "summer", "--version", "1", "--off", "--json"
        )
        assert code == 0, err
        assert orjson.loads(out)["enabled"] is False
        code, out, err = await clipper_cli(c, "status")
        assert code == 0, err
        table = out.split("autoscaling:\n", 1)[1].splitlines()
        assert table[0].split() == [
            "MODEL_NAME", "MODEL_VERSION", "ON", "REPLICAS", "BOUNDS", "TARGET", "UTILIZATION",
            "LAST_DECISION", "NOTE",
        ]  # fmt: skip
        assert table[1].split()[:6] == ["summer", "1", "False", "2", "2..3", "0.6"]
        stored = c.registry.models["summer"]["1"].autoscale
        assert stored is not None and stored.down_window_s == 300.0


@pytest.mark.skipif(
    REDIS_SERVER is None and not os.environ.get("CLIPPER_REQUIRE_REDIS"),
    reason="redis-server is not installed; set CLIPPER_REQUIRE_REDIS=1 to fail instead",
)
async def test_settings_reach_another_frontend_through_redis_and_one_drives(
    tmp_path: Path,
) -> None:
    assert REDIS_SERVER is not None, "CLIPPER_REQUIRE_REDIS is set: install redis-server"
    proc, port = start_redis()
    try:
        store = f"redis://127.0.0.1:{port}/0?prefix=autoscale-{os.getpid()}"
        ports: dict[str, Any] = {"query_port": 0, "rpc_port": 0, "admin_port": 0, "store": store}
        async with (
            Clipper(state_dir=tmp_path / "a", node_id="frontend-a", **ports) as a,
            Clipper(state_dir=tmp_path / "b", node_id="frontend-b", **ports) as b,
        ):
            idle = ModelVersion("m", "1", InputType.DOUBLES, artifact="/models/m", num_replicas=0)
            await a.control.register_model(idle, set_current=False)
            await a.set_autoscale("m", "1", min_replicas=2, max_replicas=3, up_window_s=30)

            def arrived() -> bool:
                mv = b.registry.models.get("m", {}).get("1")
                return mv is not None and mv.autoscale is not None

            await wait_for(arrived, limit_s=10, what="the settings on the other frontend")
            mine, theirs = a.registry.models["m"]["1"], b.registry.models["m"]["1"]
            assert theirs == mine and theirs.num_replicas == 2
            assert theirs.autoscale is not None and theirs.autoscale.owner == "frontend-a"
            view_a, view_b = a.autoscaler.view(mine), b.autoscaler.view(theirs)
            assert view_a is not None and view_a["driven_here"] is True
            assert view_b is not None and view_b["driven_here"] is False
            # set through b: b drives it from now on
            await b.set_autoscale("m", "1", max_replicas=5)

            def moved() -> bool:
                cfg = a.registry.models["m"]["1"].autoscale
                return cfg is not None and cfg.max_replicas == 5

            await wait_for(moved, limit_s=10, what="the change back on the first frontend")
            cfg = a.registry.models["m"]["1"].autoscale
            assert cfg is not None and (cfg.owner, cfg.up_window_s) == ("frontend-b", 30.0)
    finally:
        stop_redis(proc)

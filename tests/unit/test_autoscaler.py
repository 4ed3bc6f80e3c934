"""The autoscaler service on a fake clock: what it samples, whom it drives, what it asks the
write side for, and what it shows (metrics, status). A stand-in write side records each
``scale`` call and applies it to the registry, as the real one does once committed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from clipper.batching.cold import ColdStart
from clipper.batching.controllers import AIMDController, BatchController, FixedController
from clipper.batching.scheduler import ModelScheduler
from clipper.clock import FakeClock
from clipper.config import BatchingConfig
from clipper.errors import ReplicaError
from clipper.inputs import InputType
from clipper.registry import Intent, ModelVersion, Registry
from clipper.runtime.autoscaler import Autoscaler, replica_capacity
from clipper.runtime.control import Control
from clipper.scaling import AutoscaleConfig
from tests.catalogs import catalog_of

ME = "node-me"
INTERVAL = 1.0


class StubReplica:
    def __init__(self, controller: BatchController, draining: bool = False) -> None:
        self.controller = controller
        self.draining = draining


class StubScheduler:
    """What the autoscaler reads of a scheduler: its settings, replicas and counters."""

    def __init__(self, mv: ModelVersion, slo_s: float = 0.2) -> None:
        self.mv = mv
        self.slo_s = slo_s
        self.replicas: list[StubReplica] = []
        self.offered = self.shed = self.late = 0
        self.stalled = self.overran = self.lag_shed = 0
        self.cold: ColdStart | None = None
        self.queue: list[object] = []  # inputs held or queued


class RecordingControl:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.node_id = ME
        self.calls: list[tuple[str, str | None, int]] = []
        self.fail: Exception | None = None

    async def scale(
        self,
        name: str,
        num_replicas: int,
        version: str | None = None,
        *,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> ModelVersion:
        self.calls.append((name, version, num_replicas))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        assert version is not None
        return self.registry.set_num_replicas(name, version, num_replicas)


def linear_controller(per_input_s: float, batches: range = range(1, 9)) -> AIMDController:
    c = AIMDController(0.1)
    for n in batches:
        for _ in range(4):
            c.observe(n, per_input_s * n)
    return c


def version(owner: str = ME, **settings: Any) -> ModelVersion:
    cfg = AutoscaleConfig(
        min_replicas=1,
        max_replicas=6,
        up_window_s=4.0,
        down_window_s=8.0,
        interval_s=INTERVAL,
        owner=owner,
    ).updated(**settings)
    return ModelVersion("m", "1", InputType.DOUBLES, artifact="/models/m", autoscale=cfg)


class Harness:
    def __init__(self, mv: ModelVersion) -> None:
        self.clock = FakeClock()
        self.registry = Registry()
        self.registry.add_model(mv)
        self.registry.set_model_version(mv.name, mv.version)
        self.control = RecordingControl(self.registry)
        self.sched = StubScheduler(mv)
        # 10 ms per input: 100 inputs/s per replica, whatever the batch
        self.sched.replicas.append(StubReplica(linear_controller(0.01)))
        self.metrics = CollectorRegistry()
        self.autoscaler = Autoscaler(
            self.registry,
            cast(Control, self.control),
            catalog_of(self.registry, {mv.key: self.sched}),
            clock=self.clock,
            metrics_registry=self.metrics,
        )

    async def run(
        self,
        seconds: float,
        rps: float,
        *,
        every: Callable[[StubScheduler], None] | None = None,
        replicas: Callable[[int], list[StubReplica]] | None = None,
    ) -> None:
        """Offer ``rps`` for ``seconds``, one autoscaler pass per interval; ``every`` adds to
        the scheduler's counters each interval, ``replicas`` gives the replicas (and so the
        capacities) the scheduler has at a count."""
        for _ in range(round(seconds / INTERVAL)):
            self.sched.offered += round(rps * INTERVAL)
            if every is not None:
                every(self.sched)
            if replicas is not None:
                self.sched.replicas = replicas(self.replicas)
            self.clock.advance(INTERVAL)
            self.autoscaler.tick()
            for _ in range(3):  # let a decision's scale call finish
                await asyncio.sleep(0)

    @property
    def replicas(self) -> int:
        return self.registry.models["m"]["1"].num_replicas

    def metric(self, name: str, **labels: str) -> float | None:
        value = self.metrics.get_sample_value(name, {"model": "m", "version": "1", **labels})
        return value


def test_capacity_is_the_largest_batch_that_fits_the_slo_target_over_its_latency() -> None:
    mv = ModelVersion("m", "1", InputType.DOUBLES)
    sched = StubScheduler(mv, slo_s=0.2)  # target: 0.2 * 0.5 = 100 ms
    as_sched = cast(ModelScheduler, sched)
    assert replica_capacity(as_sched) == 0.0  # no replica
    # latency 5 ms + 2 ms per input: 47 inputs in 99 ms is the largest batch within 100 ms
    c = AIMDController(0.1)
    for n in range(1, 9):
        for _ in range(4):
            c.observe(n, 0.005 + 0.002 * n)
    sched.replicas.append(StubReplica(c))
    assert replica_capacity(as_sched) == pytest.approx(47 / (0.005 + 0.002 * 47), rel=1e-6)
    sched.replicas.append(StubReplica(AIMDController(0.1)))  # no measurement yet: not counted
    sched.replicas.append(StubReplica(linear_controller(0.5), draining=True))  # leaving
    assert replica_capacity(as_sched) == pytest.approx(47 / 0.099, rel=1e-6)
    # a batch cap in the settings bounds the batch
    sched.mv = replace(mv, batching=BatchingConfig(max_batch_size=10))
    assert replica_capacity(as_sched) == pytest.approx(10 / 0.025, rel=1e-6)
    # a fixed controller: its size, at its latency
    fixed = FixedController(4)
    for _ in range(8):
        fixed.observe(4, 0.05)
    sched.mv = replace(mv, batching=BatchingConfig(controller="fixed", max_batch_size=4))
    sched.replicas = [StubReplica(fixed)]
    assert replica_capacity(as_sched) == pytest.approx(80.0)
    # a flat line fitted on batches of 1 and 2 (a stall made its slope negative, flattened
    # to the mean) is trusted up to 4x the batch the controller allows now, not to 4096
    flat = AIMDController(0.1)
    for _ in range(20):
        flat.observe(1, 0.02)
        flat.observe(2, 0.02)
    flat.observe(1, 0.5)
    flat.observe(1, 0.5)
    sched.mv, sched.replicas = mv, [StubReplica(flat)]
    bound = 4 * flat.max_batch_size()
    assert replica_capacity(as_sched) == pytest.approx(bound / flat.typical_latency(bound))
    assert replica_capacity(as_sched) < 500
    # slower than the target even one at a time: one input per batch is what it can do
    slow = linear_controller(0.3)
    sched.mv, sched.replicas = mv, [StubReplica(slow)]
    assert replica_capacity(as_sched) == pytest.approx(1 / 0.3)


async def test_it_asks_the_write_side_for_the_count_and_shows_why() -> None:
    h = Harness(version())
    await h.run(6, 50)  # 0.5 of one replica: nothing to do
    assert h.control.calls == []
    assert h.metric("clipper_autoscale_utilization") == pytest.approx(0.5)
    assert h.metric("clipper_autoscale_replica_capacity_rps") == pytest.approx(100.0)
    await h.run(8, 300)  # 3x: ceil(300 / 70) = 5
    assert h.control.calls == [("m", "1", 5)]
    assert h.replicas == 5
    assert h.metric("clipper_autoscale_desired_replicas") == 5.0
    assert h.metric("clipper_autoscale_last_decision", reason="utilization") == 1.0
    assert h.metric("clipper_autoscale_decisions_total", reason="utilization") == 1.0
    status = h.autoscaler.status("m", "1")
    assert status is not None and status["scaling"] is False
    last = status["last_decision"]
    assert isinstance(last, dict)
    assert (last["replicas"], last["reason"], last["error"]) == (5, "utilization", None)
    view = h.autoscaler.view(h.registry.models["m"]["1"])
    assert view is not None
    assert (view["num_replicas"], view["driven_here"], view["max_replicas"]) == (5, True, 6)
    await h.run(40, 50)  # quiet: one at a time, each after the 8 s down window
    assert [n for _, _, n in h.control.calls] == [5, 4, 3, 2, 1]
    assert h.metric("clipper_autoscale_last_decision", reason="quiet") == 1.0
    assert h.metric("clipper_autoscale_last_decision", reason="utilization") is None
    assert h.metric("clipper_autoscale_decisions_total", reason="quiet") == 4.0


async def test_only_the_owner_drives_a_version() -> None:
    h = Harness(version(owner="another-frontend"))
    await h.run(10, 500)
    assert h.control.calls == []
    assert h.autoscaler.status("m", "1") is None
    view = h.autoscaler.view(h.registry.models["m"]["1"])
    assert view is not None and view["driven_here"] is False and view["status"] is None
    assert h.autoscaler.view(replace(h.registry.models["m"]["1"], autoscale=None)) is None


async def test_disabling_or_deleting_forgets_the_version_and_its_series() -> None:
    h = Harness(version())
    await h.run(3, 50)
    assert h.metric("clipper_autoscale_desired_replicas") == 1.0
    mv = h.registry.models["m"]["1"]
    assert mv.autoscale is not None
    h.registry.replace_model(replace(mv, autoscale=replace(mv.autoscale, enabled=False)))
    await h.run(10, 500)
    assert h.control.calls == []
    assert h.autoscaler.status("m", "1") is None
    assert h.metric("clipper_autoscale_desired_replicas") is None
    assert b"clipper_autoscale_desired_replicas{" not in generate_latest(h.metrics)


async def test_a_version_change_under_way_pauses_it() -> None:
    h = Harness(version())
    h.registry.begin_intent(Intent("m", "2", "1", added=True, owner=ME))
    await h.run(10, 500)
    assert h.control.calls == []
    status = h.autoscaler.status("m", "1")
    assert status is not None and status["note"] == "a version change is under way"
    h.registry.end_intent("m")
    await h.run(6, 500)
    assert h.control.calls == [("m", "1", 6)]  # ceil(500 / 70) = 8, bounded by max 6


async def test_a_failed_scale_is_reported_and_the_next_pass_decides_again() -> None:
    h = Harness(version())
    h.control.fail = ReplicaError("1 of 5 replicas of m:1 connected within 60 s")
    await h.run(6, 300)
    assert h.control.calls == [("m", "1", 5)]  # not again at once: an up window later
    status = h.autoscaler.status("m", "1")
    assert status is not None
    last = status["last_decision"]
    assert isinstance(last, dict) and "connected within 60 s" in str(last["error"])
    h.control.fail = None
    await h.run(6, 300)
    assert h.control.calls[-1] == ("m", "1", 5) and h.replicas == 5


async def test_the_owned_loop_runs_on_the_clock_and_stops() -> None:
    h = Harness(version())
    h.autoscaler.start()
    try:
        for _ in range(12):
            h.sched.offered += 300
            h.clock.advance(INTERVAL)
            for _ in range(5):
                await asyncio.sleep(0)
        assert h.control.calls == [("m", "1", 5)]
    finally:
        await h.autoscaler.stop()
    assert h.autoscaler._task is None
    h.sched.offered += 10_000
    h.clock.advance(60.0)
    await asyncio.sleep(0)
    assert len(h.control.calls) == 1  # stopped: nothing more happens


async def test_the_frontends_own_lag_does_not_scale_up_and_says_so() -> None:
    # One sequential client at 0.12 of a replica, and the loop behind (a browser on the same
    # cores): queries shed before admission for lag, expired while the replica sat free, or
    # a round trip that alone overran. More replicas on those cores would only add to the lag.
    h = Harness(version())

    def lagging(s: StubScheduler) -> None:
        s.offered += 2  # the lag-shed ones are offered load too
        s.lag_shed += 2
        s.stalled += 1
        s.overran += 1

    await h.run(40, 10, every=lagging)
    assert h.control.calls == []
    status = h.autoscaler.status("m", "1")
    assert status is not None
    assert "because the frontend was behind" in str(status["note"])
    assert status["frontend_behind_ratio"] == pytest.approx(4 / 12, abs=1e-4)
    assert h.metric("clipper_autoscale_frontend_behind_ratio") == pytest.approx(4 / 12)


async def test_shedding_and_lateness_from_the_models_queue_scale_up_at_once() -> None:
    h = Harness(version(up_window_s=10.0, down_window_s=20.0))
    await h.run(5, 20)  # 0.2 of a replica: nothing to do

    def queueing(s: StubScheduler) -> None:
        s.shed += 3  # admission priced the queue past the deadline
        s.late += 2  # expired waiting for the busy replica

    await h.run(2, 20, every=queueing)  # not the 10 s up window: within two intervals
    assert h.control.calls == [("m", "1", 2)]
    assert h.metric("clipper_autoscale_last_decision", reason="shedding") == 1.0


def affine_controller(per_batch_s: float, per_input_s: float) -> AIMDController:
    c = AIMDController(0.1)
    for n in range(1, 9):
        for _ in range(4):
            c.observe(n, per_batch_s + per_input_s * n)
    return c


def trace(n: int) -> list[StubReplica]:
    """The measured flap's shape: two replicas whose lines promise a batching gain (9 ms a
    batch and 16 ms an input: 4 inputs, the most the controller's cap lets the line be read
    at, in 73 ms, 54.8/s; 40/s one at a time), and the one left after a scale-down seeing
    batches of one only (40/s, no batching gain)."""
    if n >= 2:
        return [StubReplica(affine_controller(0.009, 0.016)) for _ in range(n)]
    return [StubReplica(linear_controller(0.025, range(1, 2)))]


async def test_a_constant_load_at_the_measured_flap_keeps_two_replicas() -> None:
    # 30/s over two at 54.8/s is 0.55 per replica at one fewer: the old rule (that capacity,
    # 0.63 bound) took one away, and the one left, at 40/s, ran at 0.75 and scaled back up.
    h = Harness(version(min_replicas=1, up_window_s=5.0, down_window_s=15.0))
    h.registry.set_num_replicas("m", "1", 2)
    await h.run(300, 30, replicas=trace)  # twenty down windows
    assert h.control.calls == []
    assert h.replicas == 2
    assert h.metric("clipper_autoscale_replica_capacity_rps") == pytest.approx(4 / 0.073)
    # priced at 0.8 x 54.8 = 43.8/s (more than the 40/s one at a time): 30/s is 0.68
    down = 0.8 * 4 / 0.073
    assert h.metric("clipper_autoscale_scale_down_capacity_rps") == pytest.approx(down)
    status = h.autoscaler.status("m", "1")
    assert status is not None and "1 replicas would run at 0.68" in str(status["note"])
    await h.run(60, 15, replicas=trace)  # the load really drops: one replica is enough
    assert h.control.calls == [("m", "1", 1)] and h.replicas == 1
    await h.run(60, 15, replicas=trace)
    assert len(h.control.calls) == 1


async def test_an_idle_version_goes_to_zero_and_a_held_query_wakes_it_at_once() -> None:
    h = Harness(version(min_replicas=0, scale_to_zero_after_s=4.0))
    await h.run(1, 0)
    cold = h.sched.cold
    assert isinstance(cold, ColdStart) and cold.limit == 64  # the hold rules are attached
    view = h.autoscaler.view(h.registry.models["m"]["1"])
    assert view is not None and view["state"] == "running"
    await h.run(4, 0)
    assert h.control.calls == [("m", "1", 0)] and h.replicas == 0
    assert h.metric("clipper_autoscale_last_decision", reason="idle") == 1.0
    h.sched.replicas = []
    view = h.autoscaler.view(h.registry.models["m"]["1"])
    assert view is not None and view["state"] == "scaled to zero"
    # a query finds no replica: the wake is asked at once, not at the next sample
    assert cold.hold(0, 1, 10.0) is None
    assert cold.hold(1, 1, 10.0) is None  # a second one while the wake runs: no second call
    for _ in range(3):
        await asyncio.sleep(0)
    assert h.control.calls == [("m", "1", 0), ("m", "1", 1)] and h.replicas == 1
    assert h.metric("clipper_autoscale_last_decision", reason="cold_start") == 1.0
    view = h.autoscaler.view(h.registry.models["m"]["1"])
    assert view is not None and view["state"] == "waking from zero"
    cold.hold(0, 1, 10.0)  # already at one replica (starting): nothing more is asked
    await asyncio.sleep(0)
    assert len(h.control.calls) == 2
    # settings without scale to zero take the hold rules away
    mv = h.registry.models["m"]["1"]
    assert mv.autoscale is not None
    h.registry.replace_model(replace(mv, autoscale=replace(mv.autoscale, min_replicas=1)))
    await h.run(1, 0)
    assert h.sched.cold is None


async def test_only_the_driving_frontend_wakes_a_version() -> None:
    h = Harness(version(owner="another-frontend", min_replicas=0))
    h.registry.set_num_replicas("m", "1", 0)
    await h.run(1, 0)
    cold = h.sched.cold
    assert isinstance(cold, ColdStart)  # held here too
    assert cold.hold(0, 1, 10.0) is None
    await asyncio.sleep(0)
    assert h.control.calls == []


async def test_a_pooled_version_unloaded_by_its_pool_counts_at_zero_and_reloads_on_a_query() -> (
    None
):
    mv = replace(version(min_replicas=0, max_replicas=1), pooled=True)
    h = Harness(mv)
    await h.run(1, 0)
    cold = h.sched.cold
    assert isinstance(cold, ColdStart) and cold.loading  # its defaults say "loading"
    # evicted for room: counted at zero replicas, with the reason
    h.sched.replicas = []
    h.autoscaler.unloaded(("m", "1"), "evicted: least recently used")
    for _ in range(3):
        await asyncio.sleep(0)
    assert h.control.calls == [("m", "1", 0)] and h.replicas == 0
    last = h.autoscaler.last_decision("m", "1")
    assert last is not None and last.decision.reason == "unloaded"
    assert "evicted: least recently used" in last.decision.detail
    h.autoscaler.unloaded(("m", "1"), "again")  # already at zero: nothing more
    await asyncio.sleep(0)
    assert len(h.control.calls) == 1
    # a query loads it again
    assert cold.hold(0, 1, 10.0) is None
    for _ in range(3):
        await asyncio.sleep(0)
    assert h.control.calls[-1] == ("m", "1", 1) and h.replicas == 1


async def test_an_unload_reported_while_a_load_is_under_way_is_counted_after_it() -> None:
    mv = replace(version(min_replicas=0, max_replicas=1), pooled=True)
    h = Harness(mv)
    h.registry.set_num_replicas("m", "1", 0)
    await h.run(1, 0)
    h.sched.replicas = []
    assert h.sched.cold is not None and h.sched.cold.hold(0, 1, 10.0) is None  # load: to 1
    h.autoscaler.unloaded(("m", "1"), "pool process exited with -9")  # while it runs
    assert h.control.calls == []  # not yet: the load's decision is under way
    for _ in range(6):
        await asyncio.sleep(0)
    assert h.control.calls == [("m", "1", 1), ("m", "1", 0)] and h.replicas == 0


async def test_an_unload_with_queries_held_for_the_version_loads_it_again_at_once() -> None:
    mv = replace(version(min_replicas=0, max_replicas=1), pooled=True)
    h = Harness(mv)
    await h.run(1, 0)
    h.sched.replicas = []
    h.sched.queue = [object()]  # a query is held for it as it is evicted
    h.autoscaler.unloaded(("m", "1"), "evicted")
    for _ in range(6):
        await asyncio.sleep(0)
    assert h.control.calls == [("m", "1", 0), ("m", "1", 1)] and h.replicas == 1


async def test_a_version_that_is_not_pooled_ignores_an_unload_report() -> None:
    h = Harness(version(min_replicas=0))
    await h.run(1, 0)
    h.autoscaler.unloaded(("m", "1"), "evicted")
    await asyncio.sleep(0)
    assert h.control.calls == []

"""Scale to zero on a fake clock: the rules that hold a query for a version with no replica
(clipper.batching.cold), what the query path answers with them, and what readiness says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from clipper.batching.cold import ColdStart
from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.clock import FakeClock
from clipper.errors import RequestError
from clipper.query.prediction import DefaultReason, Prediction
from clipper.rpc.link import Connection
from clipper.scaling import AutoscaleConfig
from tests.unit.test_deadlines import Frontend, single_app


class Got:
    """One request's reply: its predictions (or its failure), with the clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.at: float | None = None
        self.predictions: list[Prediction] | None = None
        self.failed: RequestError | None = None

    def answer(self, predictions: list[Prediction]) -> None:
        assert self.at is None, "answered twice"
        self.at, self.predictions = self.clock.now(), predictions

    def fail(self, err: RequestError) -> None:
        self.at, self.failed = self.clock.now(), err

    def one(self) -> Prediction:
        assert self.predictions is not None
        [p] = self.predictions
        return p


class Cold:
    """A frontend whose model ``m`` has lost its replica and may scale to zero."""

    def __init__(self, *, limit: int = 4) -> None:
        self.f = Frontend(single_app(cache=False), ["m"])
        self.sched: ModelScheduler = self.f.schedulers["m", "1"]
        self.sched.remove_replica(self.f.replicas.pop("m"))
        self.wakes = 0
        self.sched.cold = ColdStart(self.f.clock, limit=limit, wake=self._wake)
        self.app = self.f.registry.apps["app"]

    def _wake(self) -> None:
        self.wakes += 1

    def query(self, value: float = 1.0, *, slo_s: float | None = None) -> Got:
        got = Got(self.f.clock)
        self.f.predict("app", f'{{"input": [{value}]}}'.encode(), got, slo_s=slo_s)
        return got

    def connect(self) -> Replica:
        replica = Replica(Connection(b"new", 7, True, 3.0, self.f.clock.now()))
        self.sched.add_replica(replica)
        self.f.replicas["m"] = replica
        return replica


@pytest.fixture
def cold() -> Iterator[Cold]:
    c = Cold()
    yield c
    c.f.close()


def test_a_held_query_is_answered_by_the_replica_that_connects_in_time(cold: Cold) -> None:
    got = cold.query()
    assert got.at is None and cold.wakes == 1  # held, and the version was asked to wake
    assert len(cold.sched.queue) == 1
    cold.f.clock.advance(0.010)
    cold.connect()  # 10 ms later: the held input goes out at once
    assert len(cold.f.transport.sent) == 1
    cold.f.answer("m", [4.0])
    p = got.one()
    assert p.reason is None and p.output == 4.0
    assert cold.sched.cold is not None and cold.sched.cold.last_s == pytest.approx(0.010)


def test_a_held_query_gets_the_cold_start_default_at_its_deadline(cold: Cold) -> None:
    t0 = cold.f.clock.now()
    got = cold.query()
    due = cold.app.slo_s - cold.app.answer_margin_s
    cold.f.clock.advance(due - 1e-6)
    assert got.at is None  # not before the deadline
    cold.f.clock.advance(1e-6)
    p = got.one()
    assert got.at == pytest.approx(t0 + due, abs=1e-9)
    assert p.reason is DefaultReason.COLD_START and p.output == -1
    assert p.explanation.startswith("model m:1 is starting from zero replicas (waking for 18 ms)")
    cold.f.clock.advance(1.0)
    assert len(cold.sched.queue) == 0  # the scheduler's expiry dropped the held input
    cold.connect()
    assert cold.f.transport.sent == []  # nothing stale reaches the new replica


def test_beyond_the_held_bound_a_query_gets_the_default_at_once(cold: Cold) -> None:
    held = [cold.query(float(i)) for i in range(4)]
    assert all(g.at is None for g in held)
    extra = cold.query(9.0)
    p = extra.one()
    assert extra.at == cold.f.clock.now()
    assert p.reason is DefaultReason.COLD_START
    assert "4 inputs already wait" in p.explanation and "at most 4" in p.explanation
    assert cold.wakes == 5  # every one asks (the autoscaler ignores a wake under way)
    cold.connect()
    assert sum(len(p) for _, _, p in cold.f.transport.sent) == 4


def test_a_query_that_cannot_outlast_the_measured_wake_is_answered_at_once(cold: Cold) -> None:
    assert cold.sched.cold is not None
    cold.sched.cold.last_s = 0.5  # the previous wake took 500 ms; the SLO is 20 ms
    first = cold.query()
    p = first.one()
    assert first.at == cold.f.clock.now() and p.reason is DefaultReason.COLD_START
    assert "about 500 ms more" in p.explanation
    cold.f.clock.advance(0.490)  # 10 ms left of the expected wake: a 20 ms query waits
    later = cold.query(2.0)
    assert later.at is None
    cold.connect()
    cold.f.answer("m", [3.0])
    assert later.one().reason is None
    assert cold.sched.cold.last_s == pytest.approx(0.490)


def test_without_the_hold_rules_a_query_with_no_replica_is_answered_at_once() -> None:
    c = Cold()
    try:
        c.sched.cold = None
        got = c.query()
        assert got.one().reason is DefaultReason.NO_REPLICA and c.wakes == 0
    finally:
        c.f.close()


def test_one_wake_is_timed_from_its_first_held_query() -> None:
    clock = FakeClock()
    calls: list[float] = []
    t0 = clock.now()
    rules = ColdStart(clock, limit=10, wake=lambda: calls.append(clock.now() - t0))
    assert rules.hold(0, 1, 0.1) is None
    clock.advance(0.2)
    assert rules.hold(1, 1, 0.1) is None  # nothing measured yet: held
    assert rules.wakes == 1 and calls == pytest.approx([0.0, 0.2])
    clock.advance(0.3)
    rules.connected()
    assert rules.last_s == pytest.approx(0.5) and rules.woke_at is None
    assert rules.expected_s() is None  # no wake under way
    rules.connected()  # a second replica: no wake to measure
    assert rules.last_s == pytest.approx(0.5)
    assert rules.hold(0, 1, 0.6) is None and rules.wakes == 2
    assert rules.hold(0, 1, 0.4) is not None


def test_readiness_counts_a_scaled_to_zero_version_as_ready_but_cold(cold: Cold) -> None:
    registry, catalog = cold.f.registry, cold.f.catalog
    mv = registry.models["m"]["1"]
    [why] = catalog.reasons()  # no replica, and it does not scale to zero: not ready
    assert "has no replica connected" in why
    auto = AutoscaleConfig(min_replicas=0, max_replicas=2)
    registry.replace_model(replace(mv, autoscale=auto, num_replicas=0))
    assert catalog.reasons() == [] and catalog.unready() == []
    assert catalog.app_reasons(cold.app) == []
    assert catalog.cold() == ["m:1 (scaled to zero)"] == catalog.cold("app")
    assert catalog.cold("other") == []
    registry.replace_model(replace(mv, autoscale=auto, num_replicas=1))
    assert catalog.cold() == ["m:1 (waking from zero)"]
    cold.connect()
    assert catalog.cold() == [] and catalog.reasons() == []


def test_a_pooled_version_says_loading_at_once_and_at_its_deadline(cold: Cold) -> None:
    assert cold.sched.cold is not None
    cold.sched.cold.loading = True  # a pooled version (docs/density.md)
    cold.sched.cold.last_s = 0.5  # its last load took 500 ms; the SLO is 20 ms
    first = cold.query()
    p = first.one()
    assert first.at == cold.f.clock.now() and p.reason is DefaultReason.LOADING
    assert p.explanation.startswith("the model is loading into a pool process: about 500 ms")
    cold.sched.cold.last_s = None  # unmeasured: held, then the default at its deadline
    cold.sched.cold.woke_at = None
    held = cold.query(2.0)
    assert held.at is None
    cold.f.clock.advance(cold.app.slo_s)
    p = held.one()
    assert p.reason is DefaultReason.LOADING and p.output == -1
    assert "model m:1 is not loaded in a pool process" in p.explanation

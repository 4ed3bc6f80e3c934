"""ModelScheduler with a fake clock and a fake transport: dispatch, batching, expiry, replica
loss, model errors, admission, drains. The scheduler arms its timer on the fake clock, so
``clock.advance`` fires it: nothing here waits for real time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from clipper.batching.queue import Task
from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import Lookup, PredictionCache
from clipper.clock import FakeClock
from clipper.config import BatchingConfig
from clipper.errors import (
    DeadlineExceeded,
    ModelError,
    ModelOutputError,
    OverloadedError,
    ReplicaError,
    WireError,
)
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.registry import ModelVersion
from clipper.rpc.link import Connection
from clipper.rpc.outputs import OutputRefused

SLO_S = 1.0


class FakeTransport:
    """Records every batch (the replica it went to, its message id and payloads); message ids
    count up from 100."""

    def __init__(self) -> None:
        self.sent: list[tuple[Replica, int, list[bytes]]] = []
        self.traceparents: list[str | None] = []  # each batch's trace context, in order
        self.fail_next = False
        self.batch_sent = asyncio.Event()
        self._ids = iter(range(100, 10_000))

    def send_batch(
        self,
        link: Connection[Replica],
        itype: InputType,
        payloads: list[bytes],
        traceparent: str | None = None,
    ) -> int:
        if self.fail_next:
            self.fail_next = False
            raise WireError("the replica's send queue is full")
        assert link.peer is not None and itype is InputType.BYTES
        msg_id = next(self._ids)
        self.sent.append((link.peer, msg_id, list(payloads)))
        self.traceparents.append(traceparent)
        self.batch_sent.set()
        return msg_id

    def collect(self) -> None:
        """Nothing arrives unread here: the tests answer batches themselves."""

    def payloads(self, i: int) -> list[bytes]:
        return self.sent[i][2]


class Results:
    """Waiters that record what each task was answered with."""

    def __init__(self) -> None:
        self.calls: dict[bytes, list[tuple[object, BaseException | None]]] = {}

    def waiter(self, payload: bytes) -> Any:
        def done(value: object, err: BaseException | None) -> None:
            self.calls.setdefault(payload, []).append((value, err))

        return done

    def value(self, payload: bytes) -> object:
        [(value, err)] = self.calls[payload]
        assert err is None, err
        return value

    def error(self, payload: bytes) -> BaseException:
        [(value, err)] = self.calls[payload]
        assert value is None
        assert err is not None
        return err


class Harness:
    def __init__(self, batching: BatchingConfig, queue_capacity: int = 100) -> None:
        self.clock = FakeClock()
        self.transport = FakeTransport()
        self.cache = PredictionCache(1 << 20)
        self.metrics = Metrics()
        self.results = Results()
        mv = ModelVersion(name="m", version="1", input_type=InputType.BYTES, batching=batching)
        self.sched = ModelScheduler(
            mv,
            slo_s=SLO_S,
            cache=self.cache,
            clock=self.clock,
            transport=self.transport,
            metrics=self.metrics,
            queue_capacity=queue_capacity,
        )
        self._ids = iter(range(1000))

    def replica(self) -> Replica:
        identity = f"r{len(self.sched.replicas)}".encode()
        r = Replica(Connection(identity, next(self._ids), True, 3.0, 0.0))
        self.sched.add_replica(r)
        return r

    def task(self, payload: bytes, slo_s: float = SLO_S) -> Task:
        now = self.clock.now()
        return Task(payload, now + slo_s, now, None, self.results.waiter(payload))

    def submit(self, *payloads: bytes, slo_s: float = SLO_S, pump: bool = True) -> None:
        for p in payloads:
            self.sched.submit(self.task(p, slo_s))
        if pump:
            self.sched.pump()

    def respond(
        self, i: int, outputs: list[object] | None = None, error: str | None = None
    ) -> None:
        """Answer the i-th batch sent: by default each payload's output is its upper case."""
        replica, msg_id, payloads = self.transport.sent[i]
        if outputs is None and error is None:
            outputs = [p.upper() for p in payloads]
        self.sched.on_response(replica, msg_id, outputs, error, 10)


@pytest.fixture
def harness_factory() -> Iterator[Any]:
    made: list[Harness] = []

    def make(**kwargs: Any) -> Harness:
        h = Harness(**kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.sched.close(ReplicaError("test over"))


def fixed(size: int, **kwargs: Any) -> BatchingConfig:
    return BatchingConfig(controller="fixed", max_batch_size=size, max_wait_micros=0, **kwargs)


async def test_one_batch_in_flight_per_replica_until_it_answers(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(2))
    r = h.replica()
    h.submit(b"a", b"b", b"c", b"d", b"e")
    assert len(h.transport.sent) == 1  # in_flight=1: the rest wait for the answer
    assert h.transport.payloads(0) == [b"a", b"b"]
    assert len(r.in_flight) == 1
    h.sched.pump()
    assert len(h.transport.sent) == 1

    h.respond(0)
    assert h.results.value(b"a") == b"A"
    assert h.results.value(b"b") == b"B"
    assert h.transport.payloads(1) == [b"c", b"d"]  # the answer freed the replica
    h.respond(1)
    assert h.transport.payloads(2) == [b"e"]
    h.respond(2)
    assert h.results.value(b"e") == b"E"
    assert len(h.sched.queue) == 0
    assert r.in_flight == {}


async def test_in_flight_setting_allows_pipelining(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1, in_flight=2))
    r = h.replica()
    h.submit(b"a", b"b", b"c")
    assert [h.transport.payloads(i) for i in range(2)] == [[b"a"], [b"b"]]
    assert len(r.in_flight) == 2
    h.respond(1)  # answers may come back out of order
    assert h.transport.payloads(2) == [b"c"]
    assert h.results.value(b"b") == b"B"
    assert b"a" not in h.results.calls


async def test_batch_size_is_capped_by_the_controller(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(4))
    h.replica()
    payloads = [f"q{i}".encode() for i in range(10)]
    h.submit(*payloads)
    h.respond(0)
    h.respond(1)
    h.respond(2)
    sizes = [len(payloads) for _, _, payloads in h.transport.sent]
    assert sizes == [4, 4, 2]
    # Oldest first (all have the same deadline): arrival order is kept across batches.
    assert [p for i in range(3) for p in h.transport.payloads(i)] == payloads
    assert [h.results.value(p) for p in payloads] == [p.upper() for p in payloads]


def aimd_at(h: Harness, cap: int) -> Replica:
    """A replica whose AIMD cap is ``cap``, its batches measured at 10 ms + 1 ms an input."""
    r = h.replica()
    assert r.controller is not None
    for _ in range(4):
        for n in (1, 2):  # not full batches: the cap stays
            r.controller.observe(n, 0.010 + 0.001 * n)
    assert r.controller.max_batch_size() == cap
    return r


AIMD_4 = BatchingConfig(max_wait_micros=0, params={"initial": 4, "slow_start": False})


async def test_a_queue_past_the_cap_goes_whole_when_its_deadlines_allow(
    harness_factory: Any,
) -> None:
    """Ten queued behind a cap of 4: as 4 + 4 + 2 the last ones wait out two batches first
    and pay the 10 ms per batch three times; one batch of 10 (20 ms) meets every deadline."""
    h = harness_factory(batching=AIMD_4)
    aimd_at(h, 4)
    payloads = [f"q{i}".encode() for i in range(10)]
    h.submit(*payloads, slo_s=0.1)
    assert [len(p) for _, _, p in h.transport.sent] == [10]
    h.respond(0)
    assert [h.results.value(p) for p in payloads] == [p.upper() for p in payloads]


async def test_a_queue_past_the_cap_keeps_the_cap_when_the_larger_batch_would_be_late(
    harness_factory: Any,
) -> None:
    h = harness_factory(batching=AIMD_4)
    aimd_at(h, 4)
    h.submit(*[f"q{i}".encode() for i in range(10)], slo_s=0.018)  # a batch of 10: 20 ms
    assert [len(p) for _, _, p in h.transport.sent] == [4]
    # Without the extension (what it changes, for benchmarks) the cap holds at any deadline.
    g = harness_factory(batching=AIMD_4)
    aimd_at(g, 4)
    g.sched.extend = False
    g.submit(*[f"q{i}".encode() for i in range(10)], slo_s=0.1)
    assert [len(p) for _, _, p in g.transport.sent] == [4]


async def test_a_burst_is_priced_at_the_batch_its_queue_forms_not_at_the_cap(
    harness_factory: Any, trust_one_batch: None
) -> None:
    """The capacity is measured at batch boundaries. After an idle spell or a flood that
    shrank the cap to 4, a burst of clients arrives at once: priced at batches of 4 (10 ms +
    1 ms an input: 286 inputs/s) a 30 ms deadline admits 8; the queue goes out as one batch
    when its deadlines allow, and a batch of 20 takes 30 ms: 20 are admitted."""
    h = harness_factory(batching=AIMD_4)
    aimd_at(h, 4)
    h.submit(b"first")
    h.clock.advance(0.011)
    h.respond(0)
    admitted = 0
    for k in range(40):
        try:
            h.sched.submit(h.task(b"q%d" % k, slo_s=0.0305))
        except OverloadedError:
            break
        admitted += 1
    assert admitted == 20
    # The frontend's own admission (and a pipeline's budget) reads the same price: the next
    # input would ride a batch of 21 (31 ms), not wait out 21 inputs at 286/s (73 ms).
    assert h.sched.expected_latency_s() == pytest.approx(0.031)
    h.sched.pump()
    assert [len(p) for _, _, p in h.transport.sent[1:]] == [20]


async def test_max_batch_size_bounds_the_whole_queue_batch(harness_factory: Any) -> None:
    h = harness_factory(
        batching=BatchingConfig(
            max_wait_micros=0, max_batch_size=6, params={"initial": 4, "slow_start": False}
        )
    )
    aimd_at(h, 4)
    h.submit(*[f"q{i}".encode() for i in range(10)], slo_s=0.1)
    assert [len(p) for _, _, p in h.transport.sent] == [6]


async def test_two_replicas_share_the_queue(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(2))
    r0, r1 = h.replica(), h.replica()
    h.submit(b"a", b"b", b"c", b"d", b"e")
    assert [(rep, len(p)) for rep, _, p in h.transport.sent] == [(r0, 2), (r1, 2)]
    h.respond(1)
    assert h.transport.sent[2][0] is r1
    assert h.transport.payloads(2) == [b"e"]


async def test_delayed_batching_waits_for_company_then_dispatches_when_full(
    harness_factory: Any,
) -> None:
    wait_s = 0.005
    h = harness_factory(
        batching=BatchingConfig(controller="fixed", max_batch_size=4, max_wait_micros=5000)
    )
    h.replica()
    h.submit(b"a", b"b")
    assert h.transport.sent == []  # a partial batch waits up to max_wait
    h.clock.advance(wait_s / 2)
    h.submit(b"c")
    assert h.transport.sent == []
    h.submit(b"d")  # full: no reason to wait any longer
    assert h.transport.payloads(0) == [b"a", b"b", b"c", b"d"]


async def test_delayed_batching_sends_a_partial_batch_when_the_wait_is_over(
    harness_factory: Any,
) -> None:
    h = harness_factory(
        batching=BatchingConfig(controller="fixed", max_batch_size=4, max_wait_micros=5000)
    )
    h.replica()
    h.submit(b"a")
    assert h.transport.sent == []
    h.clock.advance(0.004)
    h.sched.pump()
    assert h.transport.sent == []  # 4 ms of 5: still waiting
    h.clock.advance(0.001)
    # No pump from the test: the scheduler's own timer fires within advance().
    assert h.transport.payloads(0) == [b"a"]


async def test_delayed_batching_never_waits_past_the_deadline(harness_factory: Any) -> None:
    h = harness_factory(
        batching=BatchingConfig(controller="fixed", max_batch_size=4, max_wait_micros=100_000)
    )
    r = h.replica()
    # Teach the controller that a batch takes 40 ms.
    h.submit(b"warm", b"up", b"x", b"y")
    h.clock.advance(0.04)
    h.respond(0)
    assert r.in_flight == {}
    # 50 ms to the deadline, 40 ms of work: it must go within 10 ms, not after 100 ms.
    h.submit(b"late", slo_s=0.05)
    assert len(h.transport.sent) == 1
    h.clock.advance(0.011)
    h.sched.pump()
    assert len(h.transport.sent) == 2
    assert h.transport.payloads(1) == [b"late"]


async def test_expired_tasks_are_dropped_before_sending(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"a", b"b", slo_s=0.1)
    assert h.transport.payloads(0) == [b"a"]
    h.clock.advance(0.2)  # b's deadline passes while a is in flight
    h.respond(0)  # the answer pumps: b is expired, not sent
    assert h.results.value(b"a") == b"A"
    err = h.results.error(b"b")
    assert isinstance(err, DeadlineExceeded)
    assert len(h.transport.sent) == 1
    assert len(h.sched.queue) == 0


async def test_expired_tasks_are_dropped_without_any_replica(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1))
    h.submit(b"early", slo_s=0.1)
    h.submit(b"later", slo_s=0.5)
    h.clock.advance(0.2)
    h.sched.pump()
    assert isinstance(h.results.error(b"early"), DeadlineExceeded)
    assert b"later" not in h.results.calls  # still within its deadline
    assert len(h.sched.queue) == 1


async def test_removed_replica_requeues_its_batches_to_the_other(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(2))
    r0 = h.replica()
    h.submit(b"a", b"b")
    assert h.transport.sent[0][0] is r0
    [(sent, _, _)] = r0.in_flight.values()
    r1 = h.replica()
    assert len(h.transport.sent) == 1  # nothing else to send

    h.sched.remove_replica(r0)
    assert h.sched.replicas == [r1]
    assert r0.in_flight == {}
    assert h.transport.sent[1][0] is r1
    assert h.transport.payloads(1) == [b"a", b"b"]
    [(resent, _, _)] = r1.in_flight.values()
    assert resent == sent  # the same tasks, deadlines kept

    h.respond(0, outputs=[b"stale", b"stale"])  # the dead replica's late answer is ignored
    assert h.results.calls == {}
    h.respond(1)
    assert h.results.value(b"a") == b"A"
    assert h.results.value(b"b") == b"B"


async def test_failed_send_requeues_and_drops_the_replica(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(2))
    r0 = h.replica()
    r1 = h.replica()
    h.transport.fail_next = True
    h.submit(b"a")
    assert r0 not in h.sched.replicas
    assert h.sched.replicas == [r1]
    # The batch whose send failed is not lost.
    h.sched.pump()
    assert h.transport.sent[-1][0] is r1
    assert h.transport.payloads(len(h.transport.sent) - 1) == [b"a"]


async def test_model_error_reaches_every_task_of_the_batch(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(3))
    h.replica()
    h.submit(b"a", b"b", b"c")
    h.respond(0, error="ValueError: boom")
    for p in (b"a", b"b", b"c"):
        err = h.results.error(p)
        assert isinstance(err, ModelError)
        assert str(err) == "ValueError: boom"
    sample = {"model": "m", "version": "1"}
    assert h.metrics.registry.get_sample_value("clipper_model_errors_total", sample) == 1


async def test_a_refused_output_is_the_model_error_of_its_own_input(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(3))
    h.replica()
    h.submit(b"a", b"b", b"c")
    why = "output contains NaN (JSON has no such number)"
    h.respond(0, outputs=[b"A", OutputRefused(why), OutputRefused(why)])
    assert h.results.value(b"a") == b"A"
    for p in (b"b", b"c"):
        err = h.results.error(p)
        assert isinstance(err, ModelOutputError) and str(err) == why
    # One failed batch, as for a model that raised.
    sample = {"model": "m", "version": "1"}
    assert h.metrics.registry.get_sample_value("clipper_model_errors_total", sample) == 1


async def test_wrong_number_of_outputs_is_a_model_error(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(2))
    h.replica()
    h.submit(b"a", b"b")
    h.respond(0, outputs=[b"only one"])
    for p in (b"a", b"b"):
        err = h.results.error(p)
        assert isinstance(err, ModelError)
        assert "1 outputs for 2 inputs" in str(err)


async def test_results_go_through_the_cache(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(2))
    h.replica()
    now = h.clock.now()
    got: list[tuple[object, BaseException | None]] = []
    key = ("m", "1", b"x")
    status, _ = h.cache.get_or_join(key, lambda v, e: got.append((v, e)))
    assert status is Lookup.MISS
    status, _ = h.cache.get_or_join(key, lambda v, e: got.append((v, e)))
    assert status is Lookup.JOINED
    h.sched.submit(Task(b"x", now + SLO_S, now, key, None))
    h.sched.pump()
    h.respond(0)
    assert got == [(b"X", None), (b"X", None)]
    assert h.cache.peek(key) == b"X"

    # Errors reach the joined waiters and are not cached.
    key2 = ("m", "1", b"y")
    failed: list[BaseException | None] = []
    h.cache.get_or_join(key2, lambda v, e: failed.append(e))
    h.sched.submit(Task(b"y", now + SLO_S, now, key2, None))
    h.sched.pump()
    h.respond(1, error="boom")
    assert len(failed) == 1
    assert isinstance(failed[0], ModelError)
    assert h.cache.peek(key2) is None


async def test_answers_of_a_replica_removed_as_failed_are_not_served_from_the_cache(
    harness_factory: Any,
) -> None:
    h = harness_factory(batching=fixed(1))
    r0 = h.replica()
    now = h.clock.now()
    key = ("m", "1", b"x")
    h.cache.get_or_join(key, noop)
    h.sched.submit(Task(b"x", now + SLO_S, now, key, None))
    h.sched.pump()
    h.respond(0)
    assert h.cache.peek(key) == b"X"
    h.sched.remove_replica(r0)  # silent, exited or unreachable: not drained
    assert h.cache.peek(key) is None
    status, _ = h.cache.get_or_join(key, noop)
    assert status is Lookup.MISS  # computed again by whoever replaces it


async def test_answers_of_a_drained_replica_stay_cached(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1))
    r0 = h.replica()
    now = h.clock.now()
    key = ("m", "1", b"x")
    h.cache.get_or_join(key, noop)
    h.sched.submit(Task(b"x", now + SLO_S, now, key, None))
    h.sched.pump()
    h.respond(0)
    r0.draining = True  # stopped on purpose (scale-down, version switch)
    h.sched.remove_replica(r0)
    assert h.cache.peek(key) == b"X"


def noop(value: object, error: BaseException | None) -> None:
    pass


async def test_submit_raises_overloaded_when_the_queue_is_full(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1), queue_capacity=2)
    h.submit(b"a", b"b", pump=False)
    with pytest.raises(OverloadedError, match=r"queue is full \(2 queries\)"):
        h.sched.submit(h.task(b"c"))
    assert len(h.sched.queue) == 2


async def test_submit_sheds_what_the_measured_capacity_cannot_serve_in_time(
    harness_factory: Any,
    trust_one_batch: None,
) -> None:
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"a")
    h.clock.advance(0.1)  # one input per 100 ms
    h.respond(0)
    h.submit(b"fits", slo_s=0.15, pump=False)  # 100 ms of work ahead of it: fits
    with pytest.raises(OverloadedError, match="more than the query's latency SLO allows"):
        h.sched.submit(h.task(b"too-late", slo_s=0.15))  # 200 ms: cannot make it


async def test_close_answers_queued_and_in_flight_tasks(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"a", b"b")
    reason = ReplicaError("shutting down")
    h.sched.close(reason)
    assert h.results.error(b"a") is reason  # was in flight
    assert h.results.error(b"b") is reason  # was queued
    assert h.sched.replicas == []
    h.submit(b"c")  # closed: nothing is sent any more
    assert len(h.transport.sent) == 1


async def test_submit_counts_the_running_batch_when_every_replica_is_busy(
    harness_factory: Any,
    trust_one_batch: None,
) -> None:
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"a")
    h.clock.advance(0.1)  # one input per 100 ms
    h.respond(0)
    h.submit(b"busy")  # goes out at once: the only replica is now busy for ~100 ms
    # 100 ms for its own batch fits a 150 ms SLO, but not after the 100 ms running ahead of it
    with pytest.raises(OverloadedError, match=r"about 200\.0 ms of work"):
        h.sched.submit(h.task(b"behind", slo_s=0.15))


async def test_a_free_replica_and_an_empty_queue_always_admit(
    harness_factory: Any, trust_one_batch: None
) -> None:
    # A cold first batch made the model look slower than any SLO; shedding everything from
    # then on would never measure it again.
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"cold")
    h.clock.advance(0.5)
    h.respond(0)
    h.sched.submit(h.task(b"next", slo_s=0.15))  # admitted: measured again
    assert len(h.sched.queue) == 1


async def test_a_fresh_models_first_burst_is_not_priced_from_one_cold_batch(
    harness_factory: Any,
) -> None:
    """A cold first batch of one (50 ms), extrapolated to the 300 queries queued behind it,
    priced them at 15 s and shed the rest of a fresh model's first burst under a 10 s SLO.
    Admission trusts the measurements after a few batches."""
    h = harness_factory(batching=BatchingConfig(max_wait_micros=1000), queue_capacity=5000)
    h.replica()
    h.submit(b"first", slo_s=10.0)
    for k in range(300):
        h.sched.submit(h.task(b"q%d" % k, slo_s=10.0))
    h.clock._t += 0.05
    h.respond(0)
    for k in range(700):
        h.sched.submit(h.task(b"r%d" % k, slo_s=10.0))  # none shed
    assert len(h.sched.queue) + sum(len(t) for _, _, t in h.transport.sent) == 1001


async def test_a_second_of_shedding_nearly_everything_starts_a_probe_of_one_slo(
    harness_factory: Any,
    trust_one_batch: None,
) -> None:
    """Batches that look slow only because the frontend's loop is saturated make admission
    shed everything, and then nothing shows the model recovered: after a second with at
    least 98% of 100+ queries shed, admission lets every query in for one SLO."""
    h = harness_factory(batching=fixed(1), queue_capacity=1000)
    h.replica()
    h.submit(b"slow")
    h.clock.advance(0.3)  # one input per 300 ms: over any 150 ms deadline once busy
    h.respond(0)
    h.submit(b"busy")
    started = h.clock.now()
    for k in range(400):  # all priced late, 9 ms apart
        try:
            h.sched.submit(h.task(b"q%d" % k, slo_s=0.15))
        except OverloadedError:
            h.clock._t += 0.009  # no timers: the replica stays busy, the queue empty
            continue
        break
    assert h.sched.probes == 1
    assert h.clock.now() - started >= 1.0  # a full second of shedding came first
    assert len(h.sched.queue) == 1  # the query that started the probe
    for k in range(3):  # and for one SLO (1 s here) everything is admitted
        h.sched.submit(h.task(b"p%d" % k, slo_s=0.15))
    assert len(h.sched.queue) == 4
    h.clock._t += SLO_S
    with pytest.raises(OverloadedError):  # the probe is over: priced as before
        h.sched.submit(h.task(b"after", slo_s=0.15))
    assert h.sched.probes == 1


async def test_no_probe_while_admission_still_admits_a_share(
    harness_factory: Any, trust_one_batch: None
) -> None:
    """Ordinary overload (half the queries shed) is priced, never probed."""
    h = harness_factory(batching=fixed(1), queue_capacity=1000)
    h.replica()
    h.submit(b"slow")
    h.clock.advance(0.3)
    h.respond(0)
    h.submit(b"busy")
    for k in range(300):
        with contextlib.suppress(OverloadedError):
            h.sched.submit(h.task(b"q%d" % k, slo_s=0.15 if k % 2 else 100.0))
        h.clock._t += 0.01
    assert h.sched.probes == 0


# -- timers on the fake clock: batch wait, deadlines, drains --------------------------------


def sent_at(r: Replica) -> list[float]:
    """When each batch in flight on ``r`` was sent (the scheduler's clock at dispatch)."""
    return [at for _, at, _ in r.in_flight.values()]


def test_a_partial_batch_goes_exactly_when_the_wait_elapses(harness_factory: Any) -> None:
    h = harness_factory(
        batching=BatchingConfig(controller="fixed", max_batch_size=4, max_wait_micros=5000)
    )
    r = h.replica()
    t0 = h.clock.now()
    h.submit(b"a")
    h.clock.advance(0.0049)
    h.submit(b"b")  # company does not restart the wait: it counts from the oldest
    h.clock.advance(0.00009)
    assert h.transport.sent == []
    h.clock.advance(0.00001 + 0.001)
    assert h.transport.payloads(0) == [b"a", b"b"]
    assert sent_at(r) == [pytest.approx(t0 + 0.005, abs=1e-9)]  # not at the end of advance
    assert h.clock.pending() == 0


def test_a_full_batch_goes_before_the_wait_elapses(harness_factory: Any) -> None:
    h = harness_factory(
        batching=BatchingConfig(controller="fixed", max_batch_size=3, max_wait_micros=5000)
    )
    r = h.replica()
    h.submit(b"a", b"b")
    h.clock.advance(0.001)
    h.submit(b"c")
    assert sent_at(r) == [h.clock.now()]  # full at 1 ms: sent then, not at 5 ms
    h.clock.advance(0.01)
    assert len(h.transport.sent) == 1  # the wait's timer did not send anything else


def test_the_batch_wait_never_runs_past_the_earliest_deadline(harness_factory: Any) -> None:
    h = harness_factory(
        batching=BatchingConfig(controller="fixed", max_batch_size=4, max_wait_micros=100_000)
    )
    r = h.replica()
    h.submit(b"warm", b"up", b"x", b"y")  # a full batch: teaches the controller 40 ms
    h.clock.advance(0.04)
    h.respond(0)
    c = r.controller
    assert c is not None
    expected = c.expected_latency(1)
    assert 0 < expected < 0.05
    deadline = h.clock.now() + 0.05
    h.submit(b"late", slo_s=0.05)
    assert len(h.transport.sent) == 1
    h.clock.advance(0.1)  # the whole 100 ms wait: it must have gone long before
    assert h.transport.payloads(1) == [b"late"]
    # Sent when what is left before the deadline is just the batch's expected latency.
    assert sent_at(r) == [pytest.approx(deadline - expected, abs=1e-9)]


def test_a_query_expired_while_queued_is_dropped_at_its_deadline_unsent(
    harness_factory: Any,
) -> None:
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"a", slo_s=1.0)
    h.submit(b"b", slo_s=0.1)  # queued behind a: the only replica is busy
    assert h.transport.payloads(0) == [b"a"]
    h.clock.advance(0.0999)
    assert b"b" not in h.results.calls
    h.clock.advance(0.0001)  # b's deadline: the scheduler's own timer expires it
    assert isinstance(h.results.error(b"b"), DeadlineExceeded)
    assert len(h.sched.queue) == 0
    h.respond(0)
    assert h.results.value(b"a") == b"A"
    assert [p for i in range(len(h.transport.sent)) for p in h.transport.payloads(i)] == [b"a"]


def test_a_drain_completes_when_the_in_flight_batches_come_back(harness_factory: Any) -> None:
    h = harness_factory(batching=fixed(1, in_flight=2))
    r0, r1 = h.replica(), h.replica()
    h.submit(b"a", b"b")
    assert [rep for rep, _, _ in h.transport.sent] == [r0, r1]
    h.submit(b"c")
    assert h.transport.sent[2][0] is r0  # pipelined on r0 too
    drained: list[int] = []
    h.sched.on_drained = lambda: drained.append(len(r0.in_flight))
    r0.draining = True
    r0.drained = asyncio.Event()
    h.submit(b"d")
    assert h.transport.sent[3][0] is r1  # a draining replica gets no new batch
    h.respond(0)
    assert drained == [1] and not r0.drained.is_set()  # one of r0's two is still out
    h.respond(2)
    assert drained == [1, 0] and r0.drained.is_set()
    assert [h.results.value(p) for p in (b"a", b"c")] == [b"A", b"C"]
    assert h.clock.pending() == 0  # nothing left armed that a drain would wait on


def test_expiries_count_as_demand_only_while_every_replica_was_busy(
    harness_factory: Any,
) -> None:
    # What the autoscaler samples: an input that expired waiting for a busy replica is the
    # model's queue (``late``); one that expired while a replica sat free is the loop's delay
    # (``stalled``): more replicas would not have taken it sooner.
    h = harness_factory(batching=fixed(1))
    h.replica()
    h.submit(b"a", b"b", slo_s=0.1)  # b waits behind a on the only replica
    h.clock.advance(0.2)
    h.respond(0)  # the answer pumps: b expired while the replica was busy
    assert isinstance(h.results.error(b"b"), DeadlineExceeded)
    assert (h.sched.late, h.sched.stalled, h.sched.overran) == (1, 0, 1)  # and a overran
    h.clock.advance(1.0)  # the replica has been free for a second
    h.submit(b"c", slo_s=0.1, pump=False)  # queued, but the loop does not get to pump it
    h.clock.advance(0.2)
    h.sched.pump()
    assert isinstance(h.results.error(b"c"), DeadlineExceeded)
    assert (h.sched.late, h.sched.stalled, h.sched.overran) == (1, 1, 1)
    assert h.sched.shed == 0 and h.sched.offered == 3


def test_late_answers_count_as_demand_only_when_the_wait_for_a_busy_replica_made_them_late(
    harness_factory: Any,
) -> None:
    h = harness_factory(batching=fixed(1))
    h.replica()
    # The round trip alone overran: sent at once to a free replica, answered after its SLO.
    h.submit(b"slow", slo_s=0.1)
    h.clock.advance(0.15)
    h.respond(0)
    assert (h.sched.late, h.sched.overran) == (0, 1)
    # Queued behind a busy replica for 80 ms of its 100: answered 30 ms later, past the
    # deadline, which it would have made without the wait: the queue made it late.
    h.submit(b"first", slo_s=1.0)
    h.submit(b"queued", slo_s=0.1)
    h.clock.advance(0.08)
    h.respond(1)  # frees the replica: "queued" goes now
    assert h.transport.payloads(2) == [b"queued"]
    h.clock.advance(0.03)
    h.respond(2)
    assert h.results.value(b"queued") == b"QUEUED"
    assert (h.sched.late, h.sched.overran) == (1, 1)


async def test_batches_other_frontends_queued_on_a_shared_replica_are_priced(
    harness_factory: Any, trust_one_batch: None
) -> None:
    """A shared replica runs the batches other frontends queued on it before ours: admission
    adds them (its latest queue report) at the batch latency measured here, even with an
    empty queue here and the replica free of our batches."""
    h = harness_factory(batching=fixed(1))
    r = h.replica()
    h.submit(b"a")
    h.clock.advance(0.1)  # one batch per 100 ms
    h.respond(0)
    assert h.sched.expected_latency_s() == 0.0  # idle here, nothing reported elsewhere
    r.link.queued_elsewhere = 3  # three batches of other frontends ahead: ~300 ms
    assert h.sched.expected_latency_s() == pytest.approx(0.4)
    with pytest.raises(OverloadedError, match=r"about 400\.0 ms of work"):
        h.sched.submit(h.task(b"behind", slo_s=0.35))
    h.sched.submit(h.task(b"fits", slo_s=0.45))
    assert len(h.sched.queue) == 1
    # A second replica with nothing queued elsewhere takes our batches at once.
    h.replica()
    assert h.sched.expected_latency_s() < 0.4


async def test_a_pipelined_batch_is_measured_from_when_the_one_before_came_back(
    harness_factory: Any,
) -> None:
    # A container runs its batches one after another: the second of two in flight waited for
    # the first, and its round trip is not what a batch costs (it halved the capacity and
    # kept AIMD's cap at 1-3 under load).
    h = harness_factory(batching=fixed(1, in_flight=2))
    r = h.replica()
    c = r.controller
    assert c is not None
    h.submit(b"a", b"b")
    assert len(r.in_flight) == 2
    h.clock.advance(0.010)
    h.respond(0)
    h.clock.advance(0.010)
    h.respond(1)  # a round trip of 20 ms, of which 10 ms behind the first
    assert c.typical_latency(1) == pytest.approx(0.010)


async def test_a_free_pipelined_slot_is_priced_behind_the_batch_running(
    harness_factory: Any,
) -> None:
    h = harness_factory(batching=fixed(1, in_flight=2))
    r = h.replica()
    for i in range(8):  # the controller learns that a batch takes 10 ms
        h.submit(b"w%d" % i)
        h.clock.advance(0.010)
        h.respond(i)
    assert h.sched.expected_latency_s() == 0.0  # idle: admits at once
    h.submit(b"x")
    assert len(r.in_flight) == 1  # a slot is free, but the container is busy with x
    h.clock.advance(0.004)
    # The next input waits for the rest of x (6 ms), then takes its own batch.
    assert h.sched.expected_latency_s() > 0.006

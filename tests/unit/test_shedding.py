"""Answer or shed under saturation, on a fake clock: the loop-lag monitor measures how late its
timer fires; the query processor counts from the caller's arrival time ``t0`` and sheds at once
what a backlog has made unable to meet its deadline (the default output with the reason, or
503 for an application that asked for rejection)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clipper.clock import FakeClock, _FakeTimer
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.single import LAG_FLOOR_S
from tests.unit.test_deadlines import Answers, Frontend, frontends, single_app  # noqa: F401

BODY = b'{"input": [1.0]}'


class StalledClock(FakeClock):
    """A fake clock whose timers fire ``stall`` seconds after they are due, like a loop that
    is busy for that long when the timer comes up."""

    def __init__(self, stall: float) -> None:
        super().__init__()
        self.stall = stall

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> _FakeTimer:
        return super().call_later(delay_s + self.stall, callback, *args)


def test_the_monitor_measures_how_late_its_timer_fires() -> None:
    clock = StalledClock(stall=0.0)
    mon = LoopLagMonitor(clock, interval_s=0.005, decay=0.5, cpu_time=clock.now)
    mon.start()
    clock.advance(0.05)
    assert mon.samples == 10
    assert mon.lag_s == 0.0
    clock.stall = 0.008
    clock.advance(0.02)
    assert mon.lag_s == pytest.approx(0.008)  # a stall shows at once
    clock.stall = 0.0
    clock.advance(0.017)  # the stalled timer in flight, then one on time
    assert mon.lag_s == pytest.approx(0.004)  # and fades by half per timely sample
    mon.stop()
    assert not mon.running and mon.lag_s == 0.0
    assert clock.pending() == 0


def test_a_late_timer_is_a_backlog_only_for_the_cpu_the_loop_spent() -> None:
    """Descheduled (another program had the core) the timer fires late, but the loop spent
    no CPU: no backlog, nothing to shed for. Busy with its own work it spent the CPU: the
    lateness is a backlog."""
    clock = StalledClock(stall=0.0)
    cpu = [0.0]  # the loop thread's CPU clock, advanced by hand
    mon = LoopLagMonitor(clock, interval_s=0.005, decay=0.5, cpu_time=lambda: cpu[0])
    mon.start()
    clock.stall = 0.012  # every timer 12 ms late, and the thread ran 1 ms of each interval
    for _ in range(4):
        cpu[0] += 0.001
        clock.advance(0.017)
    assert mon.lag_s == pytest.approx(0.012)
    assert mon.backlog_s == pytest.approx(0.001)  # under LAG_FLOOR_S: no shed
    for _ in range(4):  # now the loop ran the whole interval: its own work made it late
        cpu[0] += 0.017
        clock.advance(0.017)
    assert mon.backlog_s == pytest.approx(0.012)
    mon.stop()
    assert mon.backlog_s == 0.0


def test_a_collector_pass_is_no_backlog() -> None:
    """A garbage-collector pass stopped the loop (its thread spent the CPU), but it is a
    one-off stall, over when the timer fires: the backlog counts only the rest."""
    clock = StalledClock(stall=0.015)  # every timer 15 ms late
    cpu = [0.0]
    collected = [0.0]  # seconds of collector passes so far
    mon = LoopLagMonitor(
        clock, interval_s=0.005, decay=0.5, cpu_time=lambda: cpu[0], collector=lambda: collected[0]
    )
    mon.start()
    cpu[0] += 0.020  # the loop ran all along: 5 ms of work and a 15 ms collector pass
    collected[0] += 0.015
    clock.advance(0.020)
    assert mon.lag_s == pytest.approx(0.015)
    assert mon.backlog_s == pytest.approx(0.0)  # the pass was the whole lateness
    cpu[0] += 0.020  # the next interval: 15 ms late from its own work, and a 3 ms pass
    collected[0] += 0.003
    clock.advance(0.020)
    assert mon.backlog_s == pytest.approx(0.012)
    mon.stop()


def test_collector_passes_are_timed_into_the_histogram() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from clipper.query.collector import CollectorPauses

    h = Histogram("gc_pause", "test", ["generation"], registry=CollectorRegistry())
    ticks = iter([1.0, 1.004, 2.0, 2.0005])  # two passes: 4 ms and 0.5 ms
    # Not started: a real pass during the test would take the fake timer's ticks.
    watch = CollectorPauses(h, timer=lambda: next(ticks))
    watch._callback("start", {"generation": 2})
    watch._callback("stop", {"generation": 2})
    watch._callback("start", {"generation": 0})
    watch._callback("stop", {"generation": 0})
    assert watch.passes == 2
    assert watch.total_s == pytest.approx(0.0045)
    assert watch.longest_s == pytest.approx(0.004)
    assert h.labels(generation="2")._sum.get() == pytest.approx(0.004)


def test_the_collector_watch_sees_a_real_pass() -> None:
    import gc

    from clipper.query.collector import CollectorPauses

    watch = CollectorPauses()
    watch.start()
    watch.start()  # once only, however often started
    assert gc.callbacks.count(watch._callback) == 1
    try:
        gc.collect()
    finally:
        watch.stop()
    assert watch.passes >= 1
    assert watch.total_s > 0.0
    assert watch._callback not in gc.callbacks and not watch.running


def test_a_descheduled_loop_sheds_nothing(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    mon = LoopLagMonitor(f.clock)
    mon.lag_s, mon.backlog_s = 0.019, 0.0  # very late, none of it the loop's own work
    f.lag(mon)
    answers = Answers(f.clock)
    f.predict("app", BODY, answers)
    assert len(f.transport.sent) == 1  # queued, not shed
    f.answer("m", [3.0])
    _, doc = answers.one()
    assert doc["default"] is False


def lagging(f: Frontend, lag_s: float) -> LoopLagMonitor:
    mon = LoopLagMonitor(f.clock)
    mon.lag_s = mon.backlog_s = lag_s  # as if measured, all of it the loop's own work
    f.lag(mon)
    return mon


def test_a_loop_within_noise_queues_as_usual(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    lagging(f, LAG_FLOOR_S / 2)
    answers = Answers(f.clock)
    f.predict("app", BODY, answers)
    assert len(f.transport.sent) == 1
    f.answer("m", [7.0])
    _, doc = answers.one()
    assert doc == {"query_id": 0, "output": 7.0, "default": False}


def test_a_loop_too_far_behind_sheds_at_once_with_the_reason(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    app = single_app()  # 20 ms SLO, 2 ms answer margin
    f = Frontend(app, ["m"])
    frontends.append(f)
    lagging(f, 0.019)
    answers = Answers(f.clock)
    f.predict("app", BODY, answers)
    at, doc = answers.one()
    assert at == f.clock.now()  # answered now, not at the deadline
    assert f.transport.sent == []  # and never queued
    assert doc["default"] is True
    assert (
        "frontend is behind (event loop 19.0 ms behind on its own work"
        in (doc["default_explanation"])
    )
    assert f.clock.pending() == 0
    # For the autoscaler: offered load, shed by the frontend's lag, not by the model's queue.
    sched = f.replicas["m"].scheduler
    assert sched is not None
    assert (sched.offered, sched.lag_shed, sched.shed, sched.late) == (1, 1, 0, 0)


def test_a_second_of_lag_sheds_only_starts_a_probe_that_queues_for_one_slo(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    # The closed-loop spiral through the lag: every query shed at once, every client back at
    # once, each loop turn as long as the lag it sheds for. A second with (nearly) every
    # query shed lets queries in for one SLO, as for a queue priced late.
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    lagging(f, 0.019)
    sched = f.replicas["m"].scheduler
    assert sched is not None
    shed = Answers(f.clock)
    for _ in range(150):  # over PROBE_MIN_OFFERED, within the second
        f.predict("app", BODY, shed)
        f.clock.advance(0.005)
    assert f.transport.sent == [] and sched.lag_shed == 150
    assert all(doc["default"] for _, _, doc in shed.got)
    f.clock.advance(0.3)  # more than a second since the window opened
    probed = Answers(f.clock)
    f.predict("app", BODY, probed)
    assert len(f.transport.sent) == 1 and sched.probes == 1  # queued, not shed
    f.predict("app", BODY, probed)  # within the probe's SLO: queued too
    assert sched.lag_shed == 150
    f.clock.advance(app.slo_s)  # the probe is over: the lag sheds again
    f.predict("app", BODY, probed)
    assert sched.lag_shed == 151 and sched.probes == 1


def test_lag_that_still_leaves_time_queues(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    lagging(f, 0.005)  # behind, but 5 ms + an unknown batch latency fits in 18 ms
    answers = Answers(f.clock)
    f.predict("app", BODY, answers)
    assert len(f.transport.sent) == 1


def test_reject_applications_get_503(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(overload="reject"), ["m"])
    frontends.append(f)
    lagging(f, 0.03)
    answers = Answers(f.clock)
    f.predict("app", b'{"input_batch": [[1.0], [2.0]]}', answers)
    [(_, status, cause)] = answers.got
    assert status == 503
    assert "frontend is behind" in cause


def test_the_deadline_and_the_histogram_count_from_the_callers_t0(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    first_byte = f.clock.now()
    f.clock.advance(0.004)  # read, parsed and routed 4 ms after the first byte arrived
    f.predict("app", BODY, answers, t0=first_byte)
    assert len(f.transport.sent) == 1  # 4 ms of 20: still worth queuing
    f.clock.advance(app.slo_s - app.answer_margin_s - 0.004)
    at, doc = answers.one()
    assert at == pytest.approx(first_byte + app.slo_s - app.answer_margin_s)
    assert doc["default"] is True
    hist = f.metrics.latency.labels(app="app")
    assert hist._sum.get() == pytest.approx(app.slo_s - app.answer_margin_s)


def test_a_request_that_arrives_too_late_is_shed_without_lag(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    first_byte = f.clock.now()
    f.clock.advance(0.019)  # past the answer margin already: no batch can make it
    f.predict("app", BODY, answers, t0=first_byte)
    at, doc = answers.one()
    assert at == f.clock.now()
    assert f.transport.sent == []
    assert "the request 19.0 ms old" in doc["default_explanation"]


def test_the_mean_busy_turn_is_the_socket_wait() -> None:
    mon = LoopLagMonitor(FakeClock())
    assert mon.socket_wait_s == 0.0
    mon.turn(1.000, 1.004)  # a turn that read requests kept the loop 4 ms
    assert mon.socket_wait_s == pytest.approx(0.004)  # half in the turn, half before it
    mon.turn(1.0041, 1.0051)  # back to back: a moving average
    assert mon.socket_wait_s == pytest.approx(0.8 * 0.004 + 0.2 * 0.001)
    mon.turn(2.0, 2.0001)  # after the loop idled: nothing waited for it, start afresh
    assert mon.socket_wait_s == pytest.approx(0.0001)
    mon.stop()
    assert mon.socket_wait_s == 0.0


def test_the_histogram_adds_the_socket_wait_and_the_deadline_does_not(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    mon = lagging(f, 0.0)
    mon.turn(0.0, 0.003)  # busy turns of 3 ms: 3 ms before the first read on average
    answers = Answers(f.clock)
    f.predict("app", BODY, answers)
    f.clock.advance(0.001)
    f.answer("m", [7.0])
    _, doc = answers.one()
    assert doc["default"] is False  # the deadline did not lose the 3 ms
    hist = f.metrics.latency.labels(app="app")
    assert hist._sum.get() == pytest.approx(0.001 + 0.003)


def test_the_lag_and_a_round_trip_measured_on_the_same_loop_are_not_added(
    frontends: list[Frontend],  # noqa: F811
    trust_one_batch: None,
) -> None:
    """A batch's latency is a round trip on this loop: it already holds the loop's delay in
    reading the answer. 7 ms of lag and 12 ms batches fit in the 18 ms left; adding them
    (19 ms) shed everything at 256 connections, and then no batch ran to say otherwise."""
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    for k in range(3):  # the model measured at 12 ms a full batch (8)
        f.predict("app", batch_body(8 * k, 8), answers)
        f.clock.advance(0.012)
        f.answer("m", [7.0] * 8)
    sched = f.schedulers[("m", "1")]
    assert sched.batch_latency_s == pytest.approx(0.012)
    lagging(f, 0.007)
    f.predict("app", body(100), answers)  # goes out at once: the replica is free
    f.predict("app", body(101), answers)  # queued behind it: priced at 12 ms, not 19
    assert len(f.transport.sent) == 4
    assert len(sched.queue) == 1
    assert len(answers.got) == 3
    assert not any(p["default"] for _, _, doc in answers.got for p in doc["batch_predictions"])


def test_an_idle_model_with_a_stale_estimate_is_measured_again(
    frontends: list[Frontend],  # noqa: F811
    trust_one_batch: None,
) -> None:
    """One slow batch (25 ms, over the whole budget) must not shed the model for good while
    the loop is behind: with nothing queued and the replica free, only the lag counts."""
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    f.predict("app", body(0), answers)
    f.clock.advance(0.025)
    f.answer("m", [7.0])
    lagging(f, 0.005)
    f.predict("app", body(1), answers)
    assert len(f.transport.sent) == 2
    f.clock.advance(0.001)
    f.answer("m", [8.0])
    assert answers.got[-1][2] == {"query_id": 1, "output": 8.0, "default": False}


def body(k: int) -> bytes:
    return b'{"input": [%d.0]}' % k


def batch_body(start: int, n: int) -> bytes:
    return b'{"input_batch": [%s]}' % b", ".join(b"[%d.0]" % k for k in range(start, start + n))


def test_a_loop_behind_does_not_shed_while_admission_probes(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    lagging(f, 0.019)  # would shed at once (see above)
    sched = f.schedulers[("m", "1")]
    sched._probe_until = f.clock.now() + 0.02  # as if a probe had just started
    answers = Answers(f.clock)
    f.predict("app", BODY, answers)
    assert len(f.transport.sent) == 1 and answers.got == []


def test_freeze_heap_takes_what_is_alive_out_of_the_collector() -> None:
    import gc

    from clipper.server import Clipper

    c = Clipper()
    try:
        c.freeze_heap()
        assert gc.get_freeze_count() > 0  # later passes skip it
    finally:
        gc.unfreeze()
        c._cleanup_tmp()

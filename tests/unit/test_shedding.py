"""Answer or shed under saturation, on a fake clock: the loop-lag monitor measures how late its
timer fires; the query processor counts from the caller's arrival time ``t0`` and sheds at once
what a backlog has made unable to meet its deadline (the default output with the reason, or
503 for an application that asked for rejection)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clipper.clock import FakeClock, _FakeTimer
from clipper.frontend.loop_lag import LoopLagMonitor
from clipper.frontend.query import LAG_FLOOR_S
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
    mon = LoopLagMonitor(clock, interval_s=0.005, decay=0.5)
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


def lagging(f: Frontend, lag_s: float) -> LoopLagMonitor:
    mon = LoopLagMonitor(f.clock)
    mon.lag_s = lag_s  # as if measured: the processor only reads it
    f.proc.loop_lag = mon
    return mon


def test_a_loop_within_noise_queues_as_usual(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    lagging(f, LAG_FLOOR_S / 2)
    answers = Answers(f.clock)
    f.proc.predict("app", BODY, answers)
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
    f.proc.predict("app", BODY, answers)
    at, doc = answers.one()
    assert at == f.clock.now()  # answered now, not at the deadline
    assert f.transport.sent == []  # and never queued
    assert doc["default"] is True
    assert "frontend is behind (event loop 19.0 ms late" in doc["default_explanation"]
    assert f.clock.pending() == 0


def test_lag_that_still_leaves_time_queues(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    lagging(f, 0.005)  # behind, but 5 ms + an unknown batch latency fits in 18 ms
    answers = Answers(f.clock)
    f.proc.predict("app", BODY, answers)
    assert len(f.transport.sent) == 1


def test_reject_applications_get_503(frontends: list[Frontend]) -> None:  # noqa: F811
    f = Frontend(single_app(overload="reject"), ["m"])
    frontends.append(f)
    lagging(f, 0.03)
    answers = Answers(f.clock)
    f.proc.predict("app", b'{"input_batch": [[1.0], [2.0]]}', answers)
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
    f.proc.predict("app", BODY, answers, t0=first_byte)
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
    f.proc.predict("app", BODY, answers, t0=first_byte)
    at, doc = answers.one()
    assert at == f.clock.now()
    assert f.transport.sent == []
    assert "the request 19.0 ms old" in doc["default_explanation"]


class TurningClock(StalledClock):
    """Loop turns of ``turn`` seconds: a callback asked for "next turn" runs that much later."""

    def __init__(self, stall: float, turn: float) -> None:
        super().__init__(stall)
        self.turn = turn

    def call_soon(self, callback: Callable[..., object], *args: Any) -> _FakeTimer:
        return self.call_at(self.now() + self.turn, callback, *args)


def test_a_busy_loop_measures_its_turns_as_the_socket_wait() -> None:
    clock = TurningClock(stall=0.004, turn=0.004)
    mon = LoopLagMonitor(clock, interval_s=0.005)
    mon.start()
    assert mon.socket_wait_s == 0.0
    clock.advance(0.05)
    assert mon.lag_s == pytest.approx(0.004)
    assert mon.socket_wait_s == pytest.approx(0.004)  # one turn, measured turn by turn
    clock.stall, clock.turn = 0.0, 0.0  # the loop caught up: short turns
    clock.advance(0.05)
    assert mon.socket_wait_s == 0.0
    mon.stop()
    assert clock.pending() == 0


def test_the_histogram_adds_the_socket_wait_and_the_deadline_does_not(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    mon = lagging(f, 0.0)
    mon.turn_s = 0.003
    mon._turns = f.clock.call_later(3600.0, lambda: None)  # as if measuring turns now
    answers = Answers(f.clock)
    f.proc.predict("app", BODY, answers)
    f.clock.advance(0.001)
    f.answer("m", [7.0])
    _, doc = answers.one()
    assert doc["default"] is False  # the deadline did not lose the 3 ms
    hist = f.metrics.latency.labels(app="app")
    assert hist._sum.get() == pytest.approx(0.001 + 0.003)
    mon._turns.cancel()

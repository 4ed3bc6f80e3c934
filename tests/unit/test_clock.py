"""The clocks' timers: FakeClock fires them in time order inside advance(); MonotonicClock hands
them to the running loop (asyncio's or uvloop's); wait_all/wait_event/wait_for time out on a clock
and sleep sleeps on one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop

from clipper.clock import (
    Clock,
    FakeClock,
    MonotonicClock,
    sleep,
    wait_all,
    wait_event,
    wait_for,
)


class Log:
    """Records (label, the clock's now() when the callback ran)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[tuple[str, float]] = []

    def __call__(self, label: str) -> None:
        self.calls.append((label, self.clock.now()))

    def labels(self) -> list[str]:
        return [label for label, _ in self.calls]


def test_advance_fires_due_timers_in_time_order_each_at_its_own_time() -> None:
    clock = FakeClock(start=10.0)
    log = Log(clock)
    clock.call_later(3.0, log, "c")
    clock.call_later(1.0, log, "a")
    clock.call_at(12.0, log, "b")
    clock.call_later(9.0, log, "later")
    clock.advance(5.0)
    assert log.calls == [("a", 11.0), ("b", 12.0), ("c", 13.0)]
    assert clock.now() == 15.0  # then the clock ends at the target
    assert clock.pending() == 1


def test_a_timer_fires_when_the_clock_reaches_its_time_not_before() -> None:
    clock = FakeClock(start=0.0)
    log = Log(clock)
    clock.call_later(0.5, log, "t")
    clock.advance(0.25)
    clock.advance(0.125)
    assert log.calls == []
    clock.advance(0.125)  # exactly at 0.5
    assert log.calls == [("t", 0.5)]
    clock.advance(10.0)
    assert log.calls == [("t", 0.5)]  # once


def test_timers_due_at_the_same_time_fire_in_the_order_they_were_armed() -> None:
    clock = FakeClock()
    log = Log(clock)
    for label in "abcd":
        clock.call_later(1.0, log, label)
    clock.advance(1.0)
    assert log.labels() == list("abcd")


def test_cancelled_timers_never_fire() -> None:
    clock = FakeClock()
    log = Log(clock)
    keep = clock.call_later(1.0, log, "keep")
    drop = clock.call_later(0.5, log, "drop")
    drop.cancel()
    assert drop.cancelled() and not keep.cancelled()
    assert clock.pending() == 1
    clock.advance(2.0)
    assert log.labels() == ["keep"]
    keep.cancel()  # after it ran: a no-op
    assert clock.pending() == 0


def test_callbacks_may_arm_and_cancel_timers_during_advance() -> None:
    clock = FakeClock(start=0.0)
    log = Log(clock)
    victim = clock.call_later(3.0, log, "victim")

    def first() -> None:
        log("first")
        clock.call_later(1.0, log, "chained")  # due at 2.0: within this advance
        clock.call_later(0.0, log, "now")  # due at once: runs before "chained"
        clock.call_later(10.0, log, "beyond")  # due at 11.0: not within this advance
        victim.cancel()

    clock.call_later(1.0, first)
    clock.advance(5.0)
    assert log.calls == [("first", 1.0), ("now", 1.0), ("chained", 2.0)]
    assert clock.now() == 5.0
    clock.advance(6.0)
    assert log.calls[-1] == ("beyond", 11.0)


def test_a_timer_that_keeps_rearming_runs_once_per_period() -> None:
    clock = FakeClock(start=0.0)
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(clock.now())
        clock.call_later(0.25, tick)

    clock.call_later(0.25, tick)
    clock.advance(1.0)
    assert ticks == [0.25, 0.5, 0.75, 1.0]


def test_a_due_or_overdue_timer_runs_on_the_next_advance_even_advance_zero() -> None:
    clock = FakeClock(start=0.0)
    log = Log(clock)
    clock.call_later(-1.0, log, "negative")  # a delay below zero means now
    clock.call_at(-5.0, log, "past")  # an instant already past runs now, at now()
    assert log.calls == []  # never inside call_later itself
    clock.advance(0.0)
    assert log.calls == [("past", 0.0), ("negative", 0.0)]
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1.0)


def test_a_callbacks_exception_propagates_and_leaves_the_rest_armed() -> None:
    clock = FakeClock(start=0.0)
    log = Log(clock)

    def boom() -> None:
        raise RuntimeError("boom")

    clock.call_later(1.0, boom)
    clock.call_later(2.0, log, "after")
    with pytest.raises(RuntimeError, match="boom"):
        clock.advance(3.0)
    assert clock.now() == 1.0
    clock.advance(2.0)
    assert log.calls == [("after", 2.0)]


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_monotonic_clock_timers_run_on_the_running_loop(loop_factory: Any) -> None:
    # uvloop's loop.time() is a cached millisecond clock; the clock hands the loop relative
    # delays, so call_at (on time.monotonic()'s scale) works on either loop.
    clock = MonotonicClock()

    async def main() -> list[str]:
        ran: list[str] = []
        done = asyncio.get_running_loop().create_future()
        clock.call_later(0.0, ran.append, "later")
        clock.call_at(clock.now() + 0.001, done.set_result, None)
        cancelled = clock.call_later(0.0, ran.append, "cancelled")
        cancelled.cancel()
        await asyncio.wait_for(done, 5.0)  # a bound on a broken run, not a wait for time
        return ran

    loop = loop_factory()
    try:
        assert loop.run_until_complete(main()) == ["later"]
    finally:
        loop.close()
    # The next loop (the closed one is not kept) works as well.
    loop = loop_factory()
    try:
        assert loop.run_until_complete(main()) == ["later"]
    finally:
        loop.close()


def test_both_clocks_are_clocks() -> None:
    clocks: list[Clock] = [FakeClock(), MonotonicClock()]
    assert all(c.now() > 0 for c in clocks)


async def test_wait_all_returns_when_every_future_is_done() -> None:
    clock = FakeClock()
    loop = asyncio.get_running_loop()
    a: asyncio.Future[int] = loop.create_future()
    b: asyncio.Future[int] = loop.create_future()
    waiting = asyncio.create_task(wait_all(clock, [a, b], 1.0))
    await asyncio.sleep(0)  # one turn: the task arms its timer
    assert clock.pending() == 1
    a.set_result(1)
    b.set_exception(ValueError("an error is done too"))
    assert await waiting is True
    assert clock.pending() == 0  # its timer was cancelled
    assert await wait_all(clock, [a, b], 1.0) is True  # all done already: no timer at all


async def test_wait_all_gives_up_when_the_clock_passes_the_timeout() -> None:
    clock = FakeClock()
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(wait_all(clock, [fut], 1.0))
    await asyncio.sleep(0)
    clock.advance(0.5)
    assert not waiting.done()
    clock.advance(0.5)
    assert await waiting is False
    assert not fut.cancelled()  # like asyncio.wait: the futures are left alone


async def test_wait_event_is_true_when_set_and_false_at_the_timeout() -> None:
    clock = FakeClock()
    event = asyncio.Event()
    waiting = asyncio.create_task(wait_event(clock, event, 2.0))
    await asyncio.sleep(0)
    clock.advance(1.0)
    event.set()
    assert await waiting is True
    assert await wait_event(clock, event, 0.0) is True  # already set

    event.clear()
    waiting = asyncio.create_task(wait_event(clock, event, 2.0))
    await asyncio.sleep(0)
    clock.advance(2.0)
    assert await waiting is False
    assert clock.pending() == 0


async def test_sleep_returns_when_the_clock_passes_its_delay_not_before() -> None:
    clock = FakeClock(start=0.0)
    sleeping = asyncio.create_task(sleep(clock, 1.5))
    await asyncio.sleep(0)
    clock.advance(1.0)
    await asyncio.sleep(0)
    assert not sleeping.done()
    clock.advance(0.5)  # exactly at 1.5
    await sleeping
    assert clock.pending() == 0


async def test_a_cancelled_sleep_disarms_its_timer() -> None:
    clock = FakeClock()
    sleeping = asyncio.create_task(sleep(clock, 1.0))
    await asyncio.sleep(0)
    assert clock.pending() == 1
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    assert clock.pending() == 0


async def test_wait_for_returns_the_result_and_disarms_its_timer() -> None:
    clock = FakeClock()
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(wait_for(clock, fut, 2.0))
    await asyncio.sleep(0)
    clock.advance(1.9)
    fut.set_result(7)
    assert await waiting == 7
    assert clock.pending() == 0

    async def fails() -> None:
        raise ValueError("its own error")

    with pytest.raises(ValueError, match="its own error"):
        await wait_for(clock, fails(), 2.0)
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    done.set_result(3)
    assert await wait_for(clock, done, 0.0) == 3  # done already: no timer at all
    assert clock.pending() == 0


async def test_wait_for_cancels_the_awaitable_exactly_at_the_timeout() -> None:
    clock = FakeClock(start=0.0)
    event = asyncio.Event()
    cleaned_up: list[float] = []

    async def waits() -> None:
        try:
            await event.wait()
        finally:
            cleaned_up.append(clock.now())

    inner = asyncio.create_task(waits())
    waiting = asyncio.create_task(wait_for(clock, inner, 2.0))
    await asyncio.sleep(0)
    clock.advance(1.999)
    await asyncio.sleep(0)
    assert not waiting.done() and not inner.done()
    clock.advance(0.001)
    with pytest.raises(TimeoutError):
        await waiting
    assert inner.cancelled() and cleaned_up == [2.0]  # waited for, not left running


async def test_cancelling_wait_for_cancels_the_awaitable_and_is_no_timeout() -> None:
    clock = FakeClock()
    inner = asyncio.create_task(asyncio.Event().wait())
    waiting = asyncio.create_task(wait_for(clock, inner, 2.0))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert inner.cancelled()
    assert clock.pending() == 0


async def test_wait_for_still_times_out_in_the_cleanup_of_a_cancelled_task() -> None:
    # A cancelled task that stops a child in its except clause (cancelling() is 1 there)
    # must get the timeout, not a second CancelledError, when the child does not go.
    clock = FakeClock(start=0.0)
    outcome: list[str] = []

    async def cleans_up() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            try:
                await wait_for(clock, asyncio.Event().wait(), 3.0)
            except TimeoutError:
                outcome.append(f"timed out at {clock.now()}")
            raise

    task = asyncio.create_task(cleans_up())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    clock.advance(3.0)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert outcome == ["timed out at 3.0"]

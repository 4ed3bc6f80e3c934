"""The only place that reads time, and the only place that arms timers.

Everything that needs "now" or a timer (deadlines, batch waits, drains, silence checks) takes a
:class:`Clock`; tests pass a :class:`FakeClock` and move it by hand, so deadlines and batching
are tested without sleeping: its timers fire inside :meth:`FakeClock.advance`, in time order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, Protocol, TypeVar

__all__ = [
    "Clock",
    "FakeClock",
    "MonotonicClock",
    "TimerHandle",
    "sleep",
    "wait_all",
    "wait_event",
    "wait_for",
]

T = TypeVar("T")


class TimerHandle(Protocol):
    """What :meth:`Clock.call_later` returns (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None:
        """The callback will not run (a no-op once it ran or was cancelled)."""
        ...

    def cancelled(self) -> bool: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""
        ...

    def call_later(
        self, delay_s: float, callback: Callable[..., object], *args: Any
    ) -> TimerHandle:
        """Run ``callback(*args)`` once ``delay_s`` seconds have passed on this clock (at
        once, on the next turn, when ``delay_s <= 0``). Needs a running event loop for the
        real clock; the callback runs on that loop, never inside this call."""
        ...

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` when :meth:`now` reaches ``when`` (this clock's scale)."""
        ...

    def call_soon(self, callback: Callable[..., object], *args: Any) -> TimerHandle:
        """Run ``callback(*args)`` on the loop's next turn (a callback it schedules again runs
        on the turn after: one call per turn, unlike a zero-delay timer, which uvloop may run
        again in the same turn)."""
        ...


class MonotonicClock:
    """Real time: :func:`time.monotonic`, with timers on the running event loop.

    ``now()`` is not taken from ``loop.time()``: uvloop's is libuv's cached millisecond clock
    (truncated, refreshed once per loop turn), too coarse for latencies and sub-millisecond
    batch waits. So timers are handed to the loop as *relative* delays, computed on this
    clock's scale, never as absolute ``loop.time()`` instants: the two scales may differ (by
    up to a millisecond under uvloop, by anything on another loop) and a relative delay does
    not care. uvloop rounds a delay to whole milliseconds, so a callback may run up to half a
    millisecond early by ``now()``; callers that must not act early re-check ``now()`` (the
    scheduler re-decides and re-arms; a query's deadline timer already fires a margin early).
    """

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def now(self) -> float:
        return time.monotonic()

    def call_later(
        self, delay_s: float, callback: Callable[..., object], *args: Any
    ) -> asyncio.TimerHandle:
        loop = self._loop
        if loop is None or loop.is_closed():
            # Cached: on Python 3.11 every get_running_loop() is a getpid() system call, and
            # this runs per query. A closed loop (the next test, a restarted frontend) is
            # replaced by the one running now.
            loop = self._loop = asyncio.get_running_loop()
        return loop.call_later(delay_s, callback, *args)

    def call_at(
        self, when: float, callback: Callable[..., object], *args: Any
    ) -> asyncio.TimerHandle:
        return self.call_later(when - time.monotonic(), callback, *args)

    def call_soon(self, callback: Callable[..., object], *args: Any) -> asyncio.Handle:
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop.call_soon(callback, *args)


class _FakeTimer:
    __slots__ = ("_cancelled", "args", "callback", "when")

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]):
        self.when = when
        self.callback = callback
        self.args = args
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


class FakeClock:
    """A clock that moves only when told to; its timers fire inside :meth:`advance`.

    Unlike a loop, a timer due now (``call_later(0, ...)``) does not run by itself: it runs on
    the next ``advance`` (``advance(0)`` runs what is due without moving the clock).
    """

    __slots__ = ("_seq", "_t", "_timers")

    def __init__(self, start: float = 1000.0) -> None:
        self._t = start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()  # ties fire in the order they were armed

    def now(self) -> float:
        return self._t

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: Any) -> _FakeTimer:
        return self.call_at(self._t + max(delay_s, 0.0), callback, *args)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> _FakeTimer:
        timer = _FakeTimer(when, callback, args)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def call_soon(self, callback: Callable[..., object], *args: Any) -> _FakeTimer:
        """Like a timer due now: it runs on the next :meth:`advance`."""
        return self.call_at(self._t, callback, *args)

    def pending(self) -> int:
        """How many timers are armed and not cancelled."""
        return sum(not t.cancelled() for _, _, t in self._timers)

    def advance(self, seconds: float) -> None:
        """Move ``seconds`` forward, running every timer due by then in time order, each with
        ``now()`` at its own due time (timers armed meanwhile run too if due by the target);
        then ``now()`` is the target. A callback's exception propagates, the clock left at
        that timer's time and the later timers still armed."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        target = self._t + seconds
        timers = self._timers
        while timers and timers[0][0] <= target:
            when, _, timer = heapq.heappop(timers)
            if timer.cancelled():
                continue
            self._t = max(self._t, when)
            timer.callback(*timer.args)
        self._t = target


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_all(
    clock: Clock, futures: Collection[asyncio.Future[Any]], timeout_s: float
) -> bool:
    """``asyncio.wait(futures, timeout=timeout_s)`` timed by ``clock``: returns once every
    future is done (True) or the timeout passed (False). Cancels none of them."""
    pending = [f for f in futures if not f.done()]
    if not pending:
        return True
    settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(pending)

    def one_done(_: object) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            _settle(settled)

    for f in pending:
        f.add_done_callback(one_done)
    timer = clock.call_later(timeout_s, _settle, settled)
    try:
        await settled
    finally:
        timer.cancel()
        for f in pending:
            f.remove_done_callback(one_done)
    return all(f.done() for f in pending)


async def wait_event(clock: Clock, event: asyncio.Event, timeout_s: float) -> bool:
    """``asyncio.wait_for(event.wait(), timeout_s)`` timed by ``clock``, without the
    exception: True when the event is set, False when the timeout passed first."""
    if event.is_set():
        return True
    waiter = asyncio.get_running_loop().create_task(event.wait())
    try:
        await wait_all(clock, (waiter,), timeout_s)
    finally:
        waiter.cancel()
    return event.is_set()


async def sleep(clock: Clock, seconds: float) -> None:
    """``asyncio.sleep(seconds)`` timed by ``clock``: returns once ``seconds`` have passed on
    it (on the next turn, or the next :meth:`FakeClock.advance`, when ``seconds <= 0``)."""
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    timer = clock.call_later(seconds, _settle, woken)
    try:
        await woken
    finally:
        timer.cancel()


async def wait_for(clock: Clock, aw: Awaitable[T], timeout_s: float) -> T:
    """``asyncio.wait_for(aw, timeout_s)`` timed by ``clock``: what ``aw`` returns or raises;
    once ``timeout_s`` passed first, ``aw`` is cancelled, waited for, and TimeoutError raised.
    Cancelling the caller cancels ``aw`` too (and propagates, even at the timeout); a caller
    already cancelled on entry (cleaning up after a cancel) still gets the TimeoutError."""
    inner = asyncio.ensure_future(aw)
    if inner.done():
        return inner.result()
    me = asyncio.current_task()
    cancels_before = me.cancelling() if me is not None else 0
    timed_out = False

    def expire() -> None:
        nonlocal timed_out
        if not inner.done():
            timed_out = True
            inner.cancel()

    timer = clock.call_later(timeout_s, expire)
    try:
        return await inner
    except asyncio.CancelledError:
        cancels = me.cancelling() if me is not None else 0
        if timed_out and inner.cancelled() and cancels <= cancels_before:
            raise TimeoutError from None
        raise
    finally:
        timer.cancel()

"""How far behind the event loop is: a periodic timer on the injected clock, measuring how late
it fires.

Under saturation a request waits in the socket before its first callback, and its answer waits
again before it is written: both by about one loop turn, invisible from inside the request's
own code. The HTTP server reports each turn that read requests (:meth:`LoopLagMonitor.turn`),
from which the latency histogram estimates the socket wait. A timer due every ``interval_s``
that fires ``x`` seconds late says a loop turn takes about ``x``. The estimate rises at once
(a stall is news now) and decays by ``decay`` per later sample (one short turn does not mean
the backlog is gone). Its owner starts and stops it.

A late timer has two causes, and only one is a backlog. The loop may have been busy with its
own work (requests read, answers written): every query behind that work waits for it, so
admission prices it (:attr:`backlog_s`). Or the process was not running at all — another
program had the core, the kernel descheduled it for a time slice: that delay is over by the
time the timer fires, and a query arriving now is not behind it. The monitor tells them apart
by the loop thread's CPU time over the interval (``cpu_time``, the thread's clock): of the
lateness, at most the CPU the loop spent counts as its own work, less the time garbage-collector
passes took in the interval (``collector``: :attr:`clipper.query.collector.CollectorPauses.
total_s`), a one-off stall that is over when the timer fires, like descheduled time.
:attr:`lag_s` is the plain lateness (the ``clipper_event_loop_lag_seconds`` gauge); the runners
shed on :attr:`backlog_s` alone, so a machine shared with other programs is not mistaken for
overload.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from clipper.clock import Clock, TimerHandle

__all__ = ["LoopLagMonitor"]


class LoopLagMonitor:
    __slots__ = (
        "_armed_collector",
        "_armed_cpu",
        "_clock",
        "_collector",
        "_cpu",
        "_decay",
        "_due",
        "_timer",
        "_turn_ended",
        "backlog_s",
        "interval_s",
        "lag_s",
        "samples",
        "turn_s",
    )

    def __init__(
        self,
        clock: Clock,
        *,
        interval_s: float = 0.005,
        decay: float = 0.5,
        cpu_time: Callable[[], float] = time.thread_time,
        collector: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self._decay = decay
        # The loop thread's CPU clock (not wall time): what it spent, not what passed.
        self._cpu = cpu_time
        self._armed_cpu = 0.0
        # Seconds of collector passes so far (None: not watched).
        self._collector = collector
        self._armed_collector = 0.0
        self._timer: TimerHandle | None = None
        self._due = 0.0
        self.lag_s = 0.0  # how late the timer fires, whatever the cause
        self.backlog_s = 0.0  # the part of it the loop spent on its own work
        self.samples = 0
        # How long the loop's turns that read requests keep it busy (EWMA), from the HTTP
        # server's turn boundaries (:meth:`turn`).
        self.turn_s = 0.0
        self._turn_ended = float("-inf")

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        if self._timer is None:
            self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.lag_s = 0.0
        self.backlog_s = 0.0
        self.turn_s = 0.0

    def turn(self, began_at: float, ended_at: float) -> None:
        """A loop turn read requests from ``began_at`` (its first read) until ``ended_at`` (its
        reads and what they queued were done)."""
        busy = ended_at - began_at
        idle = began_at - self._turn_ended
        self._turn_ended = ended_at
        # After the loop idled longer than a turn, nothing waited for it: start afresh rather
        # than let the last burst's long turns inflate the next quiet requests.
        if self.turn_s == 0.0 or idle > 2.0 * self.turn_s:
            self.turn_s = busy
        else:
            self.turn_s = 0.8 * self.turn_s + 0.2 * busy

    @property
    def socket_wait_s(self) -> float:
        """About how long a request waits before its first read, over the mean busy turn.

        A request read during a turn waited for the reads before it in that turn, half the
        turn on average; one that arrived while a turn kept the loop busy waited for the next,
        again half a turn on average (arrivals spread over it): one busy turn in all. Near
        idle a turn reads one request, and this is its read time, microseconds."""
        return self.turn_s

    def _arm(self) -> None:
        self._due = self._clock.now() + self.interval_s
        self._armed_cpu = self._cpu()
        if self._collector is not None:
            self._armed_collector = self._collector()
        self._timer = self._clock.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        late = max(self._clock.now() - self._due, 0.0)
        # The loop cannot have worked longer than it ran: the rest of the lateness was time
        # the process did not have the CPU.
        own = min(late, max(self._cpu() - self._armed_cpu, 0.0))
        if self._collector is not None:
            own = max(own - (self._collector() - self._armed_collector), 0.0)
        self.samples += 1
        self.lag_s = self._smooth(self.lag_s, late)
        self.backlog_s = self._smooth(self.backlog_s, own)
        self._arm()

    def _smooth(self, previous: float, sample: float) -> float:
        """Up at once (a stall is news now), down by ``decay`` per later sample."""
        return sample if sample >= previous else sample + self._decay * (previous - sample)

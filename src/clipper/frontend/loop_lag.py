"""How far behind the event loop is: a periodic timer on the injected clock, measuring how late
it fires.

Under saturation a request waits in the socket before its first callback, and its answer waits
again before it is written: both by about one loop turn, invisible from inside the request's
own code. A timer due every ``interval_s`` that fires ``x`` seconds late says a loop turn
takes about ``x``. The estimate rises at once (a stall is news now) and decays by ``decay``
per later sample (one short turn does not mean the backlog is gone). Its owner starts and
stops it; the query processor reads :attr:`lag_s` to shed queries that cannot make it.
"""

from __future__ import annotations

from clipper.clock import Clock, TimerHandle

__all__ = ["LoopLagMonitor"]


class LoopLagMonitor:
    __slots__ = (
        "_busy_s",
        "_clock",
        "_decay",
        "_due",
        "_timer",
        "_turn_at",
        "_turns",
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
        busy_s: float = 0.002,
    ) -> None:
        self._clock = clock
        self.interval_s = interval_s
        self._decay = decay
        self._timer: TimerHandle | None = None
        self._due = 0.0
        self.lag_s = 0.0
        self.samples = 0
        # While the loop is behind by at least busy_s, a callback runs once per loop turn and
        # measures the turns (their EWMA is turn_s); it stops at the first short turn.
        self._busy_s = busy_s
        self._turns: TimerHandle | None = None
        self._turn_at = 0.0
        self.turn_s = 0.0

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
        self._stop_turns()
        self.lag_s = 0.0

    @property
    def socket_wait_s(self) -> float:
        """About how long a request now waits in its socket before the loop reads it.

        Under saturation a request arrives while the loop serves one turn and is read during
        the next: on average one turn (half of each). Below ``busy_s`` of lag, 0."""
        return self.turn_s if self._turns is not None else 0.0

    def _stop_turns(self) -> None:
        if self._turns is not None:
            self._turns.cancel()
            self._turns = None
        self.turn_s = 0.0

    def _turn(self) -> None:
        now = self._clock.now()
        turn = now - self._turn_at
        self._turn_at = now
        if turn < self._busy_s / 4:
            self._turns = None  # a short turn: the loop caught up
            self.turn_s = 0.0
            return
        self.turn_s = turn if self.turn_s == 0.0 else 0.8 * self.turn_s + 0.2 * turn
        self._turns = self._clock.call_soon(self._turn)

    def _arm(self) -> None:
        self._due = self._clock.now() + self.interval_s
        self._timer = self._clock.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        late = max(self._clock.now() - self._due, 0.0)
        self.samples += 1
        lag = self.lag_s
        self.lag_s = late if late >= lag else late + self._decay * (lag - late)
        if self.lag_s >= self._busy_s / 2 and self._turns is None:
            self._turn_at = self._clock.now()
            self._turns = self._clock.call_soon(self._turn)
        self._arm()

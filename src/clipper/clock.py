"""The only place that reads time.

Everything that needs "now" takes a :class:`Clock`; tests pass a :class:`FakeClock` and move it
by hand, so deadlines and batching are tested without sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "FakeClock", "MonotonicClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences are meaningful)."""
        ...


class MonotonicClock:
    """Real time; the same scale as ``loop.time()`` so timers and deadlines agree."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    __slots__ = ("_t",)

    def __init__(self, start: float = 1000.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        self._t += seconds

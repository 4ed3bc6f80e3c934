"""The cyclic garbage collector's passes, timed: how long each one stopped the event loop.

A pass runs inside whatever allocation triggered it, on the loop's thread, and nothing else runs
until it ends: on a heap of a few hundred thousand objects a full pass takes tens of
milliseconds. The frontend freezes what is alive at start (:meth:`clipper.server.Clipper.
freeze_heap`), so later passes cover only what was allocated since; this watch shows whether
that holds (``clipper_gc_pause_seconds``, by generation) and tells the loop-lag monitor how much
of a late timer was a collector pass (:attr:`CollectorPauses.total_s`): a pass is a one-off
stall, over by the time the timer fires, not a backlog of the loop's work to price queries
against. Its owner starts and stops it (the callback list is the interpreter's, shared).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram

__all__ = ["CollectorPauses"]


class CollectorPauses:
    __slots__ = ("_histogram", "_started", "_timer", "longest_s", "passes", "total_s")

    def __init__(
        self,
        histogram: Histogram | None = None,
        *,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        # Wall time of the pass: the loop waited for all of it, whatever the CPU did.
        self._timer = timer
        self._histogram = histogram
        self._started = 0.0
        self.total_s = 0.0  # every pass since start, summed
        self.longest_s = 0.0
        self.passes = 0

    @property
    def running(self) -> bool:
        return self._callback in gc.callbacks

    def start(self) -> None:
        if not self.running:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        while self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._timer()
            return
        took = max(self._timer() - self._started, 0.0)
        self.passes += 1
        self.total_s += took
        self.longest_s = max(self.longest_s, took)
        if self._histogram is not None:
            self._histogram.labels(generation=str(info.get("generation", "?"))).observe(took)

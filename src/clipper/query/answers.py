"""Answered queries, counted: query ids, and the per-application request, latency and
default-output metrics every runner records the same way.

The latency histogram shows what clients see: from the request's first byte to its answer, plus
the time it waited in its socket before the loop read it (the loop-lag monitor's estimate;
deadlines still count from the first byte).
"""

from __future__ import annotations

import itertools
from typing import Any

from clipper.clock import Clock
from clipper.metrics import Metrics
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.prediction import DefaultReason

__all__ = ["Answers"]


class Answers:
    __slots__ = ("_app_metrics", "clock", "ids", "loop_lag", "metrics")

    def __init__(
        self, metrics: Metrics, clock: Clock, loop_lag: LoopLagMonitor | None = None
    ) -> None:
        self.metrics = metrics
        self.clock = clock
        self.loop_lag = loop_lag  # None: no socket-wait estimate (tests, embedders)
        # Query ids, given out in answer order, one per input (``next(ids)``).
        self.ids = itertools.count()
        self._app_metrics: dict[str, tuple[Any, Any]] = {}

    def next_id(self) -> int:
        """The next query id: given out in answer order, one per input."""
        return next(self.ids)

    def socket_wait_s(self) -> float:
        """About how long a request waited in its socket before the loop read its first byte
        (one loop turn under saturation; 0 otherwise)."""
        mon = self.loop_lag
        return mon.socket_wait_s if mon is not None else 0.0

    def answered(self, app: str, t0: float) -> None:
        """A request of ``app`` that arrived at ``t0`` is answered now."""
        m = self._app_metrics.get(app)
        if m is None:
            m = self._app_metrics[app] = (
                self.metrics.requests.labels(app=app),
                self.metrics.latency.labels(app=app),
            )
        m[0].inc()
        m[1].observe(self.clock.now() - t0 + self.socket_wait_s())

    def defaulted(self, app: str, reason: DefaultReason) -> None:
        """One input of ``app`` got the default output for ``reason``."""
        self.metrics.defaults.labels(app=app, reason=reason).inc()

    def abandoned(self, app: str) -> None:
        """A query of ``app`` was abandoned: its client went away before its answer."""
        self.metrics.abandoned.labels(app=app).inc()

    def forget_app(self, app: str) -> None:
        """A deleted application: its metric series go, and the children held for them."""
        self._app_metrics.pop(app, None)
        self.metrics.forget_app(app)

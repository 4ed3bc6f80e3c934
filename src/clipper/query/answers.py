"""Answered queries, counted: query ids, and the per-application request, latency and
default-output metrics every runner records the same way; and :class:`PendingQuery`, what
every runner's query holds until it is answered once (or its client goes away).

The latency histogram shows what clients see: from the request's first byte to its answer, plus
the time it waited in its socket before the loop read it (the loop-lag monitor's estimate;
deadlines still count from the first byte).
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

from clipper.clock import Clock, TimerHandle
from clipper.metrics import Metrics
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.prediction import DefaultReason, Prediction, Reply, fail_internal
from clipper.registry import Application

__all__ = ["Answers", "PendingQuery"]


class _Answering(Protocol):
    def predictions(self, q: Any) -> list[Prediction]:
        """The finished query's predictions, counted."""


class PendingQuery:
    """One request's answer, still owed: its reply (None once answered or abandoned), its
    deadline timer, and whether its client went away. :meth:`finish` answers exactly once with
    what the runner makes of the query; a failure while answering becomes a 500, never no
    answer (it runs in a replica's or the timer's callback)."""

    __slots__ = ("app", "gone", "reply", "run", "t0", "timer")

    app: Application
    gone: bool
    reply: Reply | None
    run: _Answering
    t0: float
    timer: TimerHandle | None

    def finish(self) -> None:
        reply = self.reply
        assert reply is not None
        self.reply = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            reply.answer(self.run.predictions(self))
        except Exception as e:
            fail_internal(reply, f"answering a query of application '{self.app.name}'", e)

    def drop(self) -> bool:
        """The client went away: answer nothing from now on. False when it was answered
        already (nothing to drop)."""
        if self.reply is None:
            return False
        self.reply = None
        self.gone = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        return True


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

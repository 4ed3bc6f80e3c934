"""The query path's two switches, read where a span could start (one attribute each).

``active`` is the running frontend's :class:`~clipper.tracing.tracer.Tracer`, or None while
tracing is off (then nothing else in this package runs on the query path). ``current`` is the
sampled request's span while its protocol hands it to the query processor (the loop is one
thread and that call is synchronous), so that the inputs it queues carry it into their batch;
None at every other moment. A process traces for one frontend at a time.
"""

from __future__ import annotations

from typing import Any

from clipper.tracing.tracer import Tracer

__all__ = ["activate", "active", "current", "deactivate"]

active: Tracer | None = None
current: Any = None


def activate(tracer: Tracer) -> None:
    global active  # noqa: PLW0603 (the one switch, read as a module attribute)
    active = tracer


def deactivate(tracer: Tracer) -> None:
    global active, current  # noqa: PLW0603
    if active is tracer:
        active = None
        current = None

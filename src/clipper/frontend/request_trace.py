"""A sampled request's spans at the protocol edge (clipper.tracing): the server span, from the
request's first byte to its answer, with its ``parse`` child; the runner's spans (cache lookup,
queue wait, the batch) hang below it while the processor runs with it as the current span.

Only called where ``clipper.tracing.hooks.active`` is set: with tracing off the protocols pay
that one attribute check. An answer with default outputs marks the server span with the
reason (attributes ``clipper.default_reason``, ``clipper.default_count``, status ERROR); an
error answer sets ``http.response.status_code`` and status ERROR.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clipper.errors import RequestError
from clipper.query.prediction import Prediction
from clipper.tracing import hooks
from clipper.tracing.tracer import Span, Tracer

__all__ = ["TracedReply", "answered", "begin", "failed", "parsed", "run_traced"]


def begin(
    tracer: Tracer,
    name: str,
    traceparent: str | bytes | None,
    t0: float,
    attributes: Mapping[str, str | int | float | bool],
) -> Span | None:
    """The request's server span (None: not sampled), child of its ``traceparent`` (the
    header, or the gRPC metadata entry)."""
    return tracer.request(name, traceparent, t0, attributes)


def parsed(tracer: Tracer, span: Span, t0: float) -> None:
    """The ``parse`` span: from the first byte until now (the body read and parsed)."""
    tracer.child(span, "parse", t0, tracer.clock.now())


def run_traced(span: Span, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` (the processor's predict) with ``span`` as the current request span."""
    hooks.current = span
    try:
        fn(*args)
    finally:
        hooks.current = None


def answered(span: Span, predictions: list[Prediction], status: int | None = 200) -> None:
    """The answer is written: mark defaults, end the server span (once). ``status``: the
    HTTP status (None: a gRPC call, which says its own)."""
    tracer = hooks.active
    if tracer is None or not span.is_recording():
        return
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    span.set_attribute("clipper.outputs", len(predictions))
    defaults = [p for p in predictions if p.reason is not None]
    if defaults:
        first = defaults[0]
        assert first.reason is not None
        tracer.mark_default(span, str(first.reason), first.explanation, len(defaults))
    tracer.end(span, tracer.clock.now())


def failed(span: Span, err: RequestError) -> None:
    """An error answer (or a request refused before it was queued): end the server span."""
    tracer = hooks.active
    if tracer is None or not span.is_recording():
        return
    span.set_attribute("http.response.status_code", err.status)
    tracer.end(span, tracer.clock.now(), f"{err.status} {err.error}: {err}")


class TracedReply:
    """Mixed into a protocol's reply (before it: ``class T(TracedReply, RestReply)``) for a
    sampled request: its answer or its error ends the server span, after the protocol has
    written it (a failure inside ``answer`` ends the span first, as an error)."""

    __slots__ = ()
    span: Span

    def answer(self, predictions: list[Prediction]) -> None:
        super().answer(predictions)  # type: ignore[misc]
        answered(self.span, predictions)

    def fail(self, err: RequestError) -> None:
        super().fail(err)  # type: ignore[misc]
        failed(self.span, err)

"""OpenTelemetry traces for the frontend and its containers (``clipper-serve[otel]``).

* :mod:`~clipper.tracing.context`: the W3C ``traceparent`` and the ``OTEL_*`` settings, as
  plain values (no OpenTelemetry import).
* :mod:`~clipper.tracing.tracer`: the tracer provider, its batch span processor (its own export
  thread) and OTLP exporter, started and stopped with its process; OpenTelemetry is imported
  only there, and only when tracing is on.
* :mod:`~clipper.tracing.hooks`: the switch the query path reads (None: tracing is off).

docs/tracing.md lists the spans and their attributes.
"""

from clipper.tracing.context import (
    TraceParent,
    TraceSettings,
    format_traceparent,
    parse_traceparent,
)
from clipper.tracing.tracer import Span, Tracer

__all__ = [
    "Span",
    "TraceParent",
    "TraceSettings",
    "Tracer",
    "format_traceparent",
    "parse_traceparent",
]

"""The OpenTelemetry side: a tracer provider with a batch span processor and an OTLP exporter,
built from :class:`~clipper.tracing.context.TraceSettings` at start and shut down at stop.

Everything here is imported lazily (``clipper-serve[otel]``): a process with tracing off never
imports OpenTelemetry. The batch span processor exports on its own thread, never on the
frontend's event loop; :meth:`Tracer.stop` flushes what is left and blocks, so the frontend
calls it off the loop. Spans take their times from the frontend's clock (monotonic seconds),
turned into the wall-clock nanoseconds OTLP carries by one offset measured at start.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from clipper.clock import Clock
from clipper.errors import ConfigError
from clipper.tracing.context import (
    TraceSettings,
    format_traceparent,
    parse_traceparent,
    sampled,
)

__all__ = ["Span", "Tracer"]

# An OpenTelemetry span (opentelemetry.trace.Span): not imported unless tracing is on.
Span = Any

Attributes = Mapping[str, str | int | float | bool]


class Tracer:
    """Spans for one process (the frontend, or one container). ``exporter``: a span exporter
    to use instead of the one ``settings`` names (tests)."""

    def __init__(
        self,
        settings: TraceSettings,
        clock: Clock,
        *,
        resource: Attributes | None = None,
        exporter: Any = None,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self._resource = dict(resource or {})
        self._exporter = exporter
        self._provider: Any = None
        self._tracer: Any = None
        self._offset_ns = 0

    def start(self) -> None:
        """Build the provider and its export thread. Raises
        :class:`~clipper.errors.ConfigError` when OpenTelemetry is not installed."""
        if self._provider is not None:
            return
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider, sampling
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        except ImportError:
            raise ConfigError(
                "tracing is configured (OTEL_* variables) but OpenTelemetry is not installed: "
                "pip install 'clipper-serve[otel]'"
            ) from None
        exporter = self._exporter
        if exporter is None:
            if self.settings.exporter == "console":
                exporter = ConsoleSpanExporter()
            else:
                try:
                    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                        OTLPSpanExporter,
                    )
                except ImportError:
                    raise ConfigError(
                        "OTEL_TRACES_EXPORTER=otlp needs opentelemetry-exporter-otlp-proto-http: "
                        "pip install 'clipper-serve[otel]'"
                    ) from None
                exporter = OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
        resource = Resource.create({"service.name": self.settings.service_name, **self._resource})
        # The sampling decision is :meth:`request`'s (clipper.tracing.context.sampled): the SDK
        # records every span it is asked for.
        provider = TracerProvider(resource=resource, sampler=sampling.ALWAYS_ON)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        self._provider = provider
        self._tracer = provider.get_tracer("clipper")
        self._offset_ns = time.time_ns() - int(self.clock.now() * 1e9)

    def stop(self) -> None:
        """Export what is buffered and stop the export thread (blocks: call it off the loop)."""
        provider, self._provider = self._provider, None
        if provider is not None:
            provider.shutdown()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export every ended span now (blocks)."""
        if self._provider is None:
            return True
        return bool(self._provider.force_flush(int(timeout_s * 1000)))

    def ns(self, t: float) -> int:
        """A time on the clock's scale as OTLP's wall-clock nanoseconds."""
        return int(t * 1e9) + self._offset_ns

    # spans
    def request(
        self, name: str, traceparent: str | bytes | None, t0: float, attributes: Attributes
    ) -> Span | None:
        """A request's server span, child of the caller's ``traceparent`` when it has a valid
        one. None when the sampler says no: then nothing is created for the request."""
        parent = parse_traceparent(traceparent)
        if not sampled(self.settings, parent):
            return None
        from opentelemetry import trace

        ctx = None
        if parent is not None:
            remote = trace.SpanContext(
                parent.trace_id,
                parent.span_id,
                is_remote=True,
                trace_flags=trace.TraceFlags(parent.flags & 0x01),
            )
            ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        span = self._tracer.start_span(
            name,
            context=ctx,
            kind=trace.SpanKind.SERVER,
            start_time=self.ns(t0),
            attributes=attributes,
        )
        return span

    def child(
        self,
        parent: Span,
        name: str,
        start: float,
        end: float | None = None,
        attributes: Attributes | None = None,
        *,
        client: bool = False,
    ) -> Span:
        """A span under ``parent`` from ``start``; ended at ``end`` when given."""
        from opentelemetry import trace

        span = self._tracer.start_span(
            name,
            context=trace.set_span_in_context(parent),
            kind=trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL,
            start_time=self.ns(start),
            attributes=attributes,
        )
        if end is not None:
            span.end(end_time=self.ns(end))
        return span

    def batch(self, queries: Sequence[Span], start: float, attributes: Attributes) -> Span:
        """One batch's span: a child of the first query it carries (so that the container's
        span shares a trace with a query), linked to every query span it carries."""
        from opentelemetry import trace

        links = [trace.Link(q.get_span_context()) for q in queries]
        return self._tracer.start_span(
            "batch",
            context=trace.set_span_in_context(queries[0]),
            links=links,
            start_time=self.ns(start),
            attributes=attributes,
        )

    def end(self, span: Span, at: float, error: str | None = None) -> None:
        """End ``span`` at ``at``; ``error``: its status is ERROR with that description."""
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=self.ns(at))

    def mark_default(self, span: Span, reason: str, why: str, count: int) -> None:
        """A request answered (in part) with its application's default output."""
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("clipper.default", True)
        span.set_attribute("clipper.default_reason", reason)
        span.set_attribute("clipper.default_count", count)
        span.set_status(Status(StatusCode.ERROR, f"default output ({reason}): {why}"))

    @staticmethod
    def traceparent(span: Span) -> str:
        """The W3C header naming ``span`` as the parent (sent to the container)."""
        c = span.get_span_context()
        return format_traceparent(c.trace_id, c.span_id, bool(c.trace_flags & 0x01))

"""The container's side of a trace (clipper.tracing): a ``predict`` span for each batch whose
predict request carries a ``traceparent`` (the frontend's ``rpc predict`` span), as its child,
exported by this process's own tracer from the same ``OTEL_*`` variables as the frontend's
(a local container inherits the frontend's environment).

A batch without a ``traceparent`` (tracing off, or no query in it sampled) costs one dict
lookup. The span covers decoding the inputs, the model's predict and encoding the outputs;
its attributes are the batch size and the model version, and a batch the model failed has
status ERROR with the message the frontend gets.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Callable, Mapping

from clipper.clock import MonotonicClock
from clipper.inputs import InputType
from clipper.rpc.wire import PredictRequest
from clipper.tracing.context import TraceSettings
from clipper.tracing.tracer import Tracer

__all__ = ["PredictTraces", "predict_traces"]

_STATUS_ERROR = struct.pack("<I", 1)


class PredictTraces:
    """Spans for one container's batches; :meth:`stop` flushes them (at exit)."""

    def __init__(self, tracer: Tracer, name: str, version: str, input_type: InputType) -> None:
        self.tracer = tracer
        self.attrs = {
            "clipper.model": name,
            "clipper.model_version": version,
            "clipper.input_type": input_type.readable,
        }

    def run(
        self, req: PredictRequest, execute: Callable[[PredictRequest], list[bytes]]
    ) -> list[bytes]:
        meta = req.fast_meta
        traceparent = meta.get("traceparent") if meta is not None else None
        if not isinstance(traceparent, str):
            return execute(req)
        tracer = self.tracer
        span = tracer.request(
            "predict", traceparent, tracer.clock.now(), {**self.attrs, "clipper.batch.size": req.n}
        )
        if span is None:
            return execute(req)
        try:
            frames = execute(req)
        except BaseException as e:
            tracer.end(span, tracer.clock.now(), f"{type(e).__name__}: {e}")
            raise
        error = None
        if len(frames) == 5 and frames[3] == _STATUS_ERROR:
            error = bytes(frames[4]).decode("utf-8", "replace")
        tracer.end(span, tracer.clock.now(), error)
        return frames

    def stop(self) -> None:
        self.tracer.stop()


def predict_traces(
    name: str, version: str, input_type: InputType, env: Mapping[str, str] | None = None
) -> PredictTraces | None:
    """This container's traces when the ``OTEL_*`` variables turn them on, started; else
    None. Its service name is ``OTEL_SERVICE_NAME`` (else ``clipper``) with ``-model``."""
    settings = TraceSettings.from_env(os.environ if env is None else env)
    if not settings.enabled:
        return None
    settings = dataclasses.replace(settings, service_name=f"{settings.service_name}-model")
    tracer = Tracer(
        settings,
        MonotonicClock(),
        resource={"clipper.model": name, "clipper.model_version": version},
    )
    tracer.start()
    return PredictTraces(tracer, name, version, input_type)

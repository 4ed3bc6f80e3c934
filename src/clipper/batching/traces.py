"""One traced batch's spans (clipper.tracing): made at dispatch when a query it carries is
sampled, ended when its replica answers (or is removed).

* ``queue wait`` per sampled query: from when its input was queued to the dispatch;
* ``batch``: one per batch, a child of its first sampled query, linked to every sampled query
  it carries, with the batch size and the model version;
* ``rpc predict``: the round trip to the replica, a child of the batch span; its context goes
  to the container in the predict request, whose ``predict`` span is its child.
"""

from __future__ import annotations

from clipper.batching.queue import Task
from clipper.registry import ModelVersion
from clipper.tracing.tracer import Span, Tracer

__all__ = ["BatchTrace", "begin_batch"]


class BatchTrace:
    __slots__ = ("batch", "rpc", "traceparent", "tracer")

    def __init__(self, tracer: Tracer, batch: Span, rpc: Span) -> None:
        self.tracer = tracer
        self.batch = batch
        self.rpc = rpc
        self.traceparent = tracer.traceparent(rpc)

    def finish(self, now: float, error: str | None = None) -> None:
        self.tracer.end(self.rpc, now, error)
        self.tracer.end(self.batch, now, error)


def begin_batch(
    tracer: Tracer, tasks: list[Task], mv: ModelVersion, replica_id: int, now: float
) -> BatchTrace | None:
    """The spans of a batch about to be sent; None when no query in it is sampled."""
    spans = [t.span for t in tasks if t.span is not None]
    if not spans:
        return None
    for t in tasks:
        if t.span is not None:
            tracer.child(t.span, "queue wait", t.enqueued_at, now)
    attrs: dict[str, str | int | float | bool] = {
        "clipper.model": mv.name,
        "clipper.model_version": mv.version,
        "clipper.batch.size": len(tasks),
        "clipper.batch.traced_queries": len(spans),
        "clipper.replica_id": replica_id,
    }
    batch = tracer.batch(spans, now, attrs)
    rpc = tracer.child(batch, "rpc predict", now, None, attrs, client=True)
    return BatchTrace(tracer, batch, rpc)

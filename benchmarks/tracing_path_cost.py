"""What traces cost a query in frontend CPU, in-process: ``POST /<app>/predict`` through the
Clipper REST route (the traced-path check, the parse, the processor, the runner, the submit
seam, the scheduler's dispatch of a batch of one to a replica that answers at once, the answer
and its encoding), with tracing off, at 1% and at 100% sampling, interleaved repeats in one
process.

    PYTHONPATH=src python benchmarks/tracing_path_cost.py [--queries 4000] [--repeats 7]

The application has no cache, so every query is a batch: its spans are the request, parse,
selection, cache-less submit (no cache lookup), queue wait, batch and rpc predict. Spans go
through the SDK's batch span processor to an exporter that encodes each batch as OTLP protobuf
(what the OTLP/HTTP exporter sends) and drops it: the encoding on the export thread is counted
(``time.process_time`` counts every thread), the HTTP request is not. The time the process was
not scheduled does not count, so the figures hold on a busy machine where end-to-end ones do
not.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Sequence
from typing import Any

from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import PredictionCache
from clipper.clock import FakeClock
from clipper.config import BatchingConfig
from clipper.errors import ReplicaError
from clipper.frontend.routes import QueryRoutes
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.query.runtime import QueryServices, build_query_runtime
from clipper.registry import Application, ModelVersion, Registry
from clipper.rpc.link import Connection
from clipper.runtime.catalog import Catalog, SchedulerTable
from clipper.tracing import Tracer, TraceSettings, hooks

BODY = b'{"input": [' + b", ".join(b"%d.5" % i for i in range(64)) + b"]}"
MODES: dict[str, float | None] = {"off": None, "0%": 0.0, "1%": 0.01, "100%": 1.0}


class _Transport:
    """A replica that answers every batch as soon as the query's call returns."""

    def __init__(self) -> None:
        self.sent: list[tuple[Connection[Replica], int, int]] = []
        self.msg = 0

    def send_batch(
        self,
        link: Connection[Replica],
        itype: InputType,
        payloads: list[bytes],
        traceparent: str | None = None,
    ) -> int:
        self.msg += 1
        self.sent.append((link, self.msg, len(payloads)))
        return self.msg


class _Encoding:
    """A span exporter that encodes like OTLP/HTTP and sends nothing."""

    def __init__(self) -> None:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        self.encode = encode_spans
        self.bytes = 0

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.bytes += len(self.encode(spans).SerializeToString())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=4000, help="queries per repeat and mode")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    clock, registry, metrics = FakeClock(), Registry(), Metrics()
    cache = PredictionCache(1 << 24)
    app = Application("app", InputType.DOUBLES, "-1", 20_000, cache=False)
    registry.add_app(app)
    mv = ModelVersion(
        "m", "1", InputType.DOUBLES, batching=BatchingConfig(controller="fixed", max_batch_size=8)
    )
    registry.add_model(mv)
    registry.set_model_version("m", "1")
    registry.link("app", "m")
    table = SchedulerTable()
    transport = _Transport()
    sched = ModelScheduler(
        mv, slo_s=app.slo_s, cache=cache, clock=clock, transport=transport, metrics=metrics,
        queue_capacity=100,
    )  # fmt: skip
    replica = Replica(Connection(b"r", 0, True, 3.0, clock.now()))
    sched.add_replica(replica)
    table.put(mv.key, sched)
    catalog = Catalog(registry, table)
    query = build_query_runtime(catalog, cache, clock=clock, metrics=metrics)
    svc = QueryServices(catalog, query.processor, metrics, clock, 100, 1000)
    routes = QueryRoutes(svc)
    answered = [0]

    def respond(status: int, body: bytes, ctype: bytes) -> None:
        answered[0] += 1

    tracers = {}
    exporter = _Encoding()
    for mode, ratio in MODES.items():
        if ratio is not None:
            t = Tracer(TraceSettings(True, ratio=ratio), clock, exporter=exporter)
            t.start()
            tracers[mode] = t
    headers: dict[bytes, bytes] = {b"content-type": b"application/json"}
    gc.collect()
    gc.freeze()
    costs: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.repeats):
        for mode in MODES:
            tracer = tracers.get(mode)
            if tracer is None:
                hooks.active = None
            else:
                hooks.activate(tracer)
            t0 = time.process_time()
            for _ in range(args.queries):
                routes(b"POST", "/app/predict", headers, BODY, respond, t0=clock.now())
                for _, msg, n in transport.sent:
                    sched.on_response(replica, msg, [1.0] * n, None, 8)
                transport.sent.clear()
            if tracer is not None:
                tracer.flush(30.0)  # its export's encoding is this mode's cost
            costs[mode].append((time.process_time() - t0) / args.queries)
            hooks.active = None
    assert answered[0] == args.repeats * args.queries * len(MODES), answered
    off = statistics.median(costs["off"])
    for mode, c in costs.items():
        med = statistics.median(c)
        print(
            f"{mode:>5}: per query median {med * 1e6:7.2f} us, min {min(c) * 1e6:7.2f} us "
            f"({med / off:.3f} of off)"
        )
    print(f"({args.repeats} interleaved repeats of {args.queries} queries; OTLP bytes encoded: "
          f"{exporter.bytes:,})")  # fmt: skip
    for t in tracers.values():
        t.stop()
    sched.close(ReplicaError("done"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Traces end to end, with real processes: a ``clipper start`` frontend and its model's
container, both exporting over OTLP/HTTP (configured only by ``OTEL_*`` variables) to a
receiver in this test, which decodes every export with the ``opentelemetry-proto`` messages.

* a query with a sampled ``traceparent`` is traced although ``--trace-ratio 0``: the frontend's
  spans (request, parse, cache lookup, queue wait, batch, rpc predict) and the container's
  ``predict`` span arrive under the caller's trace id, and the container span's parent chain
  leads to the frontend's request span, whose parent is the caller's span;
* the batch span carries the batch size and a link to the query's span;
* a query without a ``traceparent`` starts no trace at ratio 0;
* a default answer marks the request span with its reason (attribute and ERROR status).
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import request, wait_for, write_row_sums

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

pytestmark = pytest.mark.integration

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
DEFAULT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind is not None else None


def _received(service: str, s: Any) -> ReceivedSpan:
    return ReceivedSpan(
        service=service,
        name=s.name,
        trace_id=s.trace_id.hex(),
        span_id=s.span_id.hex(),
        parent_id=s.parent_span_id.hex(),
        start_ns=s.start_time_unix_nano,
        end_ns=s.end_time_unix_nano,
        attributes={a.key: _value(a.value) for a in s.attributes},
        links=tuple((x.trace_id.hex(), x.span_id.hex()) for x in s.links),
        status_code=s.status.code,
        status_message=s.status.message,
    )


class Receiver:
    """An OTLP/HTTP receiver: ``POST /v1/traces`` with a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.take(trace_service.ExportTraceServiceRequest.FromString(body))
                out = trace_service.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def take(self, export: Any) -> None:
        got: list[ReceivedSpan] = []
        for rs in export.resource_spans:
            service = str({a.key: _value(a.value) for a in rs.resource.attributes}["service.name"])
            for ss in rs.scope_spans:
                got.extend(_received(service, s) for s in ss.spans)
        with self.lock:
            self.spans.extend(got)

    def snapshot(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
        r.thread.join(timeout=10)


class TracedFrontend(FrontendProcess):
    def command(self) -> list[str]:
        # Ratio 0: only a request whose caller sampled it is traced.
        return [*super().command(), "--trace-ratio", "0"]


@pytest.fixture
def frontend(tmp_path: Path, receiver: Receiver) -> Iterator[TracedFrontend]:
    fe = TracedFrontend(tmp_path / "state")
    fe.env = frontend_env(receiver)
    try:
        yield fe
    finally:
        fe.cleanup()


def frontend_env(receiver: Receiver) -> dict[str, str]:
    """Only standard OTEL_* variables: the replicas inherit them from the frontend."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "clipper-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans arrive soon after they end
    }


async def serve_sums(fe: FrontendProcess, tmp_path: Path) -> None:
    """Application and model ``sums`` (row sums, one replica), linked."""
    await fe.admin_ok(
        "add_app",
        {"name": "sums", "input_type": "doubles", "default_output": "-1",
         "latency_slo_micros": 10_000_000},
    )  # fmt: skip
    await fe.admin_ok(
        "deploy_model",
        {"model_name": "sums", "model_version": "1", "input_type": "doubles",
         "artifact_path": write_row_sums(tmp_path), "num_replicas": 1},
        limit_s=60,
    )  # fmt: skip
    await fe.admin_ok("add_model_links", {"app_name": "sums", "model_names": ["sums"]})


def tree(spans: list[ReceivedSpan]) -> str:
    """The trace as indented lines (name, service, duration): what docs/tracing.md shows."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_ns):
        by_parent.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    t0 = min(s.start_ns for s in spans)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in by_parent.get(parent, []):
            lines.append(
                f"{'  ' * depth}{s.name} [{s.service}] +{(s.start_ns - t0) / 1e6:.2f} ms "
                f"{(s.end_ns - s.start_ns) / 1e6:.2f} ms"
            )
            walk(s.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)


async def test_a_traced_query_reaches_the_container_under_the_callers_trace(
    frontend: TracedFrontend, receiver: Receiver, tmp_path: Path
) -> None:
    await frontend.start()
    query_url = f"http://127.0.0.1:{frontend.ports.query}"
    await serve_sums(frontend, tmp_path)
    await frontend.admin_ok(
        "add_app",
        {"name": "empty", "input_type": "doubles", "default_output": "-1",
         "latency_slo_micros": 100_000},
    )  # fmt: skip

    async def post(app: str, traceparent: str | None, first: float) -> Any:
        headers = {"Content-Type": "application/json"}
        if traceparent is not None:
            headers["traceparent"] = traceparent
        body = b'{"input": [%g, 2.0, 3.5]}' % first  # distinct inputs: no cache hit
        resp = await request(f"{query_url}/{app}/predict", "POST", body, headers=headers)
        assert resp.status == 200, resp.body
        return resp.json()

    untraced = await post("sums", None, 1.0)  # ratio 0: starts no trace
    assert untraced["output"] == 6.5 and untraced["default"] is False
    traced = await post("sums", f"00-{TRACE_ID}-{CALLER_SPAN}-01", 2.0)
    assert traced["default"] is False and traced["output"] == 7.5
    defaulted = await post("empty", f"00-{DEFAULT_TRACE_ID}-{CALLER_SPAN}-01", 3.0)
    assert defaulted["default"] is True

    def arrived() -> bool:
        names = {(s.trace_id, s.name) for s in receiver.snapshot()}
        wanted = [(TRACE_ID, n) for n in ("predict", "rpc predict", "POST /{app}/predict")]
        return all(w in names for w in [*wanted, (DEFAULT_TRACE_ID, "POST /{app}/predict")])

    try:
        await wait_for(arrived, limit_s=30, interval=0.05, what="the spans of both traces")
    except AssertionError as e:
        got = sorted({(s.service, s.name) for s in receiver.snapshot()})
        raise AssertionError(f"{e}; received {got}\n{frontend.log_tail()}") from None
    spans = receiver.snapshot()
    assert {s.trace_id for s in spans} == {TRACE_ID, DEFAULT_TRACE_ID}, "ratio 0 traced a query"
    trace = [s for s in spans if s.trace_id == TRACE_ID]
    print(tree(trace))
    by_id = {s.span_id: s for s in trace}
    named = {s.name: s for s in trace}
    expected = {"POST /{app}/predict", "parse", "cache lookup", "queue wait", "batch"}
    assert expected | {"rpc predict", "predict"} <= set(named), sorted(named)

    # The container's span: its own service, the batch's size, a parent chain to the request.
    predict = named["predict"]
    assert predict.service == "clipper-test-model"
    assert predict.attributes["clipper.batch.size"] == 1
    assert predict.attributes["clipper.model"] == "sums"
    chain = []
    span = predict
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        chain.append(span.name)
    assert chain == ["rpc predict", "batch", "POST /{app}/predict"]
    server = named["POST /{app}/predict"]
    assert server.parent_id == CALLER_SPAN and server.service == "clipper-test"
    assert server.attributes["http.response.status_code"] == 200
    assert "clipper.default_reason" not in server.attributes
    for name in ("parse", "cache lookup", "queue wait"):
        assert named[name].parent_id == server.span_id, name
    assert named["cache lookup"].attributes["clipper.cache.result"] == "miss"
    batch = named["batch"]
    assert batch.attributes["clipper.batch.size"] == 1
    assert (TRACE_ID, server.span_id) in batch.links
    # Spans nest in time too: the container's predict lies within the round trip.
    rpc = named["rpc predict"]
    skew = 2_000_000  # ns: each process turns its monotonic clock into wall time by itself
    assert rpc.start_ns <= predict.start_ns + skew and predict.end_ns <= rpc.end_ns + skew

    (default_span,) = [
        s for s in spans if s.trace_id == DEFAULT_TRACE_ID and s.name.startswith("POST")
    ]
    assert default_span.attributes["clipper.default_reason"] == "no_model"
    assert default_span.attributes["clipper.default_count"] == 1
    assert default_span.status_code == 2 and "no_model" in default_span.status_message


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_v2_rest_and_grpc_honour_the_callers_traceparent(
    transport: str, receiver: Receiver, tmp_path: Path
) -> None:
    import grpc

    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc

    fe = TracedFrontend(tmp_path / "state", grpc_transport=transport)
    fe.env = frontend_env(receiver)
    try:
        await fe.start()
        await serve_sums(fe, tmp_path)
        rest_trace, grpc_trace = "1" * 32, "2" * 32
        body = (
            b'{"inputs": [{"name": "input", "datatype": "FP64", "shape": [1, 2], "data": [1, 2]}]}'
        )
        resp = await request(
            f"http://127.0.0.1:{fe.ports.query}/v2/models/sums/infer",
            "POST",
            body,
            headers={
                "Content-Type": "application/json",
                "traceparent": f"00-{rest_trace}-{CALLER_SPAN}-01",
            },
        )
        assert resp.status == 200, resp.body
        infer = pb.ModelInferRequest(model_name="sums")
        tensor = infer.inputs.add(name="input", datatype="FP64", shape=[1, 2])
        tensor.contents.fp64_contents.extend([3.0, 4.0])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fe.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            tp = f"00-{grpc_trace}-{CALLER_SPAN}-01"
            out = await stub.ModelInfer(infer, metadata=(("traceparent", tp),), timeout=10)
        assert list(out.outputs[0].contents.fp64_contents) == [7.0]

        servers = {
            rest_trace: "POST /v2/models/{model}/infer",
            grpc_trace: "inference.GRPCInferenceService/ModelInfer",
        }

        def arrived() -> bool:  # each process exports on its own: wait for both ends
            names = {(s.trace_id, s.name) for s in receiver.snapshot()}
            return all(
                (t, "predict") in names and (t, "rpc predict") in names and (t, server) in names
                for t, server in servers.items()
            )

        await wait_for(arrived, limit_s=30, interval=0.05, what="both traces' container spans")
        for trace_id, server_name in servers.items():
            spans = [s for s in receiver.snapshot() if s.trace_id == trace_id]
            by_id = {s.span_id: s for s in spans}
            (predict,) = [s for s in spans if s.name == "predict"]
            span, chain = predict, []
            while span.parent_id in by_id:
                span = by_id[span.parent_id]
                chain.append(span.name)
            assert chain == ["rpc predict", "batch", server_name], (trace_id, chain)
            assert span.parent_id == CALLER_SPAN
            assert {"parse", "queue wait"} <= {s.name for s in spans}
    finally:
        fe.cleanup()


# -- in one process: pipeline stages and a selection policy, spans to memory -----------------
async def test_pipeline_stages_and_selection_are_child_spans_of_the_request(
    tmp_path: Path,
) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from clipper import Clipper
    from clipper.tracing import Tracer, TraceSettings, hooks
    from tests.integration.pipeline_models import StageModel

    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        exporter = InMemorySpanExporter()
        tracer = Tracer(TraceSettings(True, ratio=1.0), c.clock, exporter=exporter)
        tracer.start()
        hooks.activate(tracer)
        try:
            await asyncio.gather(
                c.deploy_model("feat", "1", StageModel("feat"), input_type="json"),
                c.deploy_model("score", "1", StageModel("score"), input_type="doubles"),
                c.deploy_model("score-too", "1", StageModel("score"), input_type="doubles"),
                c.deploy_model(
                    "idle", "1", StageModel("score"), input_type="doubles", num_replicas=0
                ),
            )
            spec = {
                "stages": [
                    {"name": "feat", "model": "feat"},
                    {"name": "score", "model": "score", "input": "$feat.vec"},
                    # No replica of it runs: its default stands in (degraded).
                    {"name": "extra", "model": "idle", "input": "$feat.vec", "default": 0},
                ],
                "output": {"score": "$score", "extra": "$extra"},
            }
            await c.register_application("chain", "json", "null", 5_000_000, pipeline=spec)
            await c.register_application("vote", "doubles", "-1", 5_000_000, policy="exp4")
            await c.link_model_to_app("vote", "score")
            await c.link_model_to_app("vote", "score-too")
            resp = await request(
                f"{c.query_url}/chain/predict",
                "POST",
                orjson.dumps({"input": {"x": [1, 2]}}),
                headers={"traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01"},
            )
            assert resp.status == 200 and resp.json()["degraded"] == ["extra"], resp.body
            resp = await request(
                f"{c.query_url}/vote/predict",
                "POST",
                b'{"input": [1.0, 4.0]}',
                headers={"traceparent": f"00-{DEFAULT_TRACE_ID}-{CALLER_SPAN}-01"},
            )
            assert resp.status == 200 and resp.json()["default"] is False, resp.body
            assert tracer.flush()
        finally:
            hooks.deactivate(tracer)
            tracer.stop()
    spans: list[Any] = list(exporter.get_finished_spans())
    chain = [s for s in spans if f"{s.context.trace_id:032x}" == TRACE_ID]
    (root,) = [s for s in chain if s.name == "POST /{app}/predict"]
    stages = {s.name: s for s in chain if s.name.startswith("stage ")}
    assert set(stages) == {"stage feat", "stage score", "stage extra"}
    assert all(s.parent.span_id == root.context.span_id for s in stages.values())
    extra = stages["stage extra"]
    assert extra.attributes["clipper.default_reason"] == "no_replica"
    assert extra.status.status_code.name == "ERROR"
    # Each model stage's own queue wait and batch hang below the stage, not the request.
    stage_ids = {s.context.span_id for s in stages.values()}
    batches = [s for s in chain if s.name == "batch"]
    assert len(batches) == 2 and all(b.parent.span_id in stage_ids for b in batches)
    vote = [s for s in spans if f"{s.context.trace_id:032x}" == DEFAULT_TRACE_ID]
    (selection,) = [s for s in vote if s.name == "selection"]
    assert selection.attributes["clipper.policy"] == "exp4"
    assert set(str(selection.attributes["clipper.models"]).split(",")) == {"score", "score-too"}
    assert len([s for s in vote if s.name == "batch"]) == 2  # exp4 asks both models

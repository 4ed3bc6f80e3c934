"""The Open Inference Protocol (KServe V2) gRPC service, ``inference.GRPCInferenceService``.

It serves what the REST API under ``/v2`` serves (:mod:`clipper.frontend.v2`) and with the
same meaning: a V2 model is a clipper-serve application, and ``ModelInfer`` is parsed into the
:class:`~clipper.frontend.v2_request.InferRequest` the REST API parses, validated by the same
code, and answered by :meth:`QueryProcessor.predict_payloads` (latency SLO, selection, cache
and default output all apply). No JSON on the way: the tensors become the application's
inputs, and the processor's predictions become the ModelInferResponse (:func:`encode_response`).
The call awaits a future that the query's reply resolves; it never blocks the loop.

Tensors come in ``contents`` or ``raw_input_contents``; outputs go back as
``raw_output_contents`` when the request's inputs were raw, else as ``contents``. Errors are
gRPC status codes: NOT_FOUND (unknown model, version), INVALID_ARGUMENT (bad tensors),
UNAVAILABLE (shed under overload), RESOURCE_EXHAUSTED (message too large), all rendered
by :func:`abort`. See docs/v2-protocol.md.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import orjson

from clipper.batching.queue import STANDARD
from clipper.errors import BadInputError, RequestError
from clipper.frontend import request_trace, v2
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc
from clipper.frontend.grpc.hpack_blocks import CALL_METADATA, error_metadata
from clipper.frontend.model_failure import model_failure
from clipper.frontend.tenant_sheds import count_answer, count_failure
from clipper.frontend.v2_request import (
    OUTPUT_NAME,
    InferRequest,
    InputTensor,
    check_outputs,
    default_explanations,
    find_app,
    input_payloads,
    output_tensor,
    raw_tensor,
    resolve_version,
    timeout_slo,
)
from clipper.query.prediction import CancellableReply, Prediction, answer_failed
from clipper.tracing import hooks as _trace
from clipper.tracing.tracer import Span, Tracer

if TYPE_CHECKING:
    from clipper.query.runtime import QueryServices
    from clipper.registry import Application
    from clipper.tenants import Admitted, TenantGate

__all__ = [
    "InferReply",
    "V2GrpcServer",
    "abort",
    "encode_response",
    "error_status",
    "parse_infer",
    "submit_infer",
]


# The InferTensorContents field that carries each datatype.
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

# HTTP status of a RequestError or of a query's answer -> gRPC status code.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _code(status: int) -> grpc.StatusCode:
    return _CODES.get(status, grpc.StatusCode.UNKNOWN)


class V2GrpcServer:
    """The V2 gRPC service over a frontend's query services, on ``host:port`` (port 0 picks a free
    port; :attr:`port` is the bound one after :meth:`start`)."""

    def __init__(self, svc: QueryServices, *, host: str, port: int) -> None:
        self.svc = svc
        self.host = host
        self.port = port
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Future[None] | None = None  # a drain's stop, in the background
        self._cut: asyncio.Future[None] | None = None  # abandon(): that stop cut short

    async def start(self) -> None:
        """Bind and serve on the running event loop."""
        if self._server is not None:
            return
        server = grpc.aio.server()
        servicer = Servicer(self.svc)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:  # newer grpcio raises where older ones returned 0
            bound = 0
        if bound == 0:
            # grpcio says only that it could not: almost always a port another process holds.
            raise OSError(errno.EADDRINUSE, f"cannot bind the V2 gRPC service to {address}")
        await server.start()
        self.port = bound
        self._server = server

    def begin_drain(self, grace_s: float = 86_400.0) -> None:
        """Stop taking connections and calls; those in flight get ``grace_s`` seconds to
        finish, then grpc.aio cancels them (a drain's own bound is :meth:`abandon`; grpc.aio's
        None would cancel them at once). grpc.aio does it all in one stop, run here in the
        background; :meth:`owed` says whether it is still under way."""
        server = self._server
        if server is None or self._stopping is not None:
            return
        self._stopping = asyncio.ensure_future(server.stop(grace_s))

    def owed(self) -> int:
        """1 while a drain waits for calls in flight (grpc.aio does not count them), else 0."""
        return int(self._stopping is not None and not self._stopping.done())

    def abandon(self, cause: str) -> int:
        """End the drain now: grpc.aio cancels the calls still in flight (CANCELLED)."""
        server = self._server
        if server is None or not self.owed():
            return 0
        self._cut = asyncio.ensure_future(server.stop(0))
        return 1

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls in flight get ``grace`` seconds to finish (or what a drain
        begun earlier allowed them)."""
        server, self._server = self._server, None
        if server is None:
            return
        begun = [t for t in (self._stopping, self._cut) if t is not None]
        self._stopping = self._cut = None
        # A later stop with a shorter grace cuts an earlier one short (grpc.aio).
        await asyncio.gather(*begun, server.stop(grace))


def error_status(err: RequestError) -> tuple[grpc.StatusCode, str]:
    """The gRPC status of an error: every transport renders V2 gRPC errors through this."""
    return _code(err.status), err.cause


async def abort(context: Any, err: RequestError) -> NoReturn:
    """The gRPC error: every V2 gRPC error of the grpcio transport is rendered here."""
    code, message = error_status(err)
    if err.headers:  # a refused tenant's retry-after and RateLimit fields, as trailing metadata
        metadata = tuple((k.decode(), v.decode()) for k, v in error_metadata(err.headers))
        await context.abort(code, message, metadata)  # raises
    await context.abort(code, message)  # raises
    raise AssertionError("unreachable")


class InferReply(CancellableReply):
    """A ModelInfer call's :class:`~clipper.frontend.prediction.Reply`, shared by both
    transports: :func:`submit_infer` fills in what the response needs, :meth:`answer` builds
    the ModelInferResponse (:func:`encode_response`) and hands it to :meth:`deliver`; an error
    goes to :meth:`fail`. Each transport says how to deliver, and calls :meth:`client_gone`
    when the call is cancelled (its stream reset, its connection lost) before the answer."""

    __slots__ = ("admitted", "app", "gate", "infer", "model", "span", "version")

    def __init__(self) -> None:
        super().__init__()
        self.span: Span | None = None  # a sampled call's server span (clipper.tracing)
        # A call past the tenant gate: its shed inputs are counted for its tenant.
        self.admitted: Admitted | None = None
        self.gate: TenantGate | None = None
        self.model = ""
        self.version = ""
        self.infer: InferRequest | None = None
        self.app: Application | None = None

    def answer(self, predictions: list[Prediction]) -> None:
        assert self.infer is not None
        count_answer(self.gate, self.admitted, predictions)
        failed = model_failure(self.app, predictions, errors_by_default=True)
        if failed is not None:  # a model raised: INTERNAL with its message
            self.fail(failed)
            return
        try:
            response = encode_response(self.model, self.version, self.infer, predictions)
        except Exception as e:
            self.fail(answer_failed("encoding a ModelInferResponse", e))
            return
        self.deliver(response)
        if self.span is not None:
            self.span.set_attribute("rpc.grpc.status_code", 0)
            request_trace.answered(self.span, predictions, None)

    def deliver(self, response: Any) -> None:
        raise NotImplementedError

    def fail(self, err: RequestError) -> None:
        count_failure(self.gate, self.admitted, err)
        self.refuse(err)

    def refuse(self, err: RequestError) -> None:
        """Answer the call with the error (each transport its way)."""
        raise NotImplementedError


def submit_infer(
    svc: QueryServices,
    request: Any,
    reply: InferReply,
    metadata: Mapping[bytes, bytes] | None = None,
) -> None:
    """Parse and validate a ModelInferRequest and hand it to the query processor, which
    answers ``reply`` later (or at once). ``metadata``: the call's :data:`CALL_METADATA`
    entries: ``authorization``, ``x-api-key`` and ``x-priority`` for the tenant gate (judged
    before the parse), ``traceparent`` for the trace context. Raises :class:`RequestError`:
    a bug is INTERNAL with its cause, not UNKNOWN."""
    tracer = _trace.active
    if tracer is not None:
        _submit_traced(tracer, svc, request, reply, metadata)
        return
    _submit(svc, request, reply, metadata)


def _submit_traced(
    tracer: Tracer,
    svc: QueryServices,
    request: Any,
    reply: InferReply,
    metadata: Mapping[bytes, bytes] | None,
) -> None:
    t0 = svc.clock.now()
    attrs = {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "clipper.app": str(request.model_name),
    }
    traceparent = None if metadata is None else metadata.get(b"traceparent")
    span = request_trace.begin(
        tracer, "inference.GRPCInferenceService/ModelInfer", traceparent, t0, attrs
    )
    if span is None:
        _submit(svc, request, reply, metadata)
        return
    reply.span = span
    try:
        request_trace.run_traced(span, _submit, svc, request, reply, metadata, t0)
    except RequestError as e:
        request_trace.failed(span, e)
        raise


def _submit(
    svc: QueryServices,
    request: Any,
    reply: InferReply,
    metadata: Mapping[bytes, bytes] | None,
    t0: float | None = None,
) -> None:
    try:
        app = find_app(svc.catalog.registry, request.model_name)
        rank = STANDARD
        if svc.tenants is not None:
            admitted = svc.tenants.judge(metadata or {}, app.name, app.require_key)
            if admitted is not None:
                rank = admitted.priority
                reply.admitted, reply.gate = admitted, svc.tenants
        infer = parse_infer(request)
        payloads = input_payloads(app, infer.inputs, svc.max_items)
        version = request.model_version or None
        reply.version = resolve_version(svc.catalog.registry, app, version)
        reply.model = app.name
        reply.app = app
        reply.infer = infer
        tracer = _trace.active
        if t0 is None:
            t0 = svc.clock.now()
        elif tracer is not None and reply.span is not None:
            request_trace.parsed(tracer, reply.span, t0)
        svc.processor.predict(app, payloads, version, "", reply, t0, infer.slo_s, rank)
    except RequestError:
        raise
    except Exception as e:
        raise answer_failed("ModelInfer", e) from e


class _Pending(InferReply):
    """grpcio's reply: it resolves the future the call awaits (a cancelled call leaves a
    cancelled future)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        super().__init__()
        self.future = future

    def deliver(self, response: Any) -> None:
        if not self.future.done():
            self.future.set_result(response)

    def refuse(self, err: RequestError) -> None:
        if not self.future.done():
            self.future.set_result(err)
        if self.span is not None:
            request_trace.failed(self.span, err)


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, svc: QueryServices) -> None:
        self.svc = svc

    def _app(self, name: str) -> Application:
        return find_app(self.svc.catalog.registry, name)

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=v2.server_ready(self.svc))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(
            name=v2.SERVER_NAME, version=v2.server_version(), extensions=[]
        )

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            app = self._app(request.name)
        except RequestError as err:
            await abort(context, err)
        ready = v2.model_ready(self.svc, app, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            doc = v2.model_metadata(self.svc, self._app(request.name), request.version or None)
        except RequestError as err:
            await abort(context, err)
        tensors = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=doc["name"],
            versions=doc["versions"],
            platform=doc["platform"],
            inputs=[tensors(**t) for t in doc["inputs"]],
            outputs=[tensors(**t) for t in doc["outputs"]],
        )

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        try:
            doc = v2.model_config(self.svc, self._app(request.name), request.version or None)
        except RequestError as err:
            await abort(context, err)
        config = pb.ModelConfig(
            name=doc["name"],
            platform=doc["platform"],
            backend=doc["backend"],
            max_batch_size=doc["max_batch_size"],
            input=[pb.ModelInput(**t) for t in doc["input"]],
            output=[pb.ModelOutput(**t) for t in doc["output"]],
        )
        if "dynamic_batching" in doc:
            config.dynamic_batching.CopyFrom(pb.ModelDynamicBatching(**doc["dynamic_batching"]))
        return pb.ModelConfigResponse(config=config)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        reply = _Pending(done)
        try:
            submit_infer(self.svc, request, reply, _call_metadata(context))
        except RequestError as err:
            await abort(context, err)
        try:
            result = await done
        except asyncio.CancelledError:
            # grpc.aio cancels the handler when the client cancels the call (RST_STREAM) or
            # its connection goes: the query is abandoned, its inputs leave the queue.
            reply.client_gone()
            raise
        if isinstance(result, RequestError):
            await abort(context, result)
        return result


def _call_metadata(context: Any) -> dict[bytes, bytes]:
    """grpcio's invocation metadata, the entries the tenant gate reads (repeated: joined)."""
    out: dict[bytes, bytes] = {}
    for key, value in context.invocation_metadata() or ():
        name = key.lower().encode() if isinstance(key, str) else bytes(key)
        if name in CALL_METADATA:
            v = value.encode() if isinstance(value, str) else bytes(value)
            out[name] = v if name not in out else out[name] + b"," + v
    return out


def parse_infer(request: Any) -> InferRequest:
    """A ModelInferRequest as the :class:`InferRequest` the REST API parses too. Inputs in
    ``raw_input_contents`` are answered in ``raw_output_contents``, else in ``contents``."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadInputError(
            f"got {len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one "
            "per input, or none and tensor contents"
        )
    inputs: list[InputTensor] = []
    for i, t in enumerate(request.inputs):
        shape = list(t.shape)
        if raw:
            inputs.append(InputTensor(t.name, t.datatype, shape, raw=raw[i]))
            continue
        field = _CONTENTS.get(t.datatype)
        if field is None:
            raise BadInputError(
                f"input '{t.name}': datatype {t.datatype!r} has no tensor contents field; "
                "send it in raw_input_contents"
            )
        # BYTES contents are bytes elements: input_payloads takes them as binary data's.
        inputs.append(InputTensor(t.name, t.datatype, shape, list(getattr(t.contents, field))))
    check_outputs([o.name for o in request.outputs])
    timeout = request.parameters.get("timeout")
    slo_s = None
    if timeout is not None:
        kind = timeout.WhichOneof("parameter_choice")
        slo_s = timeout_slo(getattr(timeout, kind) if kind is not None else None)
    return InferRequest(inputs, request.id or None, binary_output=bool(raw), slo_s=slo_s)


def encode_response(
    model: str, version: str, request: InferRequest, predictions: list[Prediction]
) -> Any:
    """The predictions as a ModelInferResponse: the output tensor in raw_output_contents when
    the request's inputs were raw, else in its contents."""
    response = pb.ModelInferResponse(model_name=model, model_version=version)
    if request.id is not None:
        response.id = request.id
    why = default_explanations(predictions)
    if why is not None:
        response.parameters["default"].bool_param = True
        # A parameter holds one scalar: the list travels as its JSON text.
        response.parameters["default_explanations"].string_param = orjson.dumps(why).decode()
    datatype, shape, flat = output_tensor([p.output for p in predictions])
    tensor = response.outputs.add(name=OUTPUT_NAME, datatype=datatype, shape=shape)
    if request.binary_output:
        response.raw_output_contents.append(raw_tensor(datatype, flat))
    elif datatype == "BYTES":
        tensor.contents.bytes_contents.extend([e.encode() for e in flat])
    else:
        getattr(tensor.contents, _CONTENTS[datatype]).extend(flat)
    return response

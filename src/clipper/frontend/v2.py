"""The Open Inference Protocol (KServe V2) REST API on the query port, under ``/v2``.

A V2 *model* is a clipper-serve *application*: its input type, latency SLO, selection policy,
cache and default output all apply. An ``infer`` request is parsed into the
:class:`~clipper.frontend.v2_request.InferRequest` that the gRPC service parses too, and
answered by :meth:`QueryProcessor.predict_payloads`, the path of ``POST /<app>/predict``
after its JSON. The leading dimension of the (first) input tensor is the batch: shape
``[n, d...]`` is ``n`` queries. Their outputs are stacked back into one output tensor named
``output``. See docs/v2-protocol.md.

Errors are ``{"error": "<cause>"}`` (:func:`error_response`) with the status of the
:class:`RequestError` (400 bad request, 404 unknown application or route, 413 body too large,
503 rejected under overload).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from clipper.batching.queue import STANDARD
from clipper.errors import BadInputError, NotFoundError, RequestError
from clipper.frontend import item_scan, request_trace
from clipper.frontend.fast_input import PRECHECK_BYTES, ItemCounter
from clipper.frontend.http import JSON, Respond, is_owed, watch_client
from clipper.frontend.model_failure import model_failure
from clipper.frontend.parse_pool import OFFLOAD_BYTES, ParsePool
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
    tensor_datatype,
    timeout_slo,
    too_many_rows,
)
from clipper.query.prediction import CancellableReply, Prediction, answer_failed
from clipper.tracing import hooks as _trace
from clipper.tracing.tracer import Span
from clipper.version import __version__

if TYPE_CHECKING:
    from clipper.query.runtime import QueryServices
    from clipper.registry import Application
    from clipper.tenants import Admitted, TenantGate

__all__ = [
    "SERVER_NAME",
    "encode_response",
    "error_response",
    "handle",
    "model_config",
    "model_metadata",
    "model_readiness",
    "model_ready",
    "parse_infer",
    "server_ready",
    "server_version",
    "tensor_datatype",
]

SERVER_NAME = "clipper-serve"
PLATFORM = "clipper-serve"
_EMPTY = b"text/plain"
# A large JSON header's batch dimensions, read before its parse (used on the loop's thread).
_COUNTER = ItemCounter()
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def server_version() -> str:
    return __version__


def error_response(respond: Respond, err: RequestError) -> None:
    """The V2 REST error: every V2 REST error is rendered here (with its header lines: a
    429's Retry-After and RateLimit fields)."""
    if err.headers:
        respond(err.status, orjson.dumps({"error": err.cause}), JSON, err.headers)
    else:
        respond(err.status, orjson.dumps({"error": err.cause}), JSON)


def handle(  # noqa: PLR0917 (the router's signature)
    svc: QueryServices,
    method: bytes,
    path: str,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
    *,
    t0: float | None = None,
    pool: ParsePool | None = None,
) -> None:
    """Serve one request whose path is ``/v2`` or starts with ``/v2/``; answers every error
    itself as ``{"error": ...}`` (it never raises :class:`RequestError`). ``t0``: when the
    request's first byte was read (default: now); an infer's deadline counts from it.
    ``pool``: where an infer body over :data:`OFFLOAD_BYTES` has its rows counted."""
    try:
        _route(svc, method, path, headers, body, respond, t0, pool)
    except RequestError as err:
        error_response(respond, err)
    except Exception as e:  # the V2 error form, not the HTTP layer's text
        error_response(respond, answer_failed(f"serving {method.decode()} {path}", e))


def _route(  # noqa: PLR0917
    svc: QueryServices,
    method: bytes,
    path: str,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
    t0: float | None = None,
    pool: ParsePool | None = None,
) -> None:
    parts = [p for p in path.split("/") if p][1:]  # drop the leading "v2"
    if method == b"GET":
        if not parts:
            respond(
                200,
                orjson.dumps({"name": SERVER_NAME, "version": server_version(), "extensions": []}),
                JSON,
            )
            return
        if parts == ["health", "live"]:
            respond(200, b"", _EMPTY)
            return
        if parts == ["health", "ready"]:
            respond(200 if server_ready(svc) else 503, b"", _EMPTY)
            return
    if len(parts) >= 2 and parts[0] == "models":
        name = parts[1]
        rest = parts[2:]
        version: str | None = None
        if len(rest) >= 2 and rest[0] == "versions":
            version = rest[1]
            rest = rest[2:]
        if method == b"GET" and not rest:
            doc = model_metadata(svc, find_app(svc.catalog.registry, name), version)
            respond(200, orjson.dumps(doc), JSON)
            return
        if method == b"GET" and rest == ["config"]:
            doc = model_config(svc, find_app(svc.catalog.registry, name), version)
            respond(200, orjson.dumps(doc), JSON)
            return
        if method == b"GET" and rest == ["ready"]:
            doc = model_readiness(svc, find_app(svc.catalog.registry, name), version)
            # The protocol's answer is the status (200: ready, 4xx: not); the body says why.
            respond(200 if doc["ready"] else 400, orjson.dumps(doc), JSON)
            return
        if method == b"POST" and rest == ["infer"]:
            app = find_app(svc.catalog.registry, name)
            admitted = None
            if svc.tenants is not None:  # before the parse and the queue (docs/tenants.md)
                admitted = svc.tenants.judge(headers, app.name, app.require_key)
            if pool is not None and len(body) > OFFLOAD_BYTES:
                _infer_large(pool, svc, app, version, headers, body, respond, t0, admitted)
                return
            _infer(svc, app, version, headers, body, respond, t0, admitted)
            return
    raise NotFoundError(
        f"no route for {method.decode()} {path}; the V2 API serves GET /v2, "
        "GET /v2/health/live, GET /v2/health/ready, GET /v2/models/<m>[/versions/<v>], "
        "GET /v2/models/<m>[/versions/<v>]/ready, GET /v2/models/<m>[/versions/<v>]/config "
        "and POST /v2/models/<m>[/versions/<v>]/infer"
    )


# -- health and metadata ---------------------------------------------------------------------
def server_ready(svc: QueryServices) -> bool:
    """The frontend's readiness rule (the one ``GET /ready`` applies)."""
    return svc.catalog.ready()


def model_ready(svc: QueryServices, app: Application, version: str | None) -> bool:
    """Ready when the application can answer with a prediction (version ``version`` of its
    model, when given): the rule of :meth:`~clipper.runtime.catalog.Catalog.app_reasons`."""
    return svc.catalog.app_ready(app, version)


def model_readiness(svc: QueryServices, app: Application, version: str | None) -> dict[str, Any]:
    """``GET /v2/models/<m>[/versions/<v>]/ready``'s body: KServe's ``{"name", "ready"}``, and
    ``reasons`` (why not, one line each; empty when ready)."""
    reasons = svc.catalog.app_reasons(app, version)
    return {"name": app.name, "ready": not reasons, "reasons": reasons}


def model_metadata(svc: QueryServices, app: Application, version: str | None) -> dict[str, Any]:
    """The V2 model metadata of an application (a V2 model)."""
    model = svc.catalog.single_model(app)
    versions = svc.catalog.versions(model) if model else []
    if version is not None and version not in versions:
        raise NotFoundError(
            f"model '{app.name}' has no version '{version}'; versions: {versions or 'none'}"
        )
    default_type = output_tensor([app.default_value])[0]
    return {
        "name": app.name,
        "versions": versions,
        "platform": PLATFORM,
        "inputs": [
            {"name": "input", "datatype": tensor_datatype(app.input_type), "shape": [-1, -1]}
        ],
        "outputs": [{"name": OUTPUT_NAME, "datatype": default_type, "shape": [-1, -1]}],
    }


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def model_config(svc: QueryServices, app: Application, version: str | None) -> dict[str, Any]:
    """Triton's model configuration extension for an application, in its JSON form: what
    perf_analyzer and Triton's tools read (tensors, max batch size, batching).

    ``max_batch_size`` is the most rows one request may carry: each row is a query of its
    own, so the smaller of the queue capacity and ``max_items_per_request`` (beyond which a
    request gets 413). ``dynamic_batching`` carries the
    batch wait of the model that answers (a single linked model's current version)."""
    meta = model_metadata(svc, app, version)
    config: dict[str, Any] = {
        "name": app.name,
        "platform": PLATFORM,
        "backend": SERVER_NAME,
        "max_batch_size": min(svc.queue_capacity, svc.max_items),
        "input": [
            {"name": t["name"], "data_type": _config_type(t["datatype"]), "dims": [-1]}
            for t in meta["inputs"]
        ],
        "output": [
            {"name": t["name"], "data_type": _config_type(t["datatype"]), "dims": [-1]}
            for t in meta["outputs"]
        ],
    }
    model = svc.catalog.single_model(app)
    mv = svc.catalog.version(model, version) if model else None
    if mv is not None:
        wait = mv.batching.max_wait_micros
        config["dynamic_batching"] = {"max_queue_delay_microseconds": wait}
    return config


# -- infer -------------------------------------------------------------------------------------
def _split(headers: dict[bytes, bytes], body: bytes) -> tuple[bytes, bytes]:
    """The JSON header and the binary data after it."""
    header_len = headers.get(b"inference-header-content-length")
    if header_len is None:
        return body, b""
    if not header_len.isdigit() or int(header_len) > len(body):
        raise BadInputError(
            "Inference-Header-Content-Length must be the length of the JSON header, "
            f"at most the body's {len(body)} bytes"
        )
    return body[: int(header_len)], body[int(header_len) :]


def count_rows(headers: dict[bytes, bytes], body: bytes, max_items: int) -> None:
    """The batch dimension of an infer body's tensors judged without the GIL (safe in any
    thread): 413 over ``max_items``, 400 when the JSON's brackets do not balance."""
    body, _binary = _split(headers, body)
    _refuse_rows(item_scan.v2_rows, body, max_items)


def _refuse_rows(
    count: Callable[[bytes], tuple[str, int] | None], body: bytes, max_items: int
) -> None:
    """413 when ``count`` finds a tensor's batch dimension over ``max_items``; 400 when the
    JSON cannot be scanned."""
    try:
        rows = count(body)
    except ValueError as e:
        raise BadInputError(f"malformed JSON in the infer request: {e}") from None
    if rows is not None and rows[1] > max_items:
        raise too_many_rows(rows[0], rows[1], max_items)


def parse_infer(
    headers: dict[bytes, bytes], body: bytes, max_items: int | None = None
) -> InferRequest:
    """The REST infer request (a JSON header, then binary tensor data when the header
    ``Inference-Header-Content-Length`` says where the JSON ends) as an :class:`InferRequest`.
    With ``max_items``, a JSON header over :data:`PRECHECK_BYTES` whose batch dimension
    exceeds it is refused (413) before it is parsed into Python objects (None: not checked
    here, or counted already by :func:`count_rows`)."""
    body, binary = _split(headers, body)
    if max_items is not None and len(body) > PRECHECK_BYTES:
        _refuse_rows(_COUNTER.v2_rows, body, max_items)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise BadInputError(f"malformed JSON in the infer request: {e}") from None
    if not isinstance(doc, dict):
        raise BadInputError("the infer request must be a JSON object")
    req_id = doc.get("id")
    if req_id is not None and not isinstance(req_id, str):
        raise BadInputError('"id" must be a string')
    params = doc.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise BadInputError('"parameters" must be an object')
    slo_s = timeout_slo((params or {}).get("timeout"))
    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise BadInputError('"outputs" must be an array')
        check_outputs([o.get("name") if isinstance(o, dict) else o for o in outputs])
    return InferRequest(
        _input_tensors(doc.get("inputs"), binary),
        req_id,
        binary_output=_wants_binary(outputs, params),
        slo_s=slo_s,
    )


def _input_tensors(inputs: Any, binary: bytes) -> list[InputTensor]:
    """The JSON tensors, each with its slice of the binary data when it has one."""
    if not isinstance(inputs, list):
        raise BadInputError('"inputs" must be a non-empty array of tensors')
    out: list[InputTensor] = []
    pos = 0
    for tensor in inputs:
        if not isinstance(tensor, dict):
            raise BadInputError("an input tensor must be a JSON object")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise BadInputError('an input tensor needs a string "name"')
        size = _binary_size(tensor, name)
        raw: bytes | None = None
        if size is not None:
            if pos + size > len(binary) or (len(inputs) == 1 and size != len(binary)):
                raise BadInputError(
                    f"input '{name}': binary_data_size is {size} but {len(binary) - pos} "
                    "bytes follow the JSON header"
                )
            raw, pos = binary[pos : pos + size], pos + size
        shape, datatype = tensor.get("shape"), tensor.get("datatype")
        out.append(InputTensor(name, datatype, shape, tensor.get("data"), raw))
    return out


def _binary_size(tensor: dict[str, Any], name: str) -> int | None:
    params = tensor.get("parameters")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise BadInputError(f"input '{name}': \"parameters\" must be an object")
    size = params.get("binary_data_size")
    if size is not None and (type(size) is not int or size < 0):
        raise BadInputError(f"input '{name}': binary_data_size must be a non-negative integer")
    return size


def _wants_binary(outputs: Any, params: dict[str, Any] | None) -> bool:
    """Triton's binary extension: the output as raw bytes after the JSON header, when the
    request asks for it per output or with ``binary_data_output``."""
    if params and params.get("binary_data_output") is True:
        return True
    return isinstance(outputs, list) and any(
        isinstance(o, dict)
        and isinstance(o.get("parameters"), dict)
        and o["parameters"].get("binary_data") is True
        for o in outputs
    )


def _infer(  # noqa: PLR0917
    svc: QueryServices,
    app: Application,
    version: str | None,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
    t0: float | None = None,
    admitted: Admitted | None = None,
) -> None:
    arrived = svc.clock.now() if t0 is None else t0
    rank = STANDARD if admitted is None else admitted.priority
    tracer = _trace.active
    span = None
    if tracer is not None:
        attrs = {
            "http.request.method": "POST",
            "http.route": "/v2/models/{model}/infer",
            "clipper.app": app.name,
        }
        span = request_trace.begin(
            tracer, "POST /v2/models/{model}/infer", headers.get(b"traceparent"), arrived, attrs
        )
    if span is None:
        request = parse_infer(headers, body, svc.max_items)
        payloads = input_payloads(app, request.inputs, svc.max_items)
        model_version = resolve_version(svc.catalog.registry, app, version)
        reply = _V2Reply(respond, app, model_version, request)
        reply.admitted, reply.gate = admitted, svc.tenants
        watch_client(respond, reply)  # a client that leaves first abandons the query
        svc.processor.predict(app, payloads, version, "", reply, arrived, request.slo_s, rank)
        return
    assert tracer is not None
    try:
        request = parse_infer(headers, body, svc.max_items)
        payloads = input_payloads(app, request.inputs, svc.max_items)
        model_version = resolve_version(svc.catalog.registry, app, version)
        request_trace.parsed(tracer, span, arrived)
        traced = _TracedV2Reply(respond, app, model_version, request, span)
        traced.admitted, traced.gate = admitted, svc.tenants
        watch_client(respond, traced)
        request_trace.run_traced(
            span,
            svc.processor.predict,
            app,
            payloads,
            version,
            "",
            traced,
            arrived,
            request.slo_s,
            rank,
        )
    except RequestError as e:
        request_trace.failed(span, e)
        raise


def _infer_large(  # noqa: PLR0917
    pool: ParsePool,
    svc: QueryServices,
    app: Application,
    version: str | None,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
    t0: float | None,
    admitted: Admitted | None = None,
) -> None:
    """:func:`_infer` with the rows counted in the parse pool first (see
    :meth:`~clipper.frontend.routes.QueryRoutes._predict_large`)."""
    arrived = svc.clock.now() if t0 is None else t0
    rank = STANDARD if admitted is None else admitted.priority

    def counted(_: None, err: BaseException | None) -> None:
        if not is_owed(respond):
            return
        if err is None:
            try:
                request = parse_infer(headers, body)
                payloads = input_payloads(app, request.inputs, svc.max_items)
                model_version = resolve_version(svc.catalog.registry, app, version)
            except Exception as e:  # answered below, never left owed
                err = e
        if err is not None:
            error_response(
                respond,
                err
                if isinstance(err, RequestError)
                else answer_failed("parsing a large V2 infer body", err),
            )
            return
        reply = _V2Reply(respond, app, model_version, request)
        reply.admitted, reply.gate = admitted, svc.tenants
        watch_client(respond, reply)
        svc.processor.predict(app, payloads, version, "", reply, arrived, request.slo_s, rank)

    pool.submit(lambda: count_rows(headers, body, svc.max_items), counted)


class _V2Reply(CancellableReply):
    """A REST infer request's :class:`~clipper.frontend.prediction.Reply`."""

    __slots__ = ("admitted", "app", "gate", "model", "request", "respond", "version")

    def __init__(
        self, respond: Respond, app: Application, version: str, request: InferRequest
    ) -> None:
        super().__init__()
        # A request past the tenant gate: its shed inputs are counted for its tenant.
        self.admitted: Admitted | None = None
        self.gate: TenantGate | None = None
        self.respond = respond
        self.app = app
        self.model = app.name
        self.version = version
        self.request = request

    def answer(self, predictions: list[Prediction]) -> None:
        count_answer(self.gate, self.admitted, predictions)
        failed = model_failure(self.app, predictions, errors_by_default=True)
        if failed is not None:  # a model raised: 500 with its message (docs/v2-protocol.md)
            self.fail(failed)
            return
        request = self.request
        try:
            header, raw = encode_response(
                self.model, self.version, request.id, predictions, binary=request.binary_output
            )
        except Exception as e:  # called back by the query: must answer
            self.fail(answer_failed("encoding a V2 infer response", e))
            return
        if raw is None:
            self.respond(200, header, JSON)
        else:
            self.respond(
                200,
                header + raw,
                b"application/octet-stream\r\nInference-Header-Content-Length: %d" % len(header),
            )

    def fail(self, err: RequestError) -> None:
        count_failure(self.gate, self.admitted, err)
        error_response(self.respond, err)


class _TracedV2Reply(request_trace.TracedReply, _V2Reply):
    """A sampled infer request's reply: its answer ends the request's server span."""

    __slots__ = ("span",)

    def __init__(
        self, respond: Respond, app: Application, version: str, request: InferRequest, span: Span
    ) -> None:
        super().__init__(respond, app, version, request)
        self.span = span


# -- answers -----------------------------------------------------------------------------------
def encode_response(
    model: str,
    version: str,
    req_id: str | None,
    predictions: list[Prediction],
    *,
    binary: bool = False,
) -> tuple[bytes, bytes | None]:
    """The V2 REST infer response's JSON, and the output's raw bytes when it goes as binary
    data after the JSON header."""
    datatype, shape, flat = output_tensor([p.output for p in predictions])
    out: dict[str, Any] = {"model_name": model, "model_version": version}
    if req_id is not None:
        out["id"] = req_id
    why = default_explanations(predictions)
    if why is not None:
        out["parameters"] = {"default": True, "default_explanations": why}
    tensor: dict[str, Any] = {"name": OUTPUT_NAME, "datatype": datatype, "shape": shape}
    raw: bytes | None = None
    if binary:
        raw = raw_tensor(datatype, flat)
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = flat
    out["outputs"] = [tensor]
    return orjson.dumps(out, option=_NUMPY), raw

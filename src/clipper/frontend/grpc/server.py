"""The Open Inference Protocol (KServe V2) gRPC service, ``inference.GRPCInferenceService``.

It serves what the REST API under ``/v2`` serves (:mod:`clipper.frontend.v2`) and with the
same meaning, by calling that module's functions: a V2 model is a clipper-serve application,
``ModelInfer`` is turned into the same infer request the REST path parses and answered by
:meth:`QueryProcessor.predict` (latency SLO, selection, cache and default output all apply).
The call awaits a future that the query's respond callback resolves; it never blocks the loop.

Tensors come in ``contents`` or ``raw_input_contents``; outputs go back as
``raw_output_contents`` when the request's inputs were raw, else as ``contents``. Errors are
gRPC status codes: NOT_FOUND (unknown model, version), INVALID_ARGUMENT (bad tensors),
UNAVAILABLE (shed under overload), RESOURCE_EXHAUSTED (message too large). See
docs/v2-protocol.md.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import numpy as np
import orjson

from clipper.errors import BadInputError, RequestError
from clipper.frontend import v2
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc
from clipper.frontend.http import JSON

if TYPE_CHECKING:
    from clipper.registry import Application
    from clipper.server import Clipper

__all__ = ["V2GrpcServer"]

_LEN = struct.Struct("<I")
_HEADER_LEN = b"inference-header-content-length"

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
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def _code(status: int) -> grpc.StatusCode:
    return _CODES.get(status, grpc.StatusCode.UNKNOWN)


class V2GrpcServer:
    """The V2 gRPC service of one :class:`Clipper`, on ``host:port`` (port 0 picks a free
    port; :attr:`port` is the bound one after :meth:`start`)."""

    def __init__(self, clipper: Clipper, *, host: str, port: int) -> None:
        self.clipper = clipper
        self.host = host
        self.port = port
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        """Bind and serve on the running event loop."""
        if self._server is not None:
            return
        server = grpc.aio.server()
        servicer = _Servicer(self.clipper)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        bound = server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot bind the V2 gRPC service to {address}")
        await server.start()
        self.port = bound
        self._server = server

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving; calls in flight get ``grace`` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)


async def _abort(context: Any, err: RequestError) -> NoReturn:
    await context.abort(_code(err.status), err.cause)  # raises
    raise AssertionError("unreachable")


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, clipper: Clipper) -> None:
        self.clipper = clipper

    def _app(self, name: str) -> Application:
        return v2._app(self.clipper, name, self.clipper.registry.apps.get(name))

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=v2._server_ready(self.clipper))

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name=v2.SERVER_NAME, version=v2._version(), extensions=[])

    async def ModelReady(self, request: Any, context: Any) -> Any:
        try:
            app = self._app(request.name)
        except RequestError as err:
            await _abort(context, err)
        ready = v2._model_ready(self.clipper, app, request.version or None)
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        try:
            doc = v2.model_metadata(self.clipper, self._app(request.name), request.version or None)
        except RequestError as err:
            await _abort(context, err)
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
            doc = v2.model_config(self.clipper, self._app(request.name), request.version or None)
        except RequestError as err:
            await _abort(context, err)
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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, bytes]] = loop.create_future()

        def respond(status: int, data: bytes, content_type: bytes = JSON, /) -> None:
            if not done.done():  # a cancelled call leaves a cancelled future
                done.set_result((status, data))

        raw = len(request.raw_input_contents) > 0
        try:
            app = self._app(request.model_name)
            headers, body = _as_rest(request)
            v2._infer(self.clipper, app, request.model_version or None, headers, body, respond)
        except RequestError as err:
            await _abort(context, err)
        status, data = await done
        if status != 200:
            cause = orjson.loads(v2._as_v2_error(data))["error"]
            await context.abort(_code(status), cause)
        return _as_response(orjson.loads(data), raw=raw)


def _as_rest(request: Any) -> tuple[dict[bytes, bytes], bytes]:
    """The ModelInferRequest as the REST infer request :func:`v2._infer` parses: headers and
    body (a JSON header, then binary tensor data for raw inputs)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadInputError(
            f"got {len(raw)} raw_input_contents for {len(request.inputs)} inputs; send one "
            "per input, or none and tensor contents"
        )
    inputs = []
    binary = b""
    for i, t in enumerate(request.inputs):
        tensor: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if raw:
            tensor["parameters"] = {"binary_data_size": len(raw[i])}
            binary += raw[i]
        elif t.datatype == "BYTES":
            # BYTES contents travel as binary data: JSON cannot carry arbitrary bytes.
            elems = list(t.contents.bytes_contents)
            blob = b"".join(_LEN.pack(len(e)) + e for e in elems)
            tensor["parameters"] = {"binary_data_size": len(blob)}
            binary += blob
        else:
            field = _CONTENTS.get(t.datatype)
            if field is None:
                raise BadInputError(
                    f"input '{t.name}': datatype {t.datatype!r} has no tensor contents field; "
                    "send it in raw_input_contents"
                )
            tensor["data"] = list(getattr(t.contents, field))
        inputs.append(tensor)
    doc: dict[str, Any] = {"inputs": inputs}
    if request.id:
        doc["id"] = request.id
    if request.outputs:
        doc["outputs"] = [{"name": o.name} for o in request.outputs]
    header = orjson.dumps(doc)
    if not binary:
        return {}, header
    return {_HEADER_LEN: str(len(header)).encode()}, header + binary


def _as_response(doc: dict[str, Any], *, raw: bool) -> Any:
    """The REST infer response as a ModelInferResponse."""
    response = pb.ModelInferResponse(
        model_name=doc["model_name"], model_version=doc.get("model_version") or ""
    )
    if "id" in doc:
        response.id = doc["id"]
    params = doc.get("parameters") or {}
    if params.get("default"):
        response.parameters["default"].bool_param = True
        response.parameters["default_explanations"].string_param = orjson.dumps(
            params.get("default_explanations")
        ).decode()
    for out in doc["outputs"]:
        datatype, data = out["datatype"], out["data"]
        tensor = response.outputs.add(name=out["name"], datatype=datatype, shape=out["shape"])
        if datatype == "BYTES":
            elems = [e.encode() if isinstance(e, str) else e for e in data]
            if raw:
                response.raw_output_contents.append(b"".join(_LEN.pack(len(e)) + e for e in elems))
            else:
                tensor.contents.bytes_contents.extend(elems)
        elif raw:
            blob = np.asarray(data, dtype=v2._NP_DTYPES[datatype]).tobytes()
            response.raw_output_contents.append(blob)
        else:
            getattr(tensor.contents, _CONTENTS[datatype]).extend(data)
    return response

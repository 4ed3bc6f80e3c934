"""The Open Inference Protocol (KServe V2) REST API on the query port, under ``/v2``.

A V2 *model* is a clipper-serve *application*: its input type, latency SLO, selection policy,
cache and default output all apply, because an ``infer`` request is turned into the
equivalent ``{"input_batch": [...]}`` body and answered by :meth:`QueryProcessor.predict`,
the same path as ``POST /<app>/predict``. The leading dimension of the (first) input tensor
is the batch: shape ``[n, d...]`` is ``n`` queries. Their outputs are stacked back into one
output tensor named ``output``. See docs/v2-protocol.md.

Errors are ``{"error": "<cause>"}`` with the status of the :class:`RequestError` (400 bad
request, 404 unknown application or route, 413 body too large, 503 rejected under overload).
"""

from __future__ import annotations

import base64
import math
import struct
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from clipper.errors import BadInputError, NotFoundError, RequestError
from clipper.frontend.http import JSON, Respond
from clipper.inputs import InputType, parse_input

if TYPE_CHECKING:
    from clipper.registry import Application
    from clipper.server import Clipper

__all__ = ["SERVER_NAME", "handle", "model_config", "model_metadata", "tensor_datatype"]

SERVER_NAME = "clipper-serve"
PLATFORM = "clipper-serve"
OUTPUT_NAME = "output"
_EMPTY = b"text/plain"

_INT_TYPES = frozenset(("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"))
_FP_TYPES = frozenset(("FP16", "FP32", "FP64"))
_ALL_TYPES = _INT_TYPES | _FP_TYPES | {"BOOL", "BYTES", "BF16"}

# The datatypes an application of each input type accepts in an infer request.
# BOOL elements are 0 and 1; BF16 (binary only: JSON carries plain numbers) widens to FP32.
_ACCEPTS: dict[InputType, frozenset[str]] = {
    InputType.INTS: _INT_TYPES | {"BOOL"},
    InputType.FLOATS: _INT_TYPES | _FP_TYPES | {"BOOL", "BF16"},
    InputType.DOUBLES: _INT_TYPES | _FP_TYPES | {"BOOL", "BF16"},
    InputType.STRINGS: frozenset(("BYTES",)),
    InputType.BYTES: frozenset(("BYTES",)),
    InputType.JSON: frozenset(("BYTES",)),
}

_DATATYPE = {
    InputType.DOUBLES: "FP64",
    InputType.FLOATS: "FP32",
    InputType.INTS: "INT32",
    InputType.STRINGS: "BYTES",
    InputType.BYTES: "BYTES",
    InputType.JSON: "BYTES",
}


# Little-endian element layouts of binary tensor data.
_NP_DTYPES = {
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP16": "<f2",
    "FP32": "<f4",
    "FP64": "<f8",
    "BOOL": "?",
    "BF16": "<u2",  # the upper half of an FP32: widened in _binary_payloads
}
_LEN = struct.Struct("<I")


def tensor_datatype(t: InputType) -> str:
    """The V2 datatype that model metadata advertises for an application's input type."""
    return _DATATYPE[t]


def _version() -> str:
    import clipper  # imported late: the package imports this module's importers

    return str(clipper.__version__)


def _error(respond: Respond, status: int, cause: str) -> None:
    respond(status, orjson.dumps({"error": cause}), JSON)


def handle(  # noqa: PLR0917 (the router's signature)
    clipper: Clipper,
    method: bytes,
    path: str,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
) -> None:
    """Serve one request whose path is ``/v2`` or starts with ``/v2/``; answers every error
    itself as ``{"error": ...}`` (it never raises :class:`RequestError`)."""
    try:
        _route(clipper, method, path, headers, body, respond)
    except RequestError as err:
        _error(respond, err.status, err.cause)


def _route(  # noqa: PLR0917
    clipper: Clipper,
    method: bytes,
    path: str,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
) -> None:
    parts = [p for p in path.split("/") if p][1:]  # drop the leading "v2"
    if method == b"GET":
        if not parts:
            respond(
                200,
                orjson.dumps({"name": SERVER_NAME, "version": _version(), "extensions": []}),
                JSON,
            )
            return
        if parts == ["health", "live"]:
            respond(200, b"", _EMPTY)
            return
        if parts == ["health", "ready"]:
            respond(200 if _server_ready(clipper) else 503, b"", _EMPTY)
            return
    if len(parts) >= 2 and parts[0] == "models":
        name = parts[1]
        rest = parts[2:]
        version: str | None = None
        if len(rest) >= 2 and rest[0] == "versions":
            version = rest[1]
            rest = rest[2:]
        app = clipper.registry.apps.get(name)
        if method == b"GET" and not rest:
            doc = model_metadata(clipper, _app(clipper, name, app), version)
            respond(200, orjson.dumps(doc), JSON)
            return
        if method == b"GET" and rest == ["config"]:
            doc = model_config(clipper, _app(clipper, name, app), version)
            respond(200, orjson.dumps(doc), JSON)
            return
        if method == b"GET" and rest == ["ready"]:
            ready = _model_ready(clipper, _app(clipper, name, app), version)
            respond(200 if ready else 400, b"", _EMPTY)
            return
        if method == b"POST" and rest == ["infer"]:
            _infer(clipper, _app(clipper, name, app), version, headers, body, respond)
            return
    raise NotFoundError(
        f"no route for {method.decode()} {path}; the V2 API serves GET /v2, "
        "GET /v2/health/live, GET /v2/health/ready, GET /v2/models/<m>[/versions/<v>], "
        "GET /v2/models/<m>[/versions/<v>]/ready, GET /v2/models/<m>[/versions/<v>]/config "
        "and POST /v2/models/<m>[/versions/<v>]/infer"
    )


def _app(clipper: Clipper, name: str, app: Application | None) -> Application:
    if app is None:
        raise NotFoundError(
            f"unknown model '{name}': a V2 model is a clipper-serve application; "
            f"registered applications: {sorted(clipper.registry.apps) or 'none'}"
        )
    return app


# -- health and metadata ---------------------------------------------------------------------
def _live(clipper: Clipper, model: str, version: str | None) -> bool:
    sched = clipper.schedulers.get((model, version or ""))
    return sched is not None and bool(sched.replicas)


def _server_ready(clipper: Clipper) -> bool:
    """Ready when every linked model version that should have replicas has one alive (the
    rule of ``GET /ready``)."""
    reg = clipper.registry
    for names in reg.links.values():
        for name in names:
            version = reg.current.get(name)
            mv = reg.models.get(name, {}).get(version or "")
            if mv is not None and mv.num_replicas and not _live(clipper, name, version):
                return False
    return True


def _model_ready(clipper: Clipper, app: Application, version: str | None) -> bool:
    """Ready when a linked model (the requested version of it) has a replica alive."""
    reg = clipper.registry
    for name in reg.links.get(app.name) or []:
        v = version if version is not None else reg.current.get(name)
        if v is not None and _live(clipper, name, v):
            return True
    return False


def _single_model(clipper: Clipper, app: Application) -> str | None:
    linked = clipper.registry.links.get(app.name) or []
    return linked[0] if len(linked) == 1 else None


def model_metadata(clipper: Clipper, app: Application, version: str | None) -> dict[str, Any]:
    """The V2 model metadata of an application (a V2 model)."""
    model = _single_model(clipper, app)
    versions = sorted(clipper.registry.models.get(model, {})) if model else []
    if version is not None and version not in versions:
        raise NotFoundError(
            f"model '{app.name}' has no version '{version}'; versions: {versions or 'none'}"
        )
    default_type = _output_tensor([app.default_value])[0]
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


def model_config(clipper: Clipper, app: Application, version: str | None) -> dict[str, Any]:
    """Triton's model configuration extension for an application, in its JSON form: what
    perf_analyzer and Triton's tools read (tensors, max batch size, batching).

    ``max_batch_size`` is the queue capacity: each row of a request is a query of its own,
    so that is the most rows one request can have queued. ``dynamic_batching`` carries the
    batch wait of the model that answers (a single linked model's current version)."""
    meta = model_metadata(clipper, app, version)
    config: dict[str, Any] = {
        "name": app.name,
        "platform": PLATFORM,
        "backend": SERVER_NAME,
        "max_batch_size": clipper.config.queue_capacity,
        "input": [
            {"name": t["name"], "data_type": _config_type(t["datatype"]), "dims": [-1]}
            for t in meta["inputs"]
        ],
        "output": [
            {"name": t["name"], "data_type": _config_type(t["datatype"]), "dims": [-1]}
            for t in meta["outputs"]
        ],
    }
    model = _single_model(clipper, app)
    v = version if version is not None else (clipper.registry.current.get(model) if model else None)
    mv = clipper.registry.models.get(model, {}).get(v) if model and v else None
    if mv is not None:
        wait = mv.batching.max_wait_micros
        config["dynamic_batching"] = {"max_queue_delay_microseconds": wait}
    return config


# -- infer -------------------------------------------------------------------------------------
def _infer(  # noqa: PLR0917
    clipper: Clipper,
    app: Application,
    version: str | None,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
) -> None:
    binary = b""
    header_len = headers.get(b"inference-header-content-length")
    if header_len is not None:
        if not header_len.isdigit() or int(header_len) > len(body):
            raise BadInputError(
                "Inference-Header-Content-Length must be the length of the JSON header, "
                f"at most the body's {len(body)} bytes"
            )
        body, binary = body[: int(header_len)], body[int(header_len) :]
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
    slo_s: float | None = None
    timeout = (params or {}).get("timeout")
    if timeout is not None:
        # The protocol's request timeout, in microseconds: it narrows the application's SLO.
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise BadInputError('parameter "timeout" must be a positive integer (microseconds)')
        slo_s = timeout / 1e6
    _check_outputs(doc.get("outputs"))
    payloads = _payloads(app, doc.get("inputs"), binary)
    model = _single_model(clipper, app)
    if version is not None:
        if model is not None and version not in clipper.registry.models.get(model, {}):
            raise NotFoundError(f"model '{app.name}' has no version '{version}'")
        model_version = version
    else:
        model_version = clipper.registry.current.get(model, "") if model else ""

    binary_out = _wants_binary(doc.get("outputs"), params)

    def answer(status: int, data: bytes) -> None:
        if status != 200:
            respond(status, _as_v2_error(data), JSON)
            return
        header, raw = _render(app.name, model_version, req_id, data, binary=binary_out)
        if raw is None:
            respond(200, header, JSON)
        else:
            respond(
                200,
                header + raw,
                b"application/octet-stream\r\nInference-Header-Content-Length: %d" % len(header),
            )

    processor = clipper.processor
    processor.predict_payloads(app, payloads, version, "", answer, processor.clock.now(), slo_s)


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


def _check_outputs(outputs: Any) -> None:
    if outputs is None:
        return
    if not isinstance(outputs, list):
        raise BadInputError('"outputs" must be an array')
    for out in outputs:
        if not isinstance(out, dict) or out.get("name") != OUTPUT_NAME:
            name = out.get("name") if isinstance(out, dict) else out
            raise BadInputError(
                f"unknown output {name!r}: the only output tensor is '{OUTPUT_NAME}'"
            )


def _payloads(app: Application, inputs: Any, binary: bytes) -> list[bytes]:
    """The first input tensor as the query's inputs, one per element of its first dimension,
    in the application's wire form (what :func:`parse_input` makes of a JSON input)."""
    if not isinstance(inputs, list) or not inputs:
        raise BadInputError('"inputs" must be a non-empty array of tensors')
    if len(inputs) > 1:
        raise BadInputError(
            f"got {len(inputs)} input tensors; a clipper-serve application takes one"
        )
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise BadInputError("an input tensor must be a JSON object")
    name = tensor.get("name")
    if not isinstance(name, str):
        raise BadInputError('an input tensor needs a string "name"')
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not shape or any(type(d) is not int or d < 0 for d in shape):
        raise BadInputError(
            f"input '{name}': \"shape\" must be a non-empty array of non-negative integers "
            "whose first dimension is the batch"
        )
    n = shape[0]
    if n == 0:
        raise BadInputError(f"input '{name}': the batch dimension is 0")
    datatype = tensor.get("datatype")
    if datatype not in _ALL_TYPES:
        raise BadInputError(f"input '{name}': unknown datatype {datatype!r}")
    itype = app.input_type
    if datatype not in _ACCEPTS[itype]:
        raise BadInputError(
            f"input '{name}': datatype {datatype} does not fit application '{app.name}' "
            f"of input type {itype.readable}; send {tensor_datatype(itype)}"
        )
    per_row = math.prod(shape[1:])
    size = _binary_size(tensor, name)
    if size is not None and size != len(binary):
        raise BadInputError(
            f"input '{name}': binary_data_size is {size} but {len(binary)} bytes follow "
            "the JSON header"
        )
    if size is None and "data" not in tensor:
        raise BadInputError(f"input '{name}': no \"data\" and no binary_data_size")
    if datatype != "BYTES" and per_row == 0:
        raise BadInputError(f"input '{name}': a row of shape {shape[1:]} has no elements")
    if size is not None and datatype != "BYTES":
        return _binary_payloads(itype, binary, datatype, n, per_row, name)
    flat = _bytes_elements(binary, name) if size is not None else _flatten(tensor["data"], name)
    if len(flat) != n * per_row:
        raise BadInputError(
            f"input '{name}': shape {shape} needs {n * per_row} elements, got {len(flat)}"
        )
    if datatype == "BYTES":
        return [parse_input(itype, item) for item in _byte_rows(itype, flat, per_row, name)]
    if datatype == "BOOL":
        bad = next((v for v in flat if type(v) is not bool), None)
        if bad is not None:
            raise BadInputError(f"input '{name}': element {bad!r} is not of datatype BOOL")
        flat = [int(v) for v in flat]
    else:
        is_int = datatype in _INT_TYPES
        for v in flat:
            t = type(v)
            if t is not int and (is_int or t is not float):
                raise BadInputError(f"input '{name}': element {v!r} is not of datatype {datatype}")
    return [
        parse_input(itype, flat[i * per_row : (i + 1) * per_row], may_hold_bools=False)
        for i in range(n)
    ]


def _binary_payloads(  # noqa: PLR0917
    itype: InputType, raw: bytes, datatype: str, n: int, per_row: int, name: str
) -> list[bytes]:
    """Rows of a binary numeric tensor in the application's wire form, without a detour
    through Python numbers: slices of the request when the element types agree, else one
    NumPy conversion (integers range-checked). Non-finite floats pass, as in Triton."""
    dtype = np.dtype(_NP_DTYPES[datatype])
    count = n * per_row
    if len(raw) != count * dtype.itemsize:
        raise BadInputError(
            f"input '{name}': {count} elements of {datatype} take {count * dtype.itemsize} "
            f"bytes, got {len(raw)}"
        )
    target = np.dtype(itype.numpy_dtype)
    if datatype == "BF16":
        raw = (np.frombuffer(raw, "<u2").astype("<u4") << 16).tobytes()
        dtype = np.dtype("<f4")
    if dtype != target:
        arr = np.frombuffer(raw, dtype)
        if target.kind == "i":
            info = np.iinfo(target)
            if arr.size and (int(arr.min()) < info.min or int(arr.max()) > info.max):
                raise BadInputError(
                    f"input '{name}': {datatype} element out of range for 32-bit integers"
                )
        raw = arr.astype(target).tobytes()
    step = per_row * target.itemsize
    return [raw[i * step : (i + 1) * step] for i in range(n)]


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


def _bytes_elements(raw: bytes, name: str) -> list[Any]:
    """Binary BYTES tensor data: each element a 4-byte little-endian length and its bytes.
    (Numeric binary data never becomes Python values: see :func:`_binary_payloads`.)"""
    out: list[Any] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise BadInputError(f"input '{name}': truncated BYTES element length")
        (length,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if pos + length > len(raw):
            raise BadInputError(f"input '{name}': truncated BYTES element")
        out.append(raw[pos : pos + length])
        pos += length
    return out


def _flatten(data: Any, name: str) -> list[Any]:
    if not isinstance(data, list):
        raise BadInputError(f"input '{name}': \"data\" must be an array")
    if not any(type(v) is list for v in data):
        return data
    out: list[Any] = []
    stack: list[Any] = [iter(data)]
    while stack:
        for v in stack[-1]:
            if type(v) is list:
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def _byte_rows(itype: InputType, flat: list[Any], per_row: int, name: str) -> list[Any]:
    if per_row != 1:
        raise BadInputError(
            f"input '{name}': a {itype.readable} application takes one BYTES element per "
            "row; use shape [n] or [n, 1]"
        )
    for v in flat:
        if type(v) is not str and type(v) is not bytes:  # bytes: from binary data
            raise BadInputError(f"input '{name}': BYTES element {v!r} is not a string")
    if itype is InputType.BYTES:
        return [base64.b64encode(v if type(v) is bytes else v.encode()).decode() for v in flat]
    rows = []
    for v in flat:
        try:
            if itype is InputType.STRINGS:
                rows.append(v if type(v) is str else v.decode())
            else:
                rows.append(orjson.loads(v))
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            kind = "UTF-8" if itype is InputType.STRINGS else "JSON text"
            raise BadInputError(
                f"input '{name}': a {itype.readable} application takes BYTES elements that "
                f"are {kind}; {v[:40]!r} is not"
            ) from None
    return rows


# -- answers -----------------------------------------------------------------------------------
def _as_v2_error(data: bytes) -> bytes:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return orjson.dumps({"error": data.decode("utf-8", "replace")})
    if isinstance(doc, dict):
        cause = doc.get("cause") or doc.get("error") or "request failed"
        return orjson.dumps({"error": str(cause)})
    return orjson.dumps({"error": str(doc)})


def _render(
    app: str, version: str, req_id: str | None, data: bytes, *, binary: bool = False
) -> tuple[bytes, bytes | None]:
    """The V2 response's JSON, and the output's raw bytes when it goes as binary data."""
    doc = orjson.loads(data)
    preds: list[dict[str, Any]] = doc.get("batch_predictions", [doc])
    outputs = [p.get("output") for p in preds]
    datatype, shape, flat = _output_tensor(outputs)
    out: dict[str, Any] = {"model_name": app, "model_version": version}
    if req_id is not None:
        out["id"] = req_id
    if any(p.get("default") for p in preds):
        out["parameters"] = {
            "default": True,
            "default_explanations": [
                p.get("default_explanation") if p.get("default") else None for p in preds
            ],
        }
    tensor: dict[str, Any] = {"name": OUTPUT_NAME, "datatype": datatype, "shape": shape}
    raw: bytes | None = None
    if binary:
        raw = _raw_tensor(datatype, flat)
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = flat
    out["outputs"] = [tensor]
    return orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY), raw


def _raw_tensor(datatype: str, flat: list[Any]) -> bytes:
    """Little-endian elements; BYTES elements as a 4-byte length and the bytes (Triton's)."""
    if datatype == "INT64":
        return np.asarray(flat, dtype="<i8").tobytes()
    if datatype == "FP64":
        return np.asarray(flat, dtype="<f8").tobytes()
    parts = []
    for text in flat:
        b = text.encode()
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_num(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _output_tensor(outputs: list[Any]) -> tuple[str, list[int], list[Any]]:
    """(datatype, shape, flat data) of the rows' outputs stacked: scalars as ``[n]``, equal
    length arrays of numbers as ``[n, k]``, anything else as BYTES of each output's JSON."""
    n = len(outputs)
    if all(_is_int(o) for o in outputs):
        return "INT64", [n], outputs
    if all(_is_num(o) for o in outputs):
        return "FP64", [n], outputs
    if all(type(o) is list for o in outputs):
        k = len(outputs[0])
        if k and all(len(o) == k and all(_is_num(v) for v in o) for o in outputs):
            flat = [v for o in outputs for v in o]
            kind = "INT64" if all(_is_int(v) for v in flat) else "FP64"
            return kind, [n, k], flat
    return "BYTES", [n], [orjson.dumps(o).decode() for o in outputs]

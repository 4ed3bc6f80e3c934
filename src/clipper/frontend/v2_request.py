"""The Open Inference Protocol (V2) infer request and response, whatever carried them.

The REST API (:mod:`clipper.frontend.v2`) and the gRPC service
(:mod:`clipper.frontend.grpc.server`) each parse their wire form into one
:class:`InferRequest`; everything after that is here, once: the validation of tensors,
outputs and parameters (with their error messages), the conversion of the input tensor into
the application's inputs, the model version that answers, and the output tensor that each
protocol then encodes from the processor's predictions.

A V2 *model* is a clipper-serve *application*. The leading dimension of the input tensor is
the batch: shape ``[n, d...]`` is ``n`` queries, whose outputs are stacked back into one output
tensor named ``output``.
"""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from clipper.errors import BadInputError, NotFoundError, PayloadTooLarge
from clipper.inputs import InputType, parse_input
from clipper.query.prediction import Prediction

DEFAULT_MAX_ITEMS = 1000  # FrontendConfig.max_items_per_request's default; gRPC's, until passed

if TYPE_CHECKING:
    from clipper.registry import Application, Registry

__all__ = [
    "NP_DTYPES",
    "OUTPUT_NAME",
    "InferRequest",
    "InputTensor",
    "check_outputs",
    "default_explanations",
    "find_app",
    "input_payloads",
    "output_tensor",
    "raw_tensor",
    "resolve_version",
    "single_model",
    "tensor_datatype",
    "timeout_slo",
    "too_many_rows",
]

OUTPUT_NAME = "output"

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
NP_DTYPES = {
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
_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def tensor_datatype(t: InputType) -> str:
    """The V2 datatype that model metadata advertises for an application's input type."""
    return _DATATYPE[t]


@dataclass(frozen=True, slots=True)
class InputTensor:
    """One input tensor as its protocol carried it. Exactly one of ``data`` (JSON ``data``
    or gRPC ``contents``: elements, flat or nested lists) and ``raw`` (binary tensor data:
    the REST binary extension, gRPC ``raw_input_contents``) is set, or neither (an error)."""

    name: str
    datatype: Any  # validated by input_payloads: the JSON form may hold anything
    shape: Any
    data: Any = None
    raw: bytes | None = None


@dataclass(frozen=True, slots=True)
class InferRequest:
    """One parsed infer request, the same for REST and gRPC."""

    inputs: list[InputTensor]
    id: str | None = None
    binary_output: bool = False  # the output as binary data (REST) / raw contents (gRPC)
    slo_s: float | None = None  # the request's timeout, which narrows the application's SLO


# -- shared validation -----------------------------------------------------------------------
def find_app(registry: Registry, name: str) -> Application:
    app = registry.apps.get(name)
    if app is None:
        # Not the list of the others: callers on the query port need not learn them.
        raise NotFoundError(f"unknown model '{name}': a V2 model is a clipper-serve application")
    return app


def single_model(registry: Registry, app: Application) -> str | None:
    linked = registry.links.get(app.name) or []
    return linked[0] if len(linked) == 1 else None


def resolve_version(registry: Registry, app: Application, version: str | None) -> str:
    """The model version that answers (reported in the response): the requested one, which
    must exist, else the current version of the single linked model, else ``""``."""
    model = single_model(registry, app)
    if version is not None:
        if model is not None and version not in registry.models.get(model, {}):
            raise NotFoundError(f"model '{app.name}' has no version '{version}'")
        return version
    return registry.current.get(model, "") if model else ""


def timeout_slo(timeout: Any) -> float | None:
    """The protocol's ``timeout`` parameter, in microseconds, as seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
        raise BadInputError('parameter "timeout" must be a positive integer (microseconds)')
    return timeout / 1e6


def check_outputs(names: list[Any]) -> None:
    """The requested outputs: there is one, ``output``."""
    for name in names:
        if name != OUTPUT_NAME:
            raise BadInputError(
                f"unknown output {name!r}: the only output tensor is '{OUTPUT_NAME}'"
            )


# -- inputs ------------------------------------------------------------------------------------
def too_many_rows(name: str, n: int, max_items: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"input '{name}': the batch dimension (shape[0]) is {n}; at most {max_items} rows "
        "are accepted per request (max_items_per_request): split it into several requests"
    )


def input_payloads(
    app: Application, inputs: list[InputTensor], max_items: int = DEFAULT_MAX_ITEMS
) -> list[bytes]:
    """The input tensor as the query's inputs, one per element of its first dimension, in
    the application's wire form (what :func:`parse_input` makes of a JSON input). A batch
    dimension over ``max_items`` is refused (413) before any element is decoded."""
    if not inputs:
        raise BadInputError('"inputs" must be a non-empty array of tensors')
    if len(inputs) > 1:
        raise BadInputError(
            f"got {len(inputs)} input tensors; a clipper-serve application takes one"
        )
    tensor = inputs[0]
    name, shape, datatype = tensor.name, tensor.shape, tensor.datatype
    if not isinstance(shape, list) or not shape or any(type(d) is not int or d < 0 for d in shape):
        raise BadInputError(
            f"input '{name}': \"shape\" must be a non-empty array of non-negative integers "
            "whose first dimension is the batch"
        )
    n = shape[0]
    if n == 0:
        raise BadInputError(f"input '{name}': the batch dimension is 0")
    if n > max_items:
        raise too_many_rows(name, n, max_items)
    if datatype not in _ALL_TYPES:
        raise BadInputError(f"input '{name}': unknown datatype {datatype!r}")
    itype = app.input_type
    if datatype not in _ACCEPTS[itype]:
        raise BadInputError(
            f"input '{name}': datatype {datatype} does not fit application '{app.name}' "
            f"of input type {itype.readable}; send {tensor_datatype(itype)}"
        )
    per_row = math.prod(shape[1:])
    raw = tensor.raw
    if raw is None and tensor.data is None:
        raise BadInputError(f"input '{name}': no \"data\" and no binary_data_size")
    if datatype != "BYTES" and per_row == 0:
        raise BadInputError(f"input '{name}': a row of shape {shape[1:]} has no elements")
    if raw is not None and datatype != "BYTES":
        return _binary_payloads(itype, raw, datatype, n, per_row, name)
    flat = _bytes_elements(raw, name) if raw is not None else _flatten(tensor.data, name)
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
    dtype = np.dtype(NP_DTYPES[datatype])
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
        if type(v) is not str and type(v) is not bytes:  # bytes: binary data, gRPC contents
            raise BadInputError(f"input '{name}': BYTES element {v!r} is not a string")
    if itype is InputType.BYTES:
        return [base64.b64encode(v if type(v) is bytes else v.encode()).decode() for v in flat]
    rows = []
    for v in flat:
        try:
            if itype is InputType.STRINGS:
                rows.append(v if type(v) is str else v.decode())
            else:
                rows.append(orjson.loads(v))  # a JSON application's BYTES element is JSON text
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            kind = "UTF-8" if itype is InputType.STRINGS else "JSON text"
            raise BadInputError(
                f"input '{name}': a {itype.readable} application takes BYTES elements that "
                f"are {kind}; {v[:40]!r} is not"
            ) from None
    return rows


# -- outputs -----------------------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_num(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _is_bool(v: Any) -> bool:
    return type(v) is bool


_I64 = (-(2**63), 2**63 - 1)
_U64_MAX = 2**64 - 1


def _int_datatype(values: list[int]) -> str | None:
    """INT64 when every value fits it, else UINT64 when every value fits that (a uint64
    output >= 2**63), else None: no integer tensor can carry them exactly."""
    lo, hi = min(values), max(values)
    if lo >= _I64[0] and hi <= _I64[1]:
        return "INT64"
    if lo >= 0 and hi <= _U64_MAX:
        return "UINT64"
    return None


def output_tensor(outputs: list[Any]) -> tuple[str, list[int], list[Any]]:
    """(datatype, shape, flat data) of the rows' outputs stacked: scalars as ``[n]``, equal
    length arrays as ``[n, k]``, typed BOOL (booleans), INT64 or UINT64 (integers, by their
    range) or FP64 (numbers); anything else as BYTES of each output's JSON."""
    n = len(outputs)
    shape = [n]
    flat = outputs
    if all(type(o) is list for o in outputs):
        k = len(outputs[0])
        if k and all(len(o) == k for o in outputs):
            shape = [n, k]
            flat = [v for o in outputs for v in o]
    if flat is outputs or all(type(v) is not list for v in flat):
        if all(_is_bool(v) for v in flat):
            return "BOOL", shape, flat
        if all(_is_int(v) for v in flat):
            kind = _int_datatype(flat)
            if kind is not None:
                return kind, shape, flat
        elif all(_is_num(v) for v in flat):
            return "FP64", shape, flat
    if any(isinstance(o, np.generic | np.ndarray) for o in outputs):
        # A policy's combination may be a NumPy value: as the Python value it stands for.
        return output_tensor(
            [o.tolist() if isinstance(o, np.generic | np.ndarray) else o for o in outputs]
        )
    return "BYTES", [n], [orjson.dumps(o, option=_NUMPY).decode() for o in outputs]


def raw_tensor(datatype: str, flat: list[Any]) -> bytes:
    """Little-endian elements; BYTES elements as a 4-byte length and the bytes (Triton's)."""
    if datatype != "BYTES":
        return np.asarray(flat, dtype=NP_DTYPES[datatype]).tobytes()
    parts = []
    for text in flat:
        b = text.encode()
        parts.append(_LEN.pack(len(b)) + b)
    return b"".join(parts)


def default_explanations(predictions: list[Prediction]) -> list[str | None] | None:
    """Per row, why the default output answered it (None for rows a model answered); None
    when no row is a default."""
    if not any(p.reason is not None for p in predictions):
        return None
    return [p.explanation if p.reason is not None else None for p in predictions]

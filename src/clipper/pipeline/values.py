"""The values a pipeline's stages pass each other: an input's wire form back as the JSON value
it came from, and a stage's input expression evaluated against the outputs so far.

Pure data, no runtime: the pipeline runner (:mod:`clipper.query.pipeline`) calls these per stage.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson

from clipper.errors import BadInputError
from clipper.inputs import InputType
from clipper.pipeline.spec import Const, Ref

__all__ = ["DROPPED", "decode_payload", "plain", "resolve"]

# An optional stage that was left out: null in a list, its key absent from an object.
DROPPED: Any = type("Dropped", (), {"__repr__": lambda self: "DROPPED"})()


def decode_payload(itype: InputType, payload: bytes) -> Any:
    """An input in its wire form (:func:`parse_input`'s result) as the JSON value it came from
    (``bytes`` as base64 text, as a request carries it)."""
    if itype is InputType.JSON:
        return orjson.loads(payload)
    if itype is InputType.STRINGS:
        return payload.decode("utf-8", "replace")
    if itype is InputType.BYTES:
        return base64.b64encode(payload).decode()
    return np.frombuffer(payload, dtype=itype.numpy_dtype).tolist()


def _field(value: Any, ref: Ref) -> Any:
    for i, key in enumerate(ref.path):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif (
            isinstance(value, list)
            and key.lstrip("-").isdigit()
            and -len(value) <= int(key) < len(value)
        ):
            value = value[int(key)]
        else:
            where = "$" + ".".join((ref.source, *ref.path[:i])) if i else f"${ref.source}"
            kind = type(value).__name__ if value is not None else "null"
            raise BadInputError(f"{ref} does not exist: {where} is {kind} without '{key}'")
    return value


def resolve(expr: Any, env: dict[str, Any]) -> Any:
    """The value of a compiled expression; a dropped stage's output is null in a list and
    leaves its key out of an object. Raises :class:`BadInputError` for a reference to a
    field (or list index) the value lacks."""
    kind = type(expr)
    if kind is Const:
        return expr.value
    if kind is Ref:
        value = env[expr.source]
        return value if value is DROPPED else _field(value, expr)
    if kind is list:
        return [None if v is DROPPED else v for v in (resolve(e, env) for e in expr)]
    out = {k: resolve(e, env) for k, e in expr.items()}
    return {k: v for k, v in out.items() if v is not DROPPED}


def plain(value: Any) -> Any:
    """A replica's output as plain Python (NumPy values become lists and numbers)."""
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value

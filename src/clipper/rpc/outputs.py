"""What a replica may answer: JSON values, finite numbers, at most so many bytes per output.

A model's output is served to clients as JSON. Three kinds of output cannot be, and each is a
model error for its own input (the query answered with the application's default and the
reason, or a V2 error), never a silently changed value:

* a NaN or an infinity anywhere in it: JSON has no such number, and the encoder would send
  ``null``, a value the model never returned, marked as a real answer;
* an object that is not JSON (an arbitrary Python object): its ``str``/``repr`` used to be
  served, which can leak addresses and internals;
* more than ``max_output_bytes`` of encoded JSON (:data:`DEFAULT_MAX_OUTPUT_BYTES`): one output
  must not fill the cache, the frontend's memory and a client's socket with what a bug or a
  hostile input made.

The container checks the first two before it encodes (they cannot be seen after: NaN is
encoded as ``null``) and answers the inputs concerned with an error each; the frontend checks the
size (its limit, so a replica cannot raise it) and replaces such an output with an
:class:`OutputRefused`, which the model's scheduler answers as a model error for that input only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

__all__ = [
    "DEFAULT_MAX_OUTPUT_BYTES",
    "OutputRefused",
    "non_finite",
    "oversized",
    "unservable",
]

DEFAULT_MAX_OUTPUT_BYTES = 2**20
# orjson refuses nesting deeper than 254; a walk deeper than that would only meet a cycle.
_MAX_DEPTH = 256


@dataclass(frozen=True, slots=True)
class OutputRefused:
    """In place of an output the frontend will not serve; ``reason`` says why."""

    reason: str


def non_finite(value: Any, depth: int = 0) -> str | None:
    """``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` when ``value`` holds one, else None."""
    if isinstance(value, float | np.floating):
        return None if math.isfinite(value) else _name(float(value))
    if depth > _MAX_DEPTH:
        return None  # a cycle: the encoder refuses it as not JSON
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            finite = np.isfinite(value)
            return None if finite.all() else _name(float(value[~finite].ravel()[0]))
        if value.dtype.kind != "O":
            return None
        value = value.tolist()
    if isinstance(value, list | tuple):
        for item in value:
            found = non_finite(item, depth + 1)
            if found is not None:
                return found
    elif isinstance(value, dict):
        for item in value.values():
            found = non_finite(item, depth + 1)
            if found is not None:
                return found
    return None


def _name(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def unservable(outputs: Sequence[Any], encode: Any) -> dict[int, str]:
    """The outputs that cannot be served, by index, with the reason: each one is encoded alone
    with ``encode`` (the container's JSON encoder) and searched for NaN and infinities. Only
    called when the batch as a whole failed to encode or its encoding holds a ``null``."""
    problems: dict[int, str] = {}
    for i, out in enumerate(outputs):
        try:
            encode(out)
        except (orjson.JSONEncodeError, TypeError) as e:
            problems[i] = f"output is not JSON: {e}"
            continue
        bad = non_finite(out)
        if bad is not None:
            problems[i] = f"output contains {bad} (JSON has no such number)"
    return problems


def oversized(outputs: list[Any], raw: Sequence[int] | None, max_bytes: int) -> int:
    """Replace each output larger than ``max_bytes`` (encoded) with an :class:`OutputRefused`;
    returns how many were. ``raw``: each output's size on the wire when known (v3 frames),
    else each is measured by encoding it."""
    refused = 0
    for i, out in enumerate(outputs):
        size = raw[i] if raw is not None else len(orjson.dumps(out))
        if size > max_bytes:
            outputs[i] = OutputRefused(
                f"output is {size} bytes, over the limit of {max_bytes} bytes per output "
                "(max_output_bytes)"
            )
            refused += 1
    return refused

"""The common prediction body, ``{"input": [number, ...]}`` for a doubles application, read
straight into the little-endian doubles the replicas receive, without a Python float per
element.

Decoding 784 doubles through ``orjson`` makes 784 Python floats, ``struct`` packs them, and
freeing them costs as much again: together about 40% of the frontend's time per query in the
no-op benchmark. simdjson parses the body and copies the array out as doubles in half the
time. Anything unusual (another key besides ``version`` and ``uid``, a nested array, a
non-number, an empty array, a number out of range, invalid JSON) returns None and the caller
takes the general path, which gives the exact errors; so answers and errors never depend on
which path read the body.

:class:`ItemCounter` judges a large body before it is parsed into Python objects: simdjson's
parse builds a tape in C (about 10x faster than ``orjson.loads`` building a million objects)
on which an array's length is one read, so an ``input_batch`` (or a V2 batch dimension) over
the item cap is refused without the full parse that used to take half a second.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["PRECHECK_BYTES", "DoublesReader", "ItemCounter"]

# Bodies up to this size are parsed whole as before (orjson: a few milliseconds at most);
# larger ones are first counted on simdjson's tape.
PRECHECK_BYTES = 64 * 1024

_KEYS = frozenset(("input", "version", "uid"))


def _new_parser() -> Any:
    """A simdjson parser, or None without simdjson or on a big-endian machine (the wire
    carries little-endian doubles)."""
    if sys.byteorder != "little":
        return None
    try:
        import simdjson
    except ImportError:  # pragma: no cover - a core dependency; the general path without it
        return None
    return simdjson.Parser()


class DoublesReader:
    """One parser for the event loop's thread (simdjson parsers are not shared across
    threads, and each parse invalidates the previous document: results are copied out)."""

    __slots__ = ("_parser",)

    def __init__(self) -> None:
        self._parser: Any = _new_parser()

    @property
    def available(self) -> bool:
        return self._parser is not None

    def read(self, body: bytes) -> tuple[bytes, Any, Any] | None:
        """``(payload, version, uid)`` for a one-input doubles body, else None (``version``
        a string or None, ``uid`` a string, an integer or None)."""
        # One array in the body: no input_batch, no nested arrays, no array-valued uid.
        # (Two memchr scans; bytes.count is 20x slower on a 15 KB body.)
        first = body.find(b"[")
        if self._parser is None or first < 0 or body.find(b"[", first + 1) >= 0:
            return None
        try:
            return _read(self._parser.parse(body))
        except (ValueError, TypeError, AttributeError, KeyError):
            return None
        except RuntimeError:  # a document still referenced: never, but never stuck either
            self._parser = _new_parser()
            return None


def _read(doc: Any) -> tuple[bytes, Any, Any] | None:
    # In a function of its own: the document's references die with its frame, before the
    # parser's next parse (which refuses to run while any is alive).
    keys = list(doc.keys())
    if "input" not in keys or len(keys) != len(set(keys)) or not _KEYS.issuperset(keys):
        return None
    # Lookups of absent keys cost microseconds (an exception inside): only present ones.
    version = doc["version"] if "version" in keys else None
    uid = doc["uid"] if "uid" in keys else None
    if not (version is None or type(version) is str):
        return None
    if not (uid is None or type(uid) is str or type(uid) is int):
        return None
    array = doc["input"]
    if not len(array):
        return None
    return bytes(array.as_buffer(of_type="d")), version, uid


class ItemCounter:
    """Counts, from simdjson's tape, the items a large body would make: ``input_batch``
    lengths (Clipper REST) and V2 batch dimensions. One parser, for the event loop's
    thread. Without simdjson (never in practice: a core dependency) nothing is counted and
    the general path's own check applies after its parse."""

    __slots__ = ("_parser",)

    def __init__(self) -> None:
        self._parser: Any = _new_parser()

    def _parse(self, body: bytes) -> Any:
        """The document, or None without simdjson; ``ValueError`` (simdjson's message) when
        the body is not JSON."""
        if self._parser is None:
            return None
        try:
            return self._parser.parse(body)
        except RuntimeError:  # pragma: no cover - a document still referenced: never
            self._parser = _new_parser()
            return None

    def batch_items(self, body: bytes) -> int | None:
        """The length of the longest top-level ``input_batch`` array (every occurrence: a
        repeated key must not hide one), or None when there is none or nothing was counted.
        ``ValueError`` when the body is not JSON."""
        return _batch_items(self._parse(body))

    def v2_rows(self, body: bytes) -> tuple[str, int] | None:
        """``(name, shape[0])`` of the V2 input tensor with the largest batch dimension, or
        None when no tensor has an integer one. ``ValueError`` when the body is not JSON."""
        return _v2_rows(self._parse(body))


def _batch_items(doc: Any) -> int | None:
    # The document's references die with this frame (see _read). Only proxies are touched:
    # items() and values() would build every Python object the count is meant to avoid.
    if type(doc) is not _Object:
        return None
    keys = list(doc.keys())
    if "input_batch" not in keys:
        return None
    if keys.count("input_batch") > 1:  # which one counts would be ambiguous
        raise ValueError('"input_batch" is given more than once')
    batch = doc["input_batch"]
    return len(batch) if type(batch) is _Array else None


def _v2_rows(doc: Any) -> tuple[str, int] | None:
    if type(doc) is not _Object or "inputs" not in list(doc.keys()):
        return None
    inputs = doc["inputs"]
    if type(inputs) is not _Array:
        return None
    most: tuple[str, int] | None = None
    for tensor in inputs:
        if type(tensor) is not _Object:
            continue
        fields = list(tensor.keys())
        if "shape" not in fields:
            continue
        shape = tensor["shape"]
        if type(shape) is not _Array or not len(shape) or type(shape[0]) is not int:
            continue
        name = tensor["name"] if "name" in fields else ""
        rows = shape[0]
        if most is None or rows > most[1]:
            most = (name if type(name) is str else "", rows)
    return most


def _proxy_types() -> tuple[Any, Any]:
    try:
        import simdjson
    except ImportError:  # pragma: no cover - a core dependency
        return type(None), type(None)
    return simdjson.Object, simdjson.Array


_Object, _Array = _proxy_types()

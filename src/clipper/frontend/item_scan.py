"""Counting a large JSON body's items without holding the GIL: the lengths of the arrays that
are values of the top-level object (a Clipper REST ``input_batch``) and the batch dimension of
V2 input tensors, from a structural scan done in NumPy.

simdjson's parse, which :class:`~clipper.frontend.fast_input.ItemCounter` uses on the event
loop for mid-sized bodies, holds the GIL for its whole length (measured: 60-110 ms for a 9 MB
body, and the loop's thread waits as long when the parse runs in another thread). Each NumPy
pass here is one call over the whole buffer that releases the GIL, so a worker thread can scan
a 10 MiB body while the loop goes on serving (its longest pause measured 5-8 ms, against the
full parse time before).

The scan finds the string quotes that are not escaped, the brackets, commas and colons outside
strings, and the depth of each; it checks only that brackets balance (a body that does not is
not JSON: ``ValueError``). Anything else about validity is left to the full parse that follows
a count under the cap, so answers and errors for accepted bodies never depend on the scan.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

__all__ = ["batch_items", "v2_rows"]

_KIND = np.zeros(256, np.int8)  # 1 opens, -1 closes, 2 a comma, 3 a colon
for _ch, _k in ((b"[", 1), (b"{", 1), (b"]", -1), (b"}", -1), (b",", 2), (b":", 3)):
    _KIND[_ch[0]] = _k
_QUOTE, _BACKSLASH, _OPEN_ARRAY = 0x22, 0x5C, 0x5B
# The longest spelling of an 11-letter key: every letter as \uXXXX, and its quotes.
_LONGEST_KEY = 6 * 11 + 2


class _Scan:
    """The structural characters of one body outside strings, with their depths."""

    __slots__ = ("at", "body", "depth", "kind", "quotes")

    def __init__(self, body: bytes) -> None:
        b = np.frombuffer(body, np.uint8)
        self.body = body
        self.quotes = q = _real_quotes(b)
        kinds = _KIND[b]
        at = np.flatnonzero(kinds)
        at = at[(np.searchsorted(q, at) & 1) == 0]  # an even number of quotes before: outside
        kind = kinds[at]
        delta = np.where(kind == 1, 1, np.where(kind == -1, -1, 0)).astype(np.int32)
        depth = np.cumsum(delta, dtype=np.int32)  # after each character
        if not len(depth) or int(depth.min()) < 0 or int(depth[-1]) != 0 or kind[0] != 1:
            raise ValueError("the body is not a JSON document: its brackets do not balance")
        self.at, self.kind, self.depth = at, kind, depth

    def arrays(self, level: int) -> np.ndarray[Any, Any]:
        """Indices (into :attr:`at`) of the arrays opened at ``level`` (1: the top-level
        object's values), whose value follows a key."""
        kind, depth = self.kind, self.depth
        opens = (kind == 1) & (depth == level + 1)
        opens &= np.frombuffer(self.body, np.uint8)[self.at] == _OPEN_ARRAY
        idx = np.flatnonzero(opens)
        idx = idx[idx > 0]
        found: np.ndarray[Any, Any] = idx[kind[idx - 1] == 3]  # after a colon: a value
        return found

    def key(self, i: int) -> str | None:
        """The key before the value that opens at ``at[i]`` (a colon precedes it), decoded,
        or None when it cannot be one of the keys counted (too long)."""
        q = self.quotes
        k = int(np.searchsorted(q, self.at[i - 1]))
        if k < 2:
            return None
        start, end = int(q[k - 2]), int(q[k - 1]) + 1
        if end - start > _LONGEST_KEY:
            return None
        try:
            key = orjson.loads(self.body[start:end])
        except orjson.JSONDecodeError:
            return None
        return key if type(key) is str else None

    def length(self, i: int) -> int:
        """How many elements the array opened at ``at[i]`` holds."""
        depth, kind, at = self.depth, self.kind, self.at
        level = int(depth[i])
        close = i + 1 + int(np.argmax(depth[i + 1 :] < level))  # its closing bracket
        inner = slice(i + 1, close)
        commas = int(np.count_nonzero((kind[inner] == 2) & (depth[inner] == level)))
        if commas or self.body[int(at[i]) + 1 : int(at[close])].strip():
            return commas + 1
        return 0

    def enclosing_top_array(self, i: int, tops: np.ndarray[Any, Any]) -> int | None:
        j = int(np.searchsorted(tops, i)) - 1
        return int(tops[j]) if j >= 0 else None


def _real_quotes(b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Positions of the quotes that are not escaped (preceded by an even run of backslashes)."""
    q = np.flatnonzero(b == _QUOTE)
    if not len(q):
        return q
    bs = np.flatnonzero(b == _BACKSLASH)
    if not len(bs):
        return q
    run_start = np.ones(len(bs), bool)
    run_start[1:] = np.diff(bs) != 1
    first = np.maximum.accumulate(np.where(run_start, np.arange(len(bs)), 0))
    j = np.minimum(np.searchsorted(bs, q - 1), len(bs) - 1)
    before = bs[j] == q - 1  # a backslash right before the quote
    run = np.where(before, j - first[j] + 1, 0)
    real: np.ndarray[Any, Any] = q[run % 2 == 0]
    return real


def batch_items(body: bytes) -> int | None:
    """The length of the top-level ``input_batch`` array (however its key is spelled), or None
    when there is none. ``ValueError`` when the brackets do not balance or the key is given
    more than once (which one counts would be ambiguous)."""
    scan = _Scan(body)
    found: list[int] = []
    for i in scan.arrays(1).tolist():
        if scan.key(i) == "input_batch":
            found.append(i)
            if len(found) > 1:
                raise ValueError('"input_batch" is given more than once')
    return scan.length(found[0]) if found else None


def v2_rows(body: bytes) -> tuple[str, int] | None:
    """``(name, shape[0])`` of the V2 input tensor with the largest batch dimension (a
    ``shape`` array in a tensor of the top-level ``inputs``), or None when none has an
    integer one. ``ValueError`` when the brackets do not balance."""
    scan = _Scan(body)
    tops = scan.arrays(1)
    inputs = {i for i in tops.tolist() if scan.key(i) == "inputs"}
    if not inputs:
        return None
    most: tuple[str, int] | None = None
    for i in scan.arrays(3).tolist():
        if scan.enclosing_top_array(i, tops) not in inputs or scan.key(i) != "shape":
            continue
        # The first element: what lies before the next structural character (a nested
        # array or object there is no integer).
        first = scan.body[int(scan.at[i]) + 1 : int(scan.at[i + 1])].strip()
        if not first.isdigit() or len(first) > 19:
            continue
        rows = int(first)
        if most is None or rows > most[1]:
            most = ("", rows)  # the name is read by the full parse; the count is what matters
    return most

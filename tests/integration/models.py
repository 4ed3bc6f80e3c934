"""Models deployed by the integration tests.

They live at module level of a local (not installed) module, so ``Clipper.deploy_model``
cloudpickles them by value and the container process can load them without importing the
tests. The ``time.sleep`` calls below are the models' simulated compute cost.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np


def describe_numeric(xs: Any) -> list[dict[str, Any]]:
    """For each input row: the dtype it arrived with and its values."""
    return [{"dtype": str(np.asarray(x).dtype), "values": np.asarray(x).tolist()} for x in xs]


def row_sums(xs: Any) -> list[float]:
    return [float(np.asarray(x, dtype=np.float64).sum()) for x in xs]


def shout(xs: list[str]) -> list[dict[str, Any]]:
    return [{"type": type(s).__name__, "upper": s.upper(), "len": len(s)} for s in xs]


def bytes_info(xs: list[bytes]) -> list[dict[str, Any]]:
    return [{"type": type(b).__name__, "len": len(b), "hex": b.hex()} for b in xs]


class JsonEcho:
    """An object model: ``setup()`` runs once in the container before any ``predict``."""

    def __init__(self) -> None:
        self.ready = False

    def setup(self) -> None:
        self.ready = True

    def predict(self, xs: list[Any]) -> list[dict[str, Any]]:
        if not self.ready:
            raise RuntimeError("setup() was not called")
        return [{"type": type(v).__name__, "value": v} for v in xs]


def with_nonce(xs: Any) -> list[dict[str, Any]]:
    """A fresh random nonce per evaluation: equal outputs mean the cache answered."""
    return [{"sum": float(np.asarray(x).sum()), "nonce": os.urandom(8).hex()} for x in xs]


def version_one(xs: Any) -> list[dict[str, Any]]:
    return [{"version": 1, "sum": float(np.asarray(x).sum())} for x in xs]


def version_two(xs: Any) -> list[dict[str, Any]]:
    return [{"version": 2, "sum": float(np.asarray(x).sum())} for x in xs]


def slow_sums(xs: Any) -> list[float]:
    time.sleep(0.3)
    return row_sums(xs)


def steady_sums(xs: Any) -> list[float]:
    time.sleep(0.01)
    return row_sums(xs)


def paced_sums(xs: Any) -> list[float]:
    """5 ms per batch and 20 ms per input: about 45 inputs/s per replica whatever the batch
    (what the autoscaling test scales against)."""
    time.sleep(0.005 + 0.02 * len(xs))
    return row_sums(xs)


def fragile_sums(xs: Any) -> list[float]:
    if any(float(np.asarray(x)[0]) < 0 for x in xs):
        raise ValueError("boom: negative input")
    return row_sums(xs)


# -- the selection layer: models that are right, wrong, slow, or learn ---------------------------


def label_of(xs: Any) -> list[int]:
    """Right: the label is the first element."""
    return [int(np.asarray(x)[0]) for x in xs]


def off_by_one(xs: Any) -> list[int]:
    """Always wrong."""
    return [int(np.asarray(x)[0]) + 1 for x in xs]


def off_by_two(xs: Any) -> list[int]:
    return [int(np.asarray(x)[0]) + 2 for x in xs]


def slow_label_of(xs: Any) -> list[int]:
    time.sleep(0.5)
    return label_of(xs)


class Counter:
    """Learns online: answers how many labels it has been given so far."""

    def __init__(self) -> None:
        self.seen = 0

    def predict(self, xs: Any) -> list[int]:
        return [self.seen for _ in xs]

    def update(self, xs: Any, labels: list[Any]) -> None:
        self.seen += len(labels)


def echo_rows(xs: Any) -> list[Any]:
    """Each input row back as it arrived (numbers as lists, strings as strings)."""
    return [x if isinstance(x, str) else np.asarray(x).tolist() for x in xs]


# Values of each output datatype a model can return over the JSON wire, at their extremes.
TYPED_OUTPUTS: dict[str, Any] = {
    "BOOL": [True, False],
    "INT64": [-(2**63), 2**63 - 1],
    "UINT64": [2**63, 2**64 - 1],
    "FP64": [0.5, -1e300],
    "BYTES": {"k": "v"},
}


def typed_outputs(xs: list[str]) -> list[Any]:
    """For each input naming a V2 datatype, a value of that datatype."""
    return [TYPED_OUTPUTS[x] for x in xs]


def chatty_failure(xs: Any) -> list[Any]:
    """Prints a line and raises on every batch: what fills a replica log."""
    print("chatty model output " + "x" * 200, flush=True)
    raise ValueError(f"cannot take a batch of {len(xs)}")


def dies_on_negative(xs: Any) -> list[float]:
    """A replica that crashes (the process exits) on a negative first value."""
    if any(float(np.asarray(x)[0]) < 0 for x in xs):
        os._exit(3)
    return row_sums(xs)


# -- canary and shadow ----------------------------------------------------------------------------


def sums_off_when_odd(xs: Any) -> list[float]:
    """Agrees with ``row_sums`` on rows whose first value is even, is 1 more on the others."""
    return [float(np.asarray(x).sum()) + (int(np.asarray(x)[0]) % 2) for x in xs]


def sleepy_sums(xs: Any) -> list[float]:
    """``row_sums`` after two seconds: slower than the latency SLO of the test that uses it."""
    time.sleep(2.0)
    return row_sums(xs)


# -- outputs that cannot be served ----------------------------------------------------------------


class _Opaque:
    """An object that is not JSON (its repr carries an address)."""


def hostile_outputs(xs: Any) -> list[Any]:
    """Per row, by its first value: 0 a NaN, 1 an infinity, 2 an object that is not JSON, 3 a
    string of the second value's bytes, 4 a numpy row holding a NaN, else the row's sum."""
    out: list[Any] = []
    for x in xs:
        row = np.asarray(x, dtype=np.float64)
        kind = int(row[0])
        if kind == 0:
            out.append(float("nan"))
        elif kind == 1:
            out.append({"score": [1.0, float("inf")]})
        elif kind == 2:
            out.append(_Opaque())
        elif kind == 3:
            out.append("x" * int(row[1]))
        elif kind == 4:
            out.append(np.array([1.0, np.nan]))
        else:
            out.append(float(row.sum()))
    return out


def nan_features(xs: list[Any]) -> list[Any]:
    """A pipeline's first stage (json): ``{"vec": [...]}``, with a NaN when ``x`` is negative."""
    return [{"vec": [float("nan") if v < 0 else 2.0 * v for v in x["x"]]} for x in xs]


class Ballast:
    """Row sums times ``scale``, holding ``mb`` megabytes of data (a model's weights): the
    size a pool process charges it (docs/density.md)."""

    def __init__(self, scale: float, mb: int) -> None:
        self.scale = scale
        self.weights = np.ones(mb * 2**20 // 8)

    def predict(self, xs: Any) -> list[float]:
        return [self.scale * v for v in row_sums(xs)]

"""Loss functions for feedback, all normalised to [0, 1] (the range the bandit rules assume).

* ``"0/1"`` - classification: 0 if the output equals the label, else 1. Equality is JSON
  equality: ``1 == 1.0``, but a bool never equals a number (``true`` is not ``1``), also inside
  lists and objects.
* ``"squared"`` - ``(output - label)^2 / scale^2``, clipped to 1.
* ``"absolute"`` - ``|output - label| / scale``, clipped to 1.

For the two regression losses, ``scale`` is the error at which the loss saturates: an output off by
``scale`` or more counts as completely wrong. An output that is not a number (or is NaN) cannot be
scored and costs the full loss 1; a label that is not a number is the caller's error
(:class:`~clipper.errors.BadInputError`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from clipper.choices import LOSSES as _CHOICE
from clipper.errors import BadInputError, ConfigError
from clipper.selection.base import Loss, as_number, is_number

__all__ = ["LOSSES", "make_loss", "same_output"]

LOSSES: tuple[str, ...] = _CHOICE.names
"""The loss names (the table with their help is :data:`clipper.choices.LOSSES`)."""


def same_output(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value, bools only with bools, lists and dicts element-wise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_number(a) or is_number(b):
        return is_number(a) and is_number(b) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_output(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_output(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, dict)) or isinstance(b, (list, tuple, dict)):
        return False
    return bool(a == b)


def _zero_one(output: Any, label: Any) -> float:
    return 0.0 if same_output(output, label) else 1.0


def _numeric_label(label: Any, kind: str) -> float:
    if not is_number(label) or math.isnan(float(label)):
        raise BadInputError(f"a {kind} loss needs a number as the label, got {label!r}")
    return float(label)


def make_loss(kind: str, *, scale: float = 1.0) -> Loss:
    """The loss function called ``kind`` (one of :data:`LOSSES`)."""
    _CHOICE.check(kind)
    s = as_number(scale)
    if s is None or not math.isfinite(s) or s <= 0.0:
        raise ConfigError(f"loss scale must be a number > 0, got {scale!r}")
    build: Callable[[float], Loss] = _CHOICE.load(kind)
    return build(s)


# The builders, one per option of clipper.choices.LOSSES (which names them lazily).


def _build_zero_one(scale: float) -> Loss:
    return _zero_one


def _build_squared(scale: float) -> Loss:
    return _regression("squared", scale)


def _build_absolute(scale: float) -> Loss:
    return _regression("absolute", scale)


def _regression(kind: str, s: float) -> Loss:
    def regression(output: Any, label: Any) -> float:
        y = _numeric_label(label, kind)
        if not is_number(output):
            return 1.0
        err = abs(float(output) - y) / s
        if math.isnan(err):
            return 1.0
        return min(err * err if kind == "squared" else err, 1.0)

    regression.__name__ = f"{kind}_loss"
    return regression

"""Which model each recent query drew, and with what probability: what bandit feedback needs.

A policy with bandit feedback (``exp3``, ``epsilon_greedy``, ``ucb1``, ``thompson`` with
``feedback: "bandit"``) learns from the one model a query drew, and ``exp3`` divides that
model's loss by the probability it was drawn with. Feedback names the query by its input (and
``uid``), so the frontend records, per application, the draw of each recent ``(uid, input)``
and looks it up when the label arrives. The record is bounded (least recently drawn evicted)
and keyed by a 16-byte digest of the input, not the input itself.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from clipper.errors import ConfigError

__all__ = ["Draw", "Draws"]


@dataclass(frozen=True, slots=True)
class Draw:
    """One query's draw: the model and the probability the policy gave it (None when the
    policy does not weight feedback by it)."""

    model: str
    probability: float | None


class Draws:
    """The draws of up to ``capacity`` recent ``(uid, input)`` pairs of one application."""

    __slots__ = ("_draws", "capacity")

    def __init__(self, capacity: int = 20_000) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"draw record capacity must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        self._draws: OrderedDict[tuple[str, bytes], Draw] = OrderedDict()

    def record(self, uid: str, payload: bytes, draw: Draw) -> None:
        """Remember ``draw`` for this user's input (a later draw of the same pair replaces it)."""
        key = (uid, _digest(payload))
        self._draws.pop(key, None)
        self._draws[key] = draw
        while len(self._draws) > self.capacity:
            self._draws.popitem(last=False)

    def take(self, uid: str, payload: bytes) -> Draw | None:
        """The recorded draw for this user's input, removed (one feedback per query); None if
        there is none (never drawn here, or evicted)."""
        return self._draws.pop((uid, _digest(payload)), None)

    def __len__(self) -> int:
        return len(self._draws)


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()

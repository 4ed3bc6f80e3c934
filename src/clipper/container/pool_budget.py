"""The arithmetic of a model pool: which loaded models to evict for a new one, and which pool
process a model goes to.

Pure apart from :func:`artifact_bytes` (which reads the disk): no process, no thread, no clock
of its own (the caller says when each model last predicted). :class:`PoolBudget` is what a
pool process (``python -m clipper.container --pool``) keeps of the models it holds;
:func:`place` is how the local manager chooses a pool process for a model version
(docs/density.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clipper.errors import ReplicaError

__all__ = ["MemberLoad", "ModelTooBig", "PoolBudget", "artifact_bytes", "place"]


class ModelTooBig(ReplicaError):
    """A model bigger than a pool process's whole memory budget: it can never be loaded."""


@dataclass(slots=True)
class _Held:
    bytes: int
    last_used: float


class PoolBudget:
    """The models one pool process holds, their sizes, and when each last predicted; the
    budget is in bytes."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"a pool's memory budget must be positive, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._held: dict[str, _Held] = {}

    @property
    def used_bytes(self) -> int:
        return sum(h.bytes for h in self._held.values())

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.used_bytes

    def __contains__(self, token: str) -> bool:
        return token in self._held

    def __len__(self) -> int:
        return len(self._held)

    def tokens(self) -> list[str]:
        return list(self._held)

    def size(self, token: str) -> int:
        """The bytes ``token``'s model is charged (0 when it is not held)."""
        held = self._held.get(token)
        return 0 if held is None else held.bytes

    def used(self, token: str, now: float) -> None:
        """``token``'s model answered a batch at ``now`` (its place in the LRU order)."""
        held = self._held.get(token)
        if held is not None:
            held.last_used = max(held.last_used, now)

    def evictions(self, size: int, *, keep: str = "") -> list[str]:
        """The models to evict, least recently used first, so that one of ``size`` bytes fits;
        ``keep`` (the model being loaded, already counted) is never among them. Raises
        :class:`ModelTooBig` when ``size`` exceeds the whole budget."""
        if size > self.budget_bytes:
            raise ModelTooBig(
                f"the model needs {_mb(size)} and the pool process's whole memory budget is "
                f"{_mb(self.budget_bytes)} (--pool-memory-mb): it can never be loaded"
            )
        others = {t: h for t, h in self._held.items() if t != keep}
        free = self.budget_bytes - sum(h.bytes for h in others.values()) - size
        out = []
        for token, _ in sorted(others.items(), key=lambda item: item[1].last_used):
            if free >= 0:
                break
            out.append(token)
            free += others[token].bytes
        return out

    def add(self, token: str, size: int, now: float) -> None:
        self._held[token] = _Held(size, now)

    def remove(self, token: str) -> int:
        """Forget ``token``'s model; its size (0 when it was not held)."""
        held = self._held.pop(token, None)
        return 0 if held is None else held.bytes


@dataclass(frozen=True, slots=True)
class MemberLoad:
    """What the manager knows of one pool process when placing a model: its index, whether it
    is up, the bytes of its budget its models take, and how many it holds."""

    index: int
    up: bool
    free_bytes: int
    models: int


def place(members: Sequence[MemberLoad], holder: int | None = None) -> int | None:
    """The pool process for a model: the one that holds it already (``holder``), else the up
    one with the most free budget (ties: the fewest models, then the lowest index); None when
    no member is up."""
    if holder is not None and any(m.index == holder and m.up for m in members):
        return holder
    up = [m for m in members if m.up]
    if not up:
        return None
    return min(up, key=lambda m: (-m.free_bytes, m.models, m.index)).index


def artifact_bytes(path: str) -> int:
    """The bytes of a model artifact on disk: a file, or every file under a directory."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    total = 0
    for root, _, files in os.walk(p):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"

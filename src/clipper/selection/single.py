"""``single``: always the first linked model (the original Clipper's default; no learning); the
first available one when the caller says which are (see :mod:`clipper.selection.base`)."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from clipper.selection.base import Combined, Loss, SelectionPolicy, State, count_feedback

__all__ = ["SingleModel"]


class SingleModel(SelectionPolicy):
    name = "single"
    accepts = ()

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)

    def init_state(self) -> State:
        return {"n": 0}

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        return [self._available(available)[0]]

    def combine(
        self, state: State, outputs: Mapping[str, Any], available: Collection[str] | None = None
    ) -> Combined:
        return self._combine_one(outputs)

    def observe(
        self,
        state: State,
        outputs: Mapping[str, Any],
        label: Any,
        loss: Loss,
        *,
        drawn: Mapping[str, float] | None = None,
    ) -> None:
        # Nothing to learn; the count only shows that feedback reaches the policy.
        count_feedback(state)

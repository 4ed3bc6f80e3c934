"""``ab_split``: a fixed weighted random split between models (A/B tests, canary rollouts)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from clipper.errors import ConfigError
from clipper.selection.base import (
    Combined,
    Loss,
    SelectionPolicy,
    State,
    as_number,
    count_feedback,
    sample,
    table,
)

__all__ = ["ABSplit"]


class ABSplit(SelectionPolicy):
    """Draw model i with probability ``weights[i] / sum(weights)``; feedback never moves the split.

    ``weights`` maps model name to a non-negative number; linked models it does not name get 0,
    and names of models not linked (yet) are ignored. Without ``weights`` the split is even.

    State: ``{"count": {model: int}, "n": int}`` - feedback counted per model (per arm of the
    test), for the operator to compare.
    """

    name = "ab_split"
    accepts = ("weights",)

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)
        raw = params.get("weights")
        if raw is None:
            raw = dict.fromkeys(self.models, 1.0)
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"selection policy 'ab_split': parameter 'weights' must be an object"
                f" {{model: weight}}, got {raw!r}"
            )
        weights: dict[str, float] = {}
        for model, value in raw.items():
            w = as_number(value)
            if w is None or not math.isfinite(w) or w < 0.0:
                raise ConfigError(
                    f"selection policy 'ab_split': weight of {model!r} must be a number >= 0,"
                    f" got {value!r}"
                )
            weights[str(model)] = w
        split = [weights.get(m, 0.0) for m in self.models]
        total = math.fsum(split)
        if total <= 0.0:
            raise ConfigError(
                "selection policy 'ab_split': parameter 'weights' gives no linked model a"
                f" positive weight; linked models: {', '.join(self.models)}"
            )
        self.probabilities: dict[str, float] = {
            m: w / total for m, w in zip(self.models, split, strict=True)
        }
        self.params["weights"] = weights

    def init_state(self) -> State:
        return {"count": dict.fromkeys(self.models, 0), "n": 0}

    def select(self, state: State, rng: random.Random) -> list[str]:
        return [sample(rng, self.models, [self.probabilities[m] for m in self.models])]

    def combine(self, state: State, outputs: Mapping[str, Any]) -> Combined:
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
        count_feedback(state)
        counts = table(state, "count")
        for m in self._answered(outputs):
            counts[m] = int(counts.get(m, 0)) + 1

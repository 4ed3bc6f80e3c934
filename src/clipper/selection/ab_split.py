"""``ab_split``: a fixed weighted random split between models (A/B tests, canary rollouts)."""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
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

    Only ``available`` models are drawn: the weights are renormalised over them (a 90/10 split
    whose 90 has no replica sends everything to the 10). When every available model has weight
    0, the split is even over them: a model outside the test answers rather than nobody.

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

    def split(self, available: Collection[str] | None = None) -> dict[str, float]:
        """Each available model's share of the queries (see the class docstring)."""
        models = self._available(available)
        if models == self.models:
            return self.probabilities
        share = {m: self.probabilities[m] for m in models}
        total = math.fsum(share.values())
        if total <= 0.0:
            return dict.fromkeys(models, 1.0 / len(models))
        return {m: p / total for m, p in share.items()}

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        p = self.split(available)
        models = list(p)
        return [sample(rng, models, [p[m] for m in models])]

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
        count_feedback(state)
        counts = table(state, "count")
        for m in self._answered(outputs):
            counts[m] = int(counts.get(m, 0)) + 1

"""``exp4``: the ensemble policy - evaluate every model, combine by weight, learn every weight.

Combining (over the outputs that arrived by the deadline, weights renormalised over them):

* all outputs numbers and at least one a float: regression, the answer is the weighted mean;
* all outputs ints (class labels), or anything else (strings, bools, lists, dicts, mixtures):
  weighted vote by equality (canonical JSON, so ``{"a":1,"b":2}`` equals ``{"b":2,"a":1}``,
  while ``true`` never equals ``1``); a tie goes to the answer first given in model order.

Confidence is the total weight, normalised over *all* linked models, of the models that agree with
the answer (for a mean: whose output is within ``tolerance`` of it, relative to its magnitude).
So a straggler's missing output can only lower confidence, as in the paper, and a caller can fall
back to a default answer below a threshold (5 equal models: "4 agree" is 0.8).

Models that are not ``available`` (no connected replica, as the caller knows) are not asked and
are not stragglers: the weights and the confidence are normalised over the available models, as
if only they were linked. A replica's restart thus does not turn answers into low-confidence
defaults; the confidence is the agreement among the models that could answer (a lone available
model answers with confidence 1).
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from clipper.selection.base import (
    DEFAULT_SHARE,
    Combined,
    Loss,
    SelectionPolicy,
    State,
    count_feedback,
    fixed_share,
    is_integer,
    is_number,
    normalised,
    output_key,
    read,
    table,
)

__all__ = ["Exp4"]

# Relative slack on the tolerance test: a weighted mean of identical outputs may differ from them
# in the last bit, and they must still agree with it when tolerance is 0.
_ROUND_OFF = 1e-12


class Exp4(SelectionPolicy):
    """Exponential weights over an ensemble: on feedback each model that answered gets
    ``w_i *= exp(-eta * loss_i)``, then ``share`` of the weight is spread evenly over the
    linked models again (fixed-share: ``w_i <- (1 - share) * w_i / sum(w) + share / K``), so
    the ensemble follows a model that becomes the best after a long bad run. ``share`` 0 is
    plain exponential weights (Hedge), which never forgets.

    State: ``{"log_w": {model: float}, "n": int}`` (log weights, best live model at 0, a model
    missing from the state starts level with the best).
    """

    name = "exp4"
    accepts = ("eta", "tolerance", "share")

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)
        self.eta = self._number(params, "eta", 0.1, low=0.0, low_open=True)
        self.tolerance = self._number(params, "tolerance", 0.1, low=0.0)
        self.share = self._number(params, "share", DEFAULT_SHARE, low=0.0, high=1.0)

    def init_state(self) -> State:
        return {"log_w": dict.fromkeys(self.models, 0.0), "n": 0}

    def weights(self, state: State, available: Collection[str] | None = None) -> dict[str, float]:
        """Each available model's weight, normalised over them (None: all linked models)."""
        models = self._available(available)
        w = normalised([read(state, "log_w", m, 0.0) for m in models])
        return dict(zip(models, w, strict=True))

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        return list(self._available(available))

    def combine(
        self, state: State, outputs: Mapping[str, Any], available: Collection[str] | None = None
    ) -> Combined:
        arrived = self._answered_or_raise(outputs)
        weights = self.weights(state, available)
        if any(m not in weights for m in arrived):  # outputs of models said not to be available
            weights = self.weights(state, [*weights, *arrived])
        values = [outputs[m] for m in arrived]
        if all(is_number(v) for v in values) and not all(is_integer(v) for v in values):
            return self._mean(arrived, [float(v) for v in values], weights)
        return self._vote(arrived, values, weights)

    def _mean(self, arrived: list[str], values: list[float], weights: dict[str, float]) -> Combined:
        w = [weights[m] for m in arrived]
        total = math.fsum(w)
        if total <= 0.0:  # every arrived weight underflowed: fall back to a plain mean
            w, total = [1.0] * len(arrived), float(len(arrived))
        mean = math.fsum(wi * v for wi, v in zip(w, values, strict=True)) / total
        band = (self.tolerance + _ROUND_OFF) * abs(mean)
        agree = math.fsum(
            weights[m] for m, v in zip(arrived, values, strict=True) if abs(v - mean) <= band
        )
        return Combined(mean, _unit(agree), tuple(arrived))

    def _vote(self, arrived: list[str], values: list[Any], weights: dict[str, float]) -> Combined:
        votes: dict[bytes, float] = {}
        answers: dict[bytes, Any] = {}  # insertion order = order first given, for ties
        for m, v in zip(arrived, values, strict=True):
            key = output_key(v)
            votes[key] = votes.get(key, 0.0) + weights[m]
            answers.setdefault(key, v)
        best = max(votes, key=lambda k: votes[k])  # max keeps the first of equals
        return Combined(answers[best], _unit(votes[best]), tuple(arrived))

    def observe(
        self,
        state: State,
        outputs: Mapping[str, Any],
        label: Any,
        loss: Loss,
        *,
        drawn: Mapping[str, float] | None = None,
    ) -> None:
        losses = self._losses(outputs, label, loss)
        count_feedback(state)
        if not losses:
            return
        log_w = table(state, "log_w")
        for m, value in losses.items():
            log_w[m] = read(state, "log_w", m, 0.0) - self.eta * value
        fixed_share(log_w, self.models, self.share)


def _unit(x: float) -> float:
    # Sums of normalised weights may overshoot 1 in the last bit.
    return min(max(x, 0.0), 1.0)

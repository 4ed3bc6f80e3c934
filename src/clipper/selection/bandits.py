"""Single-model bandit policies: one model is evaluated per query, feedback teaches which.

* :class:`Exp3` - exponential weights with importance-weighted losses (Auer et al.), as in
  Clipper: cheap (one evaluation), adversarial regret guarantees.
* :class:`EpsilonGreedy` - the best mean loss so far, a uniformly random model with prob epsilon.
* :class:`UCB1` - optimism: the best upper confidence bound on the mean reward (Auer et al. 2002).
* :class:`Thompson` - Beta-Bernoulli Thompson sampling with fractional rewards.

Every loss is clipped to [0, 1] first (see :mod:`clipper.selection.base`); the rewards of UCB1 and
Thompson are ``1 - loss``.

All four forget by default, because the model that is best changes while serving: Exp3 keeps
every model's weight above a floor (``floor``); the other three discount their statistics by
``discount`` per feedback. All four take ``feedback``: ``"bandit"`` (the default)
learns from the one model the query drew, ``"full"`` from every linked model's output (which
the server then evaluates on the labelled input).

All four choose only among the ``available`` models (those with a connected replica, as the
caller knows): each behaves as if only they were linked. Exp3 draws with its probabilities
over them (and records that probability for its update, so the importance weighting stays
unbiased), epsilon-greedy explores uniformly over them, UCB1 and Thompson take the best of them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from clipper.selection.base import (
    DEFAULT_DISCOUNT,
    DEFAULT_FLOOR,
    Combined,
    Loss,
    SelectionPolicy,
    State,
    count_feedback,
    discount,
    normalised,
    read,
    sample,
    table,
    weight_floor,
)

__all__ = ["UCB1", "EpsilonGreedy", "Exp3", "Thompson"]

# The range of ``discount``: 1 keeps the whole history, 0 would forget everything at once.
_DISCOUNT_RANGE: dict[str, Any] = {"low": 0.0, "high": 1.0, "low_open": True}

# Floor on the probability that divides Exp3's loss: a model we could not have drawn (p ~ 0, only
# if the state moved between select and observe) must not send its log weight to -inf.
_P_FLOOR = 1e-6


class Exp3(SelectionPolicy):
    """Exp3: draw model i with ``p_i = (1 - gamma) * w_i / sum(w) + gamma / K``; on feedback for
    the drawn model, ``w_i *= exp(-eta * loss / p_i)`` with ``p_i`` the probability it was drawn
    with (the caller's record of the draw, ``drawn``; else the current one); then no weight may
    stay below ``floor / K`` of the total (``w_i <- max(w_i, floor / K * sum(w))``), so a model
    that was bad for long can take over within about ``ln(K / floor) / eta`` losses of the
    leader. ``floor`` 0 never forgets. (A floor rather than Exp3.S's fixed-share mixing: under
    bandit feedback mixing lifts the models that are not drawn every round, and they end up
    drawn, and wrong, several times as often; see experiments/forgetting.py.)

    State: ``{"log_w": {model: float}, "n": int}``. Weights are kept as logs (no underflow after a
    long run of losses) and shifted after each update so the best live model sits at 0; a model
    missing from the state reads as 0, i.e. a newly linked model starts level with the best.

    When ``observe`` gets outputs of several models (a caller that joined every cached
    prediction), every loss is known, so each answered model gets the full-information (Hedge)
    update ``w_i *= exp(-eta * loss_i)``: dividing by p_i is only right for the one drawn model.
    """

    name = "exp3"
    accepts = ("eta", "gamma", "floor", "feedback")

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)
        self.eta = self._number(params, "eta", 0.1, low=0.0, low_open=True)
        self.gamma = self._number(params, "gamma", 0.0, low=0.0, high=1.0)
        self.floor = self._number(params, "floor", DEFAULT_FLOOR, low=0.0, high=1.0)
        self._feedback_mode(params)

    def init_state(self) -> State:
        return {"log_w": dict.fromkeys(self.models, 0.0), "n": 0}

    def probabilities(
        self, state: State, available: Collection[str] | None = None
    ) -> dict[str, float]:
        """Each available model's probability of being drawn from ``state``: Exp3 over the
        available models alone, ``(1 - gamma) * w_i / sum(w over them) + gamma / K'`` with K'
        their number (the weights renormalised over them; the models without a replica get
        nothing, the others' ratios stay)."""
        models = self._available(available)
        w = normalised([read(state, "log_w", m, 0.0) for m in models])
        floor = self.gamma / len(models)
        return {m: (1.0 - self.gamma) * wi + floor for m, wi in zip(models, w, strict=True)}

    def draw_probability(
        self, state: State, model: str, available: Collection[str] | None = None
    ) -> float | None:
        return self.probabilities(state, available).get(model)

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        p = self.probabilities(state, available)
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
        losses = self._losses(outputs, label, loss)
        count_feedback(state)
        if not losses:
            return
        if len(losses) == 1:
            ((model, value),) = losses.items()
            p = (drawn or {}).get(model)
            if p is None or not 0.0 < p <= 1.0:
                p = self.probabilities(state)[model]  # before this update, as Exp3 requires
            steps = {model: self.eta * value / max(p, _P_FLOOR)}
        else:
            steps = {m: self.eta * value for m, value in losses.items()}
        log_w = table(state, "log_w")
        for m, step in steps.items():
            log_w[m] = read(state, "log_w", m, 0.0) - step
        weight_floor(log_w, self.models, self.floor)


class EpsilonGreedy(SelectionPolicy):
    """With probability epsilon a uniformly random model; otherwise the lowest mean loss so far,
    models never tried first (in order), ties to the earlier model.

    Before each feedback is added, every linked model's count and loss sum are multiplied by
    ``discount`` (1: the plain means over the whole history), so the means are over roughly the
    last ``1 / (1 - discount)`` feedbacks.

    State: ``{"count": {model: float}, "loss_sum": {model: float}, "n": int}`` (the counts are
    whole numbers with ``discount`` 1).
    """

    name = "epsilon_greedy"
    accepts = ("epsilon", "discount", "feedback")

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)
        self.epsilon = self._number(params, "epsilon", 0.1, low=0.0, high=1.0)
        self.discount = self._number(params, "discount", DEFAULT_DISCOUNT, **_DISCOUNT_RANGE)
        self._feedback_mode(params)

    def init_state(self) -> State:
        return {
            "count": dict.fromkeys(self.models, 0),
            "loss_sum": dict.fromkeys(self.models, 0.0),
            "n": 0,
        }

    def mean_losses(self, state: State) -> dict[str, float | None]:
        """Mean observed loss per model; None for a model never observed."""
        out: dict[str, float | None] = {}
        for m in self.models:
            n = read(state, "count", m, 0)
            out[m] = read(state, "loss_sum", m, 0.0) / n if n > 0 else None
        return out

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        models = self._available(available)
        # Always one draw first, so the rng advances the same way whichever branch is taken.
        if rng.random() < self.epsilon:
            return [models[rng.randrange(len(models))]]
        means = self.mean_losses(state)
        for m in models:
            if means[m] is None:
                return [m]
        return [min(models, key=lambda m: means[m] or 0.0)]

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
        losses = self._losses(outputs, label, loss)
        count_feedback(state)
        counts, sums = table(state, "count"), table(state, "loss_sum")
        if losses:
            discount(state, "count", self.models, self.discount, 0.0)
            discount(state, "loss_sum", self.models, self.discount, 0.0)
        for m, value in losses.items():
            counts[m] = _add(counts.get(m, 0), 1)
            sums[m] = float(sums.get(m, 0.0)) + value


class UCB1(SelectionPolicy):
    """UCB1: every model once (in order), then ``argmax mean_r + c * sqrt(2 ln N / n_i)`` with
    rewards ``r = 1 - loss`` and ``c`` the ``exploration`` parameter (1 is the textbook bound,
    made for any rewards in [0, 1]; the default 0.3 explores less, which suits models whose
    errors differ by a few points); ties to the earlier model. No randomness.

    Discounted UCB (Garivier and Moulines): before each feedback is added, every linked model's
    count and reward sum are multiplied by ``discount``, so the means follow roughly the last
    ``1 / (1 - discount)`` feedbacks, and a model not played for a while sees its count shrink
    and its bound grow until it is tried again. ``discount`` 1 is plain UCB1.

    State: ``{"count": {model: float}, "reward_sum": {model: float}, "n": int}``. N, the total
    number of plays, is the sum of the live models' counts (at least 1), so it stays right when
    models are linked or unlinked.
    """

    name = "ucb1"
    accepts = ("exploration", "discount", "feedback")

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)
        self.exploration = self._number(params, "exploration", 0.3, low=0.0)
        self.discount = self._number(params, "discount", DEFAULT_DISCOUNT, **_DISCOUNT_RANGE)
        self._feedback_mode(params)

    def init_state(self) -> State:
        return {
            "count": dict.fromkeys(self.models, 0),
            "reward_sum": dict.fromkeys(self.models, 0.0),
            "n": 0,
        }

    def scores(self, state: State) -> dict[str, float]:
        """Upper confidence bound per model; +inf for a model never played."""
        counts = {m: read(state, "count", m, 0) for m in self.models}
        total = sum(counts.values())
        out: dict[str, float] = {}
        for m in self.models:
            n = counts[m]
            if n <= 0:
                out[m] = math.inf
            else:
                mean = read(state, "reward_sum", m, 0.0) / n
                bonus = math.sqrt(2.0 * math.log(max(total, 1.0)) / n)
                out[m] = mean + self.exploration * bonus
        return out

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        # N stays every linked model's plays: a model without a replica was still played.
        s = self.scores(state)
        return [max(self._available(available), key=lambda m: s[m])]  # the first of equals

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
        losses = self._losses(outputs, label, loss)
        count_feedback(state)
        counts, sums = table(state, "count"), table(state, "reward_sum")
        if losses:
            discount(state, "count", self.models, self.discount, 0.0)
            discount(state, "reward_sum", self.models, self.discount, 0.0)
        for m, value in losses.items():
            counts[m] = _add(counts.get(m, 0), 1)
            sums[m] = float(sums.get(m, 0.0)) + (1.0 - value)


class Thompson(SelectionPolicy):
    """Thompson sampling: a Beta(alpha_i, beta_i) posterior per model, starting at (1, 1); each
    query evaluates the model with the largest posterior draw. Feedback with reward
    ``r = 1 - loss`` adds r to alpha and 1 - r to beta (fractional Bernoulli updates).

    Before each feedback is added, every linked model's posterior moves back toward the prior by
    ``discount`` (``alpha <- 1 + discount * (alpha - 1)``, the same for beta), so it holds about
    the last ``1 / (1 - discount)`` feedbacks and a model not played for a while becomes
    uncertain, hence drawn, again. ``discount`` 1 is the plain posterior.

    State: ``{"alpha": {model: float}, "beta": {model: float}, "n": int}``.
    """

    name = "thompson"
    accepts = ("discount", "feedback")

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        super().__init__(models, **params)
        self.discount = self._number(params, "discount", DEFAULT_DISCOUNT, **_DISCOUNT_RANGE)
        self._feedback_mode(params)

    def init_state(self) -> State:
        return {
            "alpha": dict.fromkeys(self.models, 1.0),
            "beta": dict.fromkeys(self.models, 1.0),
            "n": 0,
        }

    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        models = self._available(available)
        draws = {
            m: rng.betavariate(read(state, "alpha", m, 1.0), read(state, "beta", m, 1.0))
            for m in models
        }
        return [max(models, key=lambda m: draws[m])]

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
        losses = self._losses(outputs, label, loss)
        count_feedback(state)
        alpha, beta = table(state, "alpha"), table(state, "beta")
        if losses:
            discount(state, "alpha", self.models, self.discount, 1.0)
            discount(state, "beta", self.models, self.discount, 1.0)
        for m, value in losses.items():
            alpha[m] = float(alpha.get(m, 1.0)) + (1.0 - value)
            beta[m] = float(beta.get(m, 1.0)) + value


def _add(count: Any, k: int) -> float | int:
    """A count plus ``k``: whole counts (old states, ``discount`` 1) stay ints."""
    return count + k if isinstance(count, int) else float(count) + k

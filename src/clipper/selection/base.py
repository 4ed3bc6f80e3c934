"""The selection-policy interface, its shared helpers, and the factory.

A policy is stateless itself: everything it learns lives in a JSON-serialisable ``State`` dict
that the caller keeps (one per user or context) and persists. Per query the caller asks
:meth:`SelectionPolicy.select` which models to evaluate, hands the outputs that arrived before the
deadline to :meth:`SelectionPolicy.combine`, and later feeds labels back through
:meth:`SelectionPolicy.observe`, which mutates the state in place.

States outlive the set of linked models: a model missing from a state is treated as fresh (its
initial weight or counts), and entries for models no longer linked are ignored (kept, so a model
that is linked again resumes where it was).

Availability: :meth:`SelectionPolicy.select`, :meth:`~SelectionPolicy.draw_probability` and
:meth:`~SelectionPolicy.combine` take ``available``, the models that can answer now (the caller
knows which have a connected replica; a policy does not). A policy then behaves as if only
those models were linked: it draws among them (a one-model policy's probabilities renormalised
over them), asks only them (an ensemble), and normalises an ensemble's confidence over them. The
state is neither read differently nor changed: a model that is back is drawn again with what it
had learned. ``None``, or a set that names none of the policy's models (nothing can answer:
the caller reports that), means all of them, which is exactly the behaviour without it.

Losses given to ``observe`` are clipped to [0, 1]: the bandit update rules and their regret bounds
assume bounded losses, and the losses of :mod:`clipper.selection.losses` are normalised to it.
"""

from __future__ import annotations

import math
import numbers
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from clipper.choices import POLICIES as _CHOICE
from clipper.errors import ConfigError

__all__ = [
    "POLICIES",
    "Combined",
    "Loss",
    "SelectionPolicy",
    "State",
    "make_policy",
]

State = dict[str, Any]
"""A policy's learned state: JSON values only (floats, ints, strs, lists, dicts)."""

Loss = Callable[[Any, Any], float]
"""``loss(output, label) -> float >= 0``; see :func:`clipper.selection.losses.make_loss`."""

POLICIES: tuple[str, ...] = _CHOICE.names
"""The policy names (the table with their help is :data:`clipper.choices.POLICIES`)."""

DEFAULT_SHARE = 0.01
"""The default fixed-share of ``exp4``: forgetting is on, since serving is not stationary (a
model degrades, another is retrained); ``share`` 0 turns it off."""

DEFAULT_FLOOR = 0.001
"""The default weight floor of ``exp3`` (forgetting on); ``floor`` 0 turns it off."""

DEFAULT_DISCOUNT = 0.998
"""The default discount of ``epsilon_greedy``, ``ucb1`` and ``thompson``: their statistics
follow about the last 500 feedbacks; ``discount`` 1 keeps the whole history."""

FEEDBACK: tuple[str, ...] = ("bandit", "full")
"""How a one-model policy learns from feedback: from the model the query drew (``bandit``), or
from every linked model, each evaluated on the input (``full``)."""


@dataclass(frozen=True, slots=True)
class Combined:
    """One answer: the output, how much the models agree on it, and which models went into it."""

    output: Any
    confidence: float
    used: tuple[str, ...]


class SelectionPolicy(ABC):
    """Picks the models to evaluate for a query, combines their outputs, learns from feedback."""

    name: ClassVar[str]
    accepts: ClassVar[tuple[str, ...]] = ()
    """The parameter names this policy takes (anything else is a ConfigError)."""

    models: tuple[str, ...]
    params: dict[str, Any]
    """The effective parameters, defaults included (JSON values)."""

    def __init__(self, models: Sequence[str], **params: Any) -> None:
        self.models = _check_models(self.name, models)
        unknown = sorted(set(params) - set(self.accepts))
        if unknown:
            accepted = ", ".join(self.accepts) if self.accepts else "none"
            raise ConfigError(
                f"selection policy {self.name!r} does not accept parameter {unknown[0]!r};"
                f" accepted: {accepted}"
            )
        self.params = {}

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({list(self.models)!r}{args})"

    @abstractmethod
    def init_state(self) -> State:
        """A fresh state: nothing learned yet."""

    @abstractmethod
    def select(
        self, state: State, rng: random.Random, available: Collection[str] | None = None
    ) -> list[str]:
        """The models to evaluate for one query: a non-empty subset of ``models``, in order,
        drawn only from ``available`` (see the module docstring; None: all)."""

    @abstractmethod
    def combine(
        self, state: State, outputs: Mapping[str, Any], available: Collection[str] | None = None
    ) -> Combined:
        """Combine the outputs that arrived (model -> output); stragglers are simply absent.
        ``available``: what :meth:`select` was given (an ensemble's confidence is over those).

        Raises ValueError if no output comes from one of ``models`` (the caller broke the
        contract: outputs must be a non-empty subset of what :meth:`select` chose)."""

    @abstractmethod
    def observe(
        self,
        state: State,
        outputs: Mapping[str, Any],
        label: Any,
        loss: Loss,
        *,
        drawn: Mapping[str, float] | None = None,
    ) -> None:
        """Learn from one labelled query, mutating ``state`` in place.

        ``outputs`` are the outputs of the models that answered; outputs of models not in
        ``models`` are ignored. Every loss is computed before the state is touched, so a loss
        function that raises (a bad label) leaves the state unchanged.

        ``drawn`` is, for a policy that draws its model at random, the probability with which
        each model in ``outputs`` was drawn for this query (recorded by the caller at
        :meth:`select` time, see :meth:`draw_probability`); policies that do not weight by it
        ignore it."""

    bandit_feedback: bool = False
    """True when feedback should learn from the one model the query drew, evaluating no other
    (the policy's ``feedback`` parameter is ``"bandit"``); False when feedback joins the label
    with every linked model's output (``"full"``, or a policy that evaluates them all)."""

    def draw_probability(
        self, state: State, model: str, available: Collection[str] | None = None
    ) -> float | None:
        """The probability that :meth:`select` draws ``model`` from ``state`` among
        ``available``, for policies that importance-weight bandit feedback by it; None for the
        others."""
        return None

    # --- helpers for subclasses ---------------------------------------------------------------

    def _number(
        self,
        params: Mapping[str, Any],
        key: str,
        default: float,
        *,
        low: float,
        high: float = math.inf,
        low_open: bool = False,
    ) -> float:
        """Read a numeric parameter, check its range, and record it in ``self.params``."""
        raw = params.get(key, default)
        value = as_number(raw)
        in_range = (
            value is not None
            and math.isfinite(value)
            and (value > low if low_open else value >= low)
            and value <= high
        )
        if value is None or not in_range:
            lo = f"> {low:g}" if low_open else f">= {low:g}"
            hi = "" if high == math.inf else f" and <= {high:g}"
            raise ConfigError(
                f"selection policy {self.name!r}: parameter {key!r} must be a number {lo}{hi},"
                f" got {raw!r}"
            )
        self.params[key] = value
        return value

    def _choice(
        self, params: Mapping[str, Any], key: str, default: str, options: tuple[str, ...]
    ) -> str:
        """Read a parameter that is one of ``options``, and record it in ``self.params``."""
        raw = params.get(key, default)
        if raw not in options:
            names = ", ".join(f'"{o}"' for o in options)
            raise ConfigError(
                f"selection policy {self.name!r}: parameter {key!r} must be one of {names},"
                f" got {raw!r}"
            )
        self.params[key] = raw
        return str(raw)

    def _feedback_mode(self, params: Mapping[str, Any]) -> None:
        """The ``feedback`` parameter of the one-model policies (default ``"bandit"``)."""
        self.bandit_feedback = self._choice(params, "feedback", "bandit", FEEDBACK) == "bandit"

    def _available(self, available: Collection[str] | None) -> tuple[str, ...]:
        """The models to choose among: those of ``models`` in ``available``, in order; all of
        them when ``available`` is None or names none of them."""
        if available is None:
            return self.models
        return tuple(m for m in self.models if m in available) or self.models

    def _answered(self, outputs: Mapping[str, Any]) -> list[str]:
        """The models of this policy that have an output, in the policy's order."""
        return [m for m in self.models if m in outputs]

    def _answered_or_raise(self, outputs: Mapping[str, Any]) -> list[str]:
        answered = self._answered(outputs)
        if not answered:
            raise ValueError(
                f"no output to combine from the models of policy {self.name!r}"
                f" ({', '.join(self.models)}); got outputs of: {', '.join(map(str, outputs))}"
            )
        return answered

    def _combine_one(self, outputs: Mapping[str, Any]) -> Combined:
        """The answer of a policy that evaluates one model: that output, fully confident.
        Should several arrive (a caller that evaluated more), the first in our order answers."""
        model = self._answered_or_raise(outputs)[0]
        return Combined(outputs[model], 1.0, (model,))

    def _losses(self, outputs: Mapping[str, Any], label: Any, loss: Loss) -> dict[str, float]:
        """Clipped losses of the answered models (computed before any state is changed)."""
        return {m: clip_loss(loss(outputs[m], label)) for m in self._answered(outputs)}


# --- shared helpers (used by the policy modules, not part of the public surface) -----------------


def _check_models(policy: str, models: Sequence[str]) -> tuple[str, ...]:
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise ConfigError(
            f"selection policy {policy!r}: models must be a list of non-empty names, got {models!r}"
        )
    names = tuple(models)
    if not names:
        raise ConfigError(f"selection policy {policy!r} needs at least one model")
    if len(set(names)) != len(names):
        dupes = sorted({m for m in names if names.count(m) > 1})
        raise ConfigError(f"selection policy {policy!r}: duplicate models: {', '.join(dupes)}")
    return names


def as_number(raw: Any) -> float | None:
    # Strings are accepted because parameters may come from the command line or env vars.
    if isinstance(raw, bool):
        return None
    if isinstance(raw, numbers.Real):
        return float(raw)
    if isinstance(raw, str):
        try:
            return float(raw)
        except ValueError:
            return None
    return None


def clip_loss(value: float) -> float:
    """Clip a loss to [0, 1]; NaN counts as the worst loss rather than poisoning the state."""
    if math.isnan(value):
        return 1.0
    return min(max(float(value), 0.0), 1.0)


def is_number(x: Any) -> bool:
    """A real number that is not a bool (JSON true/false are labels, not numbers)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_integer(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def output_key(x: Any) -> bytes:
    """Equality key for voting: canonical JSON, so dicts with the same items in another order
    agree; a value orjson cannot encode falls back to its repr."""
    try:
        return orjson.dumps(x, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return b"repr:" + repr(x).encode()


def table(state: State, key: str) -> dict[str, Any]:
    """The per-model table ``state[key]``, created if a (hand-made or old) state lacks it."""
    t = state.get(key)
    if not isinstance(t, dict):
        t = {}
        state[key] = t
    return t


def read(state: State, key: str, model: str, default: float) -> float:
    """``state[key][model]`` without mutating: missing table or model reads as ``default``."""
    t = state.get(key)
    if isinstance(t, dict):
        v = t.get(model, default)
        return float(v)
    return default


def count_feedback(state: State) -> None:
    state["n"] = int(state.get("n", 0)) + 1


def sample(rng: random.Random, models: Sequence[str], probs: Sequence[float]) -> str:
    """One model drawn with the given probabilities (which sum to ~1); one ``rng.random()``."""
    u = rng.random() * math.fsum(probs)
    acc = 0.0
    for m, p in zip(models, probs, strict=True):
        acc += p
        if u < acc:
            return m
    # Round-off left u at the very top: the last model that can be drawn at all.
    for m, p in zip(reversed(models), reversed(probs), strict=True):
        if p > 0.0:
            return m
    return models[-1]


def normalised(log_w: Sequence[float]) -> list[float]:
    """exp of log weights, normalised to sum 1 (shifted by the max so nothing overflows)."""
    top = max(log_w)
    if top == -math.inf:
        return [1.0 / len(log_w)] * len(log_w)
    w = [math.exp(x - top) for x in log_w]
    s = math.fsum(w)
    return [x / s for x in w]


def shift_to_zero(log_w: dict[str, Any], models: Sequence[str]) -> None:
    """Shift all log weights so the best live model is at 0 (ratios, hence probabilities, stay).
    Without it every log weight drifts down forever, and a fresh model (0) would dominate."""
    top = max(float(log_w.get(m, 0.0)) for m in models)
    if top != 0.0 and math.isfinite(top):
        for m in models:
            log_w.setdefault(m, 0.0)  # a missing model's implicit 0 shifts with the rest
        for m, value in list(log_w.items()):
            log_w[m] = float(value) - top


def fixed_share(log_w: dict[str, Any], models: Sequence[str], share: float) -> None:
    """Spread ``share`` of the live models' weight evenly over them again:
    ``p_i <- (1 - share) * w_i / sum(w) + share / K`` (fixed-share, Herbster and Warmuth), then
    the best live model is shifted to 0.

    No live model's weight falls below ``share / K`` of the total, so a model that did badly
    for a long time needs only about ``ln(K / share) / eta`` losses of the leader to take over,
    not as many as it lost before. The log weights of models no longer linked move with the
    live models' normaliser (they are not mixed)."""
    if share > 0.0:
        live = [float(log_w.get(m, 0.0)) for m in models]
        top = max(live)
        if not math.isfinite(top):  # a hand-made state: start the live models level
            live, top = [0.0] * len(models), 0.0
        norm = top + math.log(math.fsum(math.exp(x - top) for x in live))
        for m, value in list(log_w.items()):
            if m not in models:
                log_w[m] = float(value) - norm
        floor = share / len(models)
        for m, x in zip(models, live, strict=True):
            log_w[m] = math.log((1.0 - share) * math.exp(x - norm) + floor)
    shift_to_zero(log_w, models)


def weight_floor(log_w: dict[str, Any], models: Sequence[str], floor: float) -> None:
    """Raise every live model's weight to at least ``floor / K`` of the live total, then shift
    the best live model to 0.

    Like fixed-share, this bounds how far a model can fall behind (it takes over within about
    ``ln(K / floor) / eta`` losses of the leader), but it moves no weight to models that are
    above the floor. That matters under bandit feedback, where a model that is not drawn gets no
    loss: mixing weight back into it every round would make it drift up until it is drawn (and
    wrong) often, while a floor leaves it where the losses put it."""
    if floor > 0.0:
        live = [float(log_w.get(m, 0.0)) for m in models]
        top = max(live)
        if math.isfinite(top):
            norm = top + math.log(math.fsum(math.exp(x - top) for x in live))
            low = norm + math.log(floor / len(models))
            for m, x in zip(models, live, strict=True):
                if x < low:
                    log_w[m] = low
    shift_to_zero(log_w, models)


def discount(state: State, key: str, models: Sequence[str], factor: float, rest: float) -> None:
    """Move each live model's ``state[key][model]`` toward ``rest``:
    ``v <- rest + factor * (v - rest)`` (a missing entry reads as ``rest`` and stays so).

    Applied to every live model once per feedback, before the new observation is added, an
    observation ``k`` feedbacks old weighs ``factor ** k``: the statistics follow roughly the
    last ``1 / (1 - factor)`` feedbacks, so they track a model whose quality changes."""
    if factor >= 1.0:
        return
    t = state.get(key)
    if not isinstance(t, dict):
        return
    for m in models:
        if m in t:
            t[m] = rest + factor * (float(t[m]) - rest)


def make_policy(name: str, models: Sequence[str], **params: Any) -> SelectionPolicy:
    """Build the policy called ``name`` (one of :data:`POLICIES`) over ``models``."""
    cls: type[SelectionPolicy] = _CHOICE.load(name)
    return cls(models, **params)

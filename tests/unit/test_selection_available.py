"""Selection among the available models: every policy draws only models that can answer (a
connected replica), records the probability it actually drew with, and behaves exactly as
before when every model is available."""

from __future__ import annotations

import copy
import math
import random
from collections import Counter
from typing import Any

import pytest

from clipper.selection import UCB1, ABSplit, EpsilonGreedy, Exp3, Exp4, State, make_policy

ABC = ["a", "b", "c"]

# One state per policy in which "a" is (one of) the best, so a policy that ignored availability
# would draw it.
STATES: dict[str, tuple[dict[str, Any], State]] = {
    "exp3": ({"gamma": 0.2}, {"log_w": {"a": 0.0, "b": -0.7, "c": -1.5}, "n": 3}),
    "epsilon_greedy": (
        {"epsilon": 0.3},
        {"count": {"a": 4, "b": 2, "c": 3}, "loss_sum": {"a": 1.0, "b": 1.5, "c": 0.6}, "n": 9},
    ),
    "ucb1": (
        {},
        {"count": {"a": 4, "b": 2, "c": 3}, "reward_sum": {"a": 3.0, "b": 0.5, "c": 2.4}, "n": 9},
    ),
    "thompson": (
        {},
        {"alpha": {"a": 3.0, "b": 1.5, "c": 2.0}, "beta": {"a": 1.0, "b": 2.5, "c": 1.5}, "n": 6},
    ),
    "ab_split": ({"weights": {"a": 5, "b": 3, "c": 2}}, {"count": {}, "n": 0}),
    "exp4": ({}, {"log_w": {"a": 0.0, "b": -0.7, "c": -1.5}, "n": 3}),
    "single": ({}, {"n": 0}),
}

# The first model of 40 selections from STATES with random.Random(11), recorded with the code
# before selection knew of availability: with every model available nothing may change.
BEFORE = {
    "exp3": "abcaabaabbaaabbaccbbaaaaaaaaacababaacccb",
    "epsilon_greedy": "cccccccccbccccccccccaaccccacccccccccbccc",
    "ucb1": "c" * 40,
    "thompson": "caaaacbacbacbcaaaaacacaaaccaaabbcaaaacaa",
    "ab_split": "abcabbabbbaaacbaccbbaabaaaaaacbbabaacccb",
    "exp4": "a" * 40,
    "single": "a" * 40,
}


def sequence(name: str, available: Any, n: int = 40) -> str:
    params, state = STATES[name]
    policy = make_policy(name, ABC, **params)
    rng = random.Random(11)
    return "".join(policy.select(state, rng, available)[0] for _ in range(n))


@pytest.mark.parametrize("name", sorted(STATES))
def test_with_every_model_available_the_draws_are_those_of_before(name: str) -> None:
    assert sequence(name, None) == BEFORE[name]
    assert sequence(name, set(ABC)) == BEFORE[name]
    assert sequence(name, frozenset([*ABC, "not-linked"])) == BEFORE[name]


@pytest.mark.parametrize("name", sorted(STATES))
def test_a_model_that_is_not_available_is_never_drawn(name: str) -> None:
    params, state = STATES[name]
    policy = make_policy(name, ABC, **params)
    before = copy.deepcopy(state)
    rng = random.Random(3)
    drawn = Counter(m for _ in range(2000) for m in policy.select(state, rng, {"b", "c"}))
    assert drawn["a"] == 0
    assert drawn["b"] + drawn["c"] >= 2000
    only_c = {m for _ in range(200) for m in policy.select(state, rng, ["c"])}
    assert only_c == {"c"}
    assert state == before  # choosing among fewer models learns nothing and moves nothing


@pytest.mark.parametrize("name", sorted(STATES))
def test_nothing_available_means_choosing_as_if_all_were(name: str) -> None:
    # The caller then reports "no replica"; the policy must still return a non-empty choice.
    assert sequence(name, set()) == BEFORE[name]
    assert sequence(name, {"not-linked"}) == BEFORE[name]


def test_exp3_renormalises_its_probabilities_over_the_available_models() -> None:
    params, state = STATES["exp3"]
    p = Exp3(ABC, **params)
    w_b, w_c = math.exp(-0.7), math.exp(-1.5)
    expected = {
        "b": 0.8 * w_b / (w_b + w_c) + 0.2 / 2,
        "c": 0.8 * w_c / (w_b + w_c) + 0.2 / 2,
    }
    got = p.probabilities(state, {"b", "c"})
    assert got == pytest.approx(expected)
    assert "a" not in got
    assert math.fsum(got.values()) == pytest.approx(1.0)
    assert p.draw_probability(state, "b", {"b", "c"}) == pytest.approx(expected["b"])
    assert p.draw_probability(state, "a", {"b", "c"}) is None  # it cannot be drawn
    # All available: the probabilities of before (over all three).
    assert p.probabilities(state, set(ABC)) == p.probabilities(state)
    assert p.draw_probability(state, "a", set(ABC)) == p.draw_probability(state, "a")


def test_exp3_draws_with_the_probability_it_records_so_the_update_is_unbiased() -> None:
    params, state = STATES["exp3"]
    p = Exp3(ABC, **params)
    available = {"b", "c"}
    rng = random.Random(5)
    n = 40_000
    hits = Counter(p.select(state, rng, available)[0] for _ in range(n))
    for m in ("b", "c"):
        recorded = p.draw_probability(state, m, available)
        assert recorded is not None
        assert hits[m] / n == pytest.approx(recorded, abs=0.01)
        # The importance-weighted estimate of a loss of 1 (1/p when drawn, else 0) averages
        # to 1: Exp3's update stays unbiased with the recorded probability.
        assert hits[m] / recorded / n == pytest.approx(1.0, abs=0.03)


def test_exp3_divides_by_the_probability_among_the_available_models() -> None:
    params, state = STATES["exp3"]
    p = Exp3(ABC, floor=0.0, **params)
    prob = p.draw_probability(state, "b", {"b", "c"})
    assert prob is not None and prob > p.probabilities(state)["b"]
    p.observe(state, {"b": 0}, 1, lambda _o, _l: 1.0, drawn={"b": prob})
    # b lost 1, divided by its probability among b and c; a was the top and stays at 0.
    assert state["log_w"]["b"] == pytest.approx(-0.7 - 0.1 / prob)
    assert state["log_w"]["a"] == 0.0


def test_epsilon_greedy_explores_uniformly_over_the_available_models() -> None:
    _, state = STATES["epsilon_greedy"]
    p = EpsilonGreedy(ABC, epsilon=1.0)
    rng = random.Random(2)
    n = 6000
    drawn = Counter(p.select(state, rng, {"a", "c"})[0] for _ in range(n))
    assert set(drawn) == {"a", "c"}
    assert drawn["a"] / n == pytest.approx(0.5, abs=0.03)
    # Greedy: c has the lowest mean loss (0.2); without c, a (0.25) beats b (0.75).
    greedy = EpsilonGreedy(ABC, epsilon=0.0)
    assert greedy.select(state, rng) == ["c"]
    assert greedy.select(state, rng, {"a", "b"}) == ["a"]
    # A model never tried goes first, but only if it is available.
    fresh = greedy.init_state()
    assert greedy.select(fresh, rng) == ["a"]
    assert greedy.select(fresh, rng, {"b", "c"}) == ["b"]


def test_ucb1_and_thompson_take_the_best_available_model() -> None:
    ucb = UCB1(ABC)
    _, state = STATES["ucb1"]
    scores = ucb.scores(state)
    assert max(scores, key=lambda m: scores[m]) == "c"
    assert ucb.select(state, random.Random(0), {"a", "b"}) == [
        max(("a", "b"), key=lambda m: scores[m])
    ]
    fresh = ucb.init_state()
    assert ucb.select(fresh, random.Random(0), {"b", "c"}) == ["b"]  # untried, available first
    ts = make_policy("thompson", ABC)
    sure = {"alpha": {"a": 1000.0, "b": 1.0, "c": 1.0}, "beta": {"a": 1.0, "b": 1.0, "c": 1.0}}
    rng = random.Random(4)
    assert {ts.select(sure, rng)[0] for _ in range(50)} == {"a"}
    assert {ts.select(sure, rng, {"b", "c"})[0] for _ in range(400)} == {"b", "c"}


def test_ab_split_renormalises_its_weights_over_the_available_models() -> None:
    p = ABSplit(ABC, weights={"a": 6, "b": 3, "c": 1})
    assert p.split() == pytest.approx({"a": 0.6, "b": 0.3, "c": 0.1})
    assert p.split(set(ABC)) == p.split()
    assert p.split({"b", "c"}) == pytest.approx({"b": 0.75, "c": 0.25})
    rng = random.Random(9)
    n = 8000
    drawn = Counter(p.select(p.init_state(), rng, {"b", "c"})[0] for _ in range(n))
    assert drawn["a"] == 0
    assert drawn["b"] / n == pytest.approx(0.75, abs=0.02)
    # Only models outside the test are available: they answer, evenly, rather than nobody.
    canary = ABSplit(ABC, weights={"a": 1})
    assert canary.split({"b", "c"}) == {"b": 0.5, "c": 0.5}
    assert canary.split({"a", "b"}) == {"a": 1.0, "b": 0.0}


def test_exp4_asks_the_available_models_and_its_confidence_is_over_them() -> None:
    p = Exp4(ABC)
    s = p.init_state()
    assert p.select(s, random.Random(0), {"a", "c"}) == ["a", "c"]
    # c has no replica: a and b agreeing is full confidence, not two thirds.
    both = p.combine(s, {"a": 1, "b": 1}, {"a", "b"})
    assert both.output == 1 and both.confidence == pytest.approx(1.0)
    assert p.combine(s, {"a": 1, "b": 1}).confidence == pytest.approx(2 / 3)
    # b is a straggler among the available: it still lowers the confidence.
    assert p.combine(s, {"a": 1}, {"a", "b"}).confidence == pytest.approx(0.5)
    # Weighted: the weights are renormalised over the available models.
    _, weighted = STATES["exp4"]
    got = p.combine(weighted, {"b": 2.0, "c": 4.0}, {"b", "c"})
    w_b, w_c = math.exp(-0.7), math.exp(-1.5)
    assert got.output == pytest.approx((2.0 * w_b + 4.0 * w_c) / (w_b + w_c))
    assert got.used == ("b", "c")
    assert p.weights(weighted, {"b", "c"}) == pytest.approx(
        {"b": w_b / (w_b + w_c), "c": w_c / (w_b + w_c)}
    )
    # An output from a model said not to be available still counts (no KeyError).
    assert p.combine(s, {"a": 1, "c": 1}, {"a"}).output == 1

"""Selection policies: update rules against hand-computed values, combining, losses, user states."""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import orjson
import pytest

from clipper.errors import BadInputError, ConfigError
from clipper.selection import (
    LOSSES,
    POLICIES,
    UCB1,
    ABSplit,
    Combined,
    EpsilonGreedy,
    Exp3,
    Exp4,
    SelectionPolicy,
    SingleModel,
    State,
    Thompson,
    UserStates,
    make_loss,
    make_policy,
)

ABC = ["a", "b", "c"]
ZERO_ONE = make_loss("0/1")


def const(value: float) -> Any:
    """A loss that ignores output and label."""
    return lambda _o, _l: value


def frequencies(policy: SelectionPolicy, state: State, n: int, seed: int = 7) -> dict[str, float]:
    rng = random.Random(seed)
    counts = Counter(m for _ in range(n) for m in policy.select(state, rng))
    return {m: counts[m] / n for m in policy.models}


# --- factory and parameters -------------------------------------------------------------------


def test_make_policy_builds_every_policy() -> None:
    kinds = {
        "single": SingleModel,
        "exp3": Exp3,
        "exp4": Exp4,
        "epsilon_greedy": EpsilonGreedy,
        "ucb1": UCB1,
        "thompson": Thompson,
        "ab_split": ABSplit,
    }
    assert set(kinds) == set(POLICIES)
    for name, cls in kinds.items():
        p = make_policy(name, ABC)
        assert type(p) is cls
        assert p.name == name
        assert p.models == ("a", "b", "c")


def test_unknown_policy_lists_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"'exp5'.*single, exp3, exp4"):
        make_policy("exp5", ABC)


@pytest.mark.parametrize("name", POLICIES)
def test_unknown_param_is_named(name: str) -> None:
    with pytest.raises(ConfigError, match=r"'bogus'.*accepted"):
        make_policy(name, ABC, bogus=1)


@pytest.mark.parametrize(
    ("name", "params", "bad"),
    [
        ("exp3", {"eta": 0}, "eta"),
        ("exp3", {"eta": -1}, "eta"),
        ("exp3", {"eta": "fast"}, "eta"),
        ("exp3", {"eta": True}, "eta"),
        ("exp3", {"gamma": 1.5}, "gamma"),
        ("exp3", {"eta": math.inf}, "eta"),
        ("exp4", {"tolerance": -0.1}, "tolerance"),
        ("epsilon_greedy", {"epsilon": 2}, "epsilon"),
    ],
)
def test_invalid_param_values(name: str, params: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError, match=repr(bad)):
        make_policy(name, ABC, **params)


def test_params_are_recorded_with_defaults_and_strings_parse() -> None:
    p = make_policy("exp3", ABC, eta="0.5")
    assert p.params == {"eta": 0.5, "gamma": 0.0, "floor": 0.001, "feedback": "bandit"}
    assert make_policy("exp4", ABC).params == {"eta": 0.1, "tolerance": 0.1, "share": 0.01}


@pytest.mark.parametrize("models", [[], "ab", ["a", "a"], ["a", ""], ["a", 3]])
def test_bad_model_lists(models: Any) -> None:
    with pytest.raises(ConfigError):
        make_policy("exp3", models)


# --- single -----------------------------------------------------------------------------------


def test_single_uses_the_first_model_and_counts_feedback() -> None:
    p = make_policy("single", ABC)
    s = p.init_state()
    assert p.select(s, random.Random(0)) == ["a"]
    assert p.combine(s, {"a": 42}) == Combined(42, 1.0, ("a",))
    p.observe(s, {"a": 42}, 41, ZERO_ONE)
    p.observe(s, {"a": 42}, 42, ZERO_ONE)
    assert s == {"n": 2}


def test_combine_without_outputs_of_our_models_is_an_error() -> None:
    p = make_policy("single", ABC)
    with pytest.raises(ValueError, match="no output"):
        p.combine(p.init_state(), {})
    with pytest.raises(ValueError, match="no output"):
        p.combine(p.init_state(), {"zzz": 1})


# --- exp3 -------------------------------------------------------------------------------------


def test_exp3_update_by_hand() -> None:
    p = Exp3(ABC, eta=0.5, gamma=0.0, floor=0)
    s = p.init_state()
    assert p.probabilities(s) == pytest.approx(dict.fromkeys(ABC, 1 / 3), abs=1e-15)
    p.observe(s, {"b": "x"}, "y", const(1.0))
    # l_hat = 1 / (1/3) = 3, so log w_b = -0.5 * 3
    assert s["log_w"] == {"a": 0.0, "b": -1.5, "c": 0.0}
    assert s["n"] == 1
    z = 2 + math.exp(-1.5)
    probs = p.probabilities(s)
    assert probs["a"] == pytest.approx(1 / z, abs=1e-12)
    assert probs["b"] == pytest.approx(math.exp(-1.5) / z, abs=1e-12)
    assert probs["c"] == pytest.approx(1 / z, abs=1e-12)


def test_exp3_second_update_divides_by_the_probability_before_it() -> None:
    p = Exp3(ABC, eta=0.5, floor=0)
    s = p.init_state()
    p.observe(s, {"b": 0}, 0, const(1.0))
    p_a = 1 / (2 + math.exp(-1.5))
    p.observe(s, {"a": 0}, 0, const(0.4))
    # log w_a = -0.5 * 0.4 / p_a; then everything shifts so the best (c, still 0) stays at 0
    assert s["log_w"]["a"] == pytest.approx(-0.2 / p_a, abs=1e-12)
    assert s["log_w"]["b"] == -1.5
    assert s["log_w"]["c"] == 0.0


def test_exp3_clips_losses_to_unit_interval() -> None:
    p = Exp3(ABC, eta=0.5, floor=0)
    s = p.init_state()
    p.observe(s, {"b": 0}, 0, const(7.0))
    assert s["log_w"]["b"] == -1.5
    p.observe(s, {"c": 0}, 0, const(-3.0))
    assert s["log_w"]["c"] == 0.0


def test_exp3_sampling_frequencies_match_probabilities() -> None:
    p = Exp3(ABC, eta=0.5)
    s = p.init_state()
    p.observe(s, {"b": 0}, 0, const(1.0))
    probs = p.probabilities(s)
    freq = frequencies(p, s, 20_000)
    for m in ABC:
        assert abs(freq[m] - probs[m]) < 0.01


def test_exp3_gamma_mixes_in_uniform_exploration() -> None:
    p = Exp3(ABC, eta=0.5, gamma=0.3)
    s = {"log_w": {"a": 0.0, "b": -1.5, "c": 0.0}, "n": 1}
    z = 2 + math.exp(-1.5)
    probs = p.probabilities(s)
    assert probs["a"] == pytest.approx(0.7 / z + 0.1, abs=1e-12)
    assert probs["b"] == pytest.approx(0.7 * math.exp(-1.5) / z + 0.1, abs=1e-12)
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-12)
    # gamma = 1 is pure uniform exploration whatever the weights
    uniform = Exp3(ABC, gamma=1.0).probabilities(s)
    assert uniform == pytest.approx(dict.fromkeys(ABC, 1 / 3), abs=1e-15)


def test_exp3_several_outputs_get_the_full_information_update() -> None:
    p = Exp3(ABC, eta=0.5, floor=0)
    s = p.init_state()
    losses = {"a": 0.2, "b": 1.0}
    p.observe(s, {"a": "a", "b": "b"}, None, lambda o, _l: losses[o])
    # No division by p: every loss is known. Then shift so the best (c) is at 0.
    assert s["log_w"] == pytest.approx({"a": -0.1, "b": -0.5, "c": 0.0}, abs=1e-15)


def test_exp3_weights_stay_finite_and_relative_to_the_best() -> None:
    p = Exp3(["a", "b"], eta=1.0)
    s = p.init_state()
    for _ in range(2_000):
        p.observe(s, {"a": 0}, 0, const(1.0))
        p.observe(s, {"b": 0}, 0, const(0.5))
    assert max(s["log_w"].values()) == 0.0
    assert all(math.isfinite(v) for v in s["log_w"].values())
    assert p.select(s, random.Random(0)) == ["b"]
    orjson.dumps(s)


def test_exp3_combine_is_the_one_output() -> None:
    p = Exp3(ABC)
    assert p.combine(p.init_state(), {"b": [1, 2]}) == Combined([1, 2], 1.0, ("b",))


# --- exp4 -------------------------------------------------------------------------------------


def weighted(w: dict[str, float], **params: Any) -> tuple[Exp4, State]:
    p = Exp4(list(w), **params)
    return p, {"log_w": {m: math.log(x) for m, x in w.items()}, "n": 0}


def test_exp4_evaluates_every_model_in_order() -> None:
    p = Exp4(ABC)
    assert p.select(p.init_state(), random.Random(0)) == ABC


def test_exp4_weights_by_hand() -> None:
    p, s = weighted({"a": 0.5, "b": 0.3, "c": 0.2})
    assert p.weights(s) == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2}, abs=1e-12)


def test_exp4_vote_by_hand() -> None:
    p, s = weighted({"a": 0.5, "b": 0.3, "c": 0.2})
    r = p.combine(s, {"a": 1, "b": 1, "c": 2})
    assert (r.output, r.used) == (1, ("a", "b", "c"))
    assert r.confidence == pytest.approx(0.8, abs=1e-12)
    # c straggles: same answer, and c disagreed anyway, so confidence stays .8
    r = p.combine(s, {"a": 1, "b": 1})
    assert (r.output, r.used) == (1, ("a", "b"))
    assert r.confidence == pytest.approx(0.8, abs=1e-12)
    # b straggles: a (.5) outvotes c (.2); b's agreeing weight is lost -> .5
    r = p.combine(s, {"a": 1, "c": 2})
    assert (r.output, r.used) == (1, ("a", "c"))
    assert r.confidence == pytest.approx(0.5, abs=1e-12)
    # a straggles: b (.3) outvotes c (.2)
    r = p.combine(s, {"b": 1, "c": 2})
    assert r.output == 1
    assert r.confidence == pytest.approx(0.3, abs=1e-12)


def test_exp4_int_outputs_vote_and_weight_beats_headcount() -> None:
    p, s = weighted({"a": 0.4, "b": 0.35, "c": 0.25})
    r = p.combine(s, {"a": 1, "b": 2, "c": 2})
    assert r.output == 2
    assert r.confidence == pytest.approx(0.6, abs=1e-12)
    r = p.combine(s, {"a": 7, "b": 2, "c": 3})
    assert r.output == 7
    assert r.confidence == pytest.approx(0.4, abs=1e-12)


def test_exp4_vote_tie_goes_to_the_earlier_model() -> None:
    p = Exp4(["a", "b"])
    r = p.combine(p.init_state(), {"a": "cat", "b": "dog"})
    assert r.output == "cat"
    assert r.confidence == 0.5


def test_exp4_votes_on_json_equality() -> None:
    p = Exp4(ABC)
    s = p.init_state()
    r = p.combine(s, {"a": {"x": 1, "y": 2}, "b": {"y": 2, "x": 1}, "c": {"x": 3}})
    assert r.output == {"x": 1, "y": 2}
    assert r.confidence == pytest.approx(2 / 3, abs=1e-12)
    # true is not 1: the two 1s win
    r = p.combine(s, {"a": True, "b": 1, "c": 1})
    assert r.output == 1
    assert r.output is not True
    assert r.confidence == pytest.approx(2 / 3, abs=1e-12)
    r = p.combine(s, {"a": [1, 2], "b": "x", "c": [1, 2]})
    assert r.output == [1, 2]


def test_exp4_regression_weighted_mean_by_hand() -> None:
    p, s = weighted({"a": 0.5, "b": 0.3, "c": 0.2}, tolerance=0.1)
    r = p.combine(s, {"a": 1.0, "b": 2.0, "c": 4.0})
    # .5*1 + .3*2 + .2*4 = 1.9; within 10% (0.19) of it: only b
    assert r.output == pytest.approx(1.9, abs=1e-12)
    assert r.confidence == pytest.approx(0.3, abs=1e-12)
    # a float among ints makes it a regression too
    r = p.combine(s, {"a": 1, "b": 2.0, "c": 4})
    assert r.output == pytest.approx(1.9, abs=1e-12)


def test_exp4_tolerance_rule() -> None:
    p, s = weighted({"a": 0.5, "b": 0.3, "c": 0.2}, tolerance=0.5)
    # mean 1.9, band 0.95: a (off .9) and b (off .1) agree, c (off 2.1) does not
    r = p.combine(s, {"a": 1.0, "b": 2.0, "c": 4.0})
    assert r.confidence == pytest.approx(0.8, abs=1e-12)
    # c straggles: mean over a, b = (.5 + .6) / .8 = 1.375; band .6875 holds both
    r = p.combine(s, {"a": 1.0, "b": 2.0})
    assert r.output == pytest.approx(1.375, abs=1e-12)
    assert r.confidence == pytest.approx(0.8, abs=1e-12)
    assert r.used == ("a", "b")
    # tolerance 0: identical outputs still agree with their own mean
    p0, s0 = weighted({"a": 0.5, "b": 0.3, "c": 0.2}, tolerance=0.0)
    r = p0.combine(s0, {"a": 0.1, "b": 0.1, "c": 0.1})
    assert r.output == pytest.approx(0.1, abs=1e-15)
    assert r.confidence == pytest.approx(1.0, abs=1e-12)


def test_exp4_observe_updates_each_answered_weight_by_hand() -> None:
    p = Exp4(ABC, eta=0.1, share=0)
    s = p.init_state()
    losses = {"a": 0.0, "b": 1.0, "c": 0.5}
    p.observe(s, {"a": "a", "b": "b", "c": "c"}, None, lambda o, _l: losses[o])
    assert s["log_w"] == pytest.approx({"a": 0.0, "b": -0.1, "c": -0.05}, abs=1e-15)
    z = 1 + math.exp(-0.1) + math.exp(-0.05)
    w = p.weights(s)
    assert w["a"] == pytest.approx(1 / z, abs=1e-12)
    assert w["b"] == pytest.approx(math.exp(-0.1) / z, abs=1e-12)
    # a straggler gets no update
    p.observe(s, {"b": "b", "c": "c"}, None, lambda o, _l: losses[o])
    assert s["log_w"] == pytest.approx({"a": 0.0, "b": -0.2, "c": -0.1}, abs=1e-15)
    assert s["n"] == 2


def test_exp4_learns_to_trust_the_accurate_model() -> None:
    p = Exp4(ABC, eta=0.5, share=0)
    s = p.init_state()
    for _ in range(50):
        outputs = {"a": 1, "b": 2, "c": 2}  # b and c are wrong together
        p.observe(s, outputs, 1, ZERO_ONE)
    r = p.combine(s, {"a": 1, "b": 2, "c": 2})
    assert r.output == 1
    assert r.confidence > 0.99


# --- epsilon greedy -----------------------------------------------------------------------------


def test_epsilon_greedy_tries_untried_models_first_then_the_best() -> None:
    p = EpsilonGreedy(ABC, epsilon=0.0, discount=1)
    s = p.init_state()
    rng = random.Random(0)
    seen = []
    for loss in (0.5, 0.2, 0.9):
        (m,) = p.select(s, rng)
        seen.append(m)
        p.observe(s, {m: 0}, 0, const(loss))
    assert seen == ["a", "b", "c"]
    assert p.mean_losses(s) == {"a": 0.5, "b": 0.2, "c": 0.9}
    assert p.select(s, rng) == ["b"]
    p.observe(s, {"b": 0}, 0, const(1.0))  # b's mean becomes .6, so a leads
    assert s["count"]["b"] == 2
    assert s["loss_sum"]["b"] == pytest.approx(1.2)
    assert p.select(s, rng) == ["a"]


def test_epsilon_greedy_explores_with_probability_epsilon() -> None:
    p = EpsilonGreedy(ABC, epsilon=0.3)
    s = {"count": {"a": 1, "b": 1, "c": 1}, "loss_sum": {"a": 0.5, "b": 0.1, "c": 0.9}, "n": 3}
    freq = frequencies(p, s, 20_000)
    assert abs(freq["b"] - 0.8) < 0.01  # .7 greedy + .3 / 3
    assert abs(freq["a"] - 0.1) < 0.01
    assert abs(freq["c"] - 0.1) < 0.01


# --- ucb1 -------------------------------------------------------------------------------------


def test_ucb1_plays_each_model_once_first() -> None:
    p = UCB1(ABC)
    s = p.init_state()
    rng = random.Random(0)
    order = []
    for _ in range(3):
        (m,) = p.select(s, rng)
        order.append(m)
        p.observe(s, {m: 0}, 0, const(0.0))
    assert order == ABC


def test_ucb1_bonus_by_hand() -> None:
    p = UCB1(["a", "b"], exploration=1)  # the textbook bound
    # a: mean .8 over 10 plays, bonus sqrt(2 ln 12 / 10) = .705 -> 1.505
    # b: mean .5 over 2 plays, bonus sqrt(2 ln 12 / 2) = 1.576 -> 2.076: the bonus wins
    s = {"count": {"a": 10, "b": 2}, "reward_sum": {"a": 8.0, "b": 1.0}, "n": 12}
    scores = p.scores(s)
    assert scores["a"] == pytest.approx(0.8 + math.sqrt(2 * math.log(12) / 10), abs=1e-12)
    assert scores["b"] == pytest.approx(0.5 + math.sqrt(2 * math.log(12) / 2), abs=1e-12)
    assert p.select(s, random.Random(0)) == ["b"]
    # a: .8 + sqrt(2 ln 150 / 100) = 1.117; b: .2 + sqrt(2 ln 150 / 50) = .648: the mean wins
    s = {"count": {"a": 100, "b": 50}, "reward_sum": {"a": 80.0, "b": 10.0}, "n": 150}
    assert p.select(s, random.Random(0)) == ["a"]


def test_ucb1_observe_by_hand() -> None:
    p = UCB1(ABC, discount=1)
    s = p.init_state()
    p.observe(s, {"b": 0}, 0, const(0.25))
    p.observe(s, {"b": 0}, 0, const(3.0))  # clipped to 1 -> reward 0
    assert s["count"] == {"a": 0, "b": 2, "c": 0}
    assert s["reward_sum"] == {"a": 0.0, "b": 0.75, "c": 0.0}
    assert s["n"] == 2


# --- thompson ---------------------------------------------------------------------------------


def test_thompson_posterior_by_hand() -> None:
    p = Thompson(ABC, discount=1)
    s = p.init_state()
    for loss in (0.2, 1.0, 0.0):
        p.observe(s, {"a": 0}, 0, const(loss))
    # alpha = 1 + .8 + 0 + 1, beta = 1 + .2 + 1 + 0
    assert s["alpha"]["a"] == pytest.approx(2.8, abs=1e-12)
    assert s["beta"]["a"] == pytest.approx(2.2, abs=1e-12)
    assert s["alpha"]["b"] == s["beta"]["b"] == 1.0


def test_thompson_prefers_the_clearly_better_model() -> None:
    p = Thompson(["a", "b"])
    s = p.init_state()
    for _ in range(100):
        p.observe(s, {"a": 0}, 0, const(0.9))
        p.observe(s, {"b": 0}, 0, const(0.1))
    assert frequencies(p, s, 2_000)["b"] > 0.9


def test_thompson_explores_when_nothing_is_known() -> None:
    freq = frequencies(Thompson(ABC), Thompson(ABC).init_state(), 6_000)
    assert all(abs(f - 1 / 3) < 0.03 for f in freq.values())


# --- ab split ---------------------------------------------------------------------------------


def test_ab_split_frequencies_follow_weights_and_feedback_does_not_move_them() -> None:
    p = make_policy("ab_split", ABC, weights={"a": 3, "b": 1})
    s = p.init_state()
    freq = frequencies(p, s, 20_000)
    assert abs(freq["a"] - 0.75) < 0.01
    assert abs(freq["b"] - 0.25) < 0.01
    assert freq["c"] == 0.0
    for _ in range(50):
        p.observe(s, {"a": 0}, 1, ZERO_ONE)
    assert s["count"] == {"a": 50, "b": 0, "c": 0}
    assert frequencies(p, s, 20_000) == freq


def test_ab_split_defaults_to_even_and_ignores_unlinked_names() -> None:
    p = ABSplit(["a", "b"])
    assert p.probabilities == {"a": 0.5, "b": 0.5}
    p = ABSplit(["a", "b"], weights={"b": 1, "later": 5})
    assert p.probabilities == {"a": 0.0, "b": 1.0}


@pytest.mark.parametrize(
    "weights",
    [{"a": 0, "b": 0}, {"zzz": 1}, {"a": -1, "b": 2}, {"a": "x"}, {"a": True}, [1, 2], 3],
)
def test_ab_split_bad_weights(weights: Any) -> None:
    with pytest.raises(ConfigError, match="weight"):
        make_policy("ab_split", ABC, weights=weights)


# --- losses -----------------------------------------------------------------------------------


def test_zero_one_loss() -> None:
    assert LOSSES == ("0/1", "squared", "absolute")
    assert ZERO_ONE("cat", "cat") == 0.0
    assert ZERO_ONE("cat", "dog") == 1.0
    assert ZERO_ONE(1, 1.0) == 0.0
    assert ZERO_ONE(True, 1) == 1.0
    assert ZERO_ONE(0, False) == 1.0
    assert ZERO_ONE(True, True) == 0.0
    assert ZERO_ONE([1, 2], [1, 2.0]) == 0.0
    assert ZERO_ONE([1, True], [1, 1]) == 1.0
    assert ZERO_ONE({"a": [1]}, {"a": [1.0]}) == 0.0
    assert ZERO_ONE({"a": 1}, {"a": 1, "b": 2}) == 1.0
    assert ZERO_ONE([1], {"0": 1}) == 1.0
    assert ZERO_ONE(None, None) == 0.0


def test_squared_and_absolute_losses_with_scale() -> None:
    sq = make_loss("squared")
    assert sq(0.5, 0.2) == pytest.approx(0.09)
    assert sq(3, 1) == 1.0  # (2)^2 clipped
    sq10 = make_loss("squared", scale=10.0)
    assert sq10(3, 1) == pytest.approx(0.04)  # 2^2 / 10^2
    assert sq10(30, 1) == 1.0
    ab = make_loss("absolute", scale=4)
    assert ab(3, 1) == pytest.approx(0.5)
    assert ab(-9, 1) == 1.0
    assert ab(1, 1) == 0.0


def test_regression_losses_on_things_that_are_not_numbers() -> None:
    for kind in ("squared", "absolute"):
        loss = make_loss(kind)
        assert loss("3", 3) == 1.0
        assert loss(True, 1) == 1.0
        assert loss([3], 3) == 1.0
        assert loss(math.nan, 3) == 1.0
        with pytest.raises(BadInputError, match="label"):
            loss(3, "3")


def test_loss_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"'hinge'.*0/1, squared, absolute"):
        make_loss("hinge")
    for scale in (0, -1, math.inf, math.nan):
        with pytest.raises(ConfigError, match="scale"):
            make_loss("squared", scale=scale)


def test_a_raising_loss_leaves_the_state_unchanged() -> None:
    p = Exp4(ABC)
    s = p.init_state()
    before = orjson.dumps(s)
    with pytest.raises(BadInputError):
        p.observe(s, {"a": 1.0, "b": 2.0}, "not a number", make_loss("squared"))
    assert orjson.dumps(s) == before


# --- user states ------------------------------------------------------------------------------


def test_user_states_evict_least_recently_used() -> None:
    evicted: list[tuple[str, State]] = []
    us = UserStates(Exp3(ABC), capacity=2, on_evict=lambda u, s: evicted.append((u, s)))
    sa = us.get("alice")
    us.get("bob")
    assert us.get("alice") is sa  # alice is now the most recent
    Exp3(ABC).observe(sa, {"a": 0}, 0, const(1.0))
    us.get("carol")  # evicts bob
    assert [u for u, _ in evicted] == ["bob"]
    us.get("dave")  # evicts alice, with her updates
    assert [u for u, _ in evicted] == ["bob", "alice"]
    assert evicted[1][1] is sa
    assert evicted[1][1]["n"] == 1
    assert [u for u, _ in us.items()] == ["carol", "dave"]
    assert len(us) == 2
    assert "alice" not in us


def test_user_states_load_on_miss_else_fresh() -> None:
    saved = {"alice": {"log_w": {"a": -2.0}, "n": 9}}
    asked: list[str] = []

    def load(uid: str) -> State | None:
        asked.append(uid)
        return saved.get(uid)

    us = UserStates(Exp3(ABC), load=load)
    assert us.get("alice") == {"log_w": {"a": -2.0}, "n": 9}
    assert us.get("bob") == Exp3(ABC).init_state()
    us.get("alice")
    assert asked == ["alice", "bob"]  # the second alice was a memory hit


def test_user_states_put_replaces_and_refreshes() -> None:
    evicted: list[str] = []
    us = UserStates(SingleModel(ABC), capacity=2, on_evict=lambda u, _s: evicted.append(u))
    us.get("alice")
    us.get("bob")
    us.put("alice", {"n": 5})
    us.put("carol", {"n": 1})
    assert evicted == ["bob"]
    assert us.get("alice") == {"n": 5}


def test_the_shared_state_is_kept_apart_and_never_evicted() -> None:
    evicted: list[str] = []
    us = UserStates(SingleModel(ABC), capacity=1, on_evict=lambda u, _s: evicted.append(u))
    shared = us.get("")
    us.get("alice")
    us.get("bob")
    assert evicted == ["alice"]
    assert us.get("") is shared
    assert [u for u, _ in us.items()] == ["", "bob"]
    assert len(us) == 2
    with pytest.raises(ConfigError, match="capacity"):
        UserStates(SingleModel(ABC), capacity=0)


# --- every policy: serialisable state, models linked later, models unlinked ----------------------


def exercise(p: SelectionPolicy, s: State, rounds: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(rounds):
        chosen = p.select(s, rng)
        assert chosen
        assert set(chosen) <= set(p.models)
        assert chosen == [m for m in p.models if m in chosen]  # stable order
        outputs = {m: (i + len(m)) % 3 for m in chosen}
        straggled = dict(list(outputs.items())[: max(1, len(outputs) - 1)])
        r = p.combine(s, straggled)
        assert 0.0 <= r.confidence <= 1.0
        assert set(r.used) == set(straggled)
        p.observe(s, straggled, i % 3, ZERO_ONE)


@pytest.mark.parametrize("name", POLICIES)
def test_state_round_trips_through_json(name: str) -> None:
    p = make_policy(name, ABC)
    s = p.init_state()
    exercise(p, s, 60)
    assert s["n"] == 60
    back = orjson.loads(orjson.dumps(s))
    assert back == s
    exercise(p, back, 10)  # a loaded state works on
    orjson.dumps(back)


@pytest.mark.parametrize("name", POLICIES)
def test_models_linked_later_start_fresh(name: str) -> None:
    old = make_policy(name, ["a", "b"])
    s = old.init_state()
    exercise(old, s, 30)
    new = make_policy(name, ["a", "b", "c"])
    exercise(new, s, 30)
    orjson.dumps(s)
    # and a model unlinked later is ignored, whatever the state remembers of it
    fewer = make_policy(name, ["b", "c"])
    exercise(fewer, s, 30)
    assert all(m in ("b", "c") for m in fewer.select(s, random.Random(3)))


def test_a_fresh_model_starts_level_with_the_best() -> None:
    s = {"log_w": {"a": 0.0, "b": -3.0}, "n": 5}
    p = Exp3(["a", "b", "c"])
    probs = p.probabilities(s)
    assert probs["c"] == pytest.approx(probs["a"], abs=1e-15)
    w = Exp4(["a", "b", "c"]).weights(s)
    assert w["c"] == pytest.approx(w["a"], abs=1e-15)
    assert UCB1(["a", "c"]).select({"count": {"a": 4}}, random.Random(0)) == ["c"]
    assert EpsilonGreedy(["a", "c"], epsilon=0).select({}, random.Random(0)) == ["a"]
    t = Thompson(["a", "c"])
    t.observe({}, {"c": 0}, 0, const(0.0))


def test_unknown_output_models_are_ignored_by_observe() -> None:
    p = Exp4(["a", "b"])
    s = p.init_state()
    p.observe(s, {"a": 1, "gone": 2}, 1, ZERO_ONE)
    assert set(s["log_w"]) == {"a", "b"}

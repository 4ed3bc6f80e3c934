"""Forgetting and bandit feedback in the selection policies: the update rules against
hand-computed values, their parameters, states saved before forgetting existed, and recovery
when the best model changes."""

from __future__ import annotations

import math
import random
from typing import Any

import orjson
import pytest

from clipper.errors import ConfigError
from clipper.selection import (
    POLICIES,
    UCB1,
    EpsilonGreedy,
    Exp3,
    Exp4,
    State,
    Thompson,
    make_loss,
    make_policy,
)

ABC = ["a", "b", "c"]
ZERO_ONE = make_loss("0/1")
LEARNERS = ("exp3", "exp4", "epsilon_greedy", "ucb1", "thompson")


def const(value: float) -> Any:
    return lambda _o, _l: value


# --- parameters ----------------------------------------------------------------------------------


def test_forgetting_is_on_by_default() -> None:
    assert make_policy("exp3", ABC).params["floor"] == 0.001
    assert make_policy("exp4", ABC).params["share"] == 0.01
    for name in ("epsilon_greedy", "ucb1", "thompson"):
        assert make_policy(name, ABC).params["discount"] == 0.998
    assert make_policy("ucb1", ABC).params["exploration"] == 0.3


@pytest.mark.parametrize(
    ("name", "params", "bad", "expected"),
    [
        ("exp4", {"share": 1.5}, "share", ">= 0 and <= 1"),
        ("exp4", {"share": -0.1}, "share", ">= 0 and <= 1"),
        ("exp3", {"floor": "lots"}, "floor", ">= 0 and <= 1"),
        ("epsilon_greedy", {"discount": 0}, "discount", "> 0 and <= 1"),
        ("ucb1", {"discount": 1.01}, "discount", "> 0 and <= 1"),
        ("thompson", {"discount": None}, "discount", "> 0 and <= 1"),
        ("ucb1", {"exploration": -1}, "exploration", ">= 0"),
        ("exp3", {"feedback": "partial"}, "feedback", '"bandit", "full"'),
        ("thompson", {"feedback": ["bandit"]}, "feedback", '"bandit", "full"'),
    ],
)
def test_bad_forgetting_params_name_the_parameter_and_the_range(
    name: str, params: dict[str, Any], bad: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as e:
        make_policy(name, ABC, **params)
    assert repr(bad) in str(e.value) and expected in str(e.value)


def test_feedback_mode_is_bandit_for_one_model_learners_unless_asked() -> None:
    for name in ("exp3", "epsilon_greedy", "ucb1", "thompson"):
        assert make_policy(name, ABC).bandit_feedback is True
        full = make_policy(name, ABC, feedback="full")
        assert full.bandit_feedback is False and full.params["feedback"] == "full"
    for name in ("single", "exp4", "ab_split"):
        assert make_policy(name, ABC).bandit_feedback is False
    with pytest.raises(ConfigError, match="'feedback'"):
        make_policy("exp4", ABC, feedback="bandit")  # exp4 evaluates every model anyway


def test_only_exp3_knows_its_draw_probability() -> None:
    p = Exp3(ABC, eta=0.5, floor=0)
    s = {"log_w": {"a": 0.0, "b": -1.5, "c": 0.0}, "n": 1}
    assert p.draw_probability(s, "b") == pytest.approx(math.exp(-1.5) / (2 + math.exp(-1.5)))
    for name in POLICIES:
        if name != "exp3":
            policy = make_policy(name, ABC, **({"weights": {"a": 1}} if name == "ab_split" else {}))
            assert policy.draw_probability(policy.init_state(), "a") is None


# --- exp4: fixed-share ---------------------------------------------------------------------------


def test_exp4_fixed_share_by_hand() -> None:
    p = Exp4(["a", "b"], eta=1.0, share=0.1)
    s = p.init_state()
    p.observe(s, {"a": 0, "b": 1}, 0, ZERO_ONE)
    # w = (1, e^-1), normalised, then (1 - .1) * w + .1 / 2
    z = 1 + math.exp(-1)
    mixed = {"a": 0.9 / z + 0.05, "b": 0.9 * math.exp(-1) / z + 0.05}
    assert p.weights(s) == pytest.approx(mixed, abs=1e-12)
    assert s["log_w"]["a"] == 0.0
    assert s["log_w"]["b"] == pytest.approx(math.log(mixed["b"] / mixed["a"]), abs=1e-12)
    # a second round: the same rule on the mixed weights
    p.observe(s, {"a": 0, "b": 1}, 0, ZERO_ONE)
    wb = mixed["b"] * math.exp(-1)
    z2 = mixed["a"] + wb
    assert p.weights(s)["b"] == pytest.approx(0.9 * wb / z2 + 0.05, abs=1e-12)


def test_exp4_share_keeps_every_weight_above_share_over_k() -> None:
    p = Exp4(ABC, eta=1.0, share=0.03)
    s = p.init_state()
    for _ in range(500):
        p.observe(s, {"a": 1, "b": 2, "c": 2}, 1, ZERO_ONE)
    w = p.weights(s)
    assert w["b"] >= 0.01 - 1e-12 and w["c"] >= 0.01 - 1e-12
    # b sits at the rule's fixed point: x = .97 * x e^-1 / (w_a + 2 x e^-1) + .03 / 3
    x = w["b"]
    assert x == pytest.approx(0.97 * x * math.exp(-1) / (w["a"] + 2 * x * math.exp(-1)) + 0.01)
    assert all(math.isfinite(v) for v in s["log_w"].values())


def test_exp4_share_zero_is_plain_hedge() -> None:
    p = Exp4(ABC, eta=0.1, share=0)
    s = p.init_state()
    p.observe(s, {"a": 0, "b": 1, "c": 1}, 0, ZERO_ONE)
    assert s["log_w"] == pytest.approx({"a": 0.0, "b": -0.1, "c": -0.1}, abs=1e-15)


def test_exp4_share_moves_unlinked_models_with_the_normaliser() -> None:
    p = Exp4(["a", "b"], eta=1.0, share=0.1)
    s: State = {"log_w": {"a": 0.0, "b": 0.0, "gone": -2.0}, "n": 0}
    p.observe(s, {"a": 0, "b": 1}, 0, ZERO_ONE)
    # the live weights are normalised by z = 1 + e^-1 (gone moves by -log z with them), a's
    # becomes .9 / z + .05, and the shift that puts a back at 0 moves gone too
    z = 1 + math.exp(-1)
    a_mixed = 0.9 / z + 0.05
    assert s["log_w"]["gone"] == pytest.approx(-2.0 - math.log(z) - math.log(a_mixed), abs=1e-12)


# --- exp3: the probability of the draw, and the weight floor -------------------------------------


def test_exp3_divides_by_the_recorded_draw_probability() -> None:
    p = Exp3(ABC, eta=0.5, floor=0)
    s = p.init_state()
    p.observe(s, {"b": 0}, 1, ZERO_ONE, drawn={"b": 0.25})
    assert s["log_w"] == {"a": 0.0, "b": -2.0, "c": 0.0}  # 0.5 * 1 / 0.25, not / (1/3)
    # a probability that cannot be one falls back to the state's own
    for bad in (0.0, 1.5, math.nan):
        t = p.init_state()
        p.observe(t, {"b": 0}, 1, ZERO_ONE, drawn={"b": bad})
        assert t["log_w"]["b"] == pytest.approx(-1.5, abs=1e-12)
    # several outputs: the full-information update, the probabilities are not used
    t = p.init_state()
    p.observe(t, {"a": 1, "b": 0}, 1, ZERO_ONE, drawn={"a": 0.5, "b": 0.5})
    assert t["log_w"] == pytest.approx({"a": 0.0, "b": -0.5, "c": 0.0}, abs=1e-15)


def test_exp3_floor_by_hand() -> None:
    p = Exp3(ABC, eta=1.0, floor=0.3)
    s = p.init_state()
    p.observe(s, {"b": 0}, 1, ZERO_ONE, drawn={"b": 1 / 3})
    # log w_b = -3; the live total is 2 + e^-3, and b may not fall below .3 / 3 of it
    low = math.log(0.1 * (2 + math.exp(-3)))
    assert s["log_w"] == pytest.approx({"a": 0.0, "b": low, "c": 0.0}, abs=1e-12)
    # above the floor nothing moves (unlike mixing): a small loss stays exactly as computed
    q = Exp3(ABC, eta=0.1, floor=0.3)
    t = q.init_state()
    q.observe(t, {"b": 0}, 1, ZERO_ONE, drawn={"b": 0.5})
    assert t["log_w"] == pytest.approx({"a": 0.0, "b": -0.2, "c": 0.0}, abs=1e-15)


def test_exp3_floor_bounds_how_far_a_model_falls() -> None:
    p = Exp3(ABC, eta=0.5, floor=0.03)
    s = p.init_state()
    for _ in range(300):
        p.observe(s, {"c": 0}, 1, ZERO_ONE)
    # c's weight is clipped to .03 / 3 of the total before the clip (where its own share was
    # negligible), so its probability is .01 / (1 + .01)
    assert p.probabilities(s)["c"] == pytest.approx(0.01 / 1.01, rel=1e-9)


# --- epsilon greedy, UCB1, Thompson: discounting -------------------------------------------------


def test_epsilon_greedy_discount_by_hand() -> None:
    p = EpsilonGreedy(ABC, epsilon=0.0, discount=0.5)
    s = p.init_state()
    p.observe(s, {"a": 0}, 0, const(0.5))
    p.observe(s, {"b": 0}, 0, const(0.2))
    p.observe(s, {"a": 0}, 0, const(1.0))
    # a: count .25 + 1, loss .125 + 1; b: count .5, loss .1; c never seen
    assert s["count"] == pytest.approx({"a": 1.25, "b": 0.5, "c": 0.0})
    assert s["loss_sum"] == pytest.approx({"a": 1.125, "b": 0.1, "c": 0.0})
    assert p.mean_losses(s) == pytest.approx({"a": 0.9, "b": 0.2, "c": None})
    assert p.select(s, random.Random(0)) == ["c"]  # never tried: still first


def test_ucb1_discount_and_exploration_by_hand() -> None:
    p = UCB1(["a", "b"], discount=0.5, exploration=1.0)
    s = p.init_state()
    p.observe(s, {"a": 0}, 0, const(0.0))
    p.observe(s, {"b": 0}, 0, const(1.0))
    assert s["count"] == pytest.approx({"a": 0.5, "b": 1.0})
    assert s["reward_sum"] == pytest.approx({"a": 0.5, "b": 0.0})
    scores = p.scores(s)
    assert scores["a"] == pytest.approx(1.0 + math.sqrt(2 * math.log(1.5) / 0.5), abs=1e-12)
    assert scores["b"] == pytest.approx(0.0 + math.sqrt(2 * math.log(1.5) / 1.0), abs=1e-12)
    half = UCB1(["a", "b"], exploration=0.3)
    assert half.scores(s)["b"] == pytest.approx(0.3 * math.sqrt(2 * math.log(1.5)), abs=1e-12)
    # discounted counts that sum below 1: no negative log under the root, the means decide
    tiny = {"count": {"a": 0.3, "b": 0.2}, "reward_sum": {"a": 0.1, "b": 0.2}, "n": 9}
    assert p.scores(tiny) == pytest.approx({"a": 1 / 3, "b": 1.0})


def test_thompson_discount_by_hand() -> None:
    p = Thompson(["a", "b"], discount=0.5)
    s = p.init_state()
    p.observe(s, {"a": 0}, 0, const(0.2))
    assert (s["alpha"]["a"], s["beta"]["a"]) == pytest.approx((1.8, 1.2))
    p.observe(s, {"b": 0}, 0, const(1.0))
    # a moves halfway back to the prior (1, 1); b gets its loss
    assert s["alpha"] == pytest.approx({"a": 1.4, "b": 1.0})
    assert s["beta"] == pytest.approx({"a": 1.1, "b": 2.0})


# --- states saved before forgetting existed ------------------------------------------------------


OLD_STATES: dict[str, dict[str, Any]] = {
    "exp3": {"log_w": {"a": 0.0, "b": -40.0, "c": -1.0}, "n": 41},
    "exp4": {"log_w": {"a": 0.0, "b": -40.0, "c": -1.0}, "n": 41},
    "epsilon_greedy": {"count": {"a": 3, "b": 1}, "loss_sum": {"a": 0.0, "b": 1.0}, "n": 4},
    "ucb1": {"count": {"a": 3, "b": 1}, "reward_sum": {"a": 3.0, "b": 0.0}, "n": 4},
    "thompson": {"alpha": {"a": 4.0, "b": 1.0}, "beta": {"a": 1.0, "b": 2.0}, "n": 4},
}


@pytest.mark.parametrize("name", LEARNERS)
def test_states_saved_before_forgetting_still_load_and_learn(name: str) -> None:
    p = make_policy(name, ABC)
    s = orjson.loads(orjson.dumps(OLD_STATES[name]))
    for _ in range(5):
        chosen = p.select(s, random.Random(1))
        p.observe(s, dict.fromkeys(chosen, 1), 1, ZERO_ONE)
    assert s["n"] == OLD_STATES[name]["n"] + 5
    assert orjson.loads(orjson.dumps(s)) == s


def test_old_states_keep_whole_counts_without_discount() -> None:
    p = EpsilonGreedy(ABC, epsilon=0.0, discount=1)
    s = orjson.loads(orjson.dumps(OLD_STATES["epsilon_greedy"]))
    p.observe(s, {"a": 0}, 0, ZERO_ONE)
    assert s["count"]["a"] == 4 and isinstance(s["count"]["a"], int)


def test_exp3_floor_pulls_an_old_deep_weight_up_on_the_next_feedback() -> None:
    p = Exp3(ABC, eta=0.1, floor=0.03)
    s = orjson.loads(orjson.dumps(OLD_STATES["exp3"]))
    p.observe(s, {"a": 0}, 0, ZERO_ONE)  # a right: no loss, but the floor applies
    assert p.probabilities(s)["b"] > 0.0099


# --- recovery when the best model changes --------------------------------------------------------


def rounds_until_switch(name: str, **params: Any) -> int | None:
    """a is right and b wrong for 2000 rounds, then the reverse: after how many rounds of the
    second phase does the policy answer with b on 20 draws in a row (None: not within 1000)?"""
    p = make_policy(name, ["a", "b"], **params)
    s = p.init_state()
    rng = random.Random(5)

    def step(right: str) -> str:
        """One query and its feedback (label 1); the model whose answer was given."""
        outputs = {"a": 1 if right == "a" else 2, "b": 1 if right == "b" else 2}
        chosen = p.select(s, rng)
        answer = p.combine(s, {m: outputs[m] for m in chosen}).output
        if p.bandit_feedback:
            (m,) = chosen
            prob = p.draw_probability(s, m)
            p.observe(s, {m: outputs[m]}, 1, ZERO_ONE, drawn=None if prob is None else {m: prob})
        else:
            p.observe(s, outputs, 1, ZERO_ONE)
        return "a" if answer == outputs["a"] else "b"

    for _ in range(2000):
        step("a")
    streak = 0
    for t in range(1, 1001):
        streak = streak + 1 if step("b") == "b" else 0
        if streak == 20:
            return t
    return None


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("exp3", {"feedback": "full"}),
        ("exp4", {}),
        ("epsilon_greedy", {"epsilon": 0.05}),
        ("epsilon_greedy", {"epsilon": 0.05, "feedback": "full"}),
        ("ucb1", {"feedback": "full"}),
        ("thompson", {"feedback": "full"}),
    ],
)
def test_forgetting_follows_a_change_that_the_stationary_rule_misses(
    name: str, params: dict[str, Any]
) -> None:
    off = {"exp3": {"floor": 0}, "exp4": {"share": 0}}.get(name, {"discount": 1})
    assert rounds_until_switch(name, **params) is not None
    assert rounds_until_switch(name, **params, **off) is None

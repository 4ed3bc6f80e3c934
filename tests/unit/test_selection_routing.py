"""The selection runner routes around a model with no connected replica, on a fake clock over
fake-transport schedulers: a one-model policy draws among the models that can answer (and
records the probability it drew with), an ensemble asks and counts only them, and the default
for "no replica" is left for a query none of whose linked models has one."""

from __future__ import annotations

from typing import Any

from clipper.inputs import InputType
from clipper.registry import Application
from clipper.selection.draws import Draw
from tests.unit import test_deadlines
from tests.unit.test_deadlines import SLO_US, Answers, Frontend

frontends = test_deadlines.frontends  # each frontend is closed after its test


def selection_frontend(
    frontends: list[Frontend], policy: str, models: list[str], **app: Any
) -> Frontend:
    f = Frontend(Application("app", InputType.DOUBLES, "-1", SLO_US, policy=policy, **app), models)
    frontends.append(f)
    sel = f.query.selection.selection(f.registry.apps["app"])
    sel.states.put("", sel.policy.init_state())  # a known user: no state to load, no task
    return f


def kill(f: Frontend, model: str) -> None:
    """The model's only replica is gone (as when the manager sees its process exit)."""
    replica = f.replicas[model]
    assert replica.scheduler is not None
    replica.scheduler.remove_replica(replica)


def revive(f: Frontend, model: str) -> None:
    f.schedulers[model, "1"].add_replica(f.replicas[model])


def defaults(f: Frontend, reason: str) -> float:
    value = f.metrics.registry.get_sample_value(
        "clipper_app_default_outputs_total", {"app": "app", "reason": reason}
    )
    return value or 0.0


def ask(f: Frontend, x: float) -> tuple[list[bytes], Any]:
    """One query; the replicas it reached answer ``x + 0.5``; (models asked, the answer)."""
    answers = Answers(f.clock)
    sent = len(f.transport.sent)
    f.predict("app", b'{"input": [%f]}' % x, answers)
    asked = [link.identity for link, _, _ in f.transport.sent[sent:]]
    for identity in asked:
        f.answer(identity.decode(), [x + 0.5])
    if not answers.got:  # nothing could be asked: the answer comes at the deadline
        f.clock.advance(f.registry.apps["app"].slo_s)
    _, doc = answers.one()
    return asked, doc


def test_exp3_with_a_dead_model_answers_every_query_from_the_other(
    frontends: list[Frontend],
) -> None:
    f = selection_frontend(frontends, "exp3", ["a", "b"])
    runner = f.query.selection
    # Both up: exp3 (fresh, 50/50) draws both.
    drawn = {ask(f, float(i))[0][0] for i in range(40)}
    assert drawn == {b"a", b"b"}
    kill(f, "a")
    assert runner.available(["a", "b"]) == frozenset({"b"})
    for i in range(100, 140):
        asked, doc = ask(f, float(i))
        assert asked == [b"b"]
        assert doc["default"] is False
        assert doc["output"] == i + 0.5
        assert doc["models"] == ["b"]
        # The draw is recorded with the probability it was made with: b was the only choice.
        [payload] = f.transport.sent[-1][2]
        assert runner.draws("app").take("", payload) == Draw("b", 1.0)
    assert defaults(f, "no_replica") == 0
    revive(f, "a")
    assert runner.available(["a", "b"]) is None
    assert {ask(f, float(i))[0][0] for i in range(200, 240)} == {b"a", b"b"}


def test_the_recorded_draw_is_the_probability_among_the_available_models(
    frontends: list[Frontend],
) -> None:
    f = selection_frontend(frontends, "exp3", ["a", "b", "c"])
    runner = f.query.selection
    kill(f, "a")
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [7.0]}', answers)
    [(link, _, [payload])] = f.transport.sent
    model = link.identity.decode()
    assert model in {"b", "c"}
    # Fresh weights: 1/2 among b and c (1/3 would be the probability over all three).
    assert runner.draws("app").take("", payload) == Draw(model, 0.5)
    f.answer(model, [1.0])
    assert answers.one()[1]["models"] == [model]


def test_epsilon_greedy_and_ab_split_answer_from_the_model_that_is_up(
    frontends: list[Frontend],
) -> None:
    # epsilon-greedy tries the untried models in order (a first); an A/B split sends all to a.
    for policy, params in (
        ("epsilon_greedy", {"epsilon": 0.0}),
        ("ab_split", {"weights": {"a": 1}}),
    ):
        f = selection_frontend(frontends, policy, ["a", "b"], policy_params=params)
        assert ask(f, 1.0)[0] == [b"a"]
        kill(f, "a")
        for i in range(20):
            asked, doc = ask(f, float(i))
            assert asked == [b"b"], policy
            assert doc["default"] is False and doc["output"] == i + 0.5
        assert defaults(f, "no_replica") == 0


def test_an_ensemble_asks_only_the_models_that_are_up_and_they_make_full_confidence(
    frontends: list[Frontend],
) -> None:
    f = selection_frontend(frontends, "exp4", ["a", "b", "c"], min_confidence=0.9)
    kill(f, "c")
    asked, doc = ask(f, 1.0)
    assert sorted(asked) == [b"a", b"b"]
    assert doc["default"] is False
    assert doc["confidence"] == 1.0  # c is not a straggler: it was not asked
    assert sorted(doc["models"]) == ["a", "b"]
    missing = f.metrics.registry.get_sample_value(
        "clipper_model_missing_contributions_total", {"app": "app", "model": "c"}
    )
    assert not missing
    # A straggler among the models that are up still lowers the confidence (below 0.9 here).
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [2.0]}', answers)
    f.answer("a", [2.5])
    f.clock.advance(f.registry.apps["app"].slo_s)
    _, late = answers.one()
    assert late["default"] is True and late["confidence"] == 0.5
    assert defaults(f, "low_confidence") == 1
    assert defaults(f, "no_replica") == 0


def test_no_replica_is_the_default_only_when_no_linked_model_has_one(
    frontends: list[Frontend],
) -> None:
    f = selection_frontend(frontends, "exp3", ["a", "b"])
    kill(f, "a")
    kill(f, "b")
    assert f.query.selection.available(["a", "b"]) is None
    asked, doc = ask(f, 1.0)
    assert asked == []
    assert doc["default"] is True and doc["output"] == -1
    assert doc["default_explanation"].startswith("No replica of a chosen model is alive")
    assert defaults(f, "no_replica") == 1


def test_feedback_without_a_recorded_draw_draws_among_the_models_that_are_up(
    frontends: list[Frontend],
) -> None:
    f = selection_frontend(frontends, "exp3", ["a", "b"])
    runner = f.query.selection
    sel = runner.selection(f.registry.apps["app"])
    state = sel.states.get("")
    kill(f, "b")
    for i in range(30):
        draw = runner._draw_of(sel, state, "", b"never-asked-%d" % i)
        assert draw == Draw("a", 1.0)

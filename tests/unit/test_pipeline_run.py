"""Pipeline queries on a fake clock: stages run in order through the schedulers, each under its
deadline; time a fast stage leaves passes to the next; a stage that misses its budget is
degraded, dropped, or fails the whole query at once (and no later stage runs)."""

from __future__ import annotations

from typing import Any

import pytest

from clipper.inputs import InputType
from clipper.pipeline.spec import parse_pipeline
from clipper.pipeline.values import decode_payload, resolve
from clipper.registry import Application
from tests.unit import test_deadlines
from tests.unit.test_deadlines import Answers, Frontend

SLO_US = 50_000  # 50 ms: the answer margin is 2 ms
BUDGET = 0.050
END = BUDGET - 0.002  # the query's answer is due 48 ms after it arrived


class PipelineFrontend(Frontend):
    """A query processor with a pipeline runtime over fake-transport schedulers (``answer``
    and ``close`` as the deadline tests' frontend)."""

    def __init__(self, models: dict[str, InputType], pipeline: dict[str, Any]) -> None:
        plain = Application("plain", InputType.JSON, "null", SLO_US)
        super().__init__(plain, list(models), link=False, types=models)
        self.app = Application("p", InputType.JSON, '"fallback"', SLO_US, pipeline=pipeline)
        self.registry.add_app(self.app)

    def batches(self, model: str) -> list[Any]:
        """The deadlines of the tasks sent to ``model``."""
        self.transport.capture()
        tasks = self.transport.tasks
        return [t for r, msg_id, _ in self.transport.sent if r.identity == model.encode()
                for t in tasks.get(msg_id, [])]  # fmt: skip

    def ask(self, body: bytes = b'{"input": {"x": 2}}') -> Answers:
        answers = Answers(self.clock)
        self.predict("p", body, answers)
        return answers

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


frontends = test_deadlines.frontends  # the same fixture: each frontend is closed after the test


def three(frontends: list[Frontend], **middle: Any) -> PipelineFrontend:
    """feat (json) -> score (doubles) -> post (json), static shares 0.2 / 0.5 / 0.3."""
    f = PipelineFrontend(
        {"feat": InputType.JSON, "score": InputType.DOUBLES, "post": InputType.JSON},
        {
            "stages": [
                {"name": "feat", "model": "feat", "budget": 0.2},
                {"name": "score", "model": "score", "input": "$feat.vec", "budget": 0.5,
                 **middle},
                {"name": "post", "model": "post", "budget": 0.3,
                 "input": {"score": "$score", "x": "$request.x", "tag": "$$raw"}},
            ]
        },
    )  # fmt: skip
    frontends.append(f)
    return f


def test_three_stages_answer_in_order_and_the_leftover_passes_on(
    frontends: list[Frontend],
) -> None:
    f = three(frontends)
    t0 = f.clock.now()
    answers = f.ask()
    [feat] = f.batches("feat")
    assert feat.payload == b'{"x":2}'  # the request, passed through as it came
    assert feat.deadline == pytest.approx(t0 + 0.010)  # its share: 0.8 of 50 ms are after it
    assert f.batches("score") == []  # not before its input exists
    f.clock.advance(0.002)  # feat takes 2 of its 10 ms
    f.answer("feat", [{"vec": [1.0, 2.0]}])
    [score] = f.batches("score")
    assert score.payload == decode_payload_inverse([1.0, 2.0])
    # fixed at the query's deadline minus post's reserve: the 8 ms feat left over are score's
    assert score.deadline == pytest.approx(t0 + END - 0.015)
    # its 25 ms share and the 8 ms feat did not use, less the query's 2 ms answer margin
    assert score.deadline - f.clock.now() == pytest.approx(0.025 + 0.008 - 0.002)
    f.clock.advance(0.001)
    f.answer("score", [0.75])
    [post] = f.batches("post")
    assert decode_payload(InputType.JSON, post.payload) == {"score": 0.75, "x": 2, "tag": "$raw"}
    assert post.deadline == pytest.approx(t0 + END)
    f.answer("post", [{"label": "ok"}])
    _, doc = answers.one()
    assert doc == {"query_id": doc["query_id"], "output": {"label": "ok"}, "default": False}
    assert f.clock.pending() == 0
    assert f.metric("clipper_pipeline_stage_outcomes_total", app="p", stage="score",
                    outcome="answered") == 1  # fmt: skip
    assert f.metric("clipper_app_requests_total", app="p") == 1


def decode_payload_inverse(values: list[float]) -> bytes:
    from clipper.inputs import parse_input

    return parse_input(InputType.DOUBLES, values)


def test_a_slow_stage_with_a_default_is_degraded_at_its_deadline(
    frontends: list[Frontend],
) -> None:
    f = three(frontends, default=0.5)
    t0 = f.clock.now()
    answers = f.ask()
    f.answer("feat", [{"vec": [1.0]}])
    f.clock.advance(END - 0.015 - 1e-6)
    assert f.batches("post") == []
    f.clock.advance(1e-6)  # score's deadline: its default stands in for it
    [post] = f.batches("post")
    assert decode_payload(InputType.JSON, post.payload)["score"] == 0.5
    f.answer("score", [0.9])  # late: ignored
    f.answer("post", ["done"])
    at, doc = answers.one()
    assert at == pytest.approx(t0 + END - 0.015)
    assert doc["output"] == "done" and doc["default"] is False and doc["degraded"] == ["score"]
    assert f.metric("clipper_pipeline_stage_budget_misses_total", app="p", stage="score") == 1
    assert f.metric("clipper_pipeline_stage_outcomes_total", app="p", stage="score",
                    outcome="degraded") == 1  # fmt: skip


def test_a_stage_answer_that_arrived_unread_at_its_deadline_is_used(
    frontends: list[Frontend],
) -> None:
    """The stage's deadline timer reads the answers that arrived unread before it degrades
    the stage (the loop runs due timers before it reads its sockets)."""
    f = three(frontends, default=0.5)
    answers = f.ask()
    f.answer("feat", [{"vec": [1.0]}])
    f.transport.unread.append(lambda: f.answer("score", [0.9]))
    f.clock.advance(END - 0.015)  # score's deadline
    [post] = f.batches("post")
    assert decode_payload(InputType.JSON, post.payload)["score"] == 0.9
    f.answer("post", ["done"])
    _, doc = answers.one()
    assert doc["output"] == "done" and "degraded" not in doc


def test_a_slow_optional_stage_is_dropped(frontends: list[Frontend]) -> None:
    f = three(frontends, optional=True)
    answers = f.ask()
    f.answer("feat", [{"vec": [1.0]}])
    f.clock.advance(END - 0.015)
    [post] = f.batches("post")
    # a dropped stage's key is left out of an object
    assert decode_payload(InputType.JSON, post.payload) == {"x": 2, "tag": "$raw"}
    f.answer("post", ["done"])
    _, doc = answers.one()
    assert doc["output"] == "done" and doc["dropped"] == ["score"] and "degraded" not in doc


def test_a_slow_required_stage_answers_the_default_at_once_and_nothing_runs_after_it(
    frontends: list[Frontend],
) -> None:
    f = three(frontends)
    t0 = f.clock.now()
    answers = f.ask()
    f.answer("feat", [{"vec": [1.0]}])
    f.clock.advance(END - 0.015)  # score's deadline, 15 ms before the query's
    at, doc = answers.one()
    assert at == pytest.approx(t0 + END - 0.015)
    assert doc["default"] is True and doc["output"] == "fallback"
    assert (
        "Pipeline stage 'score' (model 'score') did not answer within its budget"
        in (doc["default_explanation"])
    )
    f.clock.advance(1.0)
    assert f.batches("post") == []  # never called
    assert f.clock.pending() == 0
    assert f.metric("clipper_pipeline_stage_outcomes_total", app="p", stage="post",
                    outcome="skipped") == 1  # fmt: skip
    assert f.metric("clipper_app_default_outputs_total", app="p", reason="slo") == 1


def test_a_missing_field_fails_the_stage_that_reads_it(frontends: list[Frontend]) -> None:
    f = three(frontends)
    answers = f.ask()
    f.answer("feat", [{"other": 1}])
    _, doc = answers.one()
    assert doc["default"] is True
    assert "$feat.vec does not exist: $feat is dict without 'vec'" in doc["default_explanation"]
    assert f.batches("score") == []


def test_auto_budgets_follow_observed_latency(frontends: list[Frontend]) -> None:
    f = PipelineFrontend(
        {"a": InputType.JSON, "b": InputType.JSON},
        {"stages": [{"name": "a", "model": "a"}, {"name": "b", "model": "b", "input": "$a"}]},
    )
    frontends.append(f)
    # nothing is known yet: even shares (25 ms each); a gets its own, b the rest of the 48
    t0 = f.clock.now()
    answers = f.ask()
    [a] = f.batches("a")
    assert a.deadline == pytest.approx(t0 + 0.025)
    f.answer("a", [1])
    f.clock.advance(0.004)
    f.answer("b", [2])
    assert answers.one()[1]["output"] == 2
    # b took 4 ms: its reserve is now its estimate and 1 ms, a may use the rest
    t1 = f.clock.now()
    f.ask(b'{"input": {"x": 3}}')
    a2 = f.batches("a")[-1]
    assert a2.deadline == pytest.approx(t1 + END - 0.005)
    f.answer("a", [1])  # (b's answer never comes: its estimate stays)
    # another setting changes: the estimates carry over; a new description applies at once
    f.registry.update_app("p", cache=False)
    t2 = f.clock.now()
    f.ask(b'{"input": {"x": 4}}')
    assert f.batches("a")[-1].deadline == pytest.approx(t2 + END - 0.005)
    f.answer("a", [1])
    f.registry.update_app(
        "p",
        pipeline={
            "stages": [
                {"name": "a", "model": "a"},
                {"name": "b", "model": "b", "input": "$a", "budget": 0.4},
            ]
        },
    )
    f.ask(b'{"input": {"x": 5}}')
    assert f.batches("a")[-1].deadline == pytest.approx(f.clock.now() + END - 0.020)


def test_admission_sheds_when_the_critical_path_expects_more_than_the_budget(
    frontends: list[Frontend], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = three(frontends)
    for model, expected in (("feat", 0.010), ("score", 0.030), ("post", 0.009)):
        sched = f.schedulers[model, "1"]
        monkeypatch.setattr(sched, "expected_latency_s", lambda e=expected: e)
    _, doc = f.ask().one()  # 49 ms expected, 48 left
    assert doc["default"] is True and doc["output"] == "fallback"
    assert "feat -> score -> post expects 49.0 ms" in doc["default_explanation"]
    assert f.transport.sent == [] and f.clock.pending() == 0
    assert f.metric("clipper_pipeline_shed_total", app="p") == 1
    f.registry.update_app("p", overload="reject")
    [(_, status, text)] = f.ask().got
    assert status == 503 and "expects 49.0 ms" in text
    monkeypatch.setattr(f.schedulers["post", "1"], "expected_latency_s", lambda: 0.008)
    f.ask()  # 48 ms: admitted
    assert len(f.batches("feat")) == 1


def test_a_stage_that_may_degrade_does_not_count_at_admission(
    frontends: list[Frontend], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = three(frontends, default=0.5)
    monkeypatch.setattr(f.schedulers["score", "1"], "expected_latency_s", lambda: 0.100)
    f.ask()  # score would be late: it is cut at its deadline and degraded, not the query shed
    assert len(f.batches("feat")) == 1
    assert f.metric("clipper_pipeline_shed_total", app="p") == 0


def test_resolve_combines_references() -> None:
    p = parse_pipeline(
        {"stages": [{"name": "s", "model": "m"}],
         "output": {"l": ["$s.0", "$request"], "k": "$s.-1", "c": 7}}
    )  # fmt: skip
    assert resolve(p.output, {"request": "r", "s": [4, 5]}) == {"l": [4, "r"], "k": 5, "c": 7}


def test_a_models_expected_latency_prices_its_queue_as_its_admission_does(
    frontends: list[Frontend],
    trust_one_batch: None,
) -> None:
    f = PipelineFrontend({"a": InputType.JSON}, {"stages": [{"name": "a", "model": "a"}]})
    frontends.append(f)
    sched = f.schedulers["a", "1"]
    assert sched.expected_latency_s() == 0.0  # nothing known yet
    f.ask(b'{"input": 1}')
    f.clock.advance(0.004)
    f.answer("a", [1])  # a batch of one took 4 ms: 250 inputs/s in batches of 8
    assert sched.expected_latency_s() == 0.0  # idle: it admits
    f.ask(b'{"input": 2}')
    f.clock.advance(0.001)
    # its own input at 4 ms, and 3 ms left of the batch running on the only replica
    assert sched.expected_latency_s() == pytest.approx(0.004 + 0.003)
    f.ask(b'{"input": 3}')
    assert sched.expected_latency_s() == pytest.approx(2 * 0.004 + 0.003)


def test_a_stage_that_cannot_start_fails_its_query_with_the_reason(
    frontends: list[Frontend], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = three(frontends)
    rt = f.query.pipelines
    assert rt is not None

    def broken(call: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(rt, "ask_model", broken)
    _, doc = f.ask().one()
    assert doc["default"] is True
    assert doc["default_explanation"] == (
        "Pipeline stage 'feat' (model 'feat') failed: RuntimeError: boom"
    )
    assert f.clock.pending() == 0

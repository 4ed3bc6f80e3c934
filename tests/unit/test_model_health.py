"""A version whose answers over the last minute are mostly errors is not ready, on a fake clock:
the window over a scheduler's totals (errors age out, the rule needs enough answers), and the
readiness of the applications linked to it flipping and back while a healthy one stays ready."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import pytest

from clipper.batching.health import (
    ERROR_FRACTION,
    MIN_ANSWERED,
    STEP_S,
    WINDOW_S,
    ModelHealth,
    Totals,
)
from clipper.clock import FakeClock
from clipper.dashboard.state import runtime_state
from clipper.inputs import InputType
from clipper.managers.base import ContainerManager
from clipper.registry import Application
from tests.unit.test_deadlines import SLO_US, Answers, Frontend


class NoProcesses:
    def all_replicas(self) -> list[Any]:
        return []


class Counts:
    def __init__(self) -> None:
        self.offered = self.answered = self.errors = self.missed = 0

    def totals(self) -> Totals:
        return (self.offered, self.answered, self.errors, self.missed)

    def answer(self, n: int, *, errors: int = 0) -> None:
        self.offered += n
        self.answered += n
        self.errors += errors


def test_the_constants_are_the_documented_rule() -> None:
    assert (WINDOW_S, MIN_ANSWERED, ERROR_FRACTION) == (60.0, 20, 0.5)


def test_a_window_needs_enough_answers_and_forgets_after_a_minute() -> None:
    clock = FakeClock()
    counts = Counts()
    health = ModelHealth(clock, counts.totals)
    assert health.reading().error_fraction is None  # nothing answered: no rate
    health.step()
    counts.answer(MIN_ANSWERED - 1, errors=MIN_ANSWERED - 1)
    health.failed("ValueError: boom\n  at line 3")
    r = health.reading()
    assert (r.answered, r.errors, r.error_fraction, r.failing) == (19, 19, 1.0, False)
    assert r.last_error == "ValueError: boom at line 3"  # one line
    clock.advance(STEP_S)
    health.step()
    counts.answer(1, errors=1)
    r = health.reading()
    assert (r.answered, r.errors, r.failing) == (20, 20, True)
    assert "answered 20 of its last 20 inputs with errors (100%" in r.reason("m:1")
    assert "latest error: ValueError: boom at line 3" in r.reason("m:1")
    # A minute on with nothing answered: the errors aged out, no error text left.
    clock.advance(WINDOW_S + STEP_S)
    r = health.reading()
    assert (r.answered, r.errors, r.failing, r.last_error) == (0, 0, False, None)


def test_the_window_slides_step_by_step() -> None:
    clock = FakeClock()
    counts = Counts()
    health = ModelHealth(clock, counts.totals)
    for _ in range(12):  # 12 steps of 5 s: 10 errors in each
        health.step()
        counts.answer(10, errors=10)
        clock.advance(STEP_S)
    assert health.reading().errors == 120
    for _ in range(6):  # half a minute of good answers, 10 a step
        health.step()
        counts.answer(10)
        clock.advance(STEP_S)
    r = health.reading()
    assert r.errors < 120 and r.answered - r.errors == 60
    assert r.failing  # still more errors than answers
    for _ in range(6):
        health.step()
        counts.answer(10)
        clock.advance(STEP_S)
    r = health.reading()
    assert r.errors == 0 and not r.failing


def test_defaults_count_the_missed_inputs_too() -> None:
    clock = FakeClock()
    counts = Counts()
    health = ModelHealth(clock, counts.totals)
    counts.offered += 10  # 10 offered: 4 shed or late, 2 errors, 4 answered well
    counts.missed += 4
    counts.answered += 6
    counts.errors += 2
    r = health.reading()
    assert (r.error_fraction, r.default_fraction) == (round(2 / 6, 4), 0.6)


# -- readiness, through real schedulers on a fake transport ------------------------------------
@pytest.fixture
def two_apps() -> Iterator[Frontend]:
    """``bad`` linked to ``m``, ``good`` linked to ``g``; no cache (each query reaches the
    model)."""
    f = Frontend(Application("bad", InputType.DOUBLES, "-1", SLO_US, cache=False), ["m", "g"],
                 link=False)  # fmt: skip
    f.registry.link("bad", "m")
    f.registry.add_app(Application("good", InputType.DOUBLES, "-1", SLO_US, cache=False))
    f.registry.link("good", "g")
    yield f
    f.close()


def _query(f: Frontend, app: str, model: str, i: int, error: str | None) -> None:
    answers = Answers(f.clock)
    f.predict(app, b'{"input": [%d.0]}' % i, answers)
    f.transport.capture()
    replica = f.replicas[model]
    [msg_id] = replica.in_flight
    assert replica.scheduler is not None
    outputs: list[object] | None = None if error else [float(i)]
    replica.scheduler.on_response(replica, msg_id, outputs, error, 10)
    assert len(answers.got) == 1


def test_a_model_failing_most_queries_is_not_ready_then_ready_again(two_apps: Frontend) -> None:
    f, catalog = two_apps, two_apps.catalog
    bad, good = f.registry.apps["bad"], f.registry.apps["good"]
    for i in range(MIN_ANSWERED - 1):
        _query(f, "bad", "m", i, "ValueError: boom")
        _query(f, "good", "g", i, None)
    assert catalog.ready() and catalog.app_ready(bad)  # 19 answers say nothing yet
    _query(f, "bad", "m", 99, "ValueError: boom")
    [why] = catalog.app_reasons(bad)
    assert why.startswith("application 'bad': model 'm:1' answered 20 of its last 20 inputs")
    assert "100%" in why and "latest error: ValueError: boom" in why
    assert catalog.app_ready(good)  # one bad model does not take the other application out
    assert catalog.reasons() == [why]  # the whole frontend's /ready says so
    assert catalog.reasons(model_errors=False) == []  # what a load balancer probes
    [failing] = catalog.failing_models()
    assert (failing["model"], failing["version"], failing["error_fraction"]) == ("m", "1", 1.0)
    # The dashboard's tables say the same.
    state = runtime_state(catalog, cast(ContainerManager, NoProcesses()))
    by_app = {a["name"]: a for a in state["apps"]}
    assert by_app["bad"]["ready"] is False and by_app["good"]["ready"] is True
    by_model = {m["name"]: m for m in state["models"]}
    assert by_model["m"]["failing"] is True and by_model["m"]["error_fraction"] == 1.0
    assert by_model["m"]["last_error"] == "ValueError: boom"
    assert by_model["g"]["failing"] is False and by_model["g"]["error_fraction"] == 0.0

    # It recovers: 20 good answers make it 50% (still not ready), one more brings it under.
    for i in range(20):
        _query(f, "bad", "m", 100 + i, None)
    assert not catalog.app_ready(bad)
    _query(f, "bad", "m", 200, None)
    assert catalog.app_ready(bad) and catalog.ready()

    # Failing again, then a quiet minute: the errors age out and it is ready again.
    for i in range(60):
        _query(f, "bad", "m", 300 + i, "ValueError: boom")
    assert not catalog.app_ready(bad)
    f.clock.advance(WINDOW_S + STEP_S)
    assert catalog.app_ready(bad) and catalog.failing_models() == []


def test_status_shows_a_pipelines_stages_as_its_linked_models() -> None:
    from clipper.cli_ops import _linked

    pipeline = {
        "linked_models": [],
        "stages": [
            {"name": "embed", "model": "encoder", "app": None},
            {"name": "rank", "model": None, "app": "ranker"},
        ],
    }
    assert _linked(pipeline) == ["embed=encoder", "rank=app:ranker"]
    assert _linked({"linked_models": ["m"], "stages": None}) == ["m"]

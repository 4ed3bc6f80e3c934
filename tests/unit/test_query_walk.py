"""The query runtime's shape, checked on real queries over a fake clock: a query enters the
processor once, goes to one runner by its application's kind, and reaches the models through
the submit seam; no runner holds the processor, and a pipeline's application stage is run by
that application's runner without going back through the processor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clipper.inputs import InputType
from clipper.query.kinds import AppKind
from clipper.query.processor import QueryProcessor
from clipper.query.seam import Submitter
from clipper.registry import Application
from tests.unit import test_deadlines
from tests.unit.test_deadlines import Answers, Frontend

frontends = test_deadlines.frontends  # each frontend is closed after its test


class Calls:
    """Counts the calls of chosen methods of live objects (and still calls them)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def watch(self, obj: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(obj, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.names.append(label)
            return inner(*args, **kwargs)

        setattr(obj, name, counted)


def watch_everything(f: Frontend) -> Calls:
    calls = Calls()
    calls.watch(f.proc, "predict", "processor")
    # the router's bound pick() is what the processor calls per query
    calls.watch(f.proc, "_pick", "pick")
    rt = f.query
    for label, runner in (
        ("single", rt.single),
        ("split", rt.split),
        ("selection", rt.selection),
        ("pipeline", rt.pipelines),
    ):
        calls.watch(runner, "run", label)
    seam = CountedSeam(rt.submitter, calls)
    for runner in (rt.single, rt.split, rt.selection, rt.pipelines):
        runner.seam = seam
    return calls


class CountedSeam:
    """The submit seam, counting submits."""

    def __init__(self, inner: Submitter, calls: Calls) -> None:
        self.inner = inner
        self.calls = calls

    def submit(self, *args: Any) -> bool:
        self.calls.names.append("seam")
        return self.inner.submit(*args)

    def explain(self, model: str, err: BaseException) -> Any:
        return self.inner.explain(model, err)

    def peek(self, model: str, version: str, payload: bytes) -> Any:
        return self.inner.peek(model, version, payload)

    def abandoned(self) -> None:
        self.inner.abandoned()


def test_no_runner_holds_the_processor_and_tables_name_runners_only(
    frontends: list[Frontend],
) -> None:
    f = Frontend(Application("app", InputType.DOUBLES, "-1", 20_000), ["m"])
    frontends.append(f)
    rt = f.query
    for runner in (rt.single, rt.split, rt.selection, rt.pipelines):
        held = [getattr(runner, a) for a in dir(runner) if not a.startswith("__")]
        assert not any(isinstance(v, QueryProcessor) for v in held), type(runner).__name__
        assert isinstance(runner.seam, Submitter)  # the seam is what they submit through
    assert set(rt.processor.runners.runners) == set(AppKind)
    assert set(rt.pipelines.stages.runners) == {AppKind.SINGLE, AppKind.SPLIT, AppKind.SELECTION}


def test_a_selection_query_passes_the_processor_one_runner_and_the_seam(
    frontends: list[Frontend],
) -> None:
    app = Application("app", InputType.DOUBLES, "-1", 20_000, policy="exp4")
    f = Frontend(app, ["a", "b"])
    frontends.append(f)
    sel = f.query.selection.selection(f.registry.apps["app"])
    sel.states.put("", sel.policy.init_state())  # a known user: no state to load
    calls = watch_everything(f)
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    assert calls.names == ["processor", "pick", "selection", "seam", "seam"]
    f.answer("a", [1.0])
    f.answer("b", [1.0])
    _, doc = answers.one()
    assert doc["default"] is False
    assert calls.names.count("processor") == 1  # answering never goes back to the processor


def test_a_pipeline_query_runs_its_application_stage_without_the_processor(
    frontends: list[Frontend],
) -> None:
    selection = Application("sel", InputType.JSON, "null", 50_000, policy="exp4")
    f = Frontend(selection, ["a", "b", "post"], link=False)
    frontends.append(f)
    f.registry.link("sel", "a")
    f.registry.link("sel", "b")
    stages = [
        {"name": "pick", "app": "sel"},
        {"name": "post", "model": "post", "input": {"picked": "$pick"}},
    ]
    f.registry.add_app(
        Application("p", InputType.JSON, "null", 50_000, pipeline={"stages": stages})
    )
    sel = f.query.selection.selection(f.registry.apps["sel"])
    sel.states.put("", sel.policy.init_state())
    calls = watch_everything(f)
    answers = Answers(f.clock)
    f.predict("p", b'{"input": {"x": 2}}', answers)
    assert calls.names == ["processor", "pick", "pipeline", "selection", "seam", "seam"]
    f.answer("a", [1])
    f.answer("b", [1])
    assert calls.names[-1] == "seam"  # the post stage, submitted by the pipeline runner
    f.answer("post", [{"ok": True}])
    _, doc = answers.one()
    assert doc["output"] == {"ok": True}
    assert calls.names.count("processor") == 1

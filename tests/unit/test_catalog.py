"""The read side: the scheduler table that only the reconciler writes (each write advances the
generation and tells the listeners), and the catalog's answers over it and the registry."""

from __future__ import annotations

from typing import Any, cast

from clipper.batching.scheduler import ModelScheduler
from clipper.inputs import InputType
from clipper.registry import Application, ModelVersion, Registry
from clipper.rollout import Rollout
from clipper.runtime.catalog import Catalog, SchedulerTable
from tests.catalogs import quiet_health


class Sched:
    def __init__(self, replicas: int) -> None:
        self.replicas: list[Any] = [object()] * replicas
        self.health = quiet_health()


def _sched(replicas: int = 1) -> ModelScheduler:
    return cast(ModelScheduler, Sched(replicas))


def world() -> tuple[Registry, SchedulerTable, Catalog]:
    registry = Registry()
    registry.add_app(Application("app", InputType.DOUBLES, "-1", 20_000))
    for v in ("1", "2"):
        registry.add_model(ModelVersion("m", v, InputType.DOUBLES))
    registry.set_model_version("m", "1")
    registry.link("app", "m")
    table = SchedulerTable()
    return registry, table, Catalog(registry, table)


def test_each_write_advances_the_generation_and_tells_the_listeners() -> None:
    _, table, catalog = world()
    heard: list[tuple[tuple[str, str], object]] = []
    catalog.subscribe(lambda key, sched: heard.append((key, sched)))
    one, two = _sched(), _sched()
    assert catalog.generation == 0
    table.put(("m", "1"), one)
    table.put(("m", "1"), one)  # the same scheduler again: nothing changed, nothing told
    table.put(("m", "2"), two)
    assert catalog.generation == 2
    assert table.pop(("m", "2")) is two
    assert table.pop(("m", "2")) is None  # already gone: no write
    assert catalog.generation == 3
    assert heard == [(("m", "1"), one), (("m", "2"), two), (("m", "2"), None)]


def test_the_current_version_is_resolved_in_one_place() -> None:
    registry, table, catalog = world()
    one, two = _sched(), _sched(replicas=0)
    table.put(("m", "1"), one)
    table.put(("m", "2"), two)
    assert catalog.scheduler("m") is one  # current
    assert catalog.scheduler("m", "2") is two  # pinned
    assert catalog.live("m", "2") is None  # no replica connected
    assert catalog.live("m") is one
    registry.set_model_version("m", "2")
    assert catalog.scheduler("m") is two  # follows the registry, no copy to refresh
    assert catalog.scheduler("nope") is None and catalog.current("nope") is None
    assert catalog.has_version("m", "2") and not catalog.has_version("m", "3")
    assert catalog.versions("m") == ["1", "2"]
    assert [k for k, _ in catalog.schedulers()] == [("m", "1"), ("m", "2")]


def test_links_rollouts_and_readiness_read_the_same_state() -> None:
    registry, table, catalog = world()
    assert catalog.linked("app") == ["m"] and catalog.linked("other") == []
    app = catalog.app("app")
    assert app is not None and catalog.single_model(app) == "m"
    assert catalog.rollout("m") is None
    registry.set_rollout("m", Rollout.build("m", {"1": 90, "2": 10}))
    rollout = catalog.rollout("m")
    assert rollout is not None and rollout.split
    registry.models["m"]["1"] = ModelVersion("m", "1", InputType.DOUBLES, num_replicas=1)
    assert catalog.reasons() == ["application 'app': model 'm:1' has no replica connected"]
    assert catalog.unready() == ["m:1"] and not catalog.ready()
    assert not catalog.app_ready(app)
    table.put(("m", "1"), _sched())
    assert catalog.ready() and catalog.app_ready(app) and catalog.unready() == []


# -- one application's readiness: each kind, ready and not, with its reasons -------------------


def kinds() -> tuple[Registry, SchedulerTable, Catalog]:
    """``single`` (model a), ``sel`` (exp4 over a and b), ``pipe`` (a required stage on model
    a, a stage with a default on b, an optional one on c, a required one on application
    sel), ``empty`` (nothing linked). Every model has version 1 (one replica wanted), current;
    no scheduler yet."""
    registry = Registry()
    for name in ("a", "b", "c"):
        registry.add_model(ModelVersion(name, "1", InputType.DOUBLES))
        registry.set_model_version(name, "1")
    registry.add_app(Application("single", InputType.DOUBLES, "-1", 20_000))
    registry.link("single", "a")
    registry.add_app(Application("sel", InputType.DOUBLES, "-1", 20_000, policy="exp4"))
    registry.link("sel", "a")
    registry.link("sel", "b")
    registry.add_app(Application("empty", InputType.DOUBLES, "-1", 20_000))
    stages = [
        {"name": "feat", "model": "a"},
        {"name": "score", "model": "b", "default": 0},
        {"name": "enrich", "model": "c", "optional": True},
        {"name": "pick", "app": "sel"},
    ]
    pipe = Application("pipe", InputType.DOUBLES, "-1", 20_000, pipeline={"stages": stages})
    registry.add_app(pipe)
    table = SchedulerTable()
    return registry, table, Catalog(registry, table)


def reasons_of(catalog: Catalog, name: str, version: str | None = None) -> list[str]:
    app = catalog.app(name)
    assert app is not None
    reasons = catalog.app_reasons(app, version)
    assert catalog.app_ready(app, version) is (not reasons)
    return reasons


def test_a_single_model_application_is_ready_when_its_current_version_has_a_replica() -> None:
    registry, table, catalog = kinds()
    missing = ["application 'single': model 'a:1' has no replica connected"]
    assert reasons_of(catalog, "single") == missing  # no scheduler yet
    table.put(("a", "1"), _sched(replicas=0))
    assert reasons_of(catalog, "single") == missing
    registry.models["a"]["1"] = ModelVersion("a", "1", InputType.DOUBLES, num_replicas=0)
    assert reasons_of(catalog, "single") == [  # scaled to none: it still cannot answer
        "application 'single': model 'a:1' has no replica connected (none is configured: "
        "num_replicas is 0)"
    ]
    table.put(("a", "1"), _sched())
    assert reasons_of(catalog, "single") == []
    # Pinned: that version, which must exist.
    assert reasons_of(catalog, "single", "1") == []
    assert reasons_of(catalog, "single", "9") == ["application 'single': model 'a' has no "
                                                  "version '9'"]  # fmt: skip
    registry.current.pop("a")  # its current version deleted with force
    assert reasons_of(catalog, "single") == [
        "application 'single': model 'a' has no current version (it answers only default outputs)"
    ]


def test_an_application_with_nothing_linked_is_not_ready() -> None:
    _, _, catalog = kinds()
    assert reasons_of(catalog, "empty") == [
        "application 'empty': no model is linked (it answers only default outputs)"
    ]


def test_a_split_is_ready_when_its_current_version_is() -> None:
    registry, table, catalog = kinds()
    registry.add_model(ModelVersion("a", "2", InputType.DOUBLES))
    registry.rollouts["a"] = Rollout.build("a", {"1": 50, "2": 50})
    table.put(("a", "2"), _sched())  # the other version of the split is not enough ...
    assert reasons_of(catalog, "single") == [
        "application 'single': model 'a:1' has no replica connected"
    ]
    table.put(("a", "1"), _sched())  # ... its queries fall back on the current one
    table.pop(("a", "2"))
    assert reasons_of(catalog, "single") == []


def test_a_selection_is_ready_when_any_linked_model_can_answer() -> None:
    _, table, catalog = kinds()
    assert reasons_of(catalog, "sel") == [
        "application 'sel': model 'a:1' has no replica connected",
        "application 'sel': model 'b:1' has no replica connected",
    ]
    table.put(("b", "1"), _sched())
    assert reasons_of(catalog, "sel") == []
    # A pinned version with several models linked: the query path refuses it.
    assert reasons_of(catalog, "sel", "1") == [
        "application 'sel': a version cannot be pinned: 2 models are linked"
    ]


def test_a_pipeline_is_ready_when_every_required_stage_can_run() -> None:
    registry, table, catalog = kinds()
    none = "has no replica connected"
    assert reasons_of(catalog, "pipe") == [
        f"application 'pipe': stage 'feat' (model 'a'): model 'a:1' {none}",
        f"application 'pipe': stage 'pick' (application 'sel'): model 'a:1' {none}",
        f"application 'pipe': stage 'pick' (application 'sel'): model 'b:1' {none}",
    ]
    table.put(("b", "1"), _sched())  # sel can answer; feat still cannot
    assert reasons_of(catalog, "pipe") == [
        f"application 'pipe': stage 'feat' (model 'a'): model 'a:1' {none}"
    ]
    table.put(("a", "1"), _sched())
    table.pop(("b", "1"))
    # Only the stages with a default or optional are left without replicas: it answers.
    assert reasons_of(catalog, "pipe") == []
    assert reasons_of(catalog, "pipe", "7") == []  # a pipeline does not use a version pin
    table.put(("b", "1"), _sched())  # sel answers with b alone
    registry.current.pop("a")
    assert reasons_of(catalog, "pipe") == [
        "application 'pipe': stage 'feat' (model 'a'): model 'a' has no current version (it "
        "answers only default outputs)"
    ]
    registry.apps.pop("sel")
    registry.models.pop("a")
    assert reasons_of(catalog, "pipe") == [
        "application 'pipe': stage 'feat' (model 'a'): model 'a' does not exist",
        "application 'pipe': stage 'pick' (application 'sel'): application 'sel' does not exist",
    ]


def test_one_application_without_replicas_leaves_the_others_ready() -> None:
    registry, table, catalog = kinds()
    registry.add_app(Application("other", InputType.DOUBLES, "-1", 20_000))
    registry.link("other", "b")
    table.put(("a", "1"), _sched())
    assert reasons_of(catalog, "single") == []
    assert reasons_of(catalog, "other") == [
        "application 'other': model 'b:1' has no replica connected"
    ]
    # The whole frontend's rule counts every linked model that should have replicas.
    assert catalog.reasons() == [
        "application 'other': model 'b:1' has no replica connected",
        "application 'sel': model 'b:1' has no replica connected",
    ]

"""The read side: the scheduler table that only the reconciler writes (each write advances the
generation and tells the listeners), and the catalog's answers over it and the registry."""

from __future__ import annotations

from typing import Any, cast

from clipper.batching.scheduler import ModelScheduler
from clipper.inputs import InputType
from clipper.registry import Application, ModelVersion, Registry
from clipper.rollout import Rollout
from clipper.runtime.catalog import Catalog, SchedulerTable


class Sched:
    def __init__(self, replicas: int) -> None:
        self.replicas: list[Any] = [object()] * replicas


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

"""A read side over schedulers a test made (fakes included), as the reconciler would publish
them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from clipper.batching.health import ModelHealth
from clipper.batching.scheduler import ModelScheduler
from clipper.clock import FakeClock
from clipper.registry import Registry
from clipper.runtime.catalog import Catalog, SchedulerTable


def quiet_health() -> ModelHealth:
    """The health of a version that has answered nothing: never failing (for fakes)."""
    return ModelHealth(FakeClock(), lambda: (0, 0, 0, 0))


def table_of(schedulers: Mapping[tuple[str, str], Any]) -> SchedulerTable:
    table = SchedulerTable()
    for key, sched in schedulers.items():
        if not hasattr(sched, "health"):  # a fake: readiness reads its error rate
            sched.health = quiet_health()
        table.put(key, cast(ModelScheduler, sched))
    return table


def catalog_of(registry: Registry, schedulers: Mapping[tuple[str, str], Any]) -> Catalog:
    return Catalog(registry, table_of(schedulers))

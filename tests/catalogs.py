"""A read side over schedulers a test made (fakes included), as the reconciler would publish
them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from clipper.batching.scheduler import ModelScheduler
from clipper.registry import Registry
from clipper.runtime.catalog import Catalog, SchedulerTable


def table_of(schedulers: Mapping[tuple[str, str], Any]) -> SchedulerTable:
    table = SchedulerTable()
    for key, sched in schedulers.items():
        table.put(key, cast(ModelScheduler, sched))
    return table


def catalog_of(registry: Registry, schedulers: Mapping[tuple[str, str], Any]) -> Catalog:
    return Catalog(registry, table_of(schedulers))

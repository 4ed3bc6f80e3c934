"""The query runtime, assembled: its parts built in dependency order, and what the protocols see.

:func:`build_query_runtime` is the query package's share of the composition root. It builds the
seam and the answer counter first, then the runners (each handed the seam and the catalog, never
the processor), then the tables, then the processor: every object is complete when it is made,
and no setter closes a cycle. :class:`QueryServices` is everything a query-side protocol may
use — the read side, the processor, the metrics, the clock — never the frontend object itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from clipper.cache import PredictionCache
from clipper.clock import Clock
from clipper.metrics import Metrics
from clipper.query.answers import Answers
from clipper.query.kinds import AppKind, Runner, RunnerTable
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.pipeline import PipelineRunner
from clipper.query.processor import DEFAULT_MAX_ITEMS, QueryProcessor
from clipper.query.seam import Submitter
from clipper.query.selection import Fetch, OnFeedback, Persist, SelectionRunner
from clipper.query.single import SingleRunner
from clipper.query.traffic import Traffic
from clipper.runtime.catalog import Catalog
from clipper.tenants import TenantGate

__all__ = ["QueryRuntime", "QueryServices", "build_query_runtime"]


@dataclass(frozen=True, slots=True)
class QueryRuntime:
    """The parts of one frontend's query path (its owner stops :attr:`selection`)."""

    processor: QueryProcessor
    submitter: Submitter
    answers: Answers
    traffic: Traffic
    single: SingleRunner
    split: SingleRunner
    selection: SelectionRunner
    pipelines: PipelineRunner


def build_query_runtime(
    catalog: Catalog,
    cache: PredictionCache,
    *,
    clock: Clock,
    metrics: Metrics,
    max_items: int = DEFAULT_MAX_ITEMS,
    loop_lag: LoopLagMonitor | None = None,
    persist: Persist | None = None,
    fetch: Fetch | None = None,
    on_feedback: OnFeedback | None = None,
    rng: random.Random | None = None,
) -> QueryRuntime:
    """The query path over ``catalog`` and ``cache``. ``loop_lag``: shed what the frontend's
    own backlog makes late (None: never; tests, embedders). ``persist``/``fetch``: where
    selection policies' user states are kept. ``on_feedback``: online learning."""
    submitter = Submitter(cache, clock, metrics)
    answers = Answers(metrics, clock, loop_lag)
    traffic = Traffic(catalog, clock=clock, metrics=metrics, rng=rng)
    single = SingleRunner(submitter, catalog, answers, clock=clock, loop_lag=loop_lag)
    split = SingleRunner(
        submitter, catalog, answers, clock=clock, traffic=traffic, loop_lag=loop_lag
    )
    selection = SelectionRunner(
        submitter, catalog, answers, clock=clock, metrics=metrics, traffic=traffic, rng=rng,
        persist=persist, fetch=fetch, on_feedback=on_feedback,
    )  # fmt: skip
    stage_runners: dict[AppKind, Runner] = {
        AppKind.SINGLE: single,
        AppKind.SPLIT: split,
        AppKind.SELECTION: selection,
    }
    pipelines = PipelineRunner(
        submitter,
        catalog,
        answers,
        RunnerTable(catalog, stage_runners),
        clock=clock,
        metrics=metrics,
    )
    processor = QueryProcessor(
        catalog,
        RunnerTable(catalog, {**stage_runners, AppKind.PIPELINE: pipelines}),
        answers=answers,
        submitter=submitter,
        metrics=metrics,
        selection=selection,
        traffic=traffic,
        max_items=max_items,
    )
    return QueryRuntime(processor, submitter, answers, traffic, single, split, selection, pipelines)


@dataclass(frozen=True, slots=True)
class QueryServices:
    """What the query-side protocols use: the read side, the query processor, the metrics,
    the frontend's clock, and the limits they check before parsing."""

    catalog: Catalog
    processor: QueryProcessor
    metrics: Metrics
    clock: Clock
    queue_capacity: int
    max_items: int
    # API keys, quotas and classes (None: every query is anonymous and standard).
    tenants: TenantGate | None = None

"""Kinds of application, and the table that maps each to the runner that answers its queries.

An application is one of four kinds, decided per query from the catalog (links and rollouts
change at run time): a **pipeline** (it has stages), a **selection** (a policy other than
``single`` over its linked models), a **split** (one model whose unpinned query goes where the
model's rollout says: canary split, shadow), or a **single** model. The composition root builds
the runners first and then the tables: the processor's, with all four, and the pipeline
runner's, without the pipeline kind (a stage never names a pipeline).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

from clipper.query.prediction import Reply
from clipper.registry import Application
from clipper.runtime.catalog import Catalog

__all__ = ["AppKind", "Runner", "RunnerTable"]


class AppKind(enum.StrEnum):
    SINGLE = "single"
    SPLIT = "split"
    SELECTION = "selection"
    PIPELINE = "pipeline"


class Runner(Protocol):
    """Answers the queries of one kind of application."""

    def run(  # noqa: PLR0917 (the hot path's shape)
        self,
        app: Application,
        payloads: list[bytes],
        version: str | None,
        uid: str,
        reply: Reply,
        t0: float,
        budget_s: float,
        rank: int = ...,
    ) -> None:
        """Answer ``payloads`` (inputs in their wire form) through ``reply``, exactly once,
        within ``budget_s`` of ``t0``; ``rank`` is the query's priority class (0 critical,
        1 standard, 2 sheddable: the order its inputs are queued and shed in). Raises
        :class:`~clipper.errors.RequestError` for a query refused before anything was
        queued."""

    def forget_app(self, app: str) -> None:
        """A deleted application: drop what is kept for it."""


class RunnerTable:
    """Kind → runner. A kind without a runner of its own is answered as a single model."""

    __slots__ = ("_catalog", "_links", "_pipeline", "_rollouts", "_selection", "_single",
                 "_split", "runners")  # fmt: skip

    def __init__(self, catalog: Catalog, runners: Mapping[AppKind, Runner]) -> None:
        self._catalog = catalog
        self._links = catalog.links
        self._rollouts = catalog.rollouts
        self.runners = dict(runners)
        self._single = runners[AppKind.SINGLE]
        self._split = runners.get(AppKind.SPLIT, self._single)
        self._selection = runners.get(AppKind.SELECTION, self._single)
        self._pipeline = runners.get(AppKind.PIPELINE)

    def kind(self, app: Application, version: str | None) -> AppKind:
        """The kind of ``app`` for a query pinned to ``version`` (None: unpinned)."""
        if app.stages is not None:
            return AppKind.PIPELINE
        linked = self._catalog.linked(app.name)
        if app.policy != "single" and linked:
            return AppKind.SELECTION
        if version is None and linked and self._catalog.rollout(linked[0]) is not None:
            return AppKind.SPLIT
        return AppKind.SINGLE

    def pick(self, app: Application, version: str | None) -> Runner:
        """The runner for a query of ``app`` (pinned to ``version``, or not)."""
        # kind(), inlined: this runs once per query.
        if app.stages is not None and self._pipeline is not None:
            return self._pipeline
        linked = self._links.get(app.name)
        if linked and app.policy != "single":
            return self._selection
        if version is None and linked and linked[0] in self._rollouts:
            return self._split
        return self._single

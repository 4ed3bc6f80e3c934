"""Per-stage Prometheus series of pipeline applications (in the frontend's metrics registry)."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["OUTCOMES", "StageMetrics"]

# What became of a stage in one query: answered, its default used, dropped (optional), or it
# failed the whole query (required); "skipped": a required stage failed before it could run.
OUTCOMES = ("answered", "degraded", "dropped", "failed", "skipped")
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1.0)


class StageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.latency = Histogram(
            "clipper_pipeline_stage_latency_seconds",
            "Time from a pipeline stage's start to its model's answer (answered stages only)",
            ["app", "stage"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.outcomes = Counter(
            "clipper_pipeline_stage_outcomes",
            "Pipeline stages per outcome: answered, degraded (its default used), dropped "
            "(optional), failed (required: the query got the application's default), skipped",
            ["app", "stage", "outcome"],
            registry=registry,
        )
        self.budget_misses = Counter(
            "clipper_pipeline_stage_budget_misses",
            "Pipeline stages that had not answered by their deadline",
            ["app", "stage"],
            registry=registry,
        )
        self.shed = Counter(
            "clipper_pipeline_shed",
            "Pipeline queries shed at admission: the critical path's expected wait exceeded "
            "the latency SLO",
            ["app"],
            registry=registry,
        )
        self._children: dict[tuple[str, str], tuple[Any, Any, dict[str, Any]]] = {}

    def stage(self, app: str, stage: str) -> tuple[Any, Any, dict[str, Any]]:
        """(latency, budget misses, outcome -> counter) of one stage, looked up once."""
        key = (app, stage)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = (
                self.latency.labels(app=app, stage=stage),
                self.budget_misses.labels(app=app, stage=stage),
                {o: self.outcomes.labels(app=app, stage=stage, outcome=o) for o in OUTCOMES},
            )
        return got

    def forget(self, app: str) -> None:
        """Remove the series of a deleted (or re-described) pipeline application."""
        for app_name, stage in [k for k in self._children if k[0] == app]:
            del self._children[(app_name, stage)]
            with contextlib.suppress(KeyError):
                self.latency.remove(app, stage)
            with contextlib.suppress(KeyError):
                self.budget_misses.remove(app, stage)
            for o in OUTCOMES:
                with contextlib.suppress(KeyError):
                    self.outcomes.remove(app, stage, o)
        with contextlib.suppress(KeyError):
            self.shed.remove(app)

"""The dashboard's sampler: every ``interval_s`` on the injected clock, one sample of every
series the dashboard plots, recorded in a :class:`~clipper.dashboard.history.History` and
handed to a listener (the event stream).

Rates and quantiles are over the interval since the previous sample, from the differences of
the frontend's own Prometheus counters and histograms (nothing is added to the query path):

* ``app/<app>/qps``: queries answered per second; ``app/<app>/p50_ms`` and ``p99_ms``: their
  latency quantiles over the interval, interpolated in the latency histogram's buckets as
  Prometheus's ``histogram_quantile`` does (None when nothing was answered); ``slo_ms``;
  ``app/<app>/defaults/<reason>``: default outputs per second by reason;
  ``app/<app>/weight/<model>``: the selection policy's weight of each linked model;
* ``model/<name>:<version>/batch_size`` (mean inputs per batch sent), ``queue`` (inputs
  waiting now), ``cache_hit_rate`` (hits over lookups), ``replicas`` (connected),
  ``errors`` (batches whose predict raised, per second), ``replicas_wanted`` (its replica
  count: what an operator or the autoscaler set);
* for the versions of a model's traffic split: ``model/<name>:<version>/split_qps`` (queries
  the split sent it per second) and ``split_fallbacks`` (those drawn for it while it had no
  replica, answered by the current version); for a shadow version: ``shadow_compared``
  (answers compared per second), ``shadow_agreement`` (the share of them equal to the real
  answer; None when none was compared) and ``shadow_errors`` (copies without an answer per
  second);
* ``frontend/loop_lag_ms``: how late the event loop runs.

Autoscaling decisions are not series but events: each new one the autoscaler took is recorded
once (the last :data:`MAX_DECISIONS` are kept) and sent with the sample that first saw it.

The sampler is a timer chain on the clock, started and stopped by its owner (the frontend's
exit stack); a sample that fails is logged and the chain goes on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clipper.dashboard.history import History, Value
from clipper.dashboard.state import DecisionOf, PolicyWeights, decision_record, runtime_state
from clipper.metrics import (
    HistogramValue,
    Labels,
    Metrics,
    counter_values,
    histogram_quantile,
    histogram_values,
)

if TYPE_CHECKING:
    from clipper.clock import Clock, TimerHandle
    from clipper.managers.base import ContainerManager
    from clipper.metrics_window import MetricsWindow
    from clipper.query.selection import Selection
    from clipper.runtime.catalog import Catalog

__all__ = ["MAX_DECISIONS", "Sampler"]

log = logging.getLogger("clipper.dashboard")


# Autoscaling decisions kept for the page (each about 200 bytes of JSON): hours of them at the
# autoscaler's pace of at most one per version per up window.
MAX_DECISIONS = 200

_NOTHING = HistogramValue([], 0.0, 0.0)  # a histogram series that gained nothing


class _Deltas:
    """What each counter (or histogram) gained since the previous sample. A series that went
    down was reset (its application or version deleted and created again): its whole value is
    the gain."""

    __slots__ = ("_counts", "_hists")

    def __init__(self) -> None:
        self._counts: dict[str, dict[Labels, float]] = {}
        self._hists: dict[str, dict[Labels, HistogramValue]] = {}

    def counters(self, name: str, metric: Any) -> dict[Labels, float]:
        held = self._counts.get(name, {})
        self._counts[name] = now = counter_values(metric)
        out = {}
        for labels, value in now.items():
            before = held.get(labels, 0.0)
            out[labels] = value - before if value >= before else value
        return out

    def histograms(self, name: str, metric: Any) -> dict[Labels, HistogramValue]:
        held = self._hists.get(name, {})
        self._hists[name] = now = histogram_values(metric, held)
        out = {}
        for labels, h in now.items():
            before = held.get(labels)
            if before is h:  # not moved: not read again
                out[labels] = _NOTHING
            elif before is None or h.count < before.count or len(before.buckets) != len(h.buckets):
                out[labels] = h
            else:
                out[labels] = HistogramValue(
                    [
                        (le, c - b)
                        for (le, c), (_, b) in zip(h.buckets, before.buckets, strict=True)
                    ],
                    h.total - before.total,
                    h.count - before.count,
                )
        return out


def _r(x: float, digits: int = 3) -> float:
    return round(x, digits)


class Sampler:
    def __init__(
        self,
        *,
        clock: Clock,
        metrics: Metrics,
        catalog: Catalog,
        manager: ContainerManager,
        selection: Callable[[str], Selection | None],
        history: History,
        interval_s: float,
        window: MetricsWindow | None = None,
        decisions: DecisionOf | None = None,
    ) -> None:
        # The autoscaler's latest decision of a version (None: no autoscaler here).
        self.decision_of = decisions
        self.decisions: deque[dict[str, Any]] = deque(maxlen=MAX_DECISIONS)
        self._seen: dict[tuple[str, str], float] = {}  # version -> time of its last decision
        # The applications' rates over the last minute (None: the tables show none).
        self.window = window
        self.clock = clock
        self.metrics = metrics
        self.catalog = catalog
        self.registry = catalog.registry
        self.manager = manager
        self.history = history
        self.interval_s = interval_s
        self.on_sample: Callable[[dict[str, Any]], None] | None = None
        self.samples = 0  # taken since start
        self.failures = 0
        self.state: dict[str, Any] = {"apps": [], "models": [], "replicas": [], "rollouts": []}
        self._weights = PolicyWeights(selection)
        self._deltas = _Deltas()
        self._timer: TimerHandle | None = None
        self._due = 0.0
        self._last = 0.0

    @property
    def running(self) -> bool:
        return self._timer is not None

    def start(self) -> None:
        """Take a first sample (the baseline of every rate) and arm the chain."""
        if self._timer is not None:
            return
        self._last = self.clock.now()
        self._collect(self.interval_s)  # baseline: the deltas start from what is counted now
        self._due = self._last + self.interval_s
        self._timer = self.clock.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        now = self.clock.now()
        try:
            self.sample(now)
        except Exception:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.exception("dashboard sample failed (%d so far)", self.failures)
        # The next one on the grid; after a stall longer than an interval, one interval on.
        self._due += self.interval_s
        if self._due <= now:
            self._due = now + self.interval_s
        self._timer = self.clock.call_at(self._due, self._tick)

    def sample(self, now: float) -> dict[str, Any]:
        """Take one sample at ``now``, record it, hand it to :attr:`on_sample`; returns it:
        ``{"t": now, "values": {series: value}, "state": runtime state, "decisions": [new
        autoscaling decisions]}``."""
        dt = max(now - self._last, 1e-9)
        self._last = now
        values = self._collect(dt)
        recorded = self.history.append(now, values)
        new = self._new_decisions()
        self.refresh_state()
        self.samples += 1
        doc = {"t": now, "values": recorded, "state": self.state, "decisions": new}
        if self.on_sample is not None:
            self.on_sample(doc)
        return doc

    def refresh_state(self) -> dict[str, Any]:
        """Read the applications, models and replicas now (also between samples)."""
        rates = self.window.app_rates() if self.window is not None else None
        self.state = runtime_state(self.catalog, self.manager, rates, self.decision_of)
        return self.state

    def _new_decisions(self) -> list[dict[str, Any]]:
        """The autoscaling decisions taken since the previous sample, recorded."""
        if self.decision_of is None:
            return []
        new = []
        seen: dict[tuple[str, str], float] = {}
        for name, versions in self.registry.models.items():
            for version, mv in versions.items():
                if mv.autoscale is None:
                    continue
                last = self.decision_of(name, version)
                if last is None:
                    continue
                seen[name, version] = last.at
                if self._seen.get((name, version)) != last.at:
                    new.append(decision_record(name, version, last))
        self._seen = seen  # versions gone or no longer autoscaled are forgotten
        new.sort(key=lambda d: (d["t"], d["model"], d["version"]))
        self.decisions.extend(new)
        return new

    def _collect(self, dt: float) -> dict[str, Value]:
        m, d = self.metrics, self._deltas
        requests = d.counters("requests", m.requests)
        latency = d.histograms("latency", m.latency)
        defaults = d.counters("defaults", m.defaults)
        batches = d.histograms("batch", m.batch_size)
        hits = d.counters("hits", m.cache_hits)
        misses = d.counters("misses", m.cache_misses)
        errors = d.counters("errors", m.model_errors)
        split = d.counters("split", m.split_requests)
        fallbacks = d.counters("fallbacks", m.split_fallbacks)
        agreed = d.counters("agreed", m.shadow_agreements)
        disagreed = d.counters("disagreed", m.shadow_disagreements)
        failed: dict[tuple[str, ...], float] = {}
        for (model, version, _), gained in d.counters("shadow_errors", m.shadow_errors).items():
            failed[model, version] = failed.get((model, version), 0.0) + gained
        out: dict[str, Value] = {}
        registry = self.registry
        for name, app in registry.apps.items():
            p = f"app/{name}/"
            out[p + "qps"] = _r(requests.get((name,), 0.0) / dt)
            lat = latency.get((name,))
            for q, series in ((0.5, "p50_ms"), (0.99, "p99_ms")):
                v = histogram_quantile(q, lat.buckets) if lat is not None else None
                out[p + series] = None if v is None else _r(v * 1e3)
            out[p + "slo_ms"] = _r(app.latency_slo_micros / 1e3)
            weights = self._weights.weights(app, registry.links.get(name, []))
            for model, w in (weights or {}).items():
                out[f"{p}weight/{model}"] = _r(w, 4)
        for (app_name, reason), gained in defaults.items():
            if app_name in registry.apps:
                out[f"app/{app_name}/defaults/{reason}"] = _r(gained / dt)
        self._weights.forget(set(registry.apps))
        for (name, version), sched in self.catalog.schedulers():
            key = (name, version)
            p = f"model/{name}:{version}/"
            b = batches.get(key)
            out[p + "batch_size"] = _r(b.total / b.count, 2) if b is not None and b.count else None
            out[p + "queue"] = float(len(sched.queue))
            h, miss = hits.get(key, 0.0), misses.get(key, 0.0)
            out[p + "cache_hit_rate"] = _r(h / (h + miss), 4) if h + miss > 0 else None
            out[p + "replicas"] = float(sum(not r.draining for r in sched.replicas))
            out[p + "errors"] = _r(errors.get(key, 0.0) / dt)
            mv = registry.models.get(name, {}).get(version)
            if mv is not None:
                out[p + "replicas_wanted"] = float(mv.num_replicas)
            rollout = registry.rollouts.get(name)
            if rollout is None:
                continue
            # Only the versions a rollout names: a model without one adds no series.
            if version in rollout.weights:
                out[p + "split_qps"] = _r(split.get(key, 0.0) / dt)
                out[p + "split_fallbacks"] = _r(fallbacks.get(key, 0.0) / dt)
            if rollout.shadow is not None and rollout.shadow.version == version:
                a, n = agreed.get(key, 0.0), agreed.get(key, 0.0) + disagreed.get(key, 0.0)
                out[p + "shadow_compared"] = _r(n / dt)
                out[p + "shadow_agreement"] = _r(a / n, 4) if n > 0 else None
                out[p + "shadow_errors"] = _r(failed.get(key, 0.0) / dt)
        lag = [s.value for family in m.loop_lag.collect() for s in family.samples]
        out["frontend/loop_lag_ms"] = _r(lag[0] * 1e3) if lag else None
        return out

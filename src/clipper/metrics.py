"""Prometheus metrics of one frontend, in its own registry (several frontends may share a
process in tests). Children are looked up once per app/model/replica, never per query."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics", "histogram_quantile"]

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)
_BATCH_BUCKETS = tuple(float(2**i) for i in range(13))


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "clipper_app_requests", "Queries answered, per application", ["app"], registry=r
        )
        self.latency = Histogram(
            "clipper_app_latency_seconds",
            "Time from a request's arrival to its answer, per application",
            ["app"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.defaults = Counter(
            "clipper_app_default_outputs",
            "Queries answered with the application's default output, by reason",
            ["app", "reason"],
            registry=r,
        )
        self.batch_size = Histogram(
            "clipper_model_batch_size",
            "Inputs per batch sent to a replica",
            ["model", "version"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        # How late the event loop runs (its 5 ms probe timer's lateness, decaying): above a
        # couple of milliseconds, queries that cannot meet their deadline are shed at once.
        self.loop_lag = Gauge(
            "clipper_event_loop_lag_seconds",
            "How late the frontend's event loop runs (a periodic timer's lateness, decaying)",
            registry=r,
        )
        self.queue_depth = Gauge(
            "clipper_model_queue_depth",
            "Inputs waiting in a model version's queue",
            ["model", "version"],
            registry=r,
        )
        self.replicas = Gauge(
            "clipper_model_replicas",
            "Connected replicas of a model version",
            ["model", "version"],
            registry=r,
        )
        self.cache_hits = Counter(
            "clipper_cache_hits", "Prediction cache hits", ["model", "version"], registry=r
        )
        self.cache_misses = Counter(
            "clipper_cache_misses",
            "Prediction cache misses (joins of an in-flight computation included)",
            ["model", "version"],
            registry=r,
        )
        self.replica_latency = Histogram(
            "clipper_replica_batch_latency_seconds",
            "Round trip of one batch to a replica",
            ["model", "version", "replica"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.missing = Counter(
            "clipper_model_missing_contributions",
            "Ensemble members chosen for a query whose output had not arrived at the deadline",
            ["app", "model"],
            registry=r,
        )
        self.model_errors = Counter(
            "clipper_model_errors",
            "Batches whose predict raised",
            ["model", "version"],
            registry=r,
        )

        # Rollouts (clipper.frontend.traffic): where a split sent queries, and how a shadow
        # version's answers compare with the real ones.
        self.split_requests = Counter(
            "clipper_split_requests",
            "Queries a model's traffic split sent to each version",
            ["model", "version"],
            registry=r,
        )
        self.split_fallbacks = Counter(
            "clipper_split_fallbacks",
            "Queries the split drew for a version with no connected replica, answered by the "
            "current version instead",
            ["model", "version"],
            registry=r,
        )
        self.shadow_requests = Counter(
            "clipper_shadow_requests",
            "Inputs copied to a shadow version",
            ["model", "version"],
            registry=r,
        )
        self.shadow_agreements = Counter(
            "clipper_shadow_agreements",
            "Shadow answers equal to the real answer",
            ["model", "version"],
            registry=r,
        )
        self.shadow_disagreements = Counter(
            "clipper_shadow_disagreements",
            "Shadow answers different from the real answer",
            ["model", "version"],
            registry=r,
        )
        self.shadow_errors = Counter(
            "clipper_shadow_errors",
            "Shadow copies without an answer, by reason (model_error, deadline, overload, "
            "no_replica, error)",
            ["model", "version", "reason"],
            registry=r,
        )
        self.shadow_dropped = Counter(
            "clipper_shadow_dropped",
            "Shadow copies not sent: the shadow version already had its bound of inputs in flight",
            ["model", "version"],
            registry=r,
        )
        self.shadow_latency = Histogram(
            "clipper_shadow_latency_seconds",
            "For shadowed inputs: each side's time to answer (role real: from queueing the real "
            "input; role shadow: from sending the copy)",
            ["model", "version", "role"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        # Incremented on the RPC authentication thread (prometheus_client counters are
        # thread-safe).
        self.rpc_refused = Counter(
            "clipper_rpc_refused",
            "Connections to the container RPC port refused at the handshake: no_keys (no or "
            "wrong CURVE keys, e.g. an unauthenticated container) or unknown_key",
            ["reason"],
            registry=r,
        )

    # -- series of things that are gone --------------------------------------------------------
    # A label set lives until removed: without this, every deleted version, replica and
    # application would stay in /metrics forever (1.4 KB -> 341 KB over 70 deploy cycles).
    def forget_version(self, model: str, version: str) -> None:
        """Remove every series of a deleted model version, its replicas' included."""
        for metric in (
            self.batch_size,
            self.queue_depth,
            self.replicas,
            self.cache_hits,
            self.cache_misses,
            self.model_errors,
            self.split_requests,
            self.split_fallbacks,
            self.shadow_requests,
            self.shadow_agreements,
            self.shadow_disagreements,
            self.shadow_dropped,
        ):
            _remove(metric, model, version)
        for reason in _label_values(self.shadow_errors, "reason", model=model, version=version):
            _remove(self.shadow_errors, model, version, reason)
        for role in _label_values(self.shadow_latency, "role", model=model, version=version):
            _remove(self.shadow_latency, model, version, role)
        for replica in _label_values(self.replica_latency, "replica", model=model, version=version):
            _remove(self.replica_latency, model, version, replica)

    def forget_replica(self, model: str, version: str, replica: str) -> None:
        """Remove the series of a replica that left its version."""
        _remove(self.replica_latency, model, version, replica)

    def forget_app(self, app: str) -> None:
        """Remove every series of a deleted application."""
        _remove(self.requests, app)
        _remove(self.latency, app)
        for reason in _label_values(self.defaults, "reason", app=app):
            _remove(self.defaults, app, reason)
        for model in _label_values(self.missing, "model", app=app):
            _remove(self.missing, app, model)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def to_json(self) -> dict[str, Any]:
        """Every sample as ``{"name{labels}": value}``: for clients that read JSON
        (the original clipper_admin's ``inspect_instance``)."""
        out: dict[str, Any] = {}
        for family in self.registry.collect():
            for s in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Quantile ``q`` of a cumulative histogram (sorted ``(upper bound, count)`` pairs),
    interpolated inside its bucket as Prometheus's ``histogram_quantile`` does; the highest
    finite bound when it falls in the +Inf bucket; None with no observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _remove(metric: Any, *labelvalues: str) -> None:
    with contextlib.suppress(KeyError):  # never observed: no series to remove
        metric.remove(*labelvalues)


def _label_values(metric: Any, label: str, **match: str) -> set[str]:
    """The values of ``label`` among the metric's series whose labels include ``match``."""
    out: set[str] = set()
    for family in metric.collect():
        for sample in family.samples:
            labels = sample.labels
            if label in labels and all(labels.get(k) == v for k, v in match.items()):
                out.add(labels[label])
    return out

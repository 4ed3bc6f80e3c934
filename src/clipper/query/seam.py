"""The submit seam: the one way a runner hands work to the models.

Every runner (single model, traffic split, selection, pipeline) reaches the models through this
small interface and nothing else: submit one payload for one model version with a deadline and
a waiter (through the prediction cache, which answers repeats and joins identical inputs in
flight), say why a failure means a default output, and read the cache. The processor is never
handed to a runner; the runners never know each other's queries.
"""

from __future__ import annotations

from typing import Any, Protocol

from clipper.batching.queue import STANDARD, Task
from clipper.batching.scheduler import ModelScheduler
from clipper.cache import CacheKey, Lookup, PredictionCache
from clipper.clock import Clock
from clipper.errors import (
    DeadlineExceeded,
    ModelError,
    ModelOutputError,
    OverloadedError,
    RegistryError,
    ReplicaError,
)
from clipper.metrics import Metrics
from clipper.query.prediction import NO_MODELS, SLO_MISSED, DefaultReason, Waiter
from clipper.registry import Application
from clipper.tracing import hooks as _trace

__all__ = ["SubmitSeam", "Submitter", "explain"]


def explain(model: str, err: BaseException) -> tuple[DefaultReason, str]:
    """Why ``err`` from ``model`` answers the default output: the reason and its words."""
    if isinstance(err, ModelOutputError):
        why = f"The model {model} returned an output that cannot be served: {err}"
        return DefaultReason.MODEL_ERROR, why
    if isinstance(err, ModelError):
        return DefaultReason.MODEL_ERROR, f"The model {model} raised an error: {err}"
    if isinstance(err, OverloadedError):
        return DefaultReason.OVERLOAD, f"Query shed under overload: {err}"
    if isinstance(err, DeadlineExceeded):
        return DefaultReason.SLO, SLO_MISSED
    if isinstance(err, RegistryError):
        return DefaultReason.NO_MODEL, NO_MODELS
    if isinstance(err, ReplicaError):
        return DefaultReason.NO_REPLICA, f"No replica of a chosen model is alive: {err}"
    return DefaultReason.ERROR, f"{type(err).__name__}: {err}"


class SubmitSeam(Protocol):
    """What a runner may ask of the models."""

    def submit(  # noqa: PLR0917 (one call per input: no keyword packing)
        self,
        app: Application,
        sched: ModelScheduler,
        payload: bytes,
        deadline: float,
        waiter: Waiter,
        rank: int = STANDARD,
    ) -> bool:
        """One input for the version ``sched`` serves: answered from the cache, joined to the
        same input in flight, or queued (True: the caller pumps ``sched`` once for its whole
        request). ``waiter`` gets the output or the error exactly once. ``rank``: the query's
        priority class (:class:`~clipper.tenants.PriorityClass`'s value)."""

    def explain(self, model: str, err: BaseException) -> tuple[DefaultReason, str]:
        """Why ``err`` means the default output, in the metric's reason and in words."""

    def abandoned(self) -> None:
        """A query was abandoned (its client went away): from now on its waiters say so
        (:class:`~clipper.cache.Abandonable`), and the schedulers drop an input queued before
        now when every waiter for it is abandoned, at dispatch."""

    def peek(self, model: str, version: str, payload: bytes) -> Any:
        """The cached output for the input, or None (not counted as a hit or a miss)."""


class Submitter:
    """The seam over the prediction cache and the schedulers, counting cache hits and misses
    per model version."""

    __slots__ = ("_cache_metrics", "cache", "clock", "metrics")

    def __init__(self, cache: PredictionCache, clock: Clock, metrics: Metrics) -> None:
        self.cache = cache
        self.clock = clock
        self.metrics = metrics
        self._cache_metrics: dict[tuple[str, str], tuple[Any, Any]] = {}

    def submit(  # noqa: PLR0917 (one call per input: no keyword packing)
        self,
        app: Application,
        sched: ModelScheduler,
        payload: bytes,
        deadline: float,
        waiter: Waiter,
        rank: int = STANDARD,
    ) -> bool:
        key: CacheKey | None = None
        span = _trace.current  # the sampled request's span (None: not traced)
        if app.cache:
            mv = sched.mv
            key = (mv.name, mv.version, payload)
            if span is None:
                status, value = self.cache.get_or_join(key, waiter)
            else:
                status, value = self._traced_lookup(span, key, waiter)
            hits, misses = self._counters(mv.name, mv.version)
            if status is Lookup.HIT:
                hits.inc()
                waiter(value, None)
                return False
            misses.inc()
            if status is Lookup.JOINED:
                return False
        task = Task(payload, deadline, self.clock.now(), key, None if key else waiter, rank, span)
        try:
            sched.submit(task)
        except OverloadedError as e:
            if key is not None:
                self.cache.fail(key, e)
            else:
                waiter(None, e)
            return False
        return True

    def explain(self, model: str, err: BaseException) -> tuple[DefaultReason, str]:
        return explain(model, err)

    def _traced_lookup(self, span: Any, key: CacheKey, waiter: Waiter) -> tuple[Lookup, Any]:
        """The cache lookup of a sampled query, as its ``cache lookup`` span (hit, joined: an
        identical input already in flight, or miss)."""
        t = self.clock.now()
        status, value = self.cache.get_or_join(key, waiter)
        tracer = _trace.active
        if tracer is not None:
            attrs = {"clipper.model": key[0], "clipper.model_version": key[1]}
            attrs["clipper.cache.result"] = status.name.lower()
            tracer.child(span, "cache lookup", t, self.clock.now(), attrs)
        return status, value

    def abandoned(self) -> None:
        self.cache.note_abandoned(self.clock.now())

    def peek(self, model: str, version: str, payload: bytes) -> Any:
        return self.cache.peek((model, version, payload))

    def forget_version(self, model: str, version: str) -> None:
        """A deleted model version: drop the cache-metric children held for it (their series
        were removed; a version registered again under the name gets new ones)."""
        self._cache_metrics.pop((model, version), None)

    def _counters(self, model: str, version: str) -> tuple[Any, Any]:
        k = (model, version)
        m = self._cache_metrics.get(k)
        if m is None:
            m = self._cache_metrics[k] = (
                self.metrics.cache_hits.labels(model=model, version=version),
                self.metrics.cache_misses.labels(model=model, version=version),
            )
        return m

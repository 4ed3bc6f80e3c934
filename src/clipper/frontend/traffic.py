"""Canary splits and shadow traffic on the query path (the rules are in :mod:`clipper.rollout`).

:meth:`Traffic.route` picks the version of a model that answers an unpinned query: the model's
current version, or a draw from its split (by a hash of the ``uid`` when the split is sticky).
A drawn version with no connected replica (still starting, or restarting) hands its query to
the current version, counted, so a split can change under load without failing a query.

A shadowed query's inputs are copied to the shadow version, fire and forget: the real inputs are
queued first, the copies afterwards on the shadow version's own scheduler (its own queue, its
own admission), never through the prediction cache, and nothing on the real path waits for them.
Each copy is compared with the real answer when both have arrived. At most
:data:`MAX_SHADOW_IN_FLIGHT` copies per shadow version are outstanding; further ones are
dropped and counted. Everything is counted in the ``clipper_split_*`` and ``clipper_shadow_*``
metrics, which the admin API's ``get_traffic`` summarises.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clipper.batching.queue import Task
from clipper.clock import Clock
from clipper.errors import DeadlineExceeded, ModelError, OverloadedError, ReplicaError
from clipper.metrics import Metrics, histogram_quantile
from clipper.registry import Registry

if TYPE_CHECKING:
    from clipper.batching.scheduler import ModelScheduler

__all__ = ["MAX_SHADOW_IN_FLIGHT", "ShadowCopies", "Traffic"]

# Shadow inputs outstanding per shadow version (queued or at a replica) before copies are dropped.
MAX_SHADOW_IN_FLIGHT = 256

Waiter = Callable[[object, BaseException | None], None]
_PENDING: Any = object()


class _Tally:
    """A Prometheus counter child and its value: the admin view reads the value without
    collecting the whole metrics registry (milliseconds on the event loop)."""

    __slots__ = ("child", "n")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.n = 0

    def inc(self) -> None:
        self.n += 1
        self.child.inc()


class _Lane:
    """One shadow version's bookkeeping: its in-flight count and metric children."""

    __slots__ = (
        "agree",
        "disagree",
        "dropped",
        "errors",
        "in_flight",
        "metrics",
        "model",
        "real_latency",
        "sent",
        "shadow_latency",
        "version",
    )

    def __init__(self, metrics: Metrics, model: str, version: str) -> None:
        self.model = model
        self.version = version
        self.metrics = metrics
        self.in_flight = 0
        self.sent = _Tally(metrics.shadow_requests.labels(model=model, version=version))
        self.agree = _Tally(metrics.shadow_agreements.labels(model=model, version=version))
        self.disagree = _Tally(metrics.shadow_disagreements.labels(model=model, version=version))
        self.dropped = _Tally(metrics.shadow_dropped.labels(model=model, version=version))
        self.real_latency = metrics.shadow_latency.labels(model=model, version=version, role="real")
        self.shadow_latency = metrics.shadow_latency.labels(
            model=model, version=version, role="shadow"
        )
        self.errors: dict[str, _Tally] = {}

    def error(self, reason: str) -> None:
        counter = self.errors.get(reason)
        if counter is None:
            counter = self.errors[reason] = _Tally(
                self.metrics.shadow_errors.labels(
                    model=self.model, version=self.version, reason=reason
                )
            )
        counter.inc()


def _reason(err: BaseException) -> str:
    if isinstance(err, ModelError):
        return "model_error"
    if isinstance(err, DeadlineExceeded):
        return "deadline"
    if isinstance(err, OverloadedError):
        return "overload"
    if isinstance(err, ReplicaError):
        return "no_replica"
    return "error"


class _Comparison:
    """One shadowed input: the real answer and the shadow's, compared once both are in."""

    __slots__ = ("clock", "lane", "real", "sent_at", "shadow")

    def __init__(self, lane: _Lane, clock: Clock) -> None:
        self.lane = lane
        self.clock = clock
        self.sent_at = clock.now()
        self.real: Any = _PENDING
        self.shadow: Any = _PENDING

    def real_waiter(self, waiter: Waiter) -> Waiter:
        def done(value: object, err: BaseException | None) -> None:
            try:
                if self.real is _PENDING:
                    self.real = None if err is not None else (value,)
                    if err is None:
                        self.lane.real_latency.observe(self.clock.now() - self.sent_at)
                    self._compare()
            finally:
                waiter(value, err)  # the real query's own callback, whatever happened above

        return done

    def shadow_done(self, value: object, err: BaseException | None) -> None:
        if self.shadow is not _PENDING:
            return
        lane = self.lane
        lane.in_flight -= 1
        if err is not None:
            self.shadow = None
            lane.error(_reason(err))
        else:
            self.shadow = (value,)
            lane.shadow_latency.observe(self.clock.now() - self.sent_at)
        self._compare()

    def _compare(self) -> None:
        real, shadow = self.real, self.shadow
        if real is _PENDING or shadow is _PENDING or real is None or shadow is None:
            return  # waiting for the other side, or one side has no answer to compare
        (self.lane.agree if real[0] == shadow[0] else self.lane.disagree).inc()


class ShadowCopies:
    """The shadow copies of one request's inputs: :meth:`wrap` each real input's waiter while
    queueing the real inputs, then :meth:`fire` once they are all queued."""

    __slots__ = ("clock", "deadline", "lane", "pending", "sched")

    def __init__(self, lane: _Lane, sched: ModelScheduler, clock: Clock, deadline: float) -> None:
        self.lane = lane
        self.sched = sched
        self.clock = clock
        self.deadline = deadline
        self.pending: list[tuple[Task, _Comparison]] = []

    def wrap(self, payload: bytes, waiter: Waiter) -> Waiter:
        lane = self.lane
        if lane.in_flight >= MAX_SHADOW_IN_FLIGHT:
            lane.dropped.inc()
            return waiter
        lane.in_flight += 1
        cmp = _Comparison(lane, self.clock)
        task = Task(payload, self.deadline, cmp.sent_at, None, cmp.shadow_done)
        self.pending.append((task, cmp))
        return cmp.real_waiter(waiter)

    def fire(self) -> None:
        """Queue the copies on the shadow version's scheduler (after the real inputs)."""
        sched, lane = self.sched, self.lane
        submitted = False
        for task, cmp in self.pending:
            if cmp.real is None:  # the real input was refused already (shed): nothing to compare
                lane.in_flight -= 1
                continue
            lane.sent.inc()
            try:
                sched.submit(task)
            except OverloadedError as e:
                assert task.waiter is not None
                task.waiter(None, e)
            else:
                submitted = True
        self.pending = []
        if submitted:
            sched.pump()


class Traffic:
    """The rollouts of one frontend's models, applied to its queries."""

    def __init__(
        self,
        registry: Registry,
        schedulers: dict[tuple[str, str], ModelScheduler],
        *,
        clock: Clock,
        metrics: Metrics,
        rng: random.Random | None = None,
    ) -> None:
        self.registry = registry
        self.schedulers = schedulers
        self.clock = clock
        self.metrics = metrics
        self.rng = rng or random.Random()
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._routed: dict[tuple[str, str], tuple[_Tally, _Tally]] = {}

    def _live(self, model: str, version: str) -> ModelScheduler | None:
        sched = self.schedulers.get((model, version))
        return sched if sched is not None and sched.replicas else None

    def pick(self, model: str, uid: str) -> str | None:
        """The version an unpinned query of ``model`` for ``uid`` goes to (no counting, no
        fallback): the split's draw, or the current version."""
        rollout = self.registry.rollouts.get(model)
        if rollout is None or not rollout.split:
            return self.registry.current.get(model)
        return rollout.pick(uid, self.rng)

    def route(
        self, model: str, uid: str, deadline: float
    ) -> tuple[str | None, ShadowCopies | None]:
        """The version that answers an unpinned query of ``model`` (None: none is current),
        and the shadow copies to make of its inputs (None: not shadowed)."""
        registry = self.registry
        current = registry.current.get(model)
        rollout = registry.rollouts.get(model)
        if rollout is None:
            return current, None
        version = current
        if rollout.split:
            drawn = rollout.pick(uid, self.rng)
            routed, fallback = self._counters(model, drawn)
            if drawn == current or self._live(model, drawn) is not None or current is None:
                version = drawn
                routed.inc()
            else:
                fallback.inc()
        shadow = rollout.shadow
        if (
            shadow is None
            or shadow.version == version
            or version is None
            or not shadow.share
            or (shadow.share < 1.0 and self.rng.random() >= shadow.share)
        ):
            return version, None
        lane = self._lane(model, shadow.version)
        sched = self._live(model, shadow.version)
        if sched is None:
            lane.error("no_replica")
            return version, None
        return version, ShadowCopies(lane, sched, self.clock, deadline)

    def _counters(self, model: str, version: str) -> tuple[_Tally, _Tally]:
        key = (model, version)
        pair = self._routed.get(key)
        if pair is None:
            pair = self._routed[key] = (
                _Tally(self.metrics.split_requests.labels(model=model, version=version)),
                _Tally(self.metrics.split_fallbacks.labels(model=model, version=version)),
            )
        return pair

    def _lane(self, model: str, version: str) -> _Lane:
        key = (model, version)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(self.metrics, model, version)
        return lane

    def in_flight(self, model: str, version: str) -> int:
        """Shadow copies outstanding for ``model:version``."""
        lane = self._lanes.get((model, version))
        return lane.in_flight if lane is not None else 0

    def forget_version(self, model: str, version: str) -> None:
        """A deleted version: drop the metric children held for it (their series are gone)."""
        self._lanes.pop((model, version), None)
        self._routed.pop((model, version), None)

    # -- the admin view ------------------------------------------------------------------------
    def describe(self, model: str) -> dict[str, Any]:
        """The model's rollout and what it did on this frontend since it started: queries per
        split version, and per shadow version the comparisons, errors and latencies."""
        registry = self.registry
        rollout = registry.rollouts.get(model)
        split_stats = {
            version: {"requests": routed.n, "fallbacks": fallback.n}
            for (name, version), (routed, fallback) in sorted(self._routed.items())
            if name == model
        }
        latencies = self._latencies(model)
        shadows: dict[str, Any] = {}
        for (name, version), lane in sorted(self._lanes.items()):
            if name != model:
                continue
            agreed = lane.agree.n
            compared = agreed + lane.disagree.n
            shadows[version] = {
                "sent": lane.sent.n,
                "compared": compared,
                "agreements": agreed,
                "agreement_rate": round(agreed / compared, 6) if compared else None,
                "errors": {reason: tally.n for reason, tally in sorted(lane.errors.items())},
                "dropped": lane.dropped.n,
                "in_flight": lane.in_flight,
                "latency_ms": {
                    role: {
                        f"p{round(q * 100)}": _ms(
                            histogram_quantile(sorted(latencies.get((version, role), [])), q)
                        )
                        for q in (0.5, 0.99)
                    }
                    for role in ("real", "shadow")
                },
            }
        return {
            "model_name": model,
            "current_version": registry.current.get(model),
            "split": rollout.weights if rollout is not None and rollout.split else None,
            "shares": rollout.shares() if rollout is not None and rollout.split else None,
            "sticky": rollout.sticky if rollout is not None else False,
            "shadow": rollout.shadow.to_record()
            if rollout is not None and rollout.shadow is not None
            else None,
            "stats": {"split": split_stats, "shadow": shadows},
        }

    def _latencies(self, model: str) -> dict[tuple[str, str], list[tuple[float, float]]]:
        """(version, role) -> the cumulative buckets of the model's shadow latency histograms
        (one metric's samples, not the whole registry's)."""
        out: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for family in self.metrics.shadow_latency.collect():
            for sample in family.samples:
                labels = sample.labels
                if sample.name.endswith("_bucket") and labels.get("model") == model:
                    key = (labels["version"], labels["role"])
                    out.setdefault(key, []).append((float(labels["le"]), sample.value))
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)

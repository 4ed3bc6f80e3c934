"""Canary splits and shadow traffic on the query path (the rules are in :mod:`clipper.rollout`):
the version resolver of the split runner and of the selection runner.

:meth:`Traffic.route` picks the version of a model that answers an unpinned query: the model's
current version, or a draw from its split (by a hash of the ``uid`` when the split is sticky).
A drawn version with no connected replica (still starting, or restarting) hands its query to
the current version, counted, so a split can change under load without failing a query.

A shadowed query's inputs are copied to the shadow version, fire and forget: each copy is queued
only once its real answer has been delivered, on the shadow version's own scheduler (its own
queue, its own admission) with the query's latency budget from then, never through the
prediction cache; nothing on the real path waits for it, and an input whose real answer failed
is not copied. The shadow's answer is then compared with the real one. At most
:data:`MAX_SHADOW_IN_FLIGHT` copies per shadow version are outstanding; further ones are
dropped and counted. Everything is counted in the ``clipper_split_*`` and ``clipper_shadow_*``
metrics, which the admin API's ``get_traffic`` summarises.
"""

from __future__ import annotations

import random
from typing import Any

from clipper.batching.queue import Task
from clipper.batching.scheduler import ModelScheduler
from clipper.clock import Clock
from clipper.errors import DeadlineExceeded, ModelError, OverloadedError, ReplicaError
from clipper.metrics import Metrics, histogram_quantile
from clipper.query.prediction import Waiter
from clipper.runtime.catalog import Catalog

__all__ = ["MAX_SHADOW_IN_FLIGHT", "ShadowCopies", "Traffic"]

# Shadow copies outstanding per shadow version (waiting for their real answer, queued, or at a
# replica) before further ones are dropped.
MAX_SHADOW_IN_FLIGHT = 256

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
        "pump_due",
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
        self.pump_due = False
        self.sent = _Tally(metrics.shadow_requests.labels(model=model, version=version))
        self.agree = _Tally(metrics.shadow_agreements.labels(model=model, version=version))
        self.disagree = _Tally(metrics.shadow_disagreements.labels(model=model, version=version))
        self.dropped = _Tally(metrics.shadow_dropped.labels(model=model, version=version))
        self.real_latency = metrics.shadow_latency.labels(model=model, version=version, role="real")
        self.shadow_latency = metrics.shadow_latency.labels(
            model=model, version=version, role="shadow"
        )
        self.errors: dict[str, _Tally] = {}

    def pump_soon(self, sched: ModelScheduler, clock: Clock) -> None:
        """Pump the shadow's scheduler once the callbacks running now have returned: the real
        answers of a batch are all delivered first, and their copies go as one batch."""
        if self.pump_due:
            return
        self.pump_due = True

        def pump() -> None:
            self.pump_due = False
            sched.pump()

        clock.call_later(0.0, pump)

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
    """One shadowed input. Its copy goes to the shadow only once the real answer has been
    delivered (the real query's callback runs first), and the two answers are compared."""

    __slots__ = ("copies", "payload", "real", "sent_at", "shadow", "started")

    def __init__(self, copies: ShadowCopies, payload: bytes) -> None:
        self.copies = copies
        self.payload = payload
        self.started = copies.clock.now()
        self.sent_at = self.started
        self.real: Any = _PENDING
        self.shadow: Any = _PENDING

    def real_waiter(self, waiter: Waiter) -> Waiter:
        def done(value: object, err: BaseException | None) -> None:
            first = self.real is _PENDING
            if first:
                self.real = None if err is not None else (value,)
            try:
                waiter(value, err)  # the real query's own callback, first
            finally:
                if first:
                    self.copies.real_done(self)

        return done

    def shadow_done(self, value: object, err: BaseException | None) -> None:
        if self.shadow is not _PENDING:
            return
        lane = self.copies.lane
        lane.in_flight -= 1
        if err is not None:
            self.shadow = None
            lane.error(_reason(err))
            return
        self.shadow = (value,)
        lane.shadow_latency.observe(self.copies.clock.now() - self.sent_at)
        (lane.agree if self.real[0] == value else lane.disagree).inc()


class ShadowCopies:
    """The shadow copies of one request's inputs: :meth:`wrap` each real input's waiter while
    queueing the real inputs, then :meth:`fire` once they are all queued. A copy is queued on
    the shadow version's scheduler when its real answer has been delivered (none before
    :meth:`fire`), with the same latency budget from then; the scheduler is pumped once, after
    the callbacks running now (a batch of real answers) have finished."""

    __slots__ = ("budget_s", "clock", "fired", "lane", "ready", "sched")

    def __init__(self, lane: _Lane, sched: ModelScheduler, clock: Clock, budget_s: float) -> None:
        self.lane = lane
        self.sched = sched
        self.clock = clock
        self.budget_s = budget_s
        self.fired = False
        self.ready: list[_Comparison] = []

    def wrap(self, payload: bytes, waiter: Waiter) -> Waiter:
        lane = self.lane
        if lane.in_flight >= MAX_SHADOW_IN_FLIGHT:
            lane.dropped.inc()
            return waiter
        lane.in_flight += 1
        return _Comparison(self, payload).real_waiter(waiter)

    def fire(self) -> None:
        """The real inputs are all queued: copies may go from now on."""
        self.fired = True
        ready, self.ready = self.ready, []
        for cmp in ready:
            self._send(cmp)

    def real_done(self, cmp: _Comparison) -> None:
        lane = self.lane
        if cmp.real is None:  # the real input failed or was shed: nothing to compare with
            lane.in_flight -= 1
            return
        lane.real_latency.observe(self.clock.now() - cmp.started)
        if self.fired:
            self._send(cmp)
        else:
            self.ready.append(cmp)  # answered from the cache while the request was queued

    def _send(self, cmp: _Comparison) -> None:
        lane = self.lane
        lane.sent.inc()
        now = self.clock.now()
        cmp.sent_at = now
        task = Task(cmp.payload, now + self.budget_s, now, None, cmp.shadow_done)
        try:
            self.sched.submit(task)
        except OverloadedError as e:
            cmp.shadow_done(None, e)
            return
        lane.pump_soon(self.sched, self.clock)


class Traffic:
    """The rollouts of one frontend's models, applied to its queries."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        clock: Clock,
        metrics: Metrics,
        rng: random.Random | None = None,
    ) -> None:
        self.catalog = catalog
        self.clock = clock
        self.metrics = metrics
        self.rng = rng or random.Random()
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._routed: dict[tuple[str, str], tuple[_Tally, _Tally]] = {}

    def _live(self, model: str, version: str) -> ModelScheduler | None:
        return self.catalog.live(model, version)

    def pick(self, model: str, uid: str) -> str | None:
        """The version an unpinned query of ``model`` for ``uid`` goes to (no counting, no
        fallback): the split's draw, or the current version."""
        rollout = self.catalog.rollout(model)
        if rollout is None or not rollout.split:
            return self.catalog.current(model)
        return rollout.pick(uid, self.rng)

    def route(
        self, model: str, uid: str, budget_s: float
    ) -> tuple[str | None, ShadowCopies | None]:
        """The version that answers an unpinned query of ``model`` (None: none is current),
        and the shadow copies to make of its inputs (None: not shadowed), each with
        ``budget_s`` to answer from when it is sent."""
        catalog = self.catalog
        current = catalog.current(model)
        rollout = catalog.rollout(model)
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
        return version, ShadowCopies(lane, sched, self.clock, budget_s)

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
        catalog = self.catalog
        rollout = catalog.rollout(model)
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
                            histogram_quantile(q, sorted(latencies.get((version, role), [])))
                        )
                        for q in (0.5, 0.99)
                    }
                    for role in ("real", "shadow")
                },
            }
        return {
            "model_name": model,
            "current_version": catalog.current(model),
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

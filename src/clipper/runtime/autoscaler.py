"""Drives the replica count of autoscaled model versions towards their SLO.

One owned task per frontend (started and stopped by the server's exit stack) wakes on the
injected clock, samples each version this frontend drives — the arrivals, the shed or late
inputs its scheduler counted (those the model's queue caused, the demand, apart from those the
frontend's own lag caused, which more replicas on the same cores would only make worse), and
the capacity its replicas' batching controllers say fits the SLO (their mean and the worst) —
feeds its :class:`~clipper.runtime.scale_policy.ScalePolicy`, and carries a decision out
through the write side (:meth:`Control.scale`: committed to the store, then realised by the
reconciler through the container manager, which drains a replica before it stops it). So it is
engine-agnostic: it only ever asks for a replica count.

A version is driven by one frontend only, its settings' ``owner`` (the frontend whose admin API
set them): on a shared store every frontend sees the settings, and each runs the count they set
(each frontend runs its own replica set), but one decides it (docs/autoscaling.md).

A version autoscaled with ``min_replicas`` 0 (on every frontend, driven here or not) has a
:class:`~clipper.batching.cold.ColdStart` on its scheduler: a query that finds no replica is
held and calls :meth:`Autoscaler.wake`, which, on the frontend that drives the version, scales
it from zero to one at once (not at the next sample).

Decisions and their reasons are in Prometheus (``clipper_autoscale_*``) and in
:meth:`Autoscaler.status`, which the admin API's model view shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from clipper.batching.cold import ColdStart
from clipper.batching.scheduler import ModelScheduler
from clipper.clock import Clock, wait_event
from clipper.registry import Change, ModelVersion, Registry
from clipper.runtime.catalog import Catalog
from clipper.runtime.control import Control
from clipper.runtime.scale_policy import Decision, Sample, ScalePolicy

__all__ = [
    "Autoscaler",
    "LastDecision",
    "replica_capacities",
    "replica_capacity",
    "replica_figures",
]

log = logging.getLogger("clipper.autoscaler")

Key = tuple[str, str]

_IDLE_WAKE_S = 60.0  # with nothing to drive, a registry change wakes it anyway
_READY_TIMEOUT_S = 60.0
_DEFAULT_MAX_BATCH = 4096
EXTRAPOLATION = 4


def replica_capacity(sched: ModelScheduler) -> float:
    """Inputs per second one replica takes in batches whose latency fits the SLO: the mean of
    :func:`replica_capacities` (0.0 while no replica has measurements)."""
    caps = replica_capacities(sched)
    return sum(caps) / len(caps) if caps else 0.0


def replica_capacities(sched: ModelScheduler) -> list[float]:
    """Each measured replica's capacity within the SLO (see :func:`replica_figures`)."""
    return [cap for cap, _ in replica_figures(sched)]


def replica_figures(sched: ModelScheduler) -> list[tuple[float, float]]:
    """Inputs per second each replica with measurements takes in batches whose latency fits
    the SLO: the largest batch whose typical latency (its controller's central estimate) is
    within the latency target the controllers aim at (the SLO times ``target_fraction``),
    divided by that latency. The central estimate, not the upper one the dispatcher uses:
    capacity is a throughput, and the upper one swings with every noisy batch.

    The latency line is trusted up to :data:`EXTRAPOLATION` times the batch size the
    controller allows now: fitted on small batches, a slope flattened by one slow outlier
    would otherwise promise thousands of inputs per batch. Under light load that errs low (a
    model that batches well is credited with less than it could do); as the load grows the
    controller's cap grows with it, and so does the estimate.

    Each with what the replica does one input at a time (no batching gain): what a
    scale-down is priced at no less than."""
    b = sched.mv.batching
    target = sched.slo_s * b.target_fraction
    if b.max_batch_size is not None:
        hard = b.max_batch_size
    else:
        hard = int(b.params.get("max_size", _DEFAULT_MAX_BATCH))
    caps: list[tuple[float, float]] = []
    for r in sched.replicas:
        c = r.controller
        if c is None or r.draining or c.typical_latency(1) <= 0.0:
            continue
        # latency grows with the batch: the largest that fits
        lo, hi = 1, max(min(hard, EXTRAPOLATION * c.max_batch_size()), 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if c.typical_latency(mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        latency = c.typical_latency(lo)
        if latency > 0.0:
            caps.append((lo / latency, 1.0 / c.typical_latency(1)))
    return caps


@dataclass(slots=True)
class LastDecision:
    """A version's latest decision: when (clock time), what, from how many replicas, and why
    carrying it out failed (None: it did not, or not yet)."""

    at: float
    decision: Decision
    previous: int = 0
    error: str | None = None


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "version"]
        self.desired = Gauge(
            "clipper_autoscale_desired_replicas",
            "Replicas the autoscaler wants for a model version (its num_replicas)",
            labels,
            registry=registry,
        )
        self.utilization = Gauge(
            "clipper_autoscale_utilization",
            "Arrival rate over the replicas' capacity within the SLO (averaged over the up window)",
            labels,
            registry=registry,
        )
        self.offered = Gauge(
            "clipper_autoscale_offered_rps",
            "Inputs per second offered to the version's queue (cache misses), up window",
            labels,
            registry=registry,
        )
        self.capacity = Gauge(
            "clipper_autoscale_replica_capacity_rps",
            "Inputs per second one replica takes in batches that fit the SLO",
            labels,
            registry=registry,
        )
        self.floor = Gauge(
            "clipper_autoscale_scale_down_capacity_rps",
            "What a scale-down prices one replica at: the slowest replica's capacity within "
            "the SLO less a fifth, never below what it does one input at a time",
            labels,
            registry=registry,
        )
        self.behind = Gauge(
            "clipper_autoscale_frontend_behind_ratio",
            "Share of the up window's queries shed or late because the frontend was behind "
            "(event loop lag, or a round trip that alone overran): not counted as demand",
            labels,
            registry=registry,
        )
        self.decisions = Counter(
            "clipper_autoscale_decisions",
            "Replica count changes asked by the autoscaler, by reason",
            [*labels, "reason"],
            registry=registry,
        )
        self.last = Gauge(
            "clipper_autoscale_last_decision",
            "1 for the reason of the version's last autoscaling decision (one series)",
            [*labels, "reason"],
            registry=registry,
        )

    def forget(self, model: str, version: str) -> None:
        gauges = (
            self.desired,
            self.utilization,
            self.offered,
            self.capacity,
            self.floor,
            self.behind,
        )
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(model, version)
        by_reason: tuple[Counter | Gauge, ...] = (self.decisions, self.last)
        for metric in by_reason:
            reasons = {
                s.labels["reason"]
                for family in metric.collect()
                for s in family.samples
                if s.labels.get("model") == model and s.labels.get("version") == version
            }
            for reason in reasons:
                with contextlib.suppress(KeyError):
                    metric.remove(model, version, reason)


class Autoscaler:
    def __init__(
        self,
        registry: Registry,
        control: Control,
        catalog: Catalog,
        *,
        clock: Clock,
        metrics_registry: CollectorRegistry,
        ready_timeout_s: float = _READY_TIMEOUT_S,
    ) -> None:
        self.registry = registry
        self.control = control
        self.catalog = catalog
        self.clock = clock
        self.ready_timeout_s = ready_timeout_s
        self._metrics = _Metrics(metrics_registry)
        self._policies: dict[Key, ScalePolicy] = {}
        self._due: dict[Key, float] = {}
        self._last: dict[Key, LastDecision] = {}
        self._actions: dict[Key, asyncio.Task[None]] = {}
        self._unloaded: dict[Key, str] = {}  # unloads reported while a decision was under way
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is not None:
            return
        self.registry.subscribe(self._on_change)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="clipper-autoscaler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self.registry.unsubscribe(self._on_change)
        tasks = [task, *self._actions.values()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._actions.clear()

    def _on_change(self, change: Change) -> None:
        if change.kind in ("model", "version", "intent", "replicas"):
            self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                delay = self.tick()
            except Exception:  # one bad sample must not stop autoscaling for good
                log.exception("an autoscaling pass failed")
                delay = 1.0
            await wait_event(self.clock, self._wake, delay)

    # -- what this frontend drives -------------------------------------------------------------
    def drives(self, mv: ModelVersion) -> bool:
        cfg = mv.autoscale
        return (
            cfg is not None
            and cfg.enabled
            and cfg.owner == self.control.node_id
            and mv.artifact is not None
            and self.registry.runs(mv)
        )

    def tick(self) -> float:
        """Sample every driven version that is due and act on its decision; returns the
        seconds until the next one is due."""
        now = self.clock.now()
        versions = [mv for vs in self.registry.models.values() for mv in vs.values()]
        self._attach_cold(versions)
        driven = {mv.key: mv for mv in versions if self.drives(mv)}
        for key in [k for k in self._policies if k not in driven]:
            self._forget(key)
        next_due = now + _IDLE_WAKE_S
        for key, mv in driven.items():
            cfg = mv.autoscale
            assert cfg is not None
            policy = self._policies.get(key)
            if policy is None or policy.config != cfg:
                policy = self._policies[key] = ScalePolicy(cfg, now)
                self._due[key] = now
            if key in self._actions:
                continue  # its last decision is being carried out: it restarts the policy
            if mv.name in self.registry.intents:
                policy.restart(now)  # a version change under way: its count is not ours
                policy.note = "a version change is under way"
            elif self._due[key] <= now:
                self._due[key] = now + cfg.interval_s
                self._sample(mv, policy, now)
            next_due = min(next_due, self._due[key])
        return max(next_due - now, 0.0)

    def _sample(self, mv: ModelVersion, policy: ScalePolicy, now: float) -> None:
        sched = self.catalog.scheduler(*mv.key)
        if sched is None:
            sample = Sample(now, 0, 0, 0.0, mv.num_replicas)
        else:
            figures = replica_figures(sched)
            caps = [cap for cap, _ in figures]
            sample = Sample(
                at=now,
                offered=sched.offered,
                # Demand: what the model's queue caused. The frontend's own lag is not: more
                # replicas on the same cores would only make it worse.
                bad=sched.shed + sched.late,
                capacity_rps=sum(caps) / len(caps) if caps else 0.0,
                replicas=mv.num_replicas,
                behind=sched.stalled + sched.overran + sched.lag_shed,
                floor_rps=min(caps, default=0.0),
                single_rps=min((one for _, one in figures), default=0.0),
            )
        decision = policy.observe(sample)
        m, labels = self._metrics, (mv.name, mv.version)
        m.desired.labels(*labels).set(mv.num_replicas)
        m.offered.labels(*labels).set(policy.rate)
        m.capacity.labels(*labels).set(policy.capacity_rps)
        m.floor.labels(*labels).set(policy.floor_rps)
        m.behind.labels(*labels).set(policy.behind_share)
        if policy.utilization is not None:
            m.utilization.labels(*labels).set(policy.utilization)
        if decision is None or decision.replicas == mv.num_replicas:
            return
        self._carry_out(mv, decision, now)

    def _carry_out(self, mv: ModelVersion, decision: Decision, now: float) -> None:
        m, labels = self._metrics, (mv.name, mv.version)
        log.info(
            "autoscaling %s:%s from %d to %d replicas: %s",
            mv.name, mv.version, mv.num_replicas, decision.replicas, decision.detail,
        )  # fmt: skip
        previous = self._last.get(mv.key)
        if previous is not None:
            with contextlib.suppress(KeyError):
                m.last.remove(*labels, previous.decision.reason)
        m.last.labels(*labels, decision.reason).set(1)
        m.desired.labels(*labels).set(decision.replicas)
        m.decisions.labels(*labels, decision.reason).inc()
        self._last[mv.key] = LastDecision(now, decision, mv.num_replicas)
        task = asyncio.get_running_loop().create_task(
            self._act(mv, decision), name=f"clipper-autoscale-{mv.name}-{mv.version}"
        )
        self._actions[mv.key] = task

    async def _act(self, mv: ModelVersion, decision: Decision) -> None:
        key = mv.key
        try:
            await self.control.scale(
                mv.name,
                decision.replicas,
                mv.version,
                wait=True,
                ready_timeout_s=self.ready_timeout_s,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("autoscaling %s:%s to %d failed: %s", *key, decision.replicas, e)
            last = self._last.get(key)
            if last is not None:
                last.error = str(e)
            cfg = mv.autoscale
            if cfg is not None and key in self._due:  # not again before an up window
                self._due[key] = self.clock.now() + cfg.up_window_s
        finally:
            self._actions.pop(key, None)
            policy = self._policies.get(key)
            if policy is not None:
                policy.restart(self.clock.now())
            self._after(mv, decision)
            self._wake.set()

    def _after(self, mv: ModelVersion, decision: Decision) -> None:
        """A pooled version's decision is over: an unload reported meanwhile is counted now;
        one unloaded while queries were held for it is loaded again at once."""
        key = mv.key
        why = self._unloaded.pop(key, None)
        if not mv.pooled:
            return
        sched = self.catalog.scheduler(*key)
        if why is not None and decision.replicas:
            # The load waited for its replica: one connected now means the report was of
            # the model's earlier load, and this one stands.
            if sched is None or not sched.replicas:
                self.unloaded(key, why)
        elif not decision.replicas and sched is not None and len(sched.queue):
            self.wake(key)

    # -- scale to zero -------------------------------------------------------------------------
    def _attach_cold(self, versions: list[ModelVersion]) -> None:
        """Give the scheduler of every version that scales to zero its hold rules (and take
        them from one that no longer does)."""
        for mv in versions:
            sched = self.catalog.scheduler(*mv.key)
            if sched is None:
                continue
            cfg = mv.autoscale
            if cfg is None or not cfg.scales_to_zero:
                sched.cold = None
            elif sched.cold is None:
                wake = functools.partial(self.wake, mv.key)
                sched.cold = ColdStart(
                    self.clock, limit=cfg.max_held_queries, wake=wake, loading=mv.pooled
                )
            else:
                sched.cold.limit = cfg.max_held_queries
                sched.cold.loading = mv.pooled

    def wake(self, key: Key) -> None:
        """A query found the version with no replica: scale it from zero to one now, when this
        frontend drives it and nothing is under way (else nothing: another frontend drives it,
        or its replica is starting)."""
        mv = self.registry.models.get(key[0], {}).get(key[1])
        if mv is None or mv.num_replicas or key in self._actions or not self.drives(mv):
            return
        cfg = mv.autoscale
        assert cfg is not None
        target = max(1, cfg.min_replicas)
        self._carry_out(mv, Decision(target, "cold_start", "a query came with no replica"),
                        self.clock.now())  # fmt: skip

    def unloaded(self, key: Key, why: str) -> None:
        """A pooled version left its pool process by itself (evicted for room, or the
        process died): count it at zero replicas, so the next query loads it again."""
        mv = self.registry.models.get(key[0], {}).get(key[1])
        if mv is None or not mv.pooled or not self.drives(mv):
            return
        if key in self._actions:
            self._unloaded[key] = why  # after the decision under way (a load: to one)
            return
        if not mv.num_replicas:
            return
        self._carry_out(mv, Decision(0, "unloaded", f"unloaded from its pool process: {why}"),
                        self.clock.now())  # fmt: skip

    def state(self, mv: ModelVersion) -> str:
        """``scaled to zero``, ``waking from zero`` (a query woke it; no replica yet) or
        ``running``: what the status and readiness say of a version."""
        sched = self.catalog.scheduler(*mv.key)
        cfg = mv.autoscale
        if cfg is None or not cfg.scales_to_zero or (sched is not None and sched.replicas):
            return "running"
        return "scaled to zero" if mv.num_replicas == 0 else "waking from zero"

    def _forget(self, key: Key) -> None:
        self._unloaded.pop(key, None)
        self._policies.pop(key, None)
        self._due.pop(key, None)
        self._last.pop(key, None)
        self._metrics.forget(*key)

    # -- what it says --------------------------------------------------------------------------
    def view(self, mv: ModelVersion) -> dict[str, object] | None:
        """A version's autoscaling as the admin API shows it: its settings, its replica
        count, and (on the frontend that drives it) the state of the decisions."""
        if mv.autoscale is None:
            return None
        return {
            **mv.autoscale.to_record(),
            "num_replicas": mv.num_replicas,
            "driven_here": mv.autoscale.owner == self.control.node_id,
            "state": self.state(mv),
            "status": self.status(mv.name, mv.version),
        }

    def last_decision(self, name: str, version: str) -> LastDecision | None:
        """The latest decision for a version this frontend drives (the dashboard's timeline)."""
        return self._last.get((name, version))

    def status(self, name: str, version: str) -> dict[str, object] | None:
        """The state of a version this frontend drives (None when it drives it not)."""
        key = (name, version)
        policy = self._policies.get(key)
        if policy is None:
            return None
        last = self._last.get(key)
        util = policy.utilization
        return {
            "offered_rps": round(policy.rate, 3),
            "replica_capacity_rps": round(policy.capacity_rps, 3),
            "scale_down_capacity_rps": round(policy.floor_rps, 3),
            "utilization": None if util is None else round(util, 4),
            "frontend_behind_ratio": round(policy.behind_share, 4),
            "scaling": key in self._actions,
            "note": policy.note,
            "last_decision": None
            if last is None
            else {
                "replicas": last.decision.replicas,
                "reason": last.decision.reason,
                "detail": last.decision.detail,
                "seconds_ago": round(max(self.clock.now() - last.at, 0.0), 3),
                "error": last.error,
            },
        }

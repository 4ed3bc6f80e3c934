"""What the dashboard shows of the runtime now: applications, model versions and replicas with
their states, and the weights an application's selection policy gives its models.

A replica's state joins what its manager says of the process with whether it is connected:

* ``queued``: waiting for one of the replica starts allowed at once (the local manager's
  ``replica_starts``); no process yet;
* ``starting``: its process was started and has not connected yet (first start);
* ``restarting``: its process exited (or was killed) and it is not connected again yet;
* ``ready``: connected and taking batches; ``draining``: connected, taking no new batches;
* ``stopping``: being stopped on purpose.

Replicas that dial in from elsewhere (``--manager external://``) have no process here: they are
``ready`` or ``draining`` while connected.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from clipper.errors import ConfigError
from clipper.selection import SHARED, make_policy
from clipper.selection.ab_split import ABSplit
from clipper.selection.bandits import Exp3
from clipper.selection.base import SelectionPolicy, State
from clipper.selection.exp4 import Exp4

if TYPE_CHECKING:
    from clipper.batching.scheduler import Replica
    from clipper.managers.base import ContainerManager
    from clipper.query.selection import Selection
    from clipper.registry import Application
    from clipper.runtime.autoscaler import LastDecision
    from clipper.runtime.catalog import Catalog

__all__ = [
    "REPLICA_STATES",
    "DecisionOf",
    "PolicyWeights",
    "decision_record",
    "policy_weights",
    "runtime_state",
]

DecisionOf = Callable[[str, str], "LastDecision | None"]
"""The autoscaler's latest decision for a version (None: it drives it not, or has not decided)."""

REPLICA_STATES = ("queued", "starting", "restarting", "ready", "draining", "stopping")

# Policies that pick at random (or by a rule over their state) without a closed form here are
# estimated by drawing this many selections from the state with a fixed seed: the same state
# always gives the same weights, so a plot moves only when the state does.
_DRAWS = 200


def _replica_state(
    proc_state: str | None, pid: int | None, restarts: int, r: Replica | None
) -> str:
    if proc_state in ("stopping", "queued"):
        return proc_state
    if r is not None and (proc_state is None or pid is not None):
        return "draining" if r.draining else "ready"
    return "restarting" if restarts else "starting"


def decision_record(name: str, version: str, last: LastDecision) -> dict[str, Any]:
    """One autoscaling decision as the dashboard shows it (``t``: clock time it was taken)."""
    d = last.decision
    return {
        "t": last.at,
        "model": name,
        "version": version,
        "from": last.previous,
        "to": d.replicas,
        "reason": d.reason,
        "detail": d.detail,
        "error": last.error,
    }


def runtime_state(
    catalog: Catalog,
    manager: ContainerManager,
    rates: Mapping[str, Mapping[str, Any]] | None = None,
    decisions: DecisionOf | None = None,
) -> dict[str, Any]:
    """``{"apps": [...], "models": [...], "replicas": [...], "rollouts": [...]}``: plain JSON
    values, sorted.

    ``rates``: each application's rates over the last minute
    (:meth:`~clipper.metrics_window.MetricsWindow.app_rates`); without them an application's
    error and default rates are None. A model version's come from its scheduler's window.
    ``decisions``: the autoscaler's latest decision of a version, shown with its settings."""
    registry = catalog.registry
    rates = rates or {}
    apps = [
        {
            "name": app.name,
            "input_type": app.input_type.readable,
            "slo_ms": app.latency_slo_micros / 1e3,
            "policy": app.policy,
            "models": list(registry.links.get(app.name, [])),
            "default_output": app.default_output,
            "cache": app.cache,
            "overload": app.overload,
            "ready": not (why := catalog.app_reasons(app)),
            "reasons": why,
            # Over the last minute, per query (None: no query in it).
            "error_fraction": rates.get(app.name, {}).get("error_fraction"),
            "default_fraction": rates.get(app.name, {}).get("default_fraction"),
        }
        for app in sorted(registry.apps.values(), key=lambda a: a.name)
    ]
    connected: dict[str, Replica] = {}
    models = []
    for name in sorted(registry.models):
        for version in sorted(registry.models[name]):
            mv = registry.models[name][version]
            sched = catalog.scheduler(name, version)
            live = sched.replicas if sched is not None else []
            connected.update((r.address, r) for r in live if r.address)
            health = sched.health.reading() if sched is not None else None
            auto = mv.autoscale
            last = decisions(name, version) if decisions is not None and auto else None
            models.append(
                {
                    "name": name,
                    "version": version,
                    "current": registry.current.get(name) == version,
                    "replicas_wanted": mv.num_replicas,
                    "replicas_ready": sum(not r.draining for r in live),
                    "queue": len(sched.queue) if sched is not None else 0,
                    "batching": mv.batching.controller,
                    # Over the last minute, per input; failing: mostly errors, not ready.
                    "error_fraction": health.error_fraction if health else None,
                    "default_fraction": health.default_fraction if health else None,
                    "failing": health.failing if health else False,
                    "last_error": health.last_error if health else None,
                    "autoscale": None
                    if auto is None or not auto.enabled
                    else {
                        "min": auto.min_replicas,
                        "max": auto.max_replicas,
                        "last": None if last is None else decision_record(name, version, last),
                    },
                }
            )
    replicas = []
    matched: set[int] = set()
    for proc in manager.all_replicas():
        r = connected.get(proc.token) if proc.token else None
        if r is not None:
            matched.add(id(r))
        replicas.append(
            {
                "model": proc.model,
                "version": proc.version,
                "slot": proc.slot,
                "replica_id": r.replica_id if r is not None else None,
                "state": _replica_state(proc.state, proc.pid, proc.restarts, r),
                "pid": proc.pid,
                "restarts": proc.restarts,
                "last_exit": proc.last_exit,
                "in_flight": len(r.in_flight) if r is not None else 0,
                "location": proc.location,
            }
        )
    for (name, version), sched in catalog.schedulers():
        for r in sorted(sched.replicas, key=lambda r: r.replica_id):
            if id(r) in matched:
                continue
            replicas.append(
                {
                    "model": name,
                    "version": version,
                    "slot": None,
                    "replica_id": r.replica_id,
                    "state": _replica_state(None, None, 0, r),
                    "pid": None,
                    "restarts": 0,
                    "last_exit": None,
                    "in_flight": len(r.in_flight),
                    "location": "external",
                }
            )
    replicas.sort(key=lambda d: (d["model"], d["version"], d["slot"] is None, d["slot"] or 0))
    rollouts = []
    for name in sorted(registry.rollouts):
        rollout = registry.rollouts[name]
        rollouts.append(
            {
                "model": name,
                "current": registry.current.get(name),
                # Each split version's share of the unpinned queries (None: no split).
                "split": rollout.shares() if rollout.split else None,
                "sticky": rollout.sticky,
                "shadow": None if rollout.shadow is None else rollout.shadow.to_record(),
            }
        )
    return {"apps": apps, "models": models, "replicas": replicas, "rollouts": rollouts}


def policy_weights(policy: SelectionPolicy, state: State) -> dict[str, float]:
    """Each model's share of the policy's choices from ``state``: the probability that a query
    evaluates it (an ensemble policy's normalised weights)."""
    if isinstance(policy, Exp3):
        return policy.probabilities(state)
    if isinstance(policy, Exp4):
        return policy.weights(state)
    if isinstance(policy, ABSplit):
        return dict(policy.probabilities)
    rng = random.Random(0)
    counts = dict.fromkeys(policy.models, 0)
    for _ in range(_DRAWS):
        for m in policy.select(state, rng):
            counts[m] += 1
    return {m: c / _DRAWS for m, c in counts.items()}


class PolicyWeights:
    """The weights of each application's policy for queries without a user id (the shared
    state), read from the live selection layer once the application has served a query, else
    from a fresh state."""

    def __init__(self, live: Callable[[str], Selection | None]) -> None:
        self._live = live  # the selection layer's current Selection of an application
        self._fresh: dict[str, tuple[Application, tuple[str, ...], SelectionPolicy]] = {}

    def weights(self, app: Application, models: Sequence[str]) -> dict[str, float] | None:
        """None for a single-model application, or one whose policy cannot be built."""
        if app.policy == "single" or not models:
            return None
        sel = self._live(app.name)
        if sel is not None and sel.app is app and sel.models == tuple(models):
            states = sel.states
            state = states.get(SHARED) if SHARED in states else sel.policy.init_state()
            return policy_weights(sel.policy, state)
        cached = self._fresh.get(app.name)
        if cached is None or cached[0] is not app or cached[1] != tuple(models):
            try:
                policy = make_policy(app.policy, list(models), **app.policy_params)
            except ConfigError:
                return None  # misconfigured: its queries answer why
            cached = self._fresh[app.name] = (app, tuple(models), policy)
        policy = cached[2]
        return policy_weights(policy, policy.init_state())

    def forget(self, keep: set[str]) -> None:
        """Drop what is cached of applications not in ``keep``."""
        for name in [n for n in self._fresh if n not in keep]:
            del self._fresh[name]

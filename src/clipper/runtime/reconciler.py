"""The one place that makes the runtime match the registry.

Desired state is a function of the registry alone: every registered model version has a
scheduler (reconfigured when its settings change, closed when it is deleted), every scheduler's
latency target follows the tightest SLO of the applications linked to its model, and a version
runs ``num_replicas`` replicas when it is current, kept, the target of a version change under
way, or named by its model's rollout (a traffic split or a shadow) — otherwise none. Changes
made on this frontend, changes from another frontend and the snapshot loaded at start-up all
arrive as registry :class:`Change` events, and all take this path: nothing else starts or stops
replicas.

Each model version's replicas are converged by one owned worker task at a time (changes that
arrive meanwhile are picked up by the same worker), so the manager never sees two overlapping
requests for one version. A version that stops running first drains: its queue is answered or
expires (bounded by its SLO) and its in-flight batches come back, then its processes stop.

Only the deployment's replica owner (:mod:`clipper.runtime.ownership`) calls the manager: every
frontend keeps its schedulers, but one whose lease went elsewhere leaves the replicas alone. It
never stops replicas because it lost the lease: the next owner adopts them. A frontend that
becomes the owner first lets its manager adopt what the previous owner left (``adopt``, when
the manager has it), then converges every version.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from clipper.batching.scheduler import ModelScheduler
from clipper.clock import Clock, TimerHandle, wait_event
from clipper.errors import RegistryError
from clipper.managers.base import ContainerManager
from clipper.registry import Change, ModelVersion, Registry
from clipper.runtime.catalog import SchedulerTable

__all__ = ["Reconciler"]

log = logging.getLogger("clipper.runtime")

_UNLINKED_SLO_S = 0.1
_DRAIN_ALLOWANCE_S = 2.0

Key = tuple[str, str]


class Reconciler:
    def __init__(
        self,
        registry: Registry,
        manager: ContainerManager,
        schedulers: SchedulerTable,
        *,
        clock: Clock,
        make_scheduler: Callable[[ModelVersion, float], ModelScheduler],
        remove_replicas: Callable[[ModelScheduler], None],
        on_app_deleted: Callable[[str], None] = lambda name: None,
        on_version_deleted: Callable[[str, str], None] = lambda name, version: None,
        forget_after_s: float = 300.0,
        acting: bool = True,
    ) -> None:
        """``acting``: whether this frontend runs the replicas from the start (False with
        shared replicas, until :meth:`set_owner` says it holds the owner lease)."""
        self.registry = registry
        self.manager = manager
        self.schedulers = schedulers
        self.clock = clock
        self._make_scheduler = make_scheduler
        self._remove_replicas = remove_replicas
        self._on_app_deleted = on_app_deleted
        self._on_version_deleted = on_version_deleted
        # A deleted version's logs stay this long (to read why it went wrong), then go.
        self._forget_after_s = forget_after_s
        self._forget_timers: dict[Key, TimerHandle] = {}
        self._forgetting: set[asyncio.Task[None]] = set()
        self._known: dict[Key, ModelVersion] = {}  # last settings of each version it ran
        self._retiring: dict[Key, ModelScheduler] = {}  # deleted, draining before it closes
        self._dirty: set[Key] = set()
        self._workers: dict[Key, asyncio.Task[None]] = {}
        self._idle: dict[Key, asyncio.Event] = {}
        self._held = True
        self._stopped = False
        # Whether this frontend is the replica owner: only then is the manager called.
        self._acting = acting
        self._adopting: asyncio.Task[None] | None = None
        registry.subscribe(self.on_change)

    # -- lifecycle -----------------------------------------------------------------------------
    def resume(self) -> None:
        """Start converging replicas (held until start-up recovery has run, so that a version
        change rolled back at start-up never starts its replicas)."""
        self._held = False
        for key in list(self._dirty):
            self._kick(key)

    @property
    def acting(self) -> bool:
        """Whether the manager is being called (this frontend owns the replicas, and any
        adoption is over)."""
        return self._acting and self._adopting is None

    def set_owner(self, owner: bool) -> None:
        """This frontend became (True) or stopped being (False) the replica owner."""
        if owner == self._acting or self._stopped:
            return
        self._acting = owner
        if self._adopting is not None:
            self._adopting.cancel()
            self._adopting = None
        if owner:
            self._adopting = asyncio.get_running_loop().create_task(
                self._take_over(), name="clipper-reconcile-adopt"
            )
            return
        # A worker under way finishes its step; the next ones call no manager. The manager
        # stops supervising (no restart, no kill): the replicas are the next owner's.
        detach: Callable[[], None] | None = getattr(self.manager, "detach", None)
        if detach is not None:
            detach()

    async def _take_over(self) -> None:
        adopt: Callable[[Callable[[str, str], bool]], Awaitable[None]] | None = getattr(
            self.manager, "adopt", None
        )
        try:
            # Workers still finishing a step from before (a drain, a deletion) go first.
            await asyncio.gather(*self._workers.values(), return_exceptions=True)
            if adopt is not None:
                await adopt(self._registered)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("adopting the previous owner's replicas failed")
        finally:
            if asyncio.current_task() is self._adopting:
                self._adopting = None
        for key in {*self._known, *(k for k, _ in self.schedulers.items())}:
            self._dirty.add(key)
        if not self._held:
            for key in list(self._dirty):
                self._kick(key)

    def _registered(self, name: str, version: str) -> bool:
        return version in self.registry.models.get(name, {})

    async def stop(self) -> None:
        self._stopped = True
        if self._adopting is not None:
            self._adopting.cancel()
            await asyncio.gather(self._adopting, return_exceptions=True)
            self._adopting = None
        for timer in self._forget_timers.values():
            timer.cancel()
        self._forget_timers.clear()
        tasks = list(self._workers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._workers.clear()
        self.registry.unsubscribe(self.on_change)

    async def settled(self, name: str, version: str) -> None:
        """Wait until the version's replica count has been acted on."""
        key = (name, version)
        while key in self._workers or (key in self._dirty and not self._held and self.acting):
            event = self._idle.setdefault(key, asyncio.Event())
            await event.wait()

    # -- desired state -------------------------------------------------------------------------
    def desired_replicas(self, mv: ModelVersion | None) -> int:
        if mv is None or mv.artifact is None or not self.registry.runs(mv):
            return 0
        return mv.num_replicas

    def slo_for(self, model: str) -> float:
        return self._slos().get(model, _UNLINKED_SLO_S)

    def _slos(self) -> dict[str, float]:
        """Each linked model's tightest SLO among the applications (and pipelines) it serves."""
        out: dict[str, float] = {}
        for app_name, names in self.registry.links.items():
            app = self.registry.apps.get(app_name)
            if app is None:
                continue
            for name in names:
                out[name] = min(out.get(name, app.slo_s), app.slo_s)
        for app in self.registry.apps.values():  # a pipeline's stages are under its SLO too
            for stage in app.stages.stages.values() if app.stages is not None else ():
                if stage.model is not None:
                    out[stage.model] = min(out.get(stage.model, app.slo_s), app.slo_s)
        return out

    # -- registry events -----------------------------------------------------------------------
    def on_change(self, change: Change) -> None:
        if change.kind == "model" and change.version is not None:
            key = (change.name, change.version)
            if change.op == "delete":
                sched = self.schedulers.pop(key)
                if sched is not None:
                    self._retiring[key] = sched
            else:
                mv = self.registry.models[change.name][change.version]
                # Deleted and registered again before its worker ran: the same scheduler
                # (its replicas are still connected to it) serves the new registration.
                sched = self.schedulers.get(key) or self._retiring.pop(key, None)
                if sched is None:
                    sched = self._make_scheduler(mv, self.slo_for(mv.name))
                elif sched.mv.batching != mv.batching:
                    sched.reconfigure(mv)  # new batching: controllers start again
                else:
                    sched.mv = mv  # labels, replica count, keep: nothing to restart
                self.schedulers.put(key, sched)
                self._known[key] = mv
            self._mark(key)
        elif change.kind in ("version", "intent", "replicas", "rollout"):
            for version in self.registry.models.get(change.name, {}):
                self._mark((change.name, version))
            if change.version is not None:
                self._mark((change.name, change.version))
        elif change.kind in ("link", "app"):
            # Links and SLOs changed: every model's target follows its tightest linked SLO
            # (an unlinked model included): one pass over the links, one over the schedulers.
            slos = self._slos()
            for (name, _), sched in self.schedulers.items():
                sched.set_slo(slos.get(name, _UNLINKED_SLO_S))
            if change.kind == "app" and change.op == "delete":
                self._on_app_deleted(change.name)

    def _mark(self, key: Key) -> None:
        if key not in self._known and key not in self.schedulers:
            return
        self._dirty.add(key)
        if not self._held:
            self._kick(key)

    def _kick(self, key: Key) -> None:
        if self._stopped or key in self._workers:
            return  # the running worker sees the key dirty again and loops
        if self._adopting is not None:
            return  # converged once the adoption is over
        self._idle.setdefault(key, asyncio.Event()).clear()
        task = asyncio.get_running_loop().create_task(
            self._work(key), name=f"clipper-reconcile-{key[0]}-{key[1]}"
        )
        self._workers[key] = task

    async def _work(self, key: Key) -> None:
        try:
            while key in self._dirty:
                self._dirty.discard(key)
                try:
                    await self._converge(key)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Logged, not fatal: the next change to this version tries again.
                    log.exception("reconciling %s:%s failed", *key)
        finally:
            self._workers.pop(key, None)
            event = self._idle.get(key)
            if event is not None:
                event.set()

    async def _converge(self, key: Key) -> None:
        name, version = key
        mv = self.registry.models.get(name, {}).get(version)
        wanted = self.desired_replicas(mv)
        known = mv or self._known.get(key)
        if known is None:
            return
        if self._acting:
            running = len(self.manager.replicas(name, version))
            if wanted == 0 and running:
                await self._drain(self.schedulers.get(key) or self._retiring.get(key))
                # The version may have come back while it drained: read it again.
                if key in self._dirty:
                    return
            await self.manager.ensure(known, wanted)
        if mv is None:
            self._known.pop(key, None)
            sched = self._retiring.pop(key, None)
            if sched is not None:
                self._remove_replicas(sched)
                sched.close(RegistryError(f"model {name}:{version} was deleted"))
            self._on_version_deleted(name, version)
            self._forget_later(key)

    def _forget_later(self, key: Key) -> None:
        """After the grace period, the manager removes what it keeps of the version (its
        logs), unless the version was registered again meanwhile."""
        old = self._forget_timers.pop(key, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._forget_timers.pop(key, None)
            name, version = key
            if self._stopped or version in self.registry.models.get(name, {}):
                return
            task = asyncio.get_running_loop().create_task(self._forget(key))
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)

        self._forget_timers[key] = self.clock.call_later(self._forget_after_s, fire)

    async def _forget(self, key: Key) -> None:
        try:
            await self.manager.forget(*key)
        except Exception:
            log.exception("removing what is left of deleted %s:%s failed", *key)

    async def _drain(self, sched: ModelScheduler | None) -> None:
        """What a version was given is answered (or expired) before its replicas stop."""
        if sched is None:
            return
        event = asyncio.Event()
        limit = self.clock.now() + sched.slo_s + _DRAIN_ALLOWANCE_S
        while sched.queue or any(r.in_flight for r in sched.replicas):
            # Woken by each answer; bounded by one SLO (what is queued is answered or
            # expired by then) plus the drain allowance.
            sched.on_drained = event.set
            remaining = limit - self.clock.now()
            if remaining <= 0:
                break
            await wait_event(self.clock, event, remaining)
            event.clear()
        sched.on_drained = None

"""The write side: every change to what is served, durable before it is acknowledged.

Each operation validates on a draft of the registry and commits to the store before the registry
changes (:meth:`StoreSync.commit`); the reconciler then makes the runtime follow. A version
change — a deploy, a switch — is recorded as an :class:`Intent` in the same commit that starts
it, and the intent is removed in the commit that finishes it (or undoes it). A frontend that
crashed in between finds its intent at start-up and rolls the change back (:meth:`recover`):
the version a deploy added is removed, a switch is abandoned, and the reconciler stops whatever
replicas that left running. Retrying the call then starts it afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from clipper.batching.scheduler import ModelScheduler
from clipper.clock import Clock, MonotonicClock, wait_event
from clipper.errors import RegistryError, ReplicaError
from clipper.managers.base import ContainerManager
from clipper.persistence import StoreSync
from clipper.registry import Application, Intent, ModelVersion, Registry
from clipper.rollout import Rollout
from clipper.runtime.catalog import Catalog
from clipper.runtime.node import NodeIdentity
from clipper.runtime.reconciler import Reconciler
from clipper.scaling import AutoscaleConfig
from clipper.store.base import DeletePrefix, StoreError
from clipper.tenants import Tenant

__all__ = ["Control", "LiveVersionError"]

log = logging.getLogger("clipper")

_GIVE_UP_AFTER_RESTARTS = 3
# What a container logs before the reason it refuses its model (clipper.container.runtime).
_REFUSED = "model refused: "


class LiveVersionError(RegistryError):
    """Deleting the version that applications are served by, without ``force`` (409)."""


class Control:
    def __init__(
        self,
        registry: Registry,
        sync: StoreSync,
        reconciler: Reconciler,
        catalog: Catalog,
        manager: ContainerManager,
        *,
        node_id: str | NodeIdentity,
        clock: Clock | None = None,
    ) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self.registry = registry
        self.sync = sync
        self.reconciler = reconciler
        self.catalog = catalog
        self.manager = manager
        self._node = node_id if isinstance(node_id, NodeIdentity) else NodeIdentity.fixed(node_id)
        self._ready_events: dict[tuple[str, str], asyncio.Event] = {}

    @property
    def node_id(self) -> str:
        """This frontend's identity in the store's intents (resolved at start)."""
        return self._node.value

    # -- applications and links ----------------------------------------------------------------
    async def add_app(self, app: Application) -> Application:
        await self.sync.commit(lambda d: d.add_app(app))
        return app

    async def update_app(self, name: str, **changes: object) -> Application:
        return await self.sync.commit(lambda d: d.update_app(name, **changes))

    async def delete_app(self, name: str) -> None:
        # Its users' learned selection states go in the same commit: an application created
        # later under the same name starts afresh.
        await self.sync.commit(
            lambda d: d.delete_app(name), extra=[DeletePrefix("state", f"{name}:")]
        )

    async def link(self, app: str, model: str) -> None:
        await self.sync.commit(lambda d: d.link(app, model))

    async def unlink(self, app: str, models: list[str]) -> None:
        def unlink_all(d: Registry) -> None:
            for model in dict.fromkeys(models):
                d.unlink(app, model)

        await self.sync.commit(unlink_all)

    # -- model versions ------------------------------------------------------------------------
    async def register_model(self, mv: ModelVersion, *, set_current: bool = True) -> None:
        """A version whose containers someone else starts (the original add_model)."""

        def register(d: Registry) -> None:
            d.add_model(mv)
            if set_current:
                d.set_model_version(mv.name, mv.version)

        await self.sync.commit(register)

    async def replace_model(self, mv: ModelVersion) -> None:
        await self.sync.commit(lambda d: d.replace_model(mv))

    def is_same_deploy(self, mv: ModelVersion, *, set_current: bool) -> bool:
        """Whether ``mv`` is already deployed exactly so (a retried call: a no-op)."""
        have = self.registry.models.get(mv.name, {}).get(mv.version)
        return (
            have is not None
            and have.to_record() == mv.to_record()
            and mv.name not in self.registry.intents
            and (not set_current or self.registry.current.get(mv.name) == mv.version)
        )

    async def deploy(
        self,
        mv: ModelVersion,
        *,
        set_current: bool = True,
        retire_previous: bool = True,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> ModelVersion:
        """Register ``mv`` and start its replicas; with ``set_current``, switch traffic to it
        once they are all connected. Undone if they do not connect; a retry of a deploy that
        completed is a no-op."""
        mv = self.pooled(mv)
        check = getattr(self.manager, "check_version", None)
        if check is not None:  # what only the manager can judge (its labels): before a commit
            check(mv)
        if self.is_same_deploy(mv, set_current=set_current):
            return mv
        if not set_current:
            mv = replace(mv, keep=True)
        intent = Intent(
            mv.name, mv.version, self.registry.current.get(mv.name), added=True, owner=self.node_id
        )

        def begin(d: Registry) -> None:
            d.add_model(mv)
            d.begin_intent(intent)

        await self.sync.commit(begin)
        try:
            if mv.num_replicas and mv.artifact is not None and (wait or set_current):
                await self.wait_for_replicas(
                    mv.name, mv.version, mv.num_replicas, ready_timeout_s=ready_timeout_s
                )
        except BaseException:
            await self._undo(intent)
            raise
        await self._finish(intent, set_current=set_current, retire_previous=retire_previous)
        return mv

    def pooled(self, mv: ModelVersion) -> ModelVersion:
        """A pooled version as it is deployed (docs/density.md): one replica at most, loaded
        into a pool process on demand, autoscaled from zero (idle: unloaded; a query loads it);
        refused where no pool runs it."""
        if not mv.pooled:
            return mv
        if not getattr(self.manager, "pools", False):
            raise RegistryError(
                f"model {mv.name}:{mv.version} is pooled, and pooled models need the local "
                "manager started with pool processes (clipper start --pool-processes N)"
            )
        if mv.artifact is None:
            raise RegistryError(
                f"model {mv.name}:{mv.version} is pooled but has no artifact: a pool process "
                "loads the model from its artifact"
            )
        cfg = mv.autoscale or AutoscaleConfig(min_replicas=0, max_replicas=1, owner=self.node_id)
        _check_pooled_autoscale(mv, cfg)
        return replace(mv, autoscale=cfg, num_replicas=min(mv.num_replicas, 1))

    async def set_version(
        self,
        name: str,
        version: str,
        *,
        ready_timeout_s: float = 60.0,
        retire_previous: bool = True,
    ) -> None:
        """Switch ``name``'s traffic to ``version`` (forward or back) without failing a query:
        its replicas start (its own recorded count; the current version's when it has none),
        traffic switches once they are connected, and the previous version drains and stops
        (or keeps running, with ``retire_previous=False``), staying registered for a later
        rollback."""
        target = self.registry.get_model(name, version)
        previous = self.registry.current.get(name)
        if previous == version:
            return
        old = self.registry.models[name].get(previous or "")
        intent = Intent(name, version, previous, added=False, owner=self.node_id)
        wanted = target.num_replicas or (old.num_replicas if old else 1) or 1

        def begin(d: Registry) -> None:
            if target.artifact is not None and target.num_replicas != wanted:
                d.set_num_replicas(name, version, wanted)
            d.begin_intent(intent)

        await self.sync.commit(begin)
        try:
            if target.artifact is not None:
                await self.wait_for_replicas(name, version, wanted, ready_timeout_s=ready_timeout_s)
        except BaseException:
            await self._undo(intent)
            raise
        await self._finish(intent, set_current=True, retire_previous=retire_previous)

    async def _finish(self, intent: Intent, *, set_current: bool, retire_previous: bool) -> None:
        def finish(d: Registry) -> None:
            name = intent.name
            if set_current:
                previous = d.current.get(name)
                d.set_model_version(name, intent.version)
                old = d.models[name].get(previous or "")
                # Retired (drained, then stopped by the reconciler) or explicitly kept.
                if (
                    old is not None
                    and old.version != intent.version
                    and old.keep != (not retire_previous)
                ):
                    d.replace_model(replace(old, keep=not retire_previous))
                target = d.models[name][intent.version]
                if target.keep:
                    d.replace_model(replace(target, keep=False))
            d.end_intent(name)

        await self.sync.commit(finish)

    async def _undo(self, intent: Intent) -> None:
        """Roll a version change back (its replicas did not come up, or it was cancelled)."""

        def undo(d: Registry) -> None:
            if d.intents.get(intent.name) != intent:
                return
            if intent.added and d.current.get(intent.name) != intent.version:
                with contextlib.suppress(RegistryError):
                    d.delete_model_version(intent.name, intent.version)
            d.end_intent(intent.name)

        try:
            await asyncio.shield(self.sync.commit(undo))
            # Its replicas are stopped before the failure is reported.
            await self.reconciler.settled(intent.name, intent.version)
        except (StoreError, asyncio.CancelledError) as e:
            # The intent stays in the store: this frontend rolls it back when it next starts.
            log.warning("rolling back the change of %s failed (%s); undone at restart", intent, e)

    async def recover(self) -> list[Intent]:
        """At start-up: roll back the version changes this frontend left unfinished."""
        mine = [i for i in self.registry.intents.values() if i.owner == self.node_id]
        if not mine:
            return []

        def undo_all(d: Registry) -> None:
            for intent in mine:
                if intent.added and d.current.get(intent.name) != intent.version:
                    with contextlib.suppress(RegistryError):
                        d.delete_model_version(intent.name, intent.version)
                d.end_intent(intent.name)

        await self.sync.commit(undo_all)
        for intent in mine:
            log.warning(
                "rolled back the unfinished %s of model %s to version %s (the frontend stopped "
                "during it)",
                "deploy" if intent.added else "switch",
                intent.name,
                intent.version,
            )
        return mine

    async def scale(
        self,
        name: str,
        num_replicas: int,
        version: str | None = None,
        *,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> ModelVersion:
        mv = self.registry.get_model(name, version)
        key = mv.version
        mv = await self.sync.commit(lambda d: d.set_num_replicas(name, key, num_replicas))
        await self.reconciler.settled(name, key)
        if wait and num_replicas and self.reconciler.desired_replicas(mv):
            await self.wait_for_replicas(name, key, num_replicas, ready_timeout_s=ready_timeout_s)
        return mv

    async def set_autoscale(
        self, name: str, version: str | None, config: AutoscaleConfig
    ) -> ModelVersion:
        """Set a version's autoscaling; its replica count moves into the new bounds in the
        same commit (the autoscaler drives it from there)."""
        key = self.registry.get_model(name, version).version

        def configure(d: Registry) -> ModelVersion:
            mv = d.get_model(name, key)
            if mv.pooled:
                _check_pooled_autoscale(mv, config)
            if mv.artifact is None and config.enabled:
                raise RegistryError(
                    f"model {name}:{key} has no artifact for clipper-serve to run (its "
                    "containers are started elsewhere): only replicas it starts can be "
                    "autoscaled"
                )
            n = config.clamp(mv.num_replicas) if config.enabled else mv.num_replicas
            mv = replace(mv, autoscale=config, num_replicas=n)
            d.replace_model(mv)
            return mv

        mv = await self.sync.commit(configure)
        await self.reconciler.settled(name, key)
        return mv

    async def delete_version(self, name: str, version: str, *, force: bool = True) -> None:
        """Remove a version; its replicas drain what they hold and stop before this returns.

        Without ``force``, the current version of a model linked to an application is refused
        (:class:`LiveVersionError`): those applications would answer only defaults."""

        def delete(d: Registry) -> None:
            if not force and d.current.get(name) == version:
                apps = sorted(a for a, models in d.links.items() if name in models)
                if apps:
                    raise LiveVersionError(
                        f"{name}:{version} is the current version of {name}, which serves "
                        f"{', '.join(apps)}: deleting it leaves them nothing but default "
                        f"outputs. Switch to another version first (set_model_version), unlink "
                        f'{name}, or delete it anyway with --force (admin API: "force": true)'
                    )
            d.delete_model_version(name, version)

        await self.sync.commit(delete)
        await self.reconciler.settled(name, version)

    # -- canary splits and shadows ------------------------------------------------------------
    async def set_rollout(
        self,
        name: str,
        update: Callable[[Rollout | None], Rollout | None],
        *,
        ready_timeout_s: float = 60.0,
    ) -> Rollout | None:
        """Change ``name``'s rollout to ``update(the one it has)``; returns once every version
        it names has its replicas connected (until then the current version answers the
        shares of those that have none). Undone if they do not connect in time."""
        before = self.registry.rollouts.get(name)
        after = await self.sync.commit(lambda d: d.set_rollout(name, update(d.rollouts.get(name))))
        try:
            for version in sorted(after.versions if after is not None else ()):
                mv = self.registry.models[name][version]
                if mv.artifact is not None and mv.num_replicas:
                    await self.wait_for_replicas(
                        name, version, mv.num_replicas, ready_timeout_s=ready_timeout_s
                    )
        except BaseException:

            def undo(d: Registry) -> None:
                if d.rollouts.get(name) == after:
                    with contextlib.suppress(RegistryError):
                        d.set_rollout(name, before)

            with contextlib.suppress(StoreError, asyncio.CancelledError):
                await asyncio.shield(self.sync.commit(undo))
            raise
        return after

    # -- tenants -------------------------------------------------------------------------------
    async def change_tenant(
        self, name: str, update: Callable[[Tenant | None], Tenant | None]
    ) -> Tenant | None:
        """Set tenant ``name`` to ``update(the one there is, or None)``; None deletes it. The
        update runs on the draft, so it sees what another frontend committed before."""

        def change(d: Registry) -> Tenant | None:
            after = update(d.tenants.get(name))
            if after is None:
                d.delete_tenant(name)
                return None
            return d.set_tenant(after)

        return await self.sync.commit(change)

    # -- readiness -----------------------------------------------------------------------------
    def replicas_changed(self, sched: ModelScheduler) -> None:
        event = self._ready_events.get(sched.mv.key)
        if event is not None:
            event.set()

    async def wait_for_replicas(
        self, name: str, version: str, n: int, *, ready_timeout_s: float = 60.0
    ) -> None:
        key = (name, version)
        deadline = self.clock.now() + ready_timeout_s
        while True:
            sched = self.catalog.scheduler(*key)
            if sched is not None and len(sched.replicas) >= n:
                return
            failed = [
                p
                for p in self.manager.replicas(name, version)
                if p.restarts >= _GIVE_UP_AFTER_RESTARTS
            ]
            if failed:
                tail = failed[0].log_tail()
                # A container that refuses its model says why in one line: that line is the
                # answer (docs/deployers.md), not a screen of log.
                refused = [ln for ln in tail.splitlines() if _REFUSED in ln]
                if refused:
                    reason = refused[-1].split(_REFUSED, 1)[1]
                    raise ReplicaError(f"{name}:{version} refused by its container: {reason}")
                raise ReplicaError(
                    f"replica {failed[0].slot} of {name}:{version} exited {failed[0].restarts} "
                    f"times (last exit code {failed[0].last_exit}); its log ends with:\n{tail}"
                )
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                connected = len(sched.replicas) if sched else 0
                raise ReplicaError(
                    f"{connected} of {n} replicas of {name}:{version} connected "
                    f"within {ready_timeout_s} s"
                )
            event = self._ready_events.setdefault(key, asyncio.Event())
            # Woken by a replica connecting; the timeout also re-checks failed processes.
            await wait_event(self.clock, event, min(remaining, 0.5))
            event.clear()


def _check_pooled_autoscale(mv: ModelVersion, cfg: AutoscaleConfig) -> None:
    if not cfg.enabled or cfg.min_replicas != 0 or cfg.max_replicas != 1:
        raise RegistryError(
            f"model {mv.name}:{mv.version} is pooled: its autoscaling must stay enabled with "
            f"min_replicas 0 and max_replicas 1 (loaded on demand, unloaded when idle), got "
            f"enabled={cfg.enabled}, min_replicas={cfg.min_replicas}, "
            f"max_replicas={cfg.max_replicas}"
        )

"""The read side: which scheduler serves a model, what an application links, whether it can answer.

Two objects, one table. :class:`SchedulerTable` holds the schedulers serving now, by
``(model, version)``; the :class:`~clipper.runtime.reconciler.Reconciler` is its only writer, and
every write advances :attr:`SchedulerTable.generation` and tells the listeners (the way a
controller publishes versioned snapshots to its proxies). :class:`Catalog` is the read-only view
everyone else is handed — the query runners, traffic, the protocols, the dashboard, the admin
API, the autoscaler, the replica directory — so that "the current version's scheduler" and the
readiness rules are written once. ``GET /ready``, ``/v2/health/ready`` and gRPC's
``ServerReady`` all read :meth:`Catalog.reasons` (the whole frontend), which also says when the
frontend withdrew its readiness (:meth:`Catalog.withdraw`: it is stopping, and drains what it
holds); ``GET /<app>/ready``, V2's model ready and gRPC's ``ModelReady`` read
:meth:`Catalog.app_reasons` (one application). A version with replicas connected whose answers
over the last minute are mostly errors is not ready either, in both: the reason names it, its
error rate and its latest error. A version autoscaled to zero (``min_replicas`` 0) with no
replica connected is ready but cold (:meth:`Catalog.cold`): its queries are held while a replica
starts, so a load balancer must not take the frontend out of rotation for it.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Mapping, ValuesView

from clipper.batching.health import HealthReading
from clipper.batching.scheduler import ModelScheduler
from clipper.pipeline.spec import Pipeline
from clipper.registry import Application, ModelVersion, Registry
from clipper.rollout import Rollout

__all__ = ["Catalog", "Key", "Listener", "SchedulerTable"]

Key = tuple[str, str]  # (model, version)
# Told of each write: the key, and its scheduler now (None: removed).
Listener = Callable[[Key, ModelScheduler | None], None]


class SchedulerTable:
    """The schedulers serving now. Written by the reconciler alone; read through a
    :class:`Catalog`."""

    __slots__ = ("_by_key", "_listeners", "generation")

    def __init__(self) -> None:
        self._by_key: dict[Key, ModelScheduler] = {}
        self._listeners: list[Listener] = []
        self.generation = 0  # advances on every write: readers can tell a snapshot is stale

    def put(self, key: Key, sched: ModelScheduler) -> None:
        if self._by_key.get(key) is sched:
            return
        self._by_key[key] = sched
        self._changed(key, sched)

    def pop(self, key: Key) -> ModelScheduler | None:
        sched = self._by_key.pop(key, None)
        if sched is not None:
            self._changed(key, None)
        return sched

    def get(self, key: Key) -> ModelScheduler | None:
        return self._by_key.get(key)

    def __getitem__(self, key: Key) -> ModelScheduler:
        return self._by_key[key]

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def items(self) -> ItemsView[Key, ModelScheduler]:
        return self._by_key.items()

    def values(self) -> ValuesView[ModelScheduler]:
        return self._by_key.values()

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def _changed(self, key: Key, sched: ModelScheduler | None) -> None:
        self.generation += 1
        for listener in self._listeners:
            listener(key, sched)


class Catalog:
    """Read-only answers about what is served; nothing here changes what is served. The one
    state of its own is :attr:`withdrawn`: why the frontend no longer reports ready whatever
    it serves (set once, by the composition root, when a stop begins its drain)."""

    __slots__ = ("_current", "_models", "_schedulers", "_table", "by_key", "currents", "links",
                 "registry", "rollouts", "withdrawn")  # fmt: skip

    def __init__(self, registry: Registry, table: SchedulerTable) -> None:
        self.registry = registry
        self._table = table
        self._schedulers = table._by_key
        self._current = registry.current
        self._models = registry.models
        # Read-only views for the query path, which looks them up once per request with a
        # plain ``.get`` (a method call here costs as much again). They stay valid: the
        # registry and the table change these dicts in place and never replace them.
        self.links: Mapping[str, list[str]] = registry.links
        self.currents: Mapping[str, str] = registry.current
        self.rollouts: Mapping[str, Rollout] = registry.rollouts
        self.by_key: Mapping[Key, ModelScheduler] = table._by_key
        self.withdrawn: str | None = None

    # -- applications ----------------------------------------------------------------------
    def app(self, name: str) -> Application | None:
        return self.registry.apps.get(name)

    def apps(self) -> list[Application]:
        return list(self.registry.apps.values())

    def linked(self, app: str) -> list[str]:
        return self.registry.links.get(app) or []

    def single_model(self, app: Application) -> str | None:
        """The one model a single-model application answers with, else None."""
        linked = self.linked(app.name)
        return linked[0] if len(linked) == 1 else None

    # -- versions --------------------------------------------------------------------------
    def current(self, model: str) -> str | None:
        """The version that answers ``model``'s unpinned queries (None: there is none)."""
        return self._current.get(model)

    def version(self, model: str, version: str | None = None) -> ModelVersion | None:
        """``version`` of ``model``, or its current version; None when there is none."""
        v = version if version is not None else self._current.get(model)
        return self._models.get(model, {}).get(v) if v is not None else None

    def has_version(self, model: str, version: str) -> bool:
        return version in self._models.get(model, {})

    def versions(self, model: str) -> list[str]:
        return sorted(self._models.get(model, {}))

    def rollout(self, model: str) -> Rollout | None:
        """The model's traffic split and shadow, if it has one."""
        return self.registry.rollouts.get(model)

    # -- schedulers ------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        return self._table.generation

    def scheduler(self, model: str, version: str | None = None) -> ModelScheduler | None:
        """The scheduler of ``model`` at ``version`` (None: its current version)."""
        if version is None:
            version = self._current.get(model)
            if version is None:
                return None
        return self._schedulers.get((model, version))

    def live(self, model: str, version: str | None = None) -> ModelScheduler | None:
        """The scheduler of ``model`` at ``version`` (None: current) when a replica of it is
        connected, else None."""
        sched = self.scheduler(model, version)
        return sched if sched is not None and sched.replicas else None

    def schedulers(self) -> list[tuple[Key, ModelScheduler]]:
        """Every scheduler serving now, by key, in key order."""
        return sorted(self._schedulers.items(), key=lambda kv: kv[0])

    def subscribe(self, listener: Listener) -> None:
        """Be told of every scheduler added or removed (by the reconciler)."""
        self._table.subscribe(listener)

    # -- readiness -------------------------------------------------------------------------
    def withdraw(self, reason: str) -> None:
        """Report not ready from now on, for ``reason`` (first in :meth:`reasons`): the
        frontend is draining, and a load balancer should send it nothing new."""
        self.withdrawn = reason

    def unready(self) -> list[str]:
        """``model:version`` of every linked model whose current version should have replicas
        and has none connected."""
        out = []
        for names in self.registry.links.values():
            for name in names:
                mv = self.version(name)
                if (mv is not None and mv.num_replicas and not self.live(name, mv.version)
                        and not _scales_to_zero(mv)):  # fmt: skip
                    out.append(f"{name}:{mv.version}")
        return out

    def failing(self, model: str, version: str | None = None) -> HealthReading | None:
        """The reading of ``model`` at ``version`` (None: current) when its answers over the
        last minute are mostly errors (:attr:`HealthReading.failing`), else None."""
        sched = self.scheduler(model, version)
        if sched is None:
            return None
        reading = sched.health.reading()
        return reading if reading.failing else None

    def failing_models(self) -> list[dict[str, object]]:
        """Every version serving now whose answers over the last minute are mostly errors: its
        ``model``, ``version``, error rate and latest error."""
        out: list[dict[str, object]] = []
        for (name, version), sched in self.schedulers():
            reading = sched.health.reading()
            if reading.failing:
                out.append({"model": name, "version": version, **reading.as_json()})
        return out

    def reasons(self, *, model_errors: bool = True) -> list[str]:
        """Why the frontend is not ready, one line per linked model that cannot answer its
        application: its current version has no replica connected (yet), or it has no current
        version at all (deleted with force), or (unless ``model_errors`` is False) its answers
        over the last minute are mostly errors. Empty when ready: the readiness rule of the
        whole frontend."""
        out = [] if self.withdrawn is None else [self.withdrawn]
        for app, names in sorted(self.registry.links.items()):
            for name in names:
                mv = self.version(name)
                if mv is None:
                    out.append(
                        f"application '{app}': model '{name}' has no current version "
                        "(it answers only default outputs)"
                    )
                elif _scales_to_zero(mv) and not self.live(name, mv.version):
                    continue  # ready but cold: its queries wait for the replica it starts
                elif mv.num_replicas and not self.live(name, mv.version):
                    out.append(
                        f"application '{app}': model '{name}:{mv.version}' has no replica connected"
                    )
                elif model_errors and (bad := self.failing(name, mv.version)) is not None:
                    out.append(f"application '{app}': {bad.reason(f'{name}:{mv.version}')}")
        return out

    def ready(self) -> bool:
        return not self.reasons()

    def cold(self, app: str | None = None) -> list[str]:
        """``model:version (scaled to zero)`` (or ``(waking from zero)``: its replica is
        starting) for every linked model (of ``app``, if given) whose current version scales
        to zero and has no replica connected: ready, but its next query waits for a start."""
        out = []
        for name, names in sorted(self.registry.links.items()):
            for model in names if app is None or name == app else ():
                mv = self.version(model)
                if mv is not None and _scales_to_zero(mv) and not self.live(model, mv.version):
                    what = "scaled to zero" if mv.num_replicas == 0 else "waking from zero"
                    entry = f"{model}:{mv.version} ({what})"
                    if entry not in out:
                        out.append(entry)
        return out

    def app_reasons(self, app: Application, version: str | None = None) -> list[str]:
        """Why ``app`` cannot answer with a prediction now, one line each; empty when it can:
        the readiness rule of one application (``GET /<app>/ready``, V2's model ready, gRPC's
        ``ModelReady``). By kind, as the query path answers it:

        * a single model, or a split (its drawn versions fall back on the current one): the
          current version (``version``, when pinned) has a replica connected and its answers
          over the last minute are not mostly errors (:mod:`clipper.batching.health`);
        * a selection: at least one linked model's current version has one;
        * a pipeline: every required stage (no ``default``, not ``optional``) can run: its
          model's current version has a replica connected, or its application is ready.

        An application with no model linked answers only its default output: not ready. A
        frontend that withdrew its readiness (draining) says so first, for every application."""
        out = [] if self.withdrawn is None else [self.withdrawn]
        out += [f"application '{app.name}': {why}" for why in self._why_not(app, version, ())]
        return out

    def app_ready(self, app: Application, version: str | None = None) -> bool:
        """``app`` can answer with a prediction (:meth:`app_reasons` is empty)."""
        return not self.app_reasons(app, version)

    def _why_not(self, app: Application, version: str | None, seen: tuple[str, ...]) -> list[str]:
        if app.stages is not None:  # a query's version pin is not used by a pipeline
            return self._stages_why_not(app.stages, (*seen, app.name))
        linked = self.linked(app.name)
        if not linked:
            return ["no model is linked (it answers only default outputs)"]
        if version is not None:
            if len(linked) > 1:  # the processor refuses such a query
                return [f"a version cannot be pinned: {len(linked)} models are linked"]
            return self._model_why_not(linked[0], version)
        if app.policy == "single":
            return self._model_why_not(linked[0], None)
        out = []
        for name in linked:  # a selection answers with whichever of its models can
            why = self._model_why_not(name, None)
            if not why:
                return []
            out.extend(why)
        return out

    def _model_why_not(self, name: str, version: str | None) -> list[str]:
        """Why ``name`` at ``version`` (None: its current version) has no replica to answer."""
        if name not in self._models:
            return [f"model '{name}' does not exist"]
        mv = self.version(name, version)
        if mv is None:
            if version is not None:
                return [f"model '{name}' has no version '{version}'"]
            return [f"model '{name}' has no current version (it answers only default outputs)"]
        if self.live(name, mv.version) is not None:
            bad = self.failing(name, mv.version)
            return [] if bad is None else [bad.reason(f"{name}:{mv.version}")]
        if _scales_to_zero(mv):
            return []  # ready but cold: a query wakes it and waits (Catalog.cold)
        if mv.num_replicas == 0:
            return [f"model '{name}:{mv.version}' has no replica connected (none is configured: "
                    "num_replicas is 0)"]  # fmt: skip
        return [f"model '{name}:{mv.version}' has no replica connected"]

    def _stages_why_not(self, pipeline: Pipeline, seen: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        for stage in pipeline.stages.values():
            if stage.on_miss != "fail":  # it may miss: the answer is degraded, not the default
                continue
            if stage.model is not None:
                why = self._model_why_not(stage.model, None)
            else:
                target = self.app(stage.app or "")
                if target is None:
                    why = [f"application '{stage.app}' does not exist"]
                elif target.name in seen:  # a stage never names a pipeline: a guard only
                    why = [f"application '{stage.app}' refers back to '{seen[0]}'"]
                else:
                    why = self._why_not(target, None, seen)
            out.extend(f"stage '{stage.name}' ({stage.target}): {w}" for w in why)
        return out


def _scales_to_zero(mv: ModelVersion) -> bool:
    return mv.autoscale is not None and mv.autoscale.scales_to_zero

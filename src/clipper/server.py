"""The frontend, assembled: query API, RPC endpoint, schedulers, cache, local manager.

``Clipper`` is the embedded entry point (``async with Clipper(...) as c``); ``clipper start`` runs
the same object. The in-process registry is the source of truth; the runtime (schedulers and
replica processes) follows it through registry change events, so the persistent store and the
admin API attach to the same seam.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import shutil
import signal
import tempfile
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import PredictionCache
from clipper.clock import Clock, MonotonicClock
from clipper.config import BatchingConfig, FrontendConfig
from clipper.deployers import package
from clipper.errors import ClipperError, RegistryError, ReplicaError
from clipper.frontend.admin import AdminApi
from clipper.frontend.ensemble import SelectionRuntime
from clipper.frontend.http import HttpServer
from clipper.frontend.metrics import Metrics
from clipper.frontend.query import QueryProcessor
from clipper.frontend.routes import AdminRoutes, QueryRoutes
from clipper.inputs import InputType
from clipper.managers.local import LocalManager
from clipper.persistence import StoreSync
from clipper.registry import Application, Change, ModelVersion, Registry
from clipper.rpc import wire
from clipper.rpc.server import RpcServer
from clipper.store.base import Store, open_store

if TYPE_CHECKING:
    from clipper.frontend.grpc.server import V2GrpcServer

__all__ = ["Clipper"]

log = logging.getLogger("clipper")

_UNLINKED_SLO_S = 0.1
_DRAIN_TIMEOUT_S = 2.0


class Clipper:
    """A clipper-serve frontend with the local container manager.

    ::

        async with Clipper(query_port=0, rpc_port=0) as c:
            c.register_application("digits", "doubles", "-1", 20_000)
            await c.deploy_model("logreg", "1", model, input_type="doubles")
            c.link_model_to_app("digits", "logreg")
            await c.serve_forever()
    """

    def __init__(
        self, config: FrontendConfig | None = None, *, clock: Clock | None = None, **overrides: Any
    ) -> None:
        if config is None:
            config = FrontendConfig(**overrides)
        elif overrides:
            raise ClipperError("pass either a FrontendConfig or keyword settings, not both")
        self.config = config
        self.clock = clock or MonotonicClock()
        self.registry = Registry()
        self.metrics = Metrics()
        self.cache = PredictionCache(config.cache_bytes, config.cache_policy)
        self.schedulers: dict[tuple[str, str], ModelScheduler] = {}
        self.processor = QueryProcessor(
            registry=self.registry,
            cache=self.cache,
            clock=self.clock,
            metrics=self.metrics,
            schedulers=self.schedulers,
        )
        self.processor.selection = SelectionRuntime(
            self.processor, persist=self._persist_state, fetch=self._fetch_state
        )
        self.processor.on_feedback = self._send_update
        self.rpc = RpcServer(
            host=config.rpc_host,
            port=config.rpc_port,
            clock=self.clock,
            registrar=self._register_replica,
            on_removed=self._replica_removed,
            input_type_of=lambda r: r.scheduler.mv.input_type if r.scheduler else InputType.BYTES,
        )
        self.http = HttpServer(
            QueryRoutes(self), host=config.host, port=config.query_port,
            max_body_bytes=config.max_body_bytes,
        )  # fmt: skip
        self.admin = AdminApi(self)
        self.admin_http = HttpServer(
            AdminRoutes(self), host=config.admin_host, port=config.admin_port,
            max_body_bytes=config.max_body_bytes,
        )  # fmt: skip
        self.grpc: V2GrpcServer | None = None
        if config.grpc_port is not None:
            # Imported only when served: grpc is heavy, and containers import this package.
            from clipper.frontend.grpc.server import V2GrpcServer

            self.grpc = V2GrpcServer(self, host=config.host, port=config.grpc_port)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if config.state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="clipper-")
            self.state_dir = Path(self._tmp.name)
        else:
            self.state_dir = Path(config.state_dir)
        self.manager = LocalManager(
            rpc_host=lambda: (
                self.config.rpc_host if self.config.rpc_host != "0.0.0.0" else "127.0.0.1"
            ),
            rpc_port=lambda: self.rpc.port,
            state_dir=self.state_dir,
            clock=self.clock,
            heartbeat_interval_s=config.heartbeat_interval_s,
            python=config.python,
            on_exit=self._process_exited,
            nice=config.container_nice,
            drain=self._drain_token,
        )
        self._replica_ids: dict[tuple[str, str], itertools.count[int]] = {}
        self._by_token: dict[str, Replica] = {}
        self._ready_events: dict[tuple[str, str], asyncio.Event] = {}
        self._started = False
        self._stop_event: asyncio.Event | None = None
        self.store: Store | None = None
        self.sync: StoreSync | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.registry.subscribe(self._on_change)

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        if self._started:
            return
        self._stop_event = asyncio.Event()
        self.store = open_store(self.config.store)
        await self.store.open()
        try:
            self.sync = StoreSync(self.registry, self.store, on_remote=self._on_remote_change)
            await self.sync.start()
        except BaseException:
            await self.store.close()
            raise
        await self.rpc.start()
        try:
            await self.http.start()
            try:
                await self.admin_http.start()
                if self.grpc is not None:
                    try:
                        await self.grpc.start()
                    except BaseException:
                        await self.admin_http.stop()
                        raise
            except BaseException:
                await self.http.stop()
                raise
        except BaseException:
            await self.rpc.stop()
            raise
        self._started = True
        # What the store says should run, runs again: a restart needs no manual step.
        for versions in self.registry.models.values():
            for mv in versions.values():
                if mv.artifact is not None and mv.num_replicas:
                    self._spawn(self.manager.ensure(mv), f"restore {mv.name}:{mv.version}")
        log.info(
            "query API on http://%s:%s, RPC on %s",
            self.config.host,
            self.http.port,
            self.rpc.address,
        )

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.admin.stop()
        if self.processor.selection is not None:
            await self.processor.selection.stop()
        await self.manager.stop_all()
        if self.grpc is not None:
            await self.grpc.stop()
        await self.admin_http.stop()
        await self.http.stop()
        for sched in self.schedulers.values():
            sched.close(ReplicaError("the frontend is shutting down"))
        await self.rpc.stop()
        if self.sync is not None:
            await self.sync.stop()
        if self.store is not None:
            await self.store.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self._stop_event is not None:
            self._stop_event.set()

    async def __aenter__(self) -> Clipper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def serve_forever(self) -> None:
        """Serve until SIGINT/SIGTERM (or :meth:`stop`), then stop cleanly."""
        assert self._stop_event is not None, "start() first"
        # Everything alive now (frameworks, trained models, the registry) lives as long as the
        # process: take it out of the cyclic collector, whose full passes over a process with
        # scikit-learn or torch loaded stall the event loop for tens of milliseconds.
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stop_event.set)
                installed.append(sig)
        try:
            await self._stop_event.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    @property
    def query_port(self) -> int:
        return self.http.port

    @property
    def admin_url(self) -> str:
        host = "127.0.0.1" if self.config.admin_host in ("0.0.0.0", "") else self.config.admin_host
        return f"http://{host}:{self.admin_http.port}"

    @property
    def query_url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        return f"http://{host}:{self.http.port}"

    # -- registry operations -----------------------------------------------------------------
    def register_application(
        self,
        name: str,
        input_type: str | InputType,
        default_output: str,
        latency_slo_micros: int,
        *,
        cache: bool = True,
        overload: Literal["default", "reject"] = "default",
        policy: str = "single",
        policy_params: dict[str, Any] | None = None,
        min_confidence: float = 0.0,
        loss: str = "0/1",
        loss_scale: float = 1.0,
        online_learning: bool = False,
    ) -> Application:
        """An application: its input type, latency SLO and default output; with a selection
        ``policy`` other than ``single`` it may link several models (see docs/selection.md)."""
        app = Application(
            name=name,
            input_type=_input_type(input_type),
            default_output=default_output,
            latency_slo_micros=latency_slo_micros,
            cache=cache,
            overload=overload,
            policy=policy,
            policy_params=dict(policy_params or {}),
            min_confidence=min_confidence,
            loss=loss,
            loss_scale=loss_scale,
            online_learning=online_learning,
        )
        self.registry.add_app(app)
        return app

    def delete_application(self, name: str) -> None:
        self.registry.delete_app(name)

    def link_model_to_app(self, app_name: str, model_name: str) -> None:
        self.registry.link(app_name, model_name)

    async def set_model_version(
        self,
        name: str,
        version: str,
        *,
        ready_timeout_s: float = 60.0,
        retire_previous: bool = True,
    ) -> None:
        """Switch ``name``'s traffic to ``version`` (forward or back) without failing a query:
        the target's replicas are started (as many as the current version runs) and traffic
        switches once they are connected; the previous version then drains its queue and
        in-flight batches and stops, staying registered for a later rollback (with
        ``retire_previous=False`` it keeps running, for queries that pin it)."""
        target = self.registry.get_model(name, version)
        previous = self.registry.current.get(name)
        if previous == version:
            return
        old = self.registry.models[name].get(previous or "")
        if target.artifact is not None:
            wanted = target.num_replicas or (old.num_replicas if old else 1) or 1
            if target.num_replicas != wanted:
                target = self.registry.set_num_replicas(name, version, wanted)
            await self.manager.ensure(target)
            await self.wait_for_replicas(name, version, wanted, ready_timeout_s=ready_timeout_s)
        self.registry.set_model_version(name, version)
        if retire_previous and old is not None and old.artifact is not None and old.num_replicas:
            self._spawn(self._retire(old), f"retire {old.name}:{old.version}")

    async def _retire(self, mv: ModelVersion) -> None:
        """Stop a version that no longer takes traffic once what it was given is answered."""
        sched = self.schedulers.get(mv.key)
        if sched is not None:
            event = asyncio.Event()
            limit = asyncio.get_running_loop().time() + sched.slo_s + _DRAIN_TIMEOUT_S
            while sched.queue or any(r.in_flight for r in sched.replicas):
                # Woken by each answer; bounded by one SLO (what is queued is answered or
                # expired by then) plus the drain allowance.
                sched.on_drained = event.set
                remaining = limit - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
                event.clear()
            sched.on_drained = None
        still_registered = mv.version in self.registry.models.get(mv.name, {})
        if still_registered and self.registry.current.get(mv.name) != mv.version:
            stopped = self.registry.set_num_replicas(mv.name, mv.version, 0)
            await self.manager.ensure(stopped)

    async def deploy_model(
        self,
        name: str,
        version: str,
        model: Any = None,
        *,
        input_type: str | InputType,
        num_replicas: int = 1,
        batching: BatchingConfig | None = None,
        labels: Sequence[str] = (),
        artifact: str | Path | None = None,
        set_current: bool = True,
        retire_previous: bool = True,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> ModelVersion:
        """Run ``model`` (a function, or an object with ``predict(inputs)``) in
        ``num_replicas`` container processes. With ``wait`` it returns once they are all
        connected; traffic switches to this version only then (when ``set_current``)."""
        if (model is None) == (artifact is None):
            raise ClipperError("deploy_model needs exactly one of model= or artifact=")
        if version in self.registry.models.get(name, {}):
            # Refuse before writing anything: the running version's file must stay as it is.
            raise RegistryError(f"model with name '{name}' and version '{version}' already exists")
        if artifact is None:
            artifact = self._save_model(name, version, model)
        mv = ModelVersion(
            name=name,
            version=version,
            input_type=_input_type(input_type),
            labels=tuple(labels),
            artifact=str(artifact),
            batching=batching or BatchingConfig(),
            num_replicas=num_replicas,
        )
        self.registry.add_model(mv)
        try:
            await self.manager.ensure(mv)
            if wait and num_replicas:
                await self.wait_for_replicas(
                    name, version, num_replicas, ready_timeout_s=ready_timeout_s
                )
        except BaseException:
            await self.manager.stop_model(name, version)
            self.registry.delete_model_version(name, version)
            raise
        if set_current:
            await self.set_model_version(
                name, version, ready_timeout_s=ready_timeout_s, retire_previous=retire_previous
            )
        return mv

    async def set_num_replicas(
        self,
        name: str,
        num_replicas: int,
        version: str | None = None,
        *,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> None:
        mv = self.registry.get_model(name, version)
        mv = self.registry.set_num_replicas(name, mv.version, num_replicas)
        await self.manager.ensure(mv)
        if wait and num_replicas:
            await self.wait_for_replicas(
                name, mv.version, num_replicas, ready_timeout_s=ready_timeout_s
            )

    async def wait_for_replicas(
        self, name: str, version: str, n: int, *, ready_timeout_s: float = 60.0
    ) -> None:
        key = (name, version)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ready_timeout_s
        while True:
            sched = self.schedulers.get(key)
            if sched is not None and len(sched.replicas) >= n:
                return
            failed = [p for p in self.manager.replicas(name, version) if p.restarts >= 3]
            if failed:
                raise ReplicaError(
                    f"replica {failed[0].slot} of {name}:{version} exited {failed[0].restarts} "
                    f"times (last exit code {failed[0].last_exit}); its log ends with:\n"
                    f"{failed[0].log_tail()}"
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                connected = len(sched.replicas) if sched else 0
                raise ReplicaError(
                    f"{connected} of {n} replicas of {name}:{version} connected "
                    f"within {ready_timeout_s} s"
                )
            event = self._ready_events.setdefault(key, asyncio.Event())
            with contextlib.suppress(TimeoutError):
                # Woken by a replica connecting; the timeout also re-checks failed processes.
                await asyncio.wait_for(event.wait(), min(remaining, 0.5))
            event.clear()

    async def stop_model(self, name: str, version: str) -> None:
        await self.manager.stop_model(name, version)
        self.registry.delete_model_version(name, version)

    def _save_model(self, name: str, version: str, model: Any) -> Path:
        """The model as an artifact directory in the state directory (the framework is
        detected: scikit-learn, PyTorch, ONNX, XGBoost, LightGBM, or any Python object)."""
        dest = self.state_dir / "models" / name / version
        if dest.exists():
            shutil.rmtree(dest)  # a deploy that failed earlier left it; this version is new
        return package(model, dest)

    # -- runtime following the registry -------------------------------------------------------
    def _on_change(self, change: Change) -> None:
        if change.kind == "model" and change.op == "add":
            assert change.version is not None
            mv = self.registry.models[change.name][change.version]
            self.schedulers[mv.key] = ModelScheduler(
                mv,
                slo_s=self._slo_for(change.name),
                cache=self.cache,
                clock=self.clock,
                transport=self.rpc,
                metrics=self.metrics,
                queue_capacity=self.config.queue_capacity,
            )
            self.schedulers[mv.key].on_replicas_changed = self._replicas_changed
        elif change.kind == "model" and change.op == "update":
            assert change.version is not None
            sched = self.schedulers.get((change.name, change.version))
            if sched is not None:
                sched.mv = self.registry.models[change.name][change.version]
        elif change.kind == "model" and change.op == "delete":
            assert change.version is not None
            sched = self.schedulers.pop((change.name, change.version), None)
            if sched is not None:
                for r in list(sched.replicas):
                    self.rpc.remove(r)
                sched.close(RegistryError(f"model {change.name}:{change.version} was deleted"))
        elif change.kind in ("link", "app"):
            # Links and SLOs changed: every model's target follows its tightest linked SLO
            # (an unlinked model included). There are few schedulers; recompute them all.
            for (name, _), sched in self.schedulers.items():
                sched.set_slo(self._slo_for(name))

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """A background task this frontend owns: cancelled on stop, failures logged."""

        async def run() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed", what)

        task = asyncio.create_task(run(), name=f"clipper: {what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_update(self, app: Application, models: list[str], payload: bytes, label: Any) -> None:
        """Online learning: the feedback goes on to one replica of each model that answered
        (replicas of a version learn independently; documented)."""
        for model in models:
            sched = self.schedulers.get((model, self.registry.current.get(model, "")))
            replica = next((r for r in sched.replicas if r.fast), None) if sched else None
            if replica is None:
                log.debug("no fast replica of %s takes online updates", model)
                continue
            try:
                self.rpc.send_update(replica, payload, label)
            except ClipperError:
                log.warning("an online update to %s was not sent", model)

    def _persist_state(self, app: str, uid: str, state: dict[str, Any]) -> None:
        if self.sync is not None:
            self.sync.write("state", f"{app}:{uid}", state)

    async def _fetch_state(self, app: str, uid: str) -> Any:
        if self.store is None:
            return None
        return await self.store.get("state", f"{app}:{uid}")

    def _on_remote_change(self, change: Change) -> None:
        """Another frontend changed the shared store: run what it says should run here too."""
        if change.kind in ("model", "replicas") and change.version is not None:
            mv = self.registry.models.get(change.name, {}).get(change.version)
            if mv is not None and mv.artifact is not None:
                self._spawn(self.manager.ensure(mv), f"ensure {mv.name}:{mv.version}")
            elif mv is None:
                self._spawn(
                    self.manager.stop_model(change.name, change.version),
                    f"stop {change.name}:{change.version}",
                )

    def _slo_for(self, model: str) -> float:
        slos = [
            self.registry.apps[a].slo_s
            for a, names in self.registry.links.items()
            if model in names and a in self.registry.apps
        ]
        return min(slos) if slos else _UNLINKED_SLO_S

    def _replicas_changed(self, sched: ModelScheduler) -> None:
        event = self._ready_events.get(sched.mv.key)
        if event is not None:
            event.set()

    def _register_replica(self, meta: wire.NewContainer, identity: bytes) -> Replica | None:
        sched = self.schedulers.get((meta.name, meta.version))
        if sched is None:
            log.debug(
                "container for unknown model %s:%s; asking again later", meta.name, meta.version
            )
            return None
        if meta.input_code != sched.mv.input_type.code:
            log.error(
                "container for %s:%s takes input type %s but the model takes %s (%s); refused",
                meta.name,
                meta.version,
                meta.input_code,
                sched.mv.input_type.code,
                sched.mv.input_type.readable,
            )
            return None
        ids = self._replica_ids.setdefault(sched.mv.key, itertools.count())
        fast = meta.fast
        replica = Replica(
            identity,
            next(ids),
            fast,
            self.config.replica_timeout_s if fast else self.config.v3_replica_timeout_s,
            self.clock.now(),
        )
        token = meta.token
        if token:
            replica.address = token
            self._by_token[token] = replica
        sched.add_replica(replica)
        return replica

    def _replica_removed(self, replica: Replica) -> None:
        if replica.address:
            self._by_token.pop(replica.address, None)
        if replica.scheduler is not None:
            replica.scheduler.remove_replica(replica)

    def _process_exited(self, token: str) -> None:
        # The manager saw the process die: no need to wait for the heartbeat timeout.
        replica = self._by_token.get(token)
        if replica is not None:
            self.rpc.remove(replica)

    async def _drain_token(self, token: str) -> None:
        """Before a replica is stopped on purpose: send it no more batches and let those in
        flight come back (bounded), so a scale-down or version switch loses no query."""
        replica = self._by_token.get(token)
        if replica is None or replica.scheduler is None:
            return
        replica.draining = True
        if replica.in_flight:
            replica.drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(replica.drained.wait(), _DRAIN_TIMEOUT_S)
        self.rpc.remove(replica)


def _input_type(t: str | InputType) -> InputType:
    if isinstance(t, InputType):
        return t
    try:
        return InputType.parse(t)
    except ValueError as e:
        raise RegistryError(str(e)) from None

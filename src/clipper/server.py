"""The composition root: builds a frontend's services, starts them in order, stops them in reverse.

``Clipper`` is the embedded entry point (``async with Clipper(...) as c``); ``clipper start`` runs
the same object. It owns no behaviour of its own: the registry (what is served) is a view of the
config store, kept by :class:`StoreSync`; :class:`Control` is the write side (every change
committed to the store before it is acknowledged); :class:`Reconciler` makes the runtime
(schedulers, replicas) follow the registry; :class:`ReplicaDirectory` matches containers that
dial in to their schedulers; the container manager runs the replicas. The methods below are the
embedded Python API, each a thin call into the write side (:class:`Operations`, whose
pre-checks and artifact placement the admin API shares, or :class:`Control`).

A stop is a drain (:meth:`Clipper.stop`): readiness is withdrawn, the query ports accept no new
connection, every request already read is answered (``drain_timeout_s`` bounds the wait), and
only then does the rest stop in reverse order: the admin port, the replicas (each after its
last batch), the store. See docs/runtime.md, "Stopping: the drain".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import PredictionCache
from clipper.choices import OnModelError, Overload
from clipper.clock import Clock, MonotonicClock, sleep, wait_event
from clipper.config import BatchingConfig, FrontendConfig
from clipper.dashboard import Dashboard
from clipper.errors import ClipperError, RegistryError, ReplicaError
from clipper.frontend.admin import AdminApi
from clipper.frontend.http import HttpLimits, HttpServer
from clipper.frontend.parse_pool import ParsePool
from clipper.frontend.routes import AdminRoutes, QueryRoutes
from clipper.inputs import InputType
from clipper.managers.base import (
    ContainerManager,
    ManagerContext,
    SharedReplicas,
    open_manager,
)
from clipper.metrics import Metrics
from clipper.metrics_window import MetricsWindow
from clipper.persistence import StoreSync
from clipper.query.collector import CollectorPauses
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.runtime import QueryServices, build_query_runtime
from clipper.registry import Application, Change, ModelVersion, Registry
from clipper.rollout import Rollout
from clipper.rpc.artifacts import ArtifactServer
from clipper.rpc.link import Connection
from clipper.rpc.server import RpcServer
from clipper.runtime.artifacts import Artifacts
from clipper.runtime.autoscaler import Autoscaler
from clipper.runtime.catalog import Catalog, SchedulerTable
from clipper.runtime.control import Control
from clipper.runtime.node import NodeIdentity
from clipper.runtime.operations import Operations, parse_input_type
from clipper.runtime.ownership import Ownership
from clipper.runtime.ports import binding
from clipper.runtime.reconciler import Reconciler
from clipper.runtime.replicas import ReplicaDirectory
from clipper.runtime.state_lock import StateLock
from clipper.store.base import Store
from clipper.store.open import open_store
from clipper.tenants import TenantGate
from clipper.tracing import hooks as trace_hooks
from clipper.tracing.context import TraceSettings
from clipper.tracing.tracer import Tracer

if TYPE_CHECKING:
    from clipper.frontend.grpc.native import NativeGrpcServer
    from clipper.frontend.grpc.server import V2GrpcServer

__all__ = ["Clipper"]

log = logging.getLogger("clipper")

# How often a drain looks whether the requests it waits for are answered: stopping only, and a
# notification per answer would cost the query path.
_DRAIN_POLL_S = 0.01


class Clipper:
    """A clipper-serve frontend.

    ::

        async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
            await c.register_application("digits", "doubles", "-1", 20_000)
            await c.deploy_model("logreg", "1", model, input_type="doubles")
            await c.link_model_to_app("digits", "logreg")
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
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if config.state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="clipper-")
            self.state_dir = Path(self._tmp.name)
        else:
            self.state_dir = Path(config.state_dir)
        # This frontend's identity in the store, read from the state directory at start.
        self.node = NodeIdentity(self.state_dir, config.node_id)
        self.registry = Registry()
        self.metrics = Metrics()
        # Recent rates and latencies per application, for the admin status.
        self.metrics_window = MetricsWindow(self.metrics, self.clock)
        self.cache = PredictionCache(config.cache_bytes, config.cache_policy)
        # The read side: the schedulers serving now (the reconciler writes them) and the one
        # reader of "which scheduler serves model M", links and readiness.
        self.schedulers = SchedulerTable()
        self.catalog = Catalog(self.registry, self.schedulers)
        self.store: Store = open_store(config.store, clock=self.clock)
        self.sync = StoreSync(self.registry, self.store, clock=self.clock)
        # How late the event loop runs: the processor sheds what a backlog makes late.
        self.collector = CollectorPauses(self.metrics.gc_pauses)
        collector = self.collector
        self.loop_lag = LoopLagMonitor(self.clock, collector=lambda: collector.total_s)
        monitor = self.loop_lag
        self.metrics.loop_lag.set_function(lambda: monitor.lag_s)
        self.metrics.loop_backlog.set_function(lambda: monitor.backlog_s)
        self.query = build_query_runtime(
            self.catalog, self.cache, clock=self.clock, metrics=self.metrics,
            max_items=config.max_items_per_request, loop_lag=self.loop_lag,
            persist=self._persist_state, fetch=self._fetch_state, on_feedback=self._send_update,
        )  # fmt: skip
        self.processor = self.query.processor
        self.traffic = self.query.traffic
        # The directory and the RPC endpoint call each other: the endpoint is built with the
        # directory, and the directory drops connections through a callback into the endpoint.
        self.directory = ReplicaDirectory(
            self.catalog,
            clock=self.clock,
            replica_timeout_s=config.replica_timeout_s,
            v3_replica_timeout_s=config.v3_replica_timeout_s,
            disconnect=self._hang_up,
        )
        self.artifacts = ArtifactServer(
            artifact_of=self._artifact_of,
            pack_dir=self.state_dir / "artifact-packs",
            on_fetch=lambda m, v: self.metrics.artifact_fetches.labels(model=m, version=v).inc(),
        )
        rpc_keys = (config.rpc_keys_dir or self.state_dir / "rpc-keys") if config.rpc_auth else None
        self.rpc: RpcServer[Replica] = RpcServer(
            host=config.rpc_host,
            port=config.rpc_port,
            clock=self.clock,
            registrar=self.directory.register,
            on_removed=self.directory.removed,
            sink=self.directory,
            artifacts=self.artifacts,
            keys_dir=rpc_keys,
            on_refused=lambda reason: self.metrics.rpc_refused.labels(reason=reason).inc(),
            max_output_bytes=config.max_output_bytes,
            local_socket=config.rpc_local_socket,
        )
        # Who runs the replicas: with sharing on, the one frontend holding the owner lease.
        self.ownership = Ownership(
            self.store,
            node_id=self.node,
            address=self._rpc_address,
            clock=self.clock,
            shared=config.replicas_shared,
            ttl_s=config.owner_lease_ttl_s,
            feed=self.rpc,
            local=lambda: self.rpc.local_address,
        )
        if config.shared_store and config.share_replicas is None and not config.replicas_shared:
            log.warning(
                "replicas are not shared with the other frontends of this store: each frontend "
                "runs its own, because the RPC keys are this state directory's; give every "
                "frontend the deployment's keys (--rpc-keys-dir) to share them "
                "(--no-share-replicas silences this)"
            )
        shared = None
        if config.replicas_shared:
            ownership = self.ownership
            shared = SharedReplicas(
                store=self.store,
                frontends=lambda: ownership.frontends,
                connected=self.directory.connected,
                retire=self._retire,
                # Two replica timeouts: a replica that was connected to the previous owner
                # has dialled this frontend well within it.
                grace_s=2 * config.replica_timeout_s,
            )
        self.manager: ContainerManager = open_manager(
            config.manager,
            ManagerContext(
                rpc_host=self._advertised_host,
                rpc_port=lambda: self.rpc.port,
                rpc_local=lambda: self.rpc.local_address,
                state_dir=self.state_dir,
                clock=self.clock,
                heartbeat_interval_s=config.heartbeat_interval_s,
                python=config.python,
                on_exit=self.directory.process_exited,
                drain=self.directory.drain,
                connected=self.directory.connected,
                nice=config.container_nice,
                log_max_bytes=config.replica_log_bytes,
                rpc_keys=rpc_keys,
                node_id=self.node,
                shared=shared,
                pool_processes=config.pool_processes,
                pool_memory_mb=config.pool_memory_mb,
                replica_starts=config.replica_starts,
                # The autoscaler is built below; a pool reports only once running.
                on_unloaded=lambda name, version, why: self.autoscaler.unloaded(
                    (name, version), why
                ),
            ),
        )
        self.reconciler = Reconciler(
            self.registry,
            self.manager,
            self.schedulers,
            clock=self.clock,
            make_scheduler=self._make_scheduler,
            remove_replicas=self._disconnect,
            on_app_deleted=self._forget_app,
            on_version_deleted=self._forget_version,
            forget_after_s=config.deleted_logs_grace_s,
            acting=not config.replicas_shared,  # until the owner lease says so
        )
        self.control = Control(
            self.registry,
            self.sync,
            self.reconciler,
            self.catalog,
            self.manager,
            node_id=self.node,
            clock=self.clock,
        )
        # Models and uploads: the state directory's, or the deployment's that its workers share.
        artifacts_dir = Path(config.artifacts_dir) if config.artifacts_dir else self.state_dir
        # The management operations' pre-checks and artifact placement, before Control.
        self.operations = Operations(self.control, Artifacts(artifacts_dir))
        self.autoscaler = Autoscaler(
            self.registry,
            self.control,
            self.catalog,
            clock=self.clock,
            metrics_registry=self.metrics.registry,
        )
        # API keys, quotas and classes: the registry's tenants, re-indexed when they change.
        self.tenant_gate = TenantGate(self.registry.tenants, self.clock, self.metrics)
        self.registry.subscribe(self._tenants_changed)
        self.services = QueryServices(
            catalog=self.catalog,
            processor=self.processor,
            metrics=self.metrics,
            clock=self.clock,
            queue_capacity=config.queue_capacity,
            max_items=config.max_items_per_request,
            tenants=self.tenant_gate,
        )
        # Large bodies are counted in these threads, off the event loop.
        self.parse_pool = ParsePool()
        self.http = HttpServer(
            QueryRoutes(self.services, self.parse_pool), host=config.host, port=config.query_port,
            max_body_bytes=config.max_body_bytes,
            limits=HttpLimits.query_port(config), clock=self.clock,
            on_turn=self.loop_lag.turn,  # the socket wait the latency histogram adds
            reuse_port=config.reuse_port,
        )  # fmt: skip
        self.admin = AdminApi(
            registry=self.registry,
            control=self.control,
            catalog=self.catalog,
            operations=self.operations,
            manager=self.manager,
            metrics=self.metrics,
            clock=self.clock,
            state_dir=artifacts_dir,
            max_upload_unpacked_bytes=config.max_upload_unpacked_bytes,
            max_upload_files=config.max_upload_files,
            window=self.metrics_window,
            traffic=self.traffic,
            autoscaler=self.autoscaler,
            owner=self.ownership.describe,
        )
        self.dashboard: Dashboard | None = None
        if config.dashboard_sample_s > 0:
            self.dashboard = Dashboard(
                clock=self.clock, metrics=self.metrics, catalog=self.catalog,
                manager=self.manager, selection=self.query.selection.current,
                interval_s=config.dashboard_sample_s, history_s=config.dashboard_history_s,
                max_clients=config.dashboard_max_clients,
                token_required=config.admin_token is not None, window=self.metrics_window,
                decisions=self.autoscaler.last_decision,
            )  # fmt: skip
        admin_routes = AdminRoutes(self.admin, config.admin_token, self.dashboard)
        self.admin_http = HttpServer(
            admin_routes, host=config.admin_host, port=config.admin_port,
            max_body_bytes=config.max_body_bytes,
            limits=HttpLimits.admin_port(config), clock=self.clock, streaming=True,
            gate=admin_routes.gate,  # the token, checked before a body is read
        )  # fmt: skip
        self.grpc: V2GrpcServer | NativeGrpcServer | None = None
        if config.grpc_port is not None:
            # Imported only when served: grpc is heavy, and containers import this package.
            from clipper.choices import GRPC_TRANSPORTS

            if config.grpc_transport == "native":
                self.grpc = GRPC_TRANSPORTS.load("native")(
                    self.services, host=config.host, port=config.grpc_port,
                    max_message_bytes=config.max_body_bytes, clock=self.clock,
                    max_connections=config.max_connections,
                    preface_timeout_s=config.header_timeout_s,
                    idle_timeout_s=config.grpc_idle_timeout_s,
                    body_timeout_s=config.body_timeout_s,
                    max_buffered_bytes=config.grpc_max_buffered_bytes,
                    reuse_port=config.reuse_port,
                )  # fmt: skip
            else:
                self.grpc = GRPC_TRANSPORTS.load("grpcio")(
                    self.services, host=config.host, port=config.grpc_port
                )
        self._stack: contextlib.AsyncExitStack | None = None
        self._stop_event: asyncio.Event | None = None
        self._drain_cut: asyncio.Event | None = None  # a second signal: answer what is left now

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the store, restore what it says (rolling back version changes this frontend
        left unfinished), start the replicas it asks for, then open the ports. A failure at any
        step undoes the steps before it."""
        if self._stack is not None:
            return
        self._stop_event = asyncio.Event()
        self._drain_cut = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._cleanup_tmp)
            # First up, last down: the spans of the drain are exported too.
            await self._start_tracing(stack)
            # One frontend per state directory (its store, artifacts, logs and node id).
            lock = StateLock(self.state_dir)
            lock.acquire()
            stack.callback(lock.release)
            self.node.resolve()
            await self.store.open()
            stack.push_async_callback(self.store.close)
            await self.artifacts.start()
            with binding("rpc_port", self.config.rpc_port):
                await self.rpc.start()
            stack.push_async_callback(self.artifacts.stop)
            stack.push_async_callback(self.rpc.stop)
            stack.callback(self._close_schedulers)
            await self.sync.start()
            stack.push_async_callback(self.sync.stop)
            await self.control.recover()
            # Undone after the reconciler stops: the owner's last act is the replicas' fate.
            stack.push_async_callback(self._stop_replicas)
            stack.push_async_callback(self.reconciler.stop)
            await self.ownership.start()
            self.reconciler.set_owner(self.ownership.is_owner)
            self.ownership.subscribe(self.reconciler.set_owner)
            self.reconciler.resume()
            self.autoscaler.start()
            stack.push_async_callback(self.autoscaler.stop)
            self.collector.start()
            stack.callback(self.collector.stop)
            self.loop_lag.start()
            stack.callback(self.loop_lag.stop)
            self.metrics_window.start()
            stack.callback(self.metrics_window.stop)
            self.parse_pool.start()  # stopped after the query port (a drain counts on it)
            stack.push_async_callback(self.parse_pool.stop)
            with binding("query_port", self.config.query_port):
                await self.http.start()
            stack.push_async_callback(self.http.stop)
            with binding("admin_port", self.config.admin_port):
                await self.admin_http.start()
            stack.push_async_callback(self.admin_http.stop)
            if self.dashboard is not None:
                # Stopped before the admin port: its streams are cut at once, not flushed to a
                # client that may have stopped reading.
                self.dashboard.start()
                stack.push_async_callback(self.dashboard.stop)
            if self.grpc is not None:
                with binding("grpc_port", self.config.grpc_port or 0):
                    await self.grpc.start()
                stack.push_async_callback(self.grpc.stop)
            stack.push_async_callback(self.query.selection.stop)
            # First to run once the query ports are drained (stop() drains them before this
            # stack unwinds): admin operations under way are cancelled (and roll back) while
            # the store and the runtime are still there. The admin port itself answers until
            # the drain is over (operators watch it), and closes after this.
            stack.push_async_callback(self.admin.stop)
            lock.describe(
                query_port=self.http.port,
                admin_port=self.admin_http.port,
                rpc_port=self.rpc.port,
                grpc_port=self.grpc.port if self.grpc is not None else None,
            )
            self._stack = stack.pop_all()
        log.info(
            "query API on http://%s:%s, RPC on %s",
            self.config.host,
            self.http.port,
            self.rpc.address,
        )
        if self.dashboard is not None:
            log.info("dashboard on %s/dashboard", self.admin_url)

    async def _start_tracing(self, stack: contextlib.AsyncExitStack) -> None:
        """OpenTelemetry traces when the ``OTEL_*`` variables ask for them (docs/tracing.md):
        the tracer's export thread starts now and is shut down (flushed) off the loop at
        stop."""
        settings = TraceSettings.from_env(os.environ, ratio=self.config.trace_ratio)
        if not settings.enabled:
            return
        tracer = Tracer(settings, self.clock)
        tracer.start()
        trace_hooks.activate(tracer)

        async def stop_tracing() -> None:
            trace_hooks.deactivate(tracer)
            await asyncio.to_thread(tracer.stop)

        stack.push_async_callback(stop_tracing)
        log.info(
            "traces: %s export, sampler %s (ratio %g), service %s",
            settings.exporter,
            settings.sampler,
            settings.ratio,
            settings.service_name,
        )

    async def stop(self) -> None:
        """Drain, then stop: readiness is withdrawn (``/ready``, ``/v2/health/ready`` and gRPC
        ``ServerReady`` answer not ready, reason "draining"), the query and gRPC ports accept
        no new connection (keep-alive connections are told ``Connection: close`` with their
        next answer, HTTP/2 ones get a GOAWAY), and every request already read is answered: a
        prediction, or the default output at its deadline. What is still unanswered after
        ``drain_timeout_s`` is answered 503 (gRPC UNAVAILABLE). Then everything stops in the
        reverse of the order it started: the admin port, the replicas after their last
        batches, the store."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            try:
                await self._drain()
            finally:
                await stack.aclose()
        finally:
            if self._stop_event is not None:
                self._stop_event.set()

    async def _drain(self) -> None:
        timeout = self.config.drain_timeout_s
        self.catalog.withdraw(
            "draining: the frontend is stopping; it answers the requests it holds (for up to "
            f"{timeout:g} s, drain_timeout_s) and "
            + (
                f"accepts new connections for {self.config.drain_delay_s:g} s more only"
                if self.config.drain_delay_s > 0
                else "accepts no new connection"
            )
        )
        ports: list[HttpServer | V2GrpcServer | NativeGrpcServer] = [self.http]
        if self.grpc is not None:
            ports.append(self.grpc)
        cut = self._drain_cut
        delay = self.config.drain_delay_s
        if delay > 0 and not (cut is not None and cut.is_set()):
            # Not ready, still serving: new connections are accepted and answered until the
            # balancers in front have seen the readiness go (a second signal ends this too).
            log.info("draining: not ready; accepting connections for %g s more", delay)
            if cut is not None:
                await wait_event(self.clock, cut, delay)
            else:
                await sleep(self.clock, delay)
        for port in ports:
            port.begin_drain()
        owed = sum(p.owed() for p in ports)
        if not owed:
            return
        log.info("draining: %d requests in flight; waiting up to %g s for them", owed, timeout)
        t0 = self.clock.now()
        deadline = t0 + timeout
        while owed and self.clock.now() < deadline and not (cut is not None and cut.is_set()):
            await sleep(self.clock, _DRAIN_POLL_S)
            owed = sum(p.owed() for p in ports)
        if not owed:
            log.info("drained in %.2f s", self.clock.now() - t0)
            return
        why = "a second signal" if cut is not None and cut.is_set() else f"{timeout:g} s passed"
        cause = (
            f"the frontend stopped before this request was answered (its drain ended: {why}, "
            "drain_timeout_s): retry it on another frontend"
        )
        left = sum(p.abandon(cause) for p in ports)
        log.warning("the drain ended (%s) with %d requests unanswered: answered 503", why, left)

    async def __aenter__(self) -> Clipper:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def freeze_heap(self) -> None:
        """Take everything alive now (frameworks, trained models, the registry: it lives as
        long as the process) out of the cyclic collector, whose full passes over a process with
        scikit-learn or torch loaded stall the event loop for tens of milliseconds. The
        collection before the freeze is such a pass (15-30 ms): a process that serves calls
        this before it says it is ready, so the first queries do not wait for it.
        :meth:`serve_forever` calls it too (cheap the second time: only what is new)."""
        gc.collect()
        gc.freeze()

    async def serve_forever(self) -> None:
        """Serve until SIGINT/SIGTERM (or :meth:`stop`), then stop cleanly: a drain (see
        :meth:`stop`); a second signal during the drain ends it at once (what is left is
        answered 503) and the stop goes on."""
        assert self._stop_event is not None, "start() first"
        stop_event, cut = self._stop_event, self._drain_cut
        self.freeze_heap()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []

        def on_signal() -> None:
            if not stop_event.is_set():
                stop_event.set()
            elif cut is not None:
                cut.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)
                installed.append(sig)
        try:
            await stop_event.wait()
        finally:
            try:
                stop_event.set()  # a stop() that did not come from a signal
                await self.stop()
            finally:
                for sig in installed:
                    loop.remove_signal_handler(sig)

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

    # -- the embedded API: each call returns once its change is stored ------------------------
    async def register_application(
        self,
        name: str,
        input_type: str | InputType,
        default_output: str,
        latency_slo_micros: int,
        *,
        cache: bool = True,
        overload: Overload = "default",
        on_model_error: OnModelError = "auto",
        policy: str = "single",
        policy_params: dict[str, Any] | None = None,
        min_confidence: float = 0.0,
        loss: str = "0/1",
        loss_scale: float = 1.0,
        online_learning: bool = False,
        pipeline: dict[str, Any] | None = None,
    ) -> Application:
        """An application: its input type, latency SLO and default output; with a selection
        ``policy`` other than ``single`` it may link several models (see docs/selection.md);
        with a ``pipeline`` its answer comes from stages of models (docs/pipelines.md)."""
        app = Application(
            name=name,
            input_type=parse_input_type(input_type),
            default_output=default_output,
            latency_slo_micros=latency_slo_micros,
            cache=cache,
            overload=overload,
            on_model_error=on_model_error,
            policy=policy,
            policy_params=dict(policy_params or {}),
            min_confidence=min_confidence,
            loss=loss,
            loss_scale=loss_scale,
            online_learning=online_learning,
            pipeline=pipeline,
        )
        return await self.control.add_app(app)

    async def update_application(self, name: str, **changes: Any) -> Application:
        return await self.control.update_app(name, **changes)

    async def set_pipeline(self, name: str, pipeline: dict[str, Any] | None) -> Application:
        """Describe an application's stages (None: a plain application again); checked before
        anything changes (docs/pipelines.md)."""
        return await self.control.update_app(name, pipeline=pipeline)

    async def delete_application(self, name: str) -> None:
        await self.control.delete_app(name)

    async def link_model_to_app(self, app_name: str, model_name: str) -> None:
        await self.operations.link(app_name, [model_name])

    async def unlink_model_from_app(self, app_name: str, model_name: str) -> None:
        await self.operations.unlink(app_name, [model_name])

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
        await self.operations.set_version(
            name, version, ready_timeout_s=ready_timeout_s, retire_previous=retire_previous
        )

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
        pooled: bool = False,
    ) -> ModelVersion:
        """Run ``model`` (a function, or an object with ``predict(inputs)``) in
        ``num_replicas`` container processes. With ``wait`` it returns once they are all
        connected; traffic switches to this version only then (when ``set_current``). A
        deploy that fails is undone; repeating one that succeeded (same artifact and
        settings) is a no-op. ``pooled``: its one replica is loaded into a pool process
        (``pool_processes``; docs/density.md)."""
        if (model is None) == (artifact is None):
            raise ClipperError("deploy_model needs exactly one of model= or artifact=")
        mv = ModelVersion(
            name=name,
            version=version,
            input_type=parse_input_type(input_type),
            labels=tuple(labels),
            artifact=None if artifact is None else str(artifact),
            batching=batching or BatchingConfig(),
            num_replicas=num_replicas,
            pooled=pooled,
        )
        if artifact is None:
            return await self.operations.deploy_object(
                mv, model, set_current=set_current, retire_previous=retire_previous, wait=wait,
                ready_timeout_s=ready_timeout_s,
            )  # fmt: skip
        return await self.operations.deploy(
            mv, set_current=set_current, retire_previous=retire_previous, wait=wait,
            ready_timeout_s=ready_timeout_s,
        )  # fmt: skip

    async def set_traffic_split(
        self,
        name: str,
        weights: Mapping[str, float] | None,
        *,
        sticky: bool = False,
        ready_timeout_s: float = 60.0,
    ) -> Rollout | None:
        """Split ``name``'s unpinned queries between versions by weight (``{"1": 95, "2": 5}``;
        None or ``{}`` removes the split: the current version answers them all again). With
        ``sticky``, a query's ``uid`` always goes to the same version. Returns once every
        version named has its replicas connected (docs/rollouts.md)."""
        return await self.operations.set_split(
            name, weights, sticky=sticky, ready_timeout_s=ready_timeout_s
        )

    async def set_shadow(
        self,
        name: str,
        version: str | None,
        share: float = 1.0,
        *,
        ready_timeout_s: float = 60.0,
    ) -> Rollout | None:
        """Copy a ``share`` (0 to 1) of ``name``'s queries to ``version``, whose answers are
        only compared with the real ones (``version`` None: no shadow)."""
        return await self.operations.set_shadow(
            name, version, share, ready_timeout_s=ready_timeout_s
        )

    def traffic_of(self, name: str) -> dict[str, Any]:
        """The model's split and shadow, and what they did on this frontend (the admin API's
        ``get_traffic``)."""
        return self.traffic.describe(self.operations.require_model(name))

    async def set_num_replicas(
        self,
        name: str,
        num_replicas: int,
        version: str | None = None,
        *,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> None:
        await self.control.scale(
            name, num_replicas, version, wait=wait, ready_timeout_s=ready_timeout_s
        )

    async def set_autoscale(
        self, name: str, version: str | None = None, **settings: Any
    ) -> ModelVersion:
        """Scale a version's replicas to its SLO between ``min_replicas`` and ``max_replicas``
        (settings not given keep their values; ``enabled=False`` stops it); this frontend
        drives it. See docs/autoscaling.md."""
        return await self.operations.set_autoscale(name, version, settings)

    async def wait_for_replicas(
        self, name: str, version: str, n: int, *, ready_timeout_s: float = 60.0
    ) -> None:
        await self.control.wait_for_replicas(name, version, n, ready_timeout_s=ready_timeout_s)

    async def stop_model(self, name: str, version: str) -> None:
        """Delete a version: its replicas drain and stop, then it is gone."""
        await self.operations.delete_version(name, version)

    # -- wiring --------------------------------------------------------------------------------
    def _make_scheduler(self, mv: ModelVersion, slo_s: float) -> ModelScheduler:
        sched = ModelScheduler(
            mv,
            slo_s=slo_s,
            cache=self.cache,
            clock=self.clock,
            transport=self.rpc,
            metrics=self.metrics,
            queue_capacity=self.config.queue_capacity,
            on_replicas_changed=self._replicas_changed,
        )
        return sched

    def _replicas_changed(self, sched: ModelScheduler) -> None:
        self.control.replicas_changed(sched)
        if self.dashboard is not None:
            self.dashboard.replicas_changed()

    def _disconnect(self, sched: ModelScheduler) -> None:
        for replica in list(sched.replicas):
            self.rpc.remove(replica.link)

    def _hang_up(self, link: Connection[Replica]) -> None:
        """Drop one connection (the replica directory's callback into the RPC endpoint)."""
        self.rpc.remove(link)

    def _close_schedulers(self) -> None:
        for sched in self.schedulers.values():
            sched.close(ReplicaError("the frontend is shutting down"))

    def _tenants_changed(self, change: Change) -> None:
        if change.kind == "tenant":
            self.tenant_gate.changed()

    def _forget_app(self, name: str) -> None:
        self.processor.forget_app(name)

    def _forget_version(self, name: str, version: str) -> None:
        self.processor.forget_version(name, version)
        self.artifacts.forget(name, version)

    async def _stop_replicas(self) -> None:
        """Unshared, this frontend's replicas stop with it. Shared: a frontend that does not
        own them leaves them alone; the owner hands them (and its lease) to the frontends that
        remain, and only the last one stops them."""
        own = self.ownership
        if not own.shared:
            await self.manager.stop_all()
            return
        await own.stop()
        await own.withdraw()
        detach: Callable[[], None] | None = getattr(self.manager, "detach", None)
        if own.is_owner and not await own.others():
            log.info("the last frontend of the deployment: stopping the shared replicas")
            await self.manager.stop_all()
        elif own.is_owner:
            log.info("leaving the shared replicas and the owner lease to the other frontends")
            if detach is not None:
                detach()
        await own.release()

    def _retire(self, token: str) -> bool:
        """RETIRE to the replica with ``token`` (a shared one, stopped by the owner), where
        the RPC endpoint speaks it."""
        retire: Callable[[str], bool] | None = getattr(self.rpc, "retire", None)
        return bool(retire(token)) if retire is not None else False

    def _rpc_address(self) -> str:
        """What replicas dial to reach this frontend (announced to the other frontends)."""
        return f"tcp://{self._advertised_host()}:{self.rpc.port}"

    def _advertised_host(self) -> str:
        """The address containers dial: --advertise-host, else the RPC bind address."""
        if self.config.advertise_host:
            return self.config.advertise_host
        return self.config.rpc_host if self.config.rpc_host not in ("0.0.0.0", "") else "127.0.0.1"

    def _artifact_of(self, name: str, version: str) -> str | None:
        """A version's artifact path, for the containers that fetch it (artifacts.py)."""
        try:
            return self.registry.get_model(name, version).artifact
        except RegistryError:
            return None

    def _cleanup_tmp(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _send_update(self, app: Application, models: list[str], payload: bytes, label: Any) -> None:
        """Online learning: the feedback goes on to one replica of each model that answered
        (replicas of a version learn independently; documented)."""
        for model in models:
            sched = self.catalog.scheduler(model)
            replica = next((r for r in sched.replicas if r.fast), None) if sched else None
            if sched is None or replica is None:
                log.debug("no fast replica of %s takes online updates", model)
                continue
            try:
                self.rpc.send_update(replica.link, sched.mv.input_type, payload, label)
            except ClipperError:
                log.warning("an online update to %s was not sent", model)

    def _persist_state(self, app: str, uid: str, state: dict[str, Any]) -> None:
        self.sync.write_state(f"{app}:{uid}", state)

    async def _fetch_state(self, app: str, uid: str) -> Any:
        return await self.store.get("state", f"{app}:{uid}")

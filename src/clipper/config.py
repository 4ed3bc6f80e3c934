"""Typed settings, validated when built; each CLI flag maps to a field and a CLIPPER_* env var."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from clipper.choices import (
    CACHE_POLICIES,
    CONTROLLERS,
    GRPC_TRANSPORTS,
    MANAGERS,
    STORES,
    WAITS,
    CachePolicy,
    Choice,
    Controller,
    GrpcTransport,
    WaitName,
)
from clipper.errors import ConfigError

__all__ = ["SAME", "BatchingConfig", "Controller", "FrontendConfig", "cli"]

SAME: Final[object] = object()
"""The :func:`cli` ``default`` of a field whose command-line default is its embedded default."""

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# More processes than this on one machine is a mistake (a typo), not a deployment.
_MAX_WORKERS = 256
_MAX_POOL_PROCESSES = 256


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How each replica of a model version forms batches.

    ``controller`` sizes batches (``aimd``: the paper's additive-increase/multiplicative-decrease;
    ``quantile``: P99 regression of batch latency on size; ``fixed``: ``max_batch_size`` always).
    The controllers aim a batch's latency at ``target_fraction`` of the tightest SLO of the apps the
    model serves: a query waits for at most about one batch in the queue and then rides one, so
    half the SLO keeps the two together inside it.
    ``max_wait_micros`` is delayed batching: how long a partial batch may wait to fill (never past
    the point where its earliest query would miss its deadline). ``wait`` says when that wait
    is spent: ``adaptive`` (the default) only while recent waits actually grew batches, so a
    lone closed-loop client pays nothing; ``fixed`` always, as in the paper.
    """

    controller: Controller = "aimd"
    max_batch_size: int | None = None
    max_wait_micros: int = 1000
    in_flight: int = 1
    target_fraction: float = 0.5
    params: dict[str, Any] = field(default_factory=dict)
    wait: WaitName = "adaptive"

    def __post_init__(self) -> None:
        CONTROLLERS.check(self.controller)
        WAITS.check(self.wait)
        if self.controller == "fixed" and self.max_batch_size is None:
            raise ConfigError("the fixed controller needs max_batch_size (an integer >= 1)")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not 0 <= self.max_wait_micros <= 1_000_000:
            raise ConfigError(
                f"max_wait_micros must be between 0 and 1000000, got {self.max_wait_micros}"
            )
        if self.in_flight < 1:
            raise ConfigError(f"in_flight must be >= 1, got {self.in_flight}")
        if not 0 < self.target_fraction <= 1:
            raise ConfigError(f"target_fraction must be in (0, 1], got {self.target_fraction}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "max_batch_size": self.max_batch_size,
            "max_wait_micros": self.max_wait_micros,
            "in_flight": self.in_flight,
            "target_fraction": self.target_fraction,
            "params": dict(self.params),
            "wait": self.wait,
        }


def cli(help: str = "", *, default: object = SAME, choice: Choice | None = None) -> dict[str, Any]:
    """The metadata of a :class:`FrontendConfig` field for its ``clipper start`` flag.

    ``help`` is the flag's help line; ``default`` replaces the field's default on the command line
    (a callable is called when the parser is built; ``None`` where the command derives the value);
    ``choice`` gives the options and their help for a ``Literal`` field.
    """
    return {"help": help, "cli_default": default, "choice": choice}


def _cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _home_state_dir() -> str:
    return str(Path.home() / ".clipper")


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """The frontend process: ports, limits, cache, liveness.

    ``clipper start`` has a ``--flag`` and a ``CLIPPER_*`` variable for every field, generated
    from the fields (see :func:`clipper.cli.add_config_options`): a new field needs no CLI code;
    its help line (optional) goes in :func:`cli` metadata.
    """

    host: str = field(default="127.0.0.1", metadata=cli("query API address"))
    # Embedded frontends (tests, notebooks) bind free ports unless told otherwise, so they run
    # beside a `clipper start` on the well-known ports; the command line keeps those.
    query_port: int = field(default=0, metadata=cli("query API port", default=1337))
    rpc_host: str = field(default="127.0.0.1", metadata=cli("container RPC address"))
    rpc_port: int = field(default=0, metadata=cli("container RPC port", default=7000))
    # What containers are told to dial: differs from rpc_host when they run on other hosts
    # (rpc_host 0.0.0.0, or behind NAT/DNS). None: rpc_host (127.0.0.1 for 0.0.0.0).
    advertise_host: str | None = field(
        default=None,
        metadata=cli(
            "address (name or IP) containers dial to reach the RPC port (default: --rpc-host)"
        ),
    )
    # Containers prove they were started by this deployment (ZeroMQ CURVE keys, made in
    # rpc_keys_dir on the first start); off only for containers that cannot do CURVE (the
    # original rpc.py), and then the RPC port must stay on loopback.
    rpc_auth: bool = field(
        default=True,
        metadata=cli(
            "containers must hold this deployment's CURVE keys (--no-rpc-auth: anyone local "
            "may connect, for the original rpc.py; loopback --rpc-host only)"
        ),
    )
    rpc_keys_dir: Path | None = field(
        default=None,
        metadata=cli("the RPC port's CURVE keys (default: <state dir>/rpc-keys)"),
    )
    # Containers the local manager starts dial a Unix socket that only this user can open,
    # without CURVE's per-message encryption (docs/containers.md); others use the TCP port.
    rpc_local_socket: bool = field(
        default=True,
        metadata=cli(
            "local containers dial a private Unix socket, unencrypted (--no-rpc-local-socket: "
            "the TCP port with CURVE, like every other container)"
        ),
    )
    max_body_bytes: int = field(default=10 * 2**20, metadata=cli("larger request bodies get 413"))
    # One request's parse and enqueue holds the event loop ~4 us per item on the reference
    # machine (benchmarks/request_size.py): 1,000 items ~4 ms, well under a 20 ms SLO;
    # 100,000 held it 0.7 s and every other client with it.
    max_items_per_request: int = field(
        default=1000,
        metadata=cli("more input_batch items (or V2 batch rows) in one request get 413"),
    )
    # One output is one input's answer: a megabyte is far more than any classifier or embedding
    # returns, and bounds what a bug or a hostile input makes a model fill the cache with.
    max_output_bytes: int = field(
        default=2**20,
        metadata=cli("a model output over this many bytes (JSON) is that input's model error"),
    )
    # Connection hygiene, as nginx's and uvicorn's defaults (docs/query-api.md, "Limits").
    max_header_bytes: int = field(
        default=32 * 1024, metadata=cli("request line and headers over this many bytes get 431")
    )
    max_header_line_bytes: int = field(
        default=8 * 1024, metadata=cli("a request line (414) or header line (431) over this")
    )
    max_connections: int = field(
        default=10_000,
        metadata=cli("query port connections; beyond them (and the health reserve): 503, close"),
    )
    health_reserve_connections: int = field(
        default=32,
        metadata=cli("query port connections beyond max_connections that serve only health"),
    )
    admin_max_connections: int = field(
        default=64, metadata=cli("admin port connections; beyond them: 503 and close")
    )
    # With an admin token, anyone can still connect: this many admin slots are kept for
    # connections whose first request carries the token, so strangers cannot fill them all.
    admin_reserve_connections: int = field(
        default=8,
        metadata=cli("admin port connections kept for requests with the admin token"),
    )
    header_timeout_s: float = field(
        default=10.0, metadata=cli("seconds to send a request's headers (slowloris): 408, close")
    )
    body_timeout_s: float = field(
        default=30.0, metadata=cli("seconds to send a request's body once its headers are in")
    )
    keepalive_timeout_s: float = field(
        default=30.0, metadata=cli("seconds an idle keep-alive connection stays open")
    )
    # gRPC clients hold one connection for many calls and reconnect after a GOAWAY by
    # themselves: a longer idle limit than HTTP/1.1 keep-alive.
    grpc_idle_timeout_s: float = field(
        default=300.0,
        metadata=cli("seconds a gRPC connection with no call open stays open (native transport)"),
    )
    # Request bodies the native gRPC transport holds for all connections together (each
    # connection holds at most its 16 MiB window); docs/security.md, "HTTP/2 (the gRPC port)".
    grpc_max_buffered_bytes: int = field(
        default=128 * 2**20,
        metadata=cli(
            "gRPC request bytes buffered over all connections; beyond: RESOURCE_EXHAUSTED"
        ),
    )
    # A stop (SIGTERM, `clipper stop`, Clipper.stop()) is a drain: readiness withdrawn, no new
    # connection accepted, every request already read answered, then the ports close. This
    # bounds it: what is still unanswered then gets 503 (gRPC UNAVAILABLE). Kubernetes' default
    # grace period is 30 s; docs/runtime.md, "Stopping: the drain".
    drain_timeout_s: float = field(
        default=20.0,
        metadata=cli("seconds a stop waits for the requests in flight before answering them 503"),
    )
    # Between readiness withdrawn and the listening sockets closed: load balancers and
    # Kubernetes endpoints notice a not-ready backend only at their next probe or watch event,
    # and go on sending new connections until then; refused, those are errors.
    drain_delay_s: float = field(
        default=0.0,
        metadata=cli(
            "seconds a stop keeps accepting connections after withdrawing readiness (let load "
            "balancers take this frontend out first)"
        ),
    )
    cache_bytes: int = field(
        default=32 * 2**20, metadata=cli("prediction cache size; 0 disables storing")
    )
    cache_policy: CachePolicy = field(default="clock", metadata=cli(choice=CACHE_POLICIES))
    queue_capacity: int = field(default=50_000, metadata=cli("queued queries per model version"))
    # Our containers heartbeat every heartbeat_interval_s even while predicting; the original
    # rpc.py only heartbeats when idle every 5 s, so it gets the original's 30 s.
    heartbeat_interval_s: float = field(
        default=0.5, metadata=cli("seconds between heartbeats to containers")
    )
    replica_timeout_s: float = field(
        default=3.0, metadata=cli("seconds of silence after which a replica is gone")
    )
    v3_replica_timeout_s: float = field(
        default=30.0,
        metadata=cli("the same for original (v3) containers, which heartbeat only when idle"),
    )
    state_dir: Path | None = field(
        default=None, metadata=cli("models, logs and the sqlite store", default=_home_state_dir)
    )
    # Where applications, models, links and replica counts live: "memory://" (gone with the
    # process), "sqlite:///dir-or-file" (the CLI's default, in the state directory) or
    # "redis://host:port/db" (shared by several frontends).
    store: str = field(
        default="memory://",
        metadata=cli(
            f"config store (default: sqlite in the state directory): {STORES.help()}",
            default=None,
        ),
    )
    # Who runs model replicas (managers/base.py MANAGERS): child processes of this frontend,
    # or containers started by someone else that dial in to the RPC port.
    manager: str = field(
        default="local://",
        metadata=cli(f"container manager: {MANAGERS.help()}"),
    )
    # This frontend's identity in the store: which unfinished version changes are its own to
    # roll back at start-up. By default made once and kept in the state directory.
    node_id: str | None = field(
        default=None,
        metadata=cli("this frontend's id in a shared store (default: kept in the state dir)"),
    )
    # Shared replicas (docs/scale-out.md): a model version's replicas serve every frontend of
    # the deployment and one frontend, the holder of the owner lease, runs them. None: on for a
    # shared store (redis) whose frontends hold one key pair (--rpc-keys-dir) and for several
    # worker processes, off otherwise (a frontend's replicas are its children and die with it).
    share_replicas: bool | None = field(
        default=None,
        metadata=cli(
            "replicas serve every frontend; one frontend (the owner lease's holder) runs them "
            "(default: on for a redis store with --rpc-keys-dir, or --workers > 1)"
        ),
    )
    # How long the owner's lease lasts unrenewed (renewed every third of it): how soon another
    # frontend takes over the replicas of an owner that died, against how long a stalled or
    # cut-off owner may stay owner.
    owner_lease_ttl_s: float = field(
        default=5.0, metadata=cli("seconds the replica owner's lease lasts unrenewed")
    )
    python: str | None = field(
        default=None, metadata=cli("interpreter that runs model containers (default: ours)")
    )
    # Containers run this much below the frontend's CPU priority (0: the same). Every query
    # needs both the event loop and its model's container: beside another program on the same
    # core, a niced container (nice 5 weighs a third of nice 0) gets the smallest share, and
    # its batches, not the loop, miss the deadlines (docs/containers.md).
    container_nice: int = field(
        default=0, metadata=cli("containers run this much nicer than the frontend")
    )
    # Many models per process (docs/density.md): the local manager's pool processes, each
    # holding the models deployed with pooled: true within its memory budget, LRU first out.
    pool_processes: int = field(
        default=0, metadata=cli("pool processes for pooled models (local manager; 0: none)")
    )
    pool_memory_mb: int = field(
        default=512, metadata=cli("memory budget of each pool process's models, in MB")
    )
    # A start storm (a restart with many versions, many woken from zero) on a few cores
    # connects none of them for as long as all of them take: the local manager starts this
    # many replica processes at a time, each until it connects (at most 10 s), in order.
    replica_starts: int = field(
        default_factory=_cores,
        metadata=cli("replica processes the local manager starts at once (0: no limit)"),
    )
    # The admin API changes what is served: loopback only, unless a bearer token guards it.
    admin_host: str = field(
        default="127.0.0.1",
        metadata=cli("admin API address; beyond loopback it needs --admin-token"),
    )
    admin_port: int = field(default=0, metadata=cli("admin API port", default=1338))
    # Replica logs: rotated by size (one previous file kept), and removed this long after
    # their version is deleted (long enough to read why it failed).
    replica_log_bytes: int = field(
        default=10 * 2**20, metadata=cli("a replica's log rotates past this size")
    )
    deleted_logs_grace_s: float = field(
        default=300.0, metadata=cli("a deleted version's replica logs are removed after this")
    )
    # An uploaded model archive is unpacked on this machine: bounded so that a small gzip
    # cannot fill the disk (the body itself is bounded by max_body_bytes).
    max_upload_unpacked_bytes: int = field(
        default=2 * 2**30, metadata=cli("an upload_model archive may unpack to this many bytes")
    )
    max_upload_files: int = field(
        default=10_000, metadata=cli("an upload_model archive may hold this many entries")
    )
    admin_token: str | None = field(
        default=None, metadata=cli("bearer token the admin API requires")
    )
    # The Open Inference Protocol's gRPC service; None = off (the embedded default, so tests and
    # notebooks bind nothing extra; `clipper start` serves it on 8001).
    grpc_port: int | None = field(
        default=None,
        metadata=cli("Open Inference Protocol gRPC port; -1 turns it off", default=8001),
    )
    # What serves that port: our own HTTP/2 on the event loop, or grpc.aio (whose thread hand-off
    # per call capped V2 gRPC at a fraction of V2 REST; docs/benchmarks.md).
    grpc_transport: GrpcTransport = field(default="native", metadata=cli(choice=GRPC_TRANSPORTS))
    # The live dashboard on the admin port (docs/dashboard.md): one sample of every plotted
    # series per interval, the last history_s seconds of them kept; 0 turns it off.
    dashboard_sample_s: float = field(
        default=1.0, metadata=cli("dashboard sample interval in seconds; 0 turns it off")
    )
    dashboard_history_s: float = field(
        default=300.0, metadata=cli("seconds of samples the dashboard keeps and plots")
    )
    dashboard_max_clients: int = field(
        default=8, metadata=cli("live dashboard streams at once; beyond them: 503")
    )

    # `clipper start --workers N` (docs/workers.md): a supervisor runs N frontend processes on
    # this machine that share the query and gRPC ports (SO_REUSEPORT), the store and the
    # artifacts; an embedded Clipper is always one process and only reads this.
    workers: int = field(
        default=1,
        metadata=cli(
            "frontend worker processes on this machine sharing the query port, the store and "
            "the models (1: this process serves)"
        ),
    )
    reuse_port: bool = field(
        default=False,
        metadata=cli(
            "bind the query and gRPC ports with SO_REUSEPORT, so that several frontend "
            "processes of this user share them (set for each worker by --workers)"
        ),
    )
    artifacts_dir: Path | None = field(
        default=None,
        metadata=cli("where models and uploads are placed (default: the state directory)"),
    )
    # Traces (docs/tracing.md) are on when the OTEL_* variables name an exporter or an OTLP
    # endpoint; this only sets the sampling ratio, overriding OTEL_TRACES_SAMPLER_ARG.
    trace_ratio: float | None = field(
        default=None,
        metadata=cli(
            "share of requests (0-1) that start a trace when they carry no sampled "
            "traceparent (default: OTEL_TRACES_SAMPLER_ARG, else 1); tracing itself is "
            "turned on by OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT"
        ),
    )

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= _MAX_WORKERS:
            raise ConfigError(f"workers must be between 1 and {_MAX_WORKERS}, got {self.workers}")
        if self.admin_host not in _LOOPBACK and not self.admin_token:
            raise ConfigError(
                f"the admin API is bound to {self.admin_host!r}, beyond this machine: "
                "set an admin token (--admin-token or CLIPPER_ADMIN_TOKEN) or bind it to "
                "127.0.0.1"
            )
        if not self.rpc_auth and self.rpc_host not in _LOOPBACK:
            raise ConfigError(
                f"the container RPC port is bound to {self.rpc_host!r}, beyond this machine, "
                "without authentication (rpc_auth off): any host could answer for a model. "
                "Turn rpc_auth on (drop --no-rpc-auth / CLIPPER_RPC_AUTH=0; containers then "
                "need --rpc-keys) or bind --rpc-host to 127.0.0.1"
            )
        for name in ("query_port", "rpc_port", "admin_port", "grpc_port"):
            port = getattr(self, name)
            if port is None:
                continue
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {port}")
        if self.max_body_bytes < 64:
            raise ConfigError(f"max_body_bytes must be >= 64, got {self.max_body_bytes}")
        if self.trace_ratio is not None and not 0.0 <= self.trace_ratio <= 1.0:
            raise ConfigError(f"trace_ratio must be between 0 and 1, got {self.trace_ratio}")
        for name in (
            "max_items_per_request", "max_header_bytes", "max_header_line_bytes",
            "max_connections", "admin_max_connections", "max_output_bytes",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.grpc_max_buffered_bytes < self.max_body_bytes:
            raise ConfigError(
                "grpc_max_buffered_bytes must hold at least one request (max_body_bytes "
                f"{self.max_body_bytes}), got {self.grpc_max_buffered_bytes}"
            )
        if self.max_header_line_bytes > self.max_header_bytes:
            raise ConfigError("max_header_line_bytes must not exceed max_header_bytes")
        if self.admin_reserve_connections < 0:
            raise ConfigError(
                f"admin_reserve_connections must be >= 0, got {self.admin_reserve_connections}"
            )
        if self.health_reserve_connections < 0:
            raise ConfigError(
                f"health_reserve_connections must be >= 0, got {self.health_reserve_connections}"
            )
        for name in (
            "header_timeout_s", "body_timeout_s", "keepalive_timeout_s", "grpc_idle_timeout_s",
        ):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if not self.drain_timeout_s >= 0:
            raise ConfigError(f"drain_timeout_s must be >= 0 seconds, got {self.drain_timeout_s}")
        if not self.drain_delay_s >= 0:
            raise ConfigError(f"drain_delay_s must be >= 0 seconds, got {self.drain_delay_s}")
        if self.dashboard_sample_s < 0 or self.dashboard_max_clients < 1:
            raise ConfigError("dashboard_sample_s must be >= 0 and dashboard_max_clients >= 1")
        if self.dashboard_sample_s and self.dashboard_history_s < 2 * self.dashboard_sample_s:
            raise ConfigError(
                "dashboard_history_s must hold at least two samples (2 x dashboard_sample_s), "
                f"got {self.dashboard_history_s}"
            )
        if self.replica_log_bytes < 1024 or self.deleted_logs_grace_s < 0:
            raise ConfigError("replica_log_bytes must be >= 1024 and deleted_logs_grace_s >= 0")
        if self.max_upload_unpacked_bytes < 1 or self.max_upload_files < 1:
            raise ConfigError("max_upload_unpacked_bytes and max_upload_files must be >= 1")
        if not 0 <= self.pool_processes <= _MAX_POOL_PROCESSES:
            raise ConfigError(
                f"pool_processes must be between 0 and {_MAX_POOL_PROCESSES}, got "
                f"{self.pool_processes}"
            )
        if self.replica_starts < 0:
            raise ConfigError(
                f"replica_starts must be >= 0 (0: no limit), got {self.replica_starts}"
            )
        if self.pool_memory_mb < 1:
            raise ConfigError(f"pool_memory_mb must be >= 1 (MB), got {self.pool_memory_mb}")
        if self.pool_processes and not self.manager.startswith("local://"):
            raise ConfigError(
                f"pool_processes needs the local manager (local://), not {self.manager!r}: "
                "pooled models need the local manager"
            )
        if self.pool_processes and self._pool_shared():
            raise ConfigError(
                "pool_processes cannot be combined with shared replicas (--workers > 1, or a "
                "redis store with --rpc-keys-dir): a pool process serves one frontend"
            )
        if self.cache_bytes < 0:
            raise ConfigError(f"cache_bytes must be >= 0, got {self.cache_bytes}")
        CACHE_POLICIES.check(self.cache_policy)
        GRPC_TRANSPORTS.check(self.grpc_transport)
        if self.queue_capacity < 1:
            raise ConfigError(f"queue_capacity must be >= 1, got {self.queue_capacity}")
        if not self.owner_lease_ttl_s > 0:
            raise ConfigError(
                f"owner_lease_ttl_s must be > 0 seconds, got {self.owner_lease_ttl_s}"
            )
        if self.replica_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError("replica_timeout_s must be longer than heartbeat_interval_s")

    @property
    def replicas_shared(self) -> bool:
        """Whether replicas are shared by the frontends: ``share_replicas``, else on for a
        redis store and for several worker processes."""
        if self.share_replicas is not None:
            return self.share_replicas
        workers = getattr(self, "workers", 1)  # --workers, where this version has it
        return self.shared_store_keys or (isinstance(workers, int) and workers > 1)

    def _pool_shared(self) -> bool:
        # The store is None until `clipper start` places it in the state directory.
        if self.store is not None:
            return self.replicas_shared
        return self.share_replicas if self.share_replicas is not None else self.workers > 1

    @property
    def shared_store(self) -> bool:
        """A store several frontends share (redis)."""
        return self.store.lower().startswith(("redis://", "rediss://"))

    @property
    def shared_store_keys(self) -> bool:
        """A shared store and keys every frontend can hold: a replica must pass every
        frontend's CURVE check, so automatic sharing needs the deployment's one key pair (an
        explicit ``rpc_keys_dir``; the default is per state directory) or RPC auth off."""
        return self.shared_store and (self.rpc_keys_dir is not None or not self.rpc_auth)

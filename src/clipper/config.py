"""Typed settings, validated when built; each CLI flag maps to a field and a CLIPPER_* env var."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipper.choices import CACHE_POLICIES, CONTROLLERS, CachePolicy, Controller
from clipper.errors import ConfigError

__all__ = ["BatchingConfig", "Controller", "FrontendConfig"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """How each replica of a model version forms batches.

    ``controller`` sizes batches (``aimd``: the paper's additive-increase/multiplicative-decrease;
    ``quantile``: P99 regression of batch latency on size; ``fixed``: ``max_batch_size`` always).
    The controllers aim a batch's latency at ``target_fraction`` of the tightest SLO of the apps the
    model serves: a query waits for at most about one batch in the queue and then rides one, so
    half the SLO keeps the two together inside it.
    ``max_wait_micros`` is delayed batching: how long a partial batch may wait to fill (never past
    the point where its earliest query would miss its deadline).
    """

    controller: Controller = "aimd"
    max_batch_size: int | None = None
    max_wait_micros: int = 1000
    in_flight: int = 1
    target_fraction: float = 0.5
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        CONTROLLERS.check(self.controller)
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
        }


@dataclass(frozen=True, slots=True)
class FrontendConfig:
    """The frontend process: ports, limits, cache, liveness."""

    host: str = "127.0.0.1"
    query_port: int = 1337
    rpc_host: str = "127.0.0.1"
    rpc_port: int = 7000
    max_body_bytes: int = 10 * 2**20
    cache_bytes: int = 32 * 2**20
    cache_policy: CachePolicy = "clock"
    queue_capacity: int = 50_000
    # Our containers heartbeat every heartbeat_interval_s even while predicting; the original
    # rpc.py only heartbeats when idle every 5 s, so it gets the original's 30 s.
    heartbeat_interval_s: float = 0.5
    replica_timeout_s: float = 3.0
    v3_replica_timeout_s: float = 30.0
    state_dir: Path | None = None
    # Where applications, models, links and replica counts live: "memory://" (gone with the
    # process), "sqlite:///dir-or-file" (the CLI's default, in the state directory) or
    # "redis://host:port/db" (shared by several frontends).
    store: str = "memory://"
    python: str | None = None
    # Containers run this much below the frontend's CPU priority: when models and the frontend
    # compete for cores, the event loop that keeps every deadline gets them first.
    container_nice: int = 5
    # The admin API changes what is served: loopback only, unless a bearer token guards it.
    admin_host: str = "127.0.0.1"
    admin_port: int = 1338
    admin_token: str | None = None
    # The Open Inference Protocol's gRPC service; None = off (the embedded default, so tests and
    # notebooks bind nothing extra; `clipper start` serves it on 8001).
    grpc_port: int | None = None

    def __post_init__(self) -> None:
        if self.admin_host not in _LOOPBACK and not self.admin_token:
            raise ConfigError(
                f"the admin API is bound to {self.admin_host!r}, beyond this machine: "
                "set an admin token (--admin-token or CLIPPER_ADMIN_TOKEN) or bind it to "
                "127.0.0.1"
            )
        for name in ("query_port", "rpc_port", "admin_port", "grpc_port"):
            port = getattr(self, name)
            if port is None:
                continue
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} must be a TCP port (0-65535), got {port}")
        if self.max_body_bytes < 64:
            raise ConfigError(f"max_body_bytes must be >= 64, got {self.max_body_bytes}")
        if self.cache_bytes < 0:
            raise ConfigError(f"cache_bytes must be >= 0, got {self.cache_bytes}")
        CACHE_POLICIES.check(self.cache_policy)
        if self.queue_capacity < 1:
            raise ConfigError(f"queue_capacity must be >= 1, got {self.queue_capacity}")
        if self.replica_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError("replica_timeout_s must be longer than heartbeat_interval_s")

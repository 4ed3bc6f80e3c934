"""The container-manager seam: what the runtime asks of whoever runs model replicas.

The reconciler decides how many replicas each model version should have and calls
:meth:`ContainerManager.ensure`; a manager makes it so on its engine and reports what runs. The
implementation is chosen by a URL-like setting (``--manager``) from the ``MANAGERS`` table in
``clipper.choices``: a new engine (Ray, Kubernetes) is one module that implements this protocol
plus a row in that table.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from clipper.choices import MANAGERS
from clipper.clock import Clock
from clipper.errors import ConfigError
from clipper.managers.shared import SharedReplicas
from clipper.registry import ModelVersion

__all__ = [
    "ContainerManager",
    "ManagerContext",
    "ReplicaStatus",
    "SharedReplicas",
    "open_manager",
]


class ReplicaStatus(Protocol):
    """One replica slot as its manager sees it (not whether it has connected: the scheduler
    knows that)."""

    @property
    def model(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def slot(self) -> int: ...

    @property
    def token(self) -> str:
        """What the container presents when it connects (``--replica-token``)."""
        ...

    @property
    def pid(self) -> int | None: ...

    @property
    def restarts(self) -> int: ...

    @property
    def last_exit(self) -> int | None: ...

    @property
    def state(self) -> str:
        """``starting``, ``running``, ``restarting`` or ``stopping``."""
        ...

    @property
    def location(self) -> str:
        """Where it runs: ``local``, a node, a pod."""
        ...

    def log_tail(self, lines: int = 20) -> str: ...


class ContainerManager(Protocol):
    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        """Run ``replicas`` replicas of ``mv`` (0 stops them all), draining what is stopped.
        Returns once the processes are started or stopped, not once they have connected."""
        ...

    async def stop_all(self) -> None:
        """Stop every replica this manager started (the frontend is stopping)."""
        ...

    def replicas(self, name: str, version: str) -> Sequence[ReplicaStatus]: ...

    def all_replicas(self) -> Sequence[ReplicaStatus]: ...

    def logs(self, max_bytes: int) -> list[tuple[str, str]]:
        """(name, last ``max_bytes`` of text) of each replica log this manager keeps."""
        ...

    def log_files(self, name: str, version: str) -> dict[int, Path] | None:
        """The log file of each replica slot of a version (present on disk, running or not),
        by slot: the ``replica`` of ``clipper status`` and ``clipper logs``. None when this
        manager keeps no logs (the containers run elsewhere)."""
        ...

    async def forget(self, name: str, version: str) -> None:
        """A deleted version: remove what the manager keeps of it (its replicas' logs). Called
        after a grace period, and only while the version stays deleted."""
        ...


@dataclass(frozen=True, slots=True)
class ManagerContext:
    """What a manager may need from the frontend that builds it."""

    rpc_host: Callable[[], str]
    rpc_port: Callable[[], int]
    state_dir: Path
    clock: Clock
    heartbeat_interval_s: float
    python: str | None
    on_exit: Callable[[str], None] | None
    drain: Callable[[str], Awaitable[None]] | None
    nice: int
    log_max_bytes: int = 10 * 2**20
    # The CURVE key directory containers are given (--rpc-keys); None: the port is open.
    rpc_keys: Path | None = None
    # The frontend's Unix socket for containers on this machine (ipc://PATH; None: none).
    rpc_local: Callable[[], str | None] = lambda: None
    # This frontend's id (known once it has started): names what an engine keeps for it.
    node_id: Callable[[], str] = lambda: ""
    # Set when replicas are shared by the frontends (None: each frontend's are its children).
    shared: SharedReplicas | None = None
    # Whether the container that presented a replica token is connected to this frontend (a
    # manager that moves a replica waits for its replacement to connect before it drains the
    # old one). None: the manager cannot tell.
    connected: Callable[[str], bool] | None = None
    # The local manager's pool processes for pooled versions (docs/density.md), and what it
    # calls when one of them unloads a model by itself (evicted, or its process died).
    pool_processes: int = 0
    pool_memory_mb: int = 512
    on_unloaded: Callable[[str, str, str], None] | None = None
    # How many replica processes the local manager starts at once (0: no limit).
    replica_starts: int = 0


def build_local(rest: str, ctx: ManagerContext) -> ContainerManager:
    from clipper.managers.local import LocalManager

    if rest:
        raise ConfigError(f"'local://' takes nothing after it, got 'local://{rest}'")
    return LocalManager(
        rpc_host=ctx.rpc_host,
        rpc_port=ctx.rpc_port,
        state_dir=ctx.state_dir,
        clock=ctx.clock,
        heartbeat_interval_s=ctx.heartbeat_interval_s,
        python=ctx.python or sys.executable,
        on_exit=ctx.on_exit,
        drain=ctx.drain,
        nice=ctx.nice,
        log_max_bytes=ctx.log_max_bytes,
        rpc_keys=ctx.rpc_keys,
        rpc_local=ctx.rpc_local,
        shared=ctx.shared,
        pool_processes=ctx.pool_processes,
        pool_memory_mb=ctx.pool_memory_mb,
        on_unloaded=ctx.on_unloaded,
        replica_starts=ctx.replica_starts,
        connected=ctx.connected,
    )


def build_external(rest: str, ctx: ManagerContext) -> ContainerManager:
    if rest:
        raise ConfigError(f"'external://' takes nothing after it, got 'external://{rest}'")
    return ExternalManager()


def build_kubernetes(rest: str, ctx: ManagerContext) -> ContainerManager:
    from clipper.managers.kubernetes import KubernetesManager, parse_url

    settings, conn = parse_url(rest)
    return KubernetesManager(
        settings,
        conn,
        rpc_host=ctx.rpc_host,
        rpc_port=ctx.rpc_port,
        rpc_keys=ctx.rpc_keys,
        heartbeat_interval_s=ctx.heartbeat_interval_s,
        drain=ctx.drain,
        clock=ctx.clock,
    )


def open_manager(url: str, ctx: ManagerContext) -> ContainerManager:
    """The manager named by ``url`` (``local://``, ``external://``: the MANAGERS table)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in MANAGERS:
        raise ConfigError(
            f"unknown container manager {url!r}; expected one of "
            f"{', '.join(f'{name}://' for name in MANAGERS)}"
        )
    build: Callable[[str, ManagerContext], ContainerManager] = MANAGERS.load(scheme)
    return build(rest, ctx)


class ExternalManager:
    """Containers run elsewhere (started by hand, by an orchestrator) and dial in to the RPC
    port, as in the original Clipper: this frontend starts and stops nothing, and reports the
    connected replicas the scheduler sees."""

    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        await asyncio.sleep(0)

    async def stop_all(self) -> None:
        await asyncio.sleep(0)

    def replicas(self, name: str, version: str) -> Sequence[ReplicaStatus]:
        return []

    def all_replicas(self) -> Sequence[ReplicaStatus]:
        return []

    def logs(self, max_bytes: int) -> list[tuple[str, str]]:
        return []

    def log_files(self, name: str, version: str) -> dict[int, Path] | None:
        return None

    async def forget(self, name: str, version: str) -> None:
        await asyncio.sleep(0)  # it keeps nothing: the containers' logs are their owners'

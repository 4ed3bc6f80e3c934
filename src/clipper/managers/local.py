"""The local container manager: replicas as child processes of the frontend.

Each replica slot is owned by one supervising task: it starts the container process, waits for it
to exit, and restarts it with exponential backoff unless it is being stopped. Containers get the
frontend's pid and exit by themselves if it dies, so a killed frontend leaves no orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import clipper
from clipper.clock import Clock
from clipper.errors import ReplicaError
from clipper.registry import ModelVersion

__all__ = ["LocalManager", "ReplicaProcess"]

log = logging.getLogger("clipper.manager")

_BACKOFF_START = 0.1
_BACKOFF_MAX = 5.0
_STABLE_AFTER = 10.0
_STOP_GRACE = 3.0

OnExit = Callable[[str], None]
Drain = Callable[[str], Awaitable[None]]


@dataclass(slots=True)
class ReplicaProcess:
    """One replica slot: the process currently filling it and its history."""

    model: str
    version: str
    slot: int
    log_path: Path
    token: str = ""
    pid: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    stopping: bool = False
    location: str = "local"

    @property
    def state(self) -> str:
        if self.stopping:
            return "stopping"
        if self.pid is None:
            return "restarting" if self.restarts else "starting"
        return "running"

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class LocalManager:
    def __init__(
        self,
        *,
        rpc_host: Callable[[], str],
        rpc_port: Callable[[], int],
        state_dir: Path,
        clock: Clock,
        heartbeat_interval_s: float,
        python: str | None = None,
        on_exit: OnExit | None = None,
        drain: Drain | None = None,
        nice: int = 0,
        rpc_keys: Path | None = None,
    ) -> None:
        self._rpc_host = rpc_host
        self._rpc_port = rpc_port
        self.state_dir = state_dir
        self.clock = clock
        self.heartbeat_interval_s = heartbeat_interval_s
        self.python = python or sys.executable
        self.on_exit = on_exit
        self.nice = nice
        self.drain = drain
        self.rpc_keys = rpc_keys
        self._groups: dict[tuple[str, str], list[ReplicaProcess]] = {}
        self._generation = 0

    def replicas(self, name: str, version: str) -> list[ReplicaProcess]:
        return list(self._groups.get((name, version), ()))

    def all_replicas(self) -> list[ReplicaProcess]:
        return [p for group in self._groups.values() for p in group]

    def logs(self, max_bytes: int) -> list[tuple[str, str]]:
        out = []
        for path in sorted((self.state_dir / "logs").glob("*.log")):
            try:
                with path.open("rb") as f:
                    size = f.seek(0, 2)
                    f.seek(max(size - max_bytes, 0))
                    data = f.read()
            except OSError:
                continue
            out.append((path.name, data.decode("utf-8", "replace")))
        return out

    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        """Start or stop processes until ``replicas`` slots are running."""
        if replicas and mv.artifact is None:
            raise ReplicaError(
                f"model {mv.name}:{mv.version} has no artifact to run; its containers are "
                "started outside clipper-serve"
            )
        group = self._groups.setdefault(mv.key, [])
        while len(group) < replicas:
            proc = ReplicaProcess(
                mv.name,
                mv.version,
                len(group),
                self.state_dir / "logs" / f"{mv.name}-{mv.version}-{len(group)}.log",
            )
            proc.log_path.parent.mkdir(parents=True, exist_ok=True)
            proc.task = asyncio.create_task(
                self._supervise(mv, proc),
                name=f"clipper-replica-{mv.name}-{mv.version}-{proc.slot}",
            )
            group.append(proc)
        surplus = group[replicas:]
        del group[replicas:]
        await asyncio.gather(*(self._stop(p) for p in surplus))
        if not group:
            self._groups.pop(mv.key, None)

    async def stop_model(self, name: str, version: str) -> None:
        group = self._groups.pop((name, version), [])
        await asyncio.gather(*(self._stop(p) for p in group))

    async def stop_all(self) -> None:
        groups = list(self._groups.values())
        self._groups.clear()
        await asyncio.gather(*(self._stop(p) for group in groups for p in group))

    async def _stop(self, proc: ReplicaProcess) -> None:
        proc.stopping = True
        if self.drain is not None and proc.token:
            with contextlib.suppress(Exception):
                await self.drain(proc.token)
        if proc.task is not None:
            proc.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await proc.task

    def _command(self, mv: ModelVersion, proc: ReplicaProcess) -> list[str]:
        assert mv.artifact is not None
        # The key directory's path, never the keys: command lines are visible to everyone.
        keys = ["--rpc-keys", str(self.rpc_keys)] if self.rpc_keys is not None else []
        return [
            self.python, "-m", "clipper.container",
            "--model-path", mv.artifact,
            "--name", mv.name,
            "--version", mv.version,
            "--input-type", mv.input_type.readable,
            "--ip", self._rpc_host(),
            "--port", str(self._rpc_port()),
            "--heartbeat-interval", str(self.heartbeat_interval_s),
            "--parent-pid", str(os.getpid()),
            "--replica-token", proc.token,
            "--nice", str(self.nice),
            *keys,
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The container must import the same clipper as we run, installed or not.
        src = str(Path(clipper.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    async def _supervise(self, mv: ModelVersion, proc: ReplicaProcess) -> None:
        backoff = _BACKOFF_START
        while True:
            self._generation += 1
            proc.token = f"{mv.name}:{mv.version}:{proc.slot}:{self._generation}"
            started = self.clock.now()
            with proc.log_path.open("ab") as logf:
                child = await asyncio.create_subprocess_exec(
                    *self._command(mv, proc),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=logf,
                    stderr=logf,
                    env=self._env(),
                )
            proc.pid = child.pid
            try:
                code = await child.wait()
            except asyncio.CancelledError:
                await _terminate(child)
                proc.pid = None
                raise
            proc.pid = None
            proc.last_exit = code
            if self.on_exit is not None:
                self.on_exit(proc.token)
            if proc.stopping:
                return
            proc.restarts += 1
            if self.clock.now() - started > _STABLE_AFTER:
                backoff = _BACKOFF_START
            log.warning(
                "replica %s of %s:%s exited with %s; restarting in %.1f s (log: %s)",
                proc.slot,
                mv.name,
                mv.version,
                code,
                backoff,
                proc.log_path,
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)


async def _terminate(child: asyncio.subprocess.Process) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(child.wait(), _STOP_GRACE)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()

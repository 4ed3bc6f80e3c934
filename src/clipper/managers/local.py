"""The local container manager: replicas as child processes of the frontend.

Each replica slot is owned by one supervising task: it starts the container process, waits for it
to exit, and restarts it with exponential backoff unless it is being stopped. Containers get the
frontend's pid and exit by themselves if it dies, so a killed frontend leaves no orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from clipper.clock import Clock, sleep, wait_for
from clipper.errors import ReplicaError
from clipper.registry import ModelVersion
from clipper.version import IMPORT_ROOT

__all__ = ["LOG_MAX_BYTES", "LocalManager", "ReplicaProcess", "RotatingLog"]

log = logging.getLogger("clipper.manager")

_BACKOFF_START = 0.1
_BACKOFF_MAX = 5.0
_STABLE_AFTER = 10.0
_STOP_GRACE = 3.0
# A replica's log (its stdout and stderr) rotates past this size, keeping one previous file
# (<log>.1): at most about twice this on disk per replica slot, however much a model prints.
LOG_MAX_BYTES = 10 * 2**20
_PIPE_CHUNK = 64 * 1024

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
        log_max_bytes: int = LOG_MAX_BYTES,
        rpc_keys: Path | None = None,
    ) -> None:
        self.log_max_bytes = log_max_bytes
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
        # Stops under way. Out of their group already, these processes have no other owner:
        # a caller cancelled meanwhile (the frontend stopping during a reconcile) must not
        # cut a stop short, and stop_all waits for them.
        self._stopping: set[asyncio.Task[None]] = set()

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

    def log_file(self, name: str, version: str, slot: int) -> Path:
        return self.state_dir / "logs" / f"{name}-{version}-{slot}.log"

    def log_files(self, name: str, version: str) -> dict[int, Path]:
        prefix = f"{name}-{version}-"
        out = {}
        for path in (self.state_dir / "logs").glob(f"{glob.escape(prefix)}*.log"):
            slot = path.name[len(prefix) : -len(".log")]
            if slot.isdigit():
                out[int(slot)] = path
        return dict(sorted(out.items()))

    async def forget(self, name: str, version: str) -> None:
        """Remove the logs of a deleted version's replica slots (``<m>-<v>-<slot>.log`` and
        its rotated ``.1``), unless a slot of that name runs again."""
        if (name, version) in self._groups:
            return  # registered and started again: its logs are live
        prefix = f"{name}-{version}-"

        def remove() -> None:
            for path in (self.state_dir / "logs").glob(f"{glob.escape(prefix)}*.log*"):
                rest = path.name[len(prefix) :]
                slot, _, suffix = rest.partition(".")
                if slot.isdigit() and suffix in ("log", "log.1"):
                    path.unlink(missing_ok=True)

        await asyncio.to_thread(remove)

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
                self.log_file(mv.name, mv.version, len(group)),
            )
            proc.log_path.parent.mkdir(parents=True, exist_ok=True)
            proc.task = asyncio.create_task(
                self._supervise(mv, proc),
                name=f"clipper-replica-{mv.name}-{mv.version}-{proc.slot}",
            )
            group.append(proc)
        surplus = group[replicas:]
        del group[replicas:]
        if not group:
            self._groups.pop(mv.key, None)
        stops = [asyncio.ensure_future(self._stop(p)) for p in surplus]
        for stop in stops:
            self._stopping.add(stop)
            stop.add_done_callback(self._stopping.discard)
        if stops:
            await asyncio.shield(asyncio.gather(*stops))

    async def stop_all(self) -> None:
        groups = list(self._groups.values())
        self._groups.clear()
        await asyncio.gather(*(self._stop(p) for group in groups for p in group))
        await asyncio.gather(*self._stopping, return_exceptions=True)

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
        path = (IMPORT_ROOT, env.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    async def _supervise(self, mv: ModelVersion, proc: ReplicaProcess) -> None:
        backoff = _BACKOFF_START
        while True:
            self._generation += 1
            proc.token = f"{mv.name}:{mv.version}:{proc.slot}:{self._generation}"
            started = self.clock.now()
            # Through a pipe, not the file itself: the manager writes it, rotated by size.
            child = await asyncio.create_subprocess_exec(
                *self._command(mv, proc),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env(),
            )
            assert child.stdout is not None
            copier = asyncio.create_task(
                _copy_log(child.stdout, RotatingLog(proc.log_path, self.log_max_bytes))
            )
            proc.pid = child.pid
            try:
                code = await child.wait()
            except asyncio.CancelledError:
                await _terminate(child, self.clock)
                await _finish_copy(copier, self.clock)
                proc.pid = None
                raise
            await _finish_copy(copier, self.clock)
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
            await sleep(self.clock, backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)


async def _terminate(child: asyncio.subprocess.Process, clock: Clock) -> None:
    if child.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGTERM)
    try:
        await wait_for(clock, child.wait(), _STOP_GRACE)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


class RotatingLog:
    """A log file capped in size: past ``max_bytes`` it becomes ``<path>.1`` (replacing the
    previous one) and a new file starts. :meth:`write` blocks on the disk: call it in a
    thread."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes

    def write(self, data: bytes) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(data) > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        with self.path.open("ab") as f:
            f.write(data)


async def _copy_log(stream: asyncio.StreamReader, log_file: RotatingLog) -> None:
    """The child's output into its log until EOF; the disk writes run in a thread, so a
    replica printing fast never holds the event loop."""
    while chunk := await stream.read(_PIPE_CHUNK):
        try:
            await asyncio.to_thread(log_file.write, chunk)
        except OSError as e:  # a full disk must not stop the replica: it would block on the pipe
            log.warning("cannot write replica log %s: %s", log_file.path, e)


async def _finish_copy(copier: asyncio.Task[None], clock: Clock) -> None:
    """Let the copy reach EOF (a grandchild holding the pipe open gets a second), then stop."""
    try:
        await wait_for(clock, asyncio.shield(copier), 1.0)
    except TimeoutError:
        copier.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await copier
    except asyncio.CancelledError:
        copier.cancel()  # our own task is being cancelled: stop the copy too, and go
        raise

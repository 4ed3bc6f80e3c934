"""The local container manager: replicas as child processes of the frontend.

Each replica slot is owned by one supervising task: it starts the container process, waits for it
to exit, and restarts it with exponential backoff unless it is being stopped. Containers get the
frontend's pid and exit by themselves if it dies, so a killed frontend leaves no orphans.

Shared mode (:class:`SharedReplicas`: a redis store, or several worker processes): replicas
serve every frontend and outlive the one that started them. Each is started with ``--shared``,
every other live frontend's ``--frontend`` address and no ``--parent-pid``, in a session of its
own (a SIGKILL of the frontend's process group does not reach it), writing its log file itself
(a pipe would break with the frontend); it is recorded in the store (kind ``replica``) when it
starts and the record deleted when it is stopped. The next owner adopts the records
(:meth:`LocalManager.adopt`): a slot whose replica is connected counts as running, is stopped
with a RETIRE message, and is started anew if it does not connect within the grace period. A
frontend that is no longer the owner detaches (:meth:`LocalManager.detach`): it stops
supervising and leaves the processes running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import glob
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipper.clock import Clock, sleep, wait_for
from clipper.errors import ConfigError, RegistryError, ReplicaError
from clipper.managers.local_devices import replica_devices, replica_env
from clipper.managers.pool import ModelPool, OnUnloaded, PooledReplica
from clipper.managers.replica_log import (
    BACKOFF_START,
    LOG_MAX_BYTES,
    RotatingLog,
    copy_log,
    finish_copy,
    next_backoff,
)
from clipper.managers.shared import SharedReplicas
from clipper.managers.start_gate import StartGate
from clipper.registry import ModelVersion
from clipper.store.base import StoreError
from clipper.version import IMPORT_ROOT

__all__ = ["LOG_MAX_BYTES", "LocalManager", "ReplicaProcess", "RotatingLog"]

log = logging.getLogger("clipper.manager")

_STOP_GRACE = 3.0
# A retired replica drains every link (bounded by its drain timeout) and exits within this.
_RETIRE_WAIT_S = 8.0

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
    # Shared mode: supervision ended, the process left running for the next owner.
    detached: bool = False
    # Shared mode: the host of the frontend that started it (its pid means something there).
    host: str = ""
    # Waiting for a place among the starts allowed at once (start_gate.py), not spawned yet.
    queued: bool = False

    @property
    def state(self) -> str:
        if self.stopping:
            return "stopping"
        if self.queued:
            return "queued"
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
        rpc_local: Callable[[], str | None] = lambda: None,
        shared: SharedReplicas | None = None,
        pool_processes: int = 0,
        pool_memory_mb: int = 512,
        on_unloaded: OnUnloaded | None = None,
        replica_starts: int = 0,
        connected: Callable[[str], bool] | None = None,
    ) -> None:
        self.shared = shared
        # At most this many replica processes in their first seconds at once (0: no limit):
        # the rest wait their turn, first asked first started (start_gate.py).
        self.starts = StartGate(replica_starts, clock, connected)
        self.host = socket.gethostname()
        # Tokens are unique across frontends and restarts: an adopted replica's token and one
        # this manager makes never meet.
        self._run = secrets.token_hex(3)
        # The settings each version was last ensured with: an adopted slot that never connects
        # is started anew with them.
        self._versions: dict[tuple[str, str], ModelVersion] = {}
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
        self._rpc_local = rpc_local
        self._groups: dict[tuple[str, str], list[ReplicaProcess]] = {}
        self._generation = 0
        # Stops under way. Out of their group already, these processes have no other owner:
        # a caller cancelled meanwhile (the frontend stopping during a reconcile) must not
        # cut a stop short, and stop_all waits for them.
        self._stopping: set[asyncio.Task[None]] = set()
        # Pooled versions' replicas, in shared pool processes (docs/density.md).
        self.pool: ModelPool | None = None
        if pool_processes:
            self.pool = ModelPool(
                processes=pool_processes,
                memory_mb=pool_memory_mb,
                command=self._pool_command,
                env=self._env,
                log_dir=state_dir / "logs",
                clock=clock,
                on_exit=on_exit,
                on_unloaded=on_unloaded,
                log_max_bytes=log_max_bytes,
                run_id=self._run,
            )

    @property
    def pools(self) -> bool:
        """Whether pooled versions can run here (started with pool processes)."""
        return self.pool is not None

    def pool_view(self, name: str, version: str) -> dict[str, Any] | None:
        """A pooled version's place in the pool (the admin model view)."""
        return None if self.pool is None else self.pool.view(name, version)

    def replicas(self, name: str, version: str) -> list[ReplicaProcess | PooledReplica]:
        pooled = [] if self.pool is None else self.pool.replicas(name, version)
        return [*self._groups.get((name, version), ()), *pooled]

    def all_replicas(self) -> list[ReplicaProcess | PooledReplica]:
        pooled = [] if self.pool is None else self.pool.all_replicas()
        return [*(p for group in self._groups.values() for p in group), *pooled]

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
        if self.pool is not None:
            for r in self.pool.replicas(name, version):  # a pooled version: its pool's log
                out.setdefault(r.slot, r.log_path)
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

    def check_version(self, mv: ModelVersion) -> None:
        """RegistryError for a version this manager cannot run as labelled (a deploy's 400)."""
        try:
            devices = replica_devices(mv)
        except ConfigError as e:
            raise RegistryError(str(e)) from None
        if devices and mv.pooled:
            raise RegistryError(
                f"model {mv.name}:{mv.version} is pooled: a pool process runs on CPU, so it "
                "cannot take a local:gpus label (deploy it unpooled)"
            )

    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        """Start or stop processes until ``replicas`` slots are running."""
        if replicas and mv.artifact is None:
            raise ReplicaError(
                f"model {mv.name}:{mv.version} has no artifact to run; its containers are "
                "started outside clipper-serve"
            )
        if replicas:
            self.check_version(mv)  # a version registered before the check: its reconcile fails
        self._versions[mv.key] = mv
        if mv.pooled:
            if self.pool is None:
                raise ReplicaError(
                    f"model {mv.name}:{mv.version} is pooled, but this frontend runs no pool "
                    "processes (clipper start --pool-processes N)"
                )
            await self.pool.ensure(mv, min(replicas, 1))
            return
        group = self._groups.setdefault(mv.key, [])
        while len(group) < replicas:
            # The lowest free slot: adopted slots need not be 0..n-1.
            used = {p.slot for p in group}
            slot = next(i for i in range(len(group) + 1) if i not in used)
            proc = ReplicaProcess(
                mv.name, mv.version, slot, self.log_file(mv.name, mv.version, slot), host=self.host
            )
            proc.log_path.parent.mkdir(parents=True, exist_ok=True)
            proc.task = asyncio.create_task(
                self._supervise(mv, proc),
                name=f"clipper-replica-{mv.name}-{mv.version}-{proc.slot}",
            )
            group.append(proc)
            group.sort(key=lambda p: p.slot)
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
        pool = [] if self.pool is None else [self.pool.stop_all()]
        await asyncio.gather(*(self._stop(p) for group in groups for p in group), *pool)
        await asyncio.gather(*self._stopping, return_exceptions=True)

    def detach(self) -> None:
        """Stop supervising every replica and leave the processes running (shared mode: this
        frontend is no longer the owner; the next one adopts them from their records)."""
        groups = list(self._groups.values())
        self._groups.clear()
        for proc in (p for group in groups for p in group):
            proc.detached = True
            if proc.task is not None:
                proc.task.cancel()

    async def adopt(self, wanted: Callable[[str, str], bool]) -> None:
        """Take over the replicas the store records (shared mode; a new owner, before it
        converges): each slot counts as running while its replica is connected here; one of
        a version no longer registered (``wanted`` False) is stopped at once."""
        if self.shared is None:
            return
        try:
            records = await self.shared.store.records("replica")
        except StoreError as exc:
            log.warning("cannot read the replica records to adopt: %s", exc)
            return
        stops = []
        for key, rec in sorted(records.items()):
            proc = _adopted(rec, self)
            if proc is None:
                log.warning("ignoring a malformed replica record %r: %r", key, rec)
                continue
            group = self._groups.setdefault((proc.model, proc.version), [])
            if any(p.slot == proc.slot for p in group):
                continue  # this manager runs that slot already
            if not wanted(proc.model, proc.version):
                stops.append(asyncio.ensure_future(self._stop(proc)))
                if not group:
                    self._groups.pop((proc.model, proc.version), None)
                continue
            proc.task = asyncio.create_task(
                self._watch_adopted(proc),
                name=f"clipper-replica-{proc.model}-{proc.version}-{proc.slot}-adopted",
            )
            group.append(proc)
            group.sort(key=lambda p: p.slot)
            log.info(
                "adopted replica %s of %s:%s (pid %s, token %s)",
                proc.slot,
                proc.model,
                proc.version,
                proc.pid,
                proc.token,
            )
        for stop in stops:
            self._stopping.add(stop)
            stop.add_done_callback(self._stopping.discard)

    async def _stop(self, proc: ReplicaProcess) -> None:
        proc.stopping = True
        if self.shared is not None:
            await self._stop_shared(proc)
            return
        if self.drain is not None and proc.token:
            with contextlib.suppress(Exception):
                await self.drain(proc.token)
        if proc.task is not None:
            proc.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await proc.task

    async def _stop_shared(self, proc: ReplicaProcess) -> None:
        """A shared replica serves other frontends too: RETIRE lets it drain every link (and
        answer their batches) before it exits; a signal is the fallback."""
        assert self.shared is not None
        adopted = proc.location == "adopted"
        if adopted and proc.task is not None:
            proc.task.cancel()  # its watcher must not start it anew
            with contextlib.suppress(asyncio.CancelledError):
                await proc.task
            adopted = proc.location == "adopted"  # the watcher may have started it anew
        retired = bool(proc.token) and self.shared.retire(proc.token)
        if adopted:
            if retired:
                await self._gone(proc)
            if proc.pid is not None and _runs(proc.pid, proc.token, proc.host == self.host):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGTERM)
        else:
            if not retired and self.drain is not None and proc.token:
                with contextlib.suppress(Exception):
                    await self.drain(proc.token)
            if proc.task is not None:
                if retired:
                    # The supervisor returns once the process exits (it is stopping).
                    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                        await wait_for(self.clock, asyncio.shield(proc.task), _RETIRE_WAIT_S)
                proc.task.cancel()  # still running: SIGTERM, then SIGKILL
                with contextlib.suppress(asyncio.CancelledError):
                    await proc.task
        await self._forget_record(proc)

    async def _gone(self, proc: ReplicaProcess) -> None:
        """Wait (bounded) for a retired replica that is not our child to exit."""
        assert self.shared is not None
        deadline = self.clock.now() + _RETIRE_WAIT_S
        local = proc.host == self.host
        while self.clock.now() < deadline:
            if local and proc.pid is not None:
                if not _runs(proc.pid, proc.token, True):
                    return
            elif not self.shared.connected(proc.token):
                return
            await sleep(self.clock, min(0.1, self.heartbeat_interval_s))

    async def _watch_adopted(self, proc: ReplicaProcess) -> None:
        """An adopted slot counts as running while its replica is connected here; one that
        does not connect within the grace period, or goes silent that long, is started anew
        (as this manager's own child) once the version's settings are known here."""
        assert self.shared is not None
        grace = self.shared.grace_s
        heard = self.clock.now()  # the grace period runs from the adoption
        while True:
            if self.shared.connected(proc.token):
                heard = self.clock.now()
            elif self.clock.now() - heard > grace:
                break
            await sleep(self.clock, self.heartbeat_interval_s)
        log.warning(
            "adopted replica %s of %s:%s (token %s) is not connected after %.1f s: starting "
            "it anew",
            proc.slot,
            proc.model,
            proc.version,
            proc.token,
            grace,
        )
        if proc.pid is not None and _runs(proc.pid, proc.token, proc.host == self.host):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGTERM)  # hung: it would hold its slot's work
        await self._forget_record(proc)
        mv = self._versions.get((proc.model, proc.version))
        while mv is None:  # the reconciler ensures every version right after an adoption
            await sleep(self.clock, self.heartbeat_interval_s)
            mv = self._versions.get((proc.model, proc.version))
        proc.location, proc.host, proc.pid, proc.token = "local", self.host, None, ""
        proc.log_path.parent.mkdir(parents=True, exist_ok=True)
        await self._supervise(mv, proc)

    def _record_key(self, proc: ReplicaProcess) -> str:
        return f"{proc.model}/{proc.version}/{proc.slot}"

    async def _write_record(self, proc: ReplicaProcess) -> None:
        assert self.shared is not None
        record = {
            "name": proc.model,
            "version": proc.version,
            "slot": proc.slot,
            "token": proc.token,
            "host": proc.host or self.host,
            "pid": proc.pid,
            "location": proc.location,
        }
        try:
            await self.shared.store.put("replica", self._record_key(proc), record)
        except StoreError as exc:
            # Logged, not fatal: the replica runs; a next owner would not adopt it and would
            # start the slot anew (the orphan exits by its orphan timeout once unheard of).
            log.warning("cannot record replica %s: %s", self._record_key(proc), exc)

    async def _forget_record(self, proc: ReplicaProcess) -> None:
        if self.shared is None:
            return
        try:
            await self.shared.store.delete("replica", self._record_key(proc))
        except StoreError as exc:
            log.warning("cannot delete the record of replica %s: %s", self._record_key(proc), exc)

    def _command(self, mv: ModelVersion, proc: ReplicaProcess) -> list[str]:
        assert mv.artifact is not None
        if self.shared is not None:
            # Every other live frontend (this one is --ip/--port); no parent to die with.
            own = f"tcp://{self._rpc_host()}:{self._rpc_port()}"
            others = [a for a in self.shared.frontends() if a != own]
            tail = ["--shared", *(arg for a in others for arg in ("--frontend", a))]
        else:
            tail = ["--parent-pid", str(os.getpid())]
        return [
            self.python, "-m", "clipper.container",
            "--model-path", mv.artifact,
            "--name", mv.name,
            "--version", mv.version,
            "--input-type", mv.input_type.readable,
            *self._dial(),
            "--heartbeat-interval", str(self.heartbeat_interval_s),
            "--replica-token", proc.token,
            "--nice", str(self.nice),
            *tail,
        ]  # fmt: skip

    def _pool_command(self, index: int) -> list[str]:
        assert self.pool is not None
        return [
            self.python, "-m", "clipper.container", "--pool",
            "--memory-budget-mb", str(self.pool.memory_mb),
            *self._dial(),
            "--heartbeat-interval", str(self.heartbeat_interval_s),
            "--parent-pid", str(os.getpid()),
            "--nice", str(self.nice),
        ]  # fmt: skip

    def _dial(self) -> list[str]:
        """How a container this manager starts reaches the frontend: on its private Unix
        socket without keys (clipper.rpc.server.RpcServer.local_address), else its TCP port
        with the key directory's path (never the keys: command lines are visible to
        everyone). A shared replica gets the key path either way, for the other frontends it
        dials over TCP (those on this machine it dials on their sockets once they tell it
        of them: clipper.container.dial)."""
        local = self._rpc_local()
        keys = ["--rpc-keys", str(self.rpc_keys)] if self.rpc_keys is not None else []
        if local is not None:
            return ["--ipc", local.removeprefix("ipc://"), *(keys if self.shared else [])]
        return ["--ip", self._rpc_host(), "--port", str(self._rpc_port()), *keys]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # The container must import the same clipper as we run, installed or not.
        path = (IMPORT_ROOT, env.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def _replica_env(self, mv: ModelVersion, proc: ReplicaProcess) -> dict[str, str]:
        """The frontend's environment, with the slot's GPU when the version lists some."""
        return {**self._env(), **replica_env(mv, proc.slot)}

    async def _start(
        self, proc: ReplicaProcess, spawn: Callable[[], Awaitable[asyncio.subprocess.Process]]
    ) -> asyncio.subprocess.Process:
        """``spawn()`` once the start gate gives ``proc`` a place; ``proc`` says ``queued``
        while it waits for one."""
        proc.queued = True
        try:
            return await self.starts.start(spawn, placed=lambda: setattr(proc, "queued", False))
        finally:
            proc.queued = False

    async def _supervise(self, mv: ModelVersion, proc: ReplicaProcess) -> None:
        if self.shared is not None:
            await self._supervise_shared(mv, proc)
            return
        backoff = BACKOFF_START
        while True:
            self._generation += 1
            proc.token = f"{mv.name}:{mv.version}:{proc.slot}:{self._run}.{self._generation}"
            # Through a pipe, not the file itself: the manager writes it, rotated by size.
            child = await self._start(
                proc,
                functools.partial(
                    asyncio.create_subprocess_exec,
                    *self._command(mv, proc),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env=self._replica_env(mv, proc),
                ),
            )
            started = self.clock.now()  # once it had its turn
            assert child.stdout is not None
            copier = asyncio.create_task(
                copy_log(child.stdout, RotatingLog(proc.log_path, self.log_max_bytes))
            )
            proc.pid = child.pid
            exited = asyncio.ensure_future(child.wait())
            try:
                await self.starts.hold(proc.token, exited)
                code = await exited
            except asyncio.CancelledError:
                exited.cancel()
                await _terminate(child, self.clock)
                await finish_copy(copier, self.clock)
                proc.pid = None
                raise
            await finish_copy(copier, self.clock)
            next_backoff = await self._exited(mv, proc, code, started, backoff)
            if next_backoff is None:
                return
            backoff = next_backoff

    async def _supervise_shared(self, mv: ModelVersion, proc: ReplicaProcess) -> None:
        """As :meth:`_supervise`, for a replica that must outlive this frontend: its own
        session, its log written by itself (unrotated while it runs), its record in the store;
        a cancel of a detached slot leaves it running."""
        backoff = BACKOFF_START
        while True:
            self._generation += 1
            proc.token = f"{mv.name}:{mv.version}:{proc.slot}:{self._run}.{self._generation}"
            opening = asyncio.ensure_future(
                asyncio.to_thread(_open_log, proc.log_path, self.log_max_bytes)
            )
            try:
                log_file = await asyncio.shield(opening)
            except asyncio.CancelledError:
                opening.add_done_callback(_close_opened)  # the file arrives after the cancel
                raise
            try:
                child = await self._start(
                    proc,
                    functools.partial(
                        asyncio.create_subprocess_exec,
                        *self._command(mv, proc),
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=log_file,
                        stderr=asyncio.subprocess.STDOUT,
                        env=self._replica_env(mv, proc),
                        start_new_session=True,
                    ),
                )
            finally:
                log_file.close()  # the child holds its own copy
            started = self.clock.now()  # once it had its turn
            proc.pid = child.pid
            proc.host = self.host
            exited = asyncio.ensure_future(child.wait())
            placed = True  # the start's place in the gate, until hold gives it up
            try:
                await self._write_record(proc)
                placed = False
                await self.starts.hold(proc.token, exited)
                code = await exited
            except asyncio.CancelledError:
                exited.cancel()
                if placed:
                    self.starts.leave()
                if not proc.detached:
                    await _terminate(child, self.clock)
                    proc.pid = None
                raise
            next_backoff = await self._exited(mv, proc, code, started, backoff)
            if next_backoff is None:
                return
            backoff = next_backoff

    async def _exited(
        self, mv: ModelVersion, proc: ReplicaProcess, code: int, started: float, backoff: float
    ) -> float | None:
        """A replica process exited: report it, and unless it was stopped, wait out the
        back-off; the next back-off, or None when the slot is done."""
        proc.pid = None
        proc.last_exit = code
        if self.on_exit is not None:
            self.on_exit(proc.token)
        if proc.stopping:
            return None
        proc.restarts += 1
        wait, after = next_backoff(backoff, self.clock.now() - started)
        log.warning(
            "replica %s of %s:%s exited with %s; restarting in %.1f s (log: %s)",
            proc.slot, mv.name, mv.version, code, wait, proc.log_path,
        )  # fmt: skip
        await sleep(self.clock, wait)
        return after


def _open_log(path: Path, max_bytes: int) -> Any:
    """A shared replica's log, opened for the child to append to; rotated (one previous file)
    at each start, since nothing copies it while it runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size > max_bytes:
            os.replace(path, path.with_name(path.name + ".1"))
    return path.open("ab")


def _close_opened(opening: asyncio.Future[Any]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _runs(pid: int, token: str, local: bool) -> bool:
    """Whether ``pid`` is (still) the replica with ``token`` on this machine: its command line
    says so (a pid alone may have been reused)."""
    if not local or not token:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    if stat[stat.rindex(b")") + 2 :][:1] in (b"Z", b"X"):
        return False  # exited, not reaped yet
    return token.encode() in args


def _adopted(rec: Any, manager: LocalManager) -> ReplicaProcess | None:
    """The slot a replica record describes, or None when it is malformed."""
    if not isinstance(rec, dict):
        return None
    name, version, slot = rec.get("name"), rec.get("version"), rec.get("slot")
    token, pid, host = rec.get("token"), rec.get("pid"), rec.get("host")
    if not (isinstance(name, str) and isinstance(version, str) and isinstance(token, str)):
        return None
    if not isinstance(slot, int) or isinstance(slot, bool) or slot < 0 or not token:
        return None
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
        return None
    return ReplicaProcess(
        name,
        version,
        slot,
        manager.log_file(name, version, slot),
        token=token,
        pid=pid,
        location="adopted",
        host=host if isinstance(host, str) else "",
    )


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

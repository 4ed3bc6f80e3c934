"""The local manager's pool processes: pooled model versions loaded into shared processes.

``clipper start --pool-processes N --pool-memory-mb M`` (docs/density.md): N long-lived
container processes (``python -m clipper.container --pool``, :mod:`clipper.container.pool`),
started with the first pooled version, each holding models within M MB. A version deployed
with ``pooled: true`` gets its one replica from a pool process instead of a process of its
own: ``ensure(mv, 1)`` picks the process that holds it already, else the one with the most
free budget (:func:`clipper.container.pool_budget.place`) and sends it ``load``;
``ensure(mv, 0)`` sends ``unload``. The conversation runs over each child's stdin and stdout
(JSON lines, asyncio streams on the event loop); its stderr is its log (rotated, as a
replica's). Once loaded, the model registers with the frontend as an ordinary replica with the
token given here, so the replica directory, batching and routing are unchanged.

A model the pool process evicts for room (least recently used first), and every model of a
pool process that died, is reported to ``on_unloaded``: the autoscaler then counts the version
at zero replicas (unloaded), and the next query loads it again through the scale-to-zero hold.
A dead pool process is restarted with the supervision back-off of every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from clipper.clock import Clock, sleep, wait_for
from clipper.container.pool_budget import MemberLoad, artifact_bytes, place
from clipper.errors import ReplicaError
from clipper.managers.replica_log import (
    BACKOFF_START,
    RotatingLog,
    copy_log,
    finish_copy,
    next_backoff,
)
from clipper.registry import ModelVersion

__all__ = ["ModelPool", "PooledReplica"]

log = logging.getLogger("clipper.manager")

_STOP_GRACE = 3.0
# An unload drains the model's links (bounded by the pool process's drain timeout).
_UNLOAD_WAIT_S = 12.0
# wait_for_replicas gives up on a slot with this many restarts: a refused load says so at once.
_REFUSED_RESTARTS = 3
_MAX_LINE = 64 * 1024
_MAX_BUFFERED = 1 << 20  # control bytes written to a pool process and not read yet

OnUnloaded = Callable[[str, str, str], None]


@dataclass(slots=True)
class PooledReplica:
    """A pooled version's one replica slot, as the manager's status shows it (the
    :class:`~clipper.managers.base.ReplicaStatus` protocol)."""

    model: str
    version: str
    token: str
    member: int
    log_path: Path
    slot: int = 0
    pid: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    loaded: bool = False
    stopping: bool = False
    bytes: int = 0
    error: str = ""
    gone: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def location(self) -> str:
        return f"pool-{self.member}"

    @property
    def state(self) -> str:
        if self.error:
            return "refused"
        if self.stopping:
            return "stopping"
        return "running" if self.loaded else "loading"

    def log_tail(self, lines: int = 20) -> str:
        if self.error:
            # The line wait_for_replicas reads as the reason (as a refusing container's).
            return f"model refused: {self.error}"
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass(slots=True)
class _Member:
    index: int
    log_path: Path
    pid: int | None = None
    stdin: asyncio.StreamWriter | None = None
    restarts: int = 0
    models: dict[str, PooledReplica] = field(default_factory=dict)  # by token
    rss: int = 0
    loads: int = 0
    evictions: int = 0

    def used_bytes(self, estimate: Callable[[PooledReplica], int]) -> int:
        return sum(r.bytes if r.loaded else estimate(r) for r in self.models.values())


class ModelPool:
    def __init__(
        self,
        *,
        processes: int,
        memory_mb: int,
        command: Callable[[int], list[str]],
        env: Callable[[], dict[str, str]],
        log_dir: Path,
        clock: Clock,
        on_exit: Callable[[str], None] | None,
        on_unloaded: OnUnloaded | None,
        log_max_bytes: int,
        run_id: str,
    ) -> None:
        self.memory_mb = memory_mb
        self.budget_bytes = memory_mb * 2**20
        self._command = command
        self._env = env
        self.clock = clock
        self.on_exit = on_exit
        self.on_unloaded = on_unloaded
        self.log_max_bytes = log_max_bytes
        self._run = run_id
        self._generation = 0
        self.members = [_Member(i, log_dir / f"pool-{i}.log") for i in range(processes)]
        self._by_key: dict[tuple[str, str], PooledReplica] = {}
        self._estimates: dict[str, int] = {}  # artifact sizes by token, until loaded
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        # Set once every pool process has started (placement then sees them all).
        self._up = asyncio.Event()

    # -- what runs ----------------------------------------------------------------------------
    def replicas(self, name: str, version: str) -> list[PooledReplica]:
        r = self._by_key.get((name, version))
        return [] if r is None else [r]

    def all_replicas(self) -> list[PooledReplica]:
        return list(self._by_key.values())

    def view(self, name: str, version: str) -> dict[str, Any]:
        """A pooled version's place: loaded where, its size (the admin model view)."""
        r = self._by_key.get((name, version))
        if r is None:
            return {"state": "unloaded", "process": None}
        member = self.members[r.member]
        return {
            "state": r.state if r.state != "running" else "loaded",
            "process": r.member,
            "pid": member.pid,
            "bytes": r.bytes,
            "error": r.error or None,
        }

    def describe(self) -> list[dict[str, Any]]:
        """Each pool process: its pid, models, budget use, resident memory, loads, evictions."""
        return [
            {
                "process": m.index,
                "pid": m.pid,
                "models": sum(1 for r in m.models.values() if r.loaded),
                "used_bytes": m.used_bytes(self._estimate),
                "budget_bytes": self.budget_bytes,
                "rss_bytes": _rss(m.pid),
                "loads": m.loads,
                "evictions": m.evictions,
                "restarts": m.restarts,
            }
            for m in self.members
        ]

    # -- the manager's seam ---------------------------------------------------------------------
    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        """Load ``mv`` into a pool process (``replicas`` 1; more is one) or unload it (0).
        Returns once the load is asked for (the replica connects when it is loaded) or once
        the unload is over."""
        self._start()
        have = self._by_key.get(mv.key)
        if replicas:
            if have is not None and not have.error:
                return
            if have is not None:  # refused before: ask again (a change to the version)
                self._drop(have)
            await self._load(mv)
            return
        if have is not None:
            await self._unload(have)

    async def stop_all(self) -> None:
        # The frontend is stopping: what leaves now was not evicted (nothing to count).
        self._stopping = True
        for r in self._by_key.values():
            r.stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._by_key.clear()

    # -- loading --------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._tasks:
            return
        for member in self.members:
            member.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._tasks.append(
                asyncio.create_task(self._supervise(member), name=f"clipper-pool-{member.index}")
            )

    def _estimate(self, r: PooledReplica) -> int:
        return self._estimates.get(r.token, 0)

    async def _load(self, mv: ModelVersion) -> None:
        assert mv.artifact is not None
        # Placement needs the members: the first loads wait for every one to have started.
        await wait_for(self.clock, self._up.wait(), 30.0)
        loads = [
            MemberLoad(
                m.index,
                m.stdin is not None,
                self.budget_bytes - m.used_bytes(self._estimate),
                len(m.models),
            )
            for m in self.members
        ]
        index = place(loads)
        if index is None:
            raise ReplicaError(
                f"cannot load {mv.name}:{mv.version}: no pool process is running (each is "
                "restarting)"
            )
        member = self.members[index]
        self._generation += 1
        token = f"{mv.name}:{mv.version}:0:{self._run}.p{self._generation}"
        r = PooledReplica(mv.name, mv.version, token, index, member.log_path, pid=member.pid)
        self._estimates[token] = await asyncio.to_thread(artifact_bytes, mv.artifact)
        if self._by_key.get(mv.key) is not None:
            return  # another ensure got there meanwhile
        self._by_key[mv.key] = r
        member.models[token] = r
        member.loads += 1
        self._send(
            member,
            op="load",
            name=mv.name,
            version=mv.version,
            input_type=mv.input_type.readable,
            model_path=mv.artifact,
            token=token,
        )

    async def _unload(self, r: PooledReplica) -> None:
        member = self.members[r.member]
        r.stopping = True
        if member.stdin is not None and not r.error:
            self._send(member, op="unload", token=r.token)
            with contextlib.suppress(TimeoutError):
                await wait_for(self.clock, r.gone.wait(), _UNLOAD_WAIT_S)
        self._drop(r)

    def _drop(self, r: PooledReplica) -> None:
        if self._by_key.get((r.model, r.version)) is r:
            del self._by_key[(r.model, r.version)]
        self.members[r.member].models.pop(r.token, None)
        self._estimates.pop(r.token, None)
        r.gone.set()

    def _send(self, member: _Member, **msg: Any) -> None:
        if member.stdin is None:
            return
        if member.stdin.transport.get_write_buffer_size() > _MAX_BUFFERED:
            # Bounded: a pool process that stopped reading its stdin is hung.
            raise ReplicaError(f"pool process {member.index} does not read its control channel")
        member.stdin.write(orjson.dumps(msg) + b"\n")

    # -- the pool process's answers ----------------------------------------------------------
    def _on_message(self, member: _Member, msg: dict[str, Any]) -> None:
        token = str(msg.get("token", ""))
        r = member.models.get(token)
        op = msg.get("op")
        if isinstance(msg.get("rss"), int):
            member.rss = msg["rss"]
        if r is None:
            return
        if op == "loaded":
            r.loaded, r.bytes = True, int(msg.get("bytes", 0))
            self._estimates.pop(token, None)
        elif op == "refused":
            r.error = str(msg.get("error", "refused"))
            r.restarts = _REFUSED_RESTARTS
            log.warning("pool process %d refused %s:%s: %s", member.index, r.model, r.version,
                        r.error)  # fmt: skip
        elif op == "evicted":
            reason = str(msg.get("reason", ""))
            asked = r.stopping
            self._drop(r)
            if not asked and not self._stopping:
                member.evictions += 1
                log.info("%s:%s left pool process %d: %s", r.model, r.version, member.index,
                         reason)  # fmt: skip
                if self.on_unloaded is not None:
                    self.on_unloaded(r.model, r.version, reason)

    # -- supervision ----------------------------------------------------------------------------
    async def _supervise(self, member: _Member) -> None:
        backoff = BACKOFF_START
        while True:
            started = self.clock.now()
            child = await asyncio.create_subprocess_exec(
                *self._command(member.index),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(),
                limit=_MAX_LINE,
            )
            assert child.stdout is not None and child.stderr is not None
            copier = asyncio.create_task(
                copy_log(child.stderr, RotatingLog(member.log_path, self.log_max_bytes))
            )
            reader = asyncio.create_task(self._read(member, child.stdout))
            member.pid, member.stdin = child.pid, child.stdin
            if all(m.pid is not None for m in self.members):
                self._up.set()
            try:
                code = await child.wait()
            except asyncio.CancelledError:
                await _terminate(child, self.clock)
                reader.cancel()
                await finish_copy(copier, self.clock)
                member.pid, member.stdin = None, None
                raise
            reader.cancel()
            await finish_copy(copier, self.clock)
            member.pid, member.stdin = None, None
            lost = list(member.models.values())
            for r in lost:
                self._drop(r)
                if self.on_exit is not None:
                    self.on_exit(r.token)
                if self.on_unloaded is not None and not r.stopping and not self._stopping:
                    self.on_unloaded(r.model, r.version, f"pool process exited with {code}")
            member.restarts += 1
            wait, backoff = next_backoff(backoff, self.clock.now() - started)
            log.warning(
                "pool process %d exited with %s (%d models lost); restarting in %.1f s (log: %s)",
                member.index, code, len(lost), wait, member.log_path,
            )  # fmt: skip
            await sleep(self.clock, wait)

    async def _read(self, member: _Member, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line over the limit: not from our pool process
                log.warning("pool process %d wrote an over-long control line", member.index)
                continue
            if not line:
                return
            try:
                msg = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.warning("pool process %d: not a control line: %r", member.index, line[:200])
                continue
            if isinstance(msg, dict):
                self._on_message(member, msg)


async def _terminate(child: asyncio.subprocess.Process, clock: Clock) -> None:
    if child.returncode is not None:
        return
    if child.stdin is not None:
        child.stdin.close()  # the pool process drains its models and exits
    try:
        await wait_for(clock, child.wait(), _STOP_GRACE)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0

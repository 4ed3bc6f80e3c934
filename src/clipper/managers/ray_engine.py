"""The Ray container manager (``--manager ray://ADDRESS?namespace=...``): Ray places and supervises
the replicas, ZeroMQ stays the data path.

Each replica slot is a named, detached, restartable actor
(:class:`clipper.managers.ray_replica.ReplicaSupervisor`) called
``clipper/<frontend node id>/<model>/<version>/<slot>`` in the manager's namespace. The name makes
it idempotent: a restarted frontend (same state directory, so the same node id) asks for the same
names and adopts the actors that still run (``get_if_exists``), telling them its current address,
instead of starting duplicates. Actors of its own that it no longer wants (a version deleted, or
scaled down, while it was away) are drained and killed once it has been up for a while.

Every Ray call blocks, so each runs on the manager's own small thread pool, never on the event
loop; the replica view (:meth:`RayManager.replicas`) is what a status poll, every ``poll_s``,
last saw: container pid, state, node, restarts (of the container and of the actor).

Placement (:mod:`clipper.managers.ray_settings`), from the URL's parameters, overridden per
model version by its labels ``ray:<param>=<value>`` (see docs/scale-out.md): ``num_cpus``
(default 1), ``num_gpus``
(fractional shares a GPU), ``resource.<NAME>`` (custom resources), ``node`` (hard affinity to
a node id), ``strategy`` (``default`` or ``spread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from clipper.clock import wait_event
from clipper.errors import ConfigError, ReplicaError
from clipper.managers.base import ContainerManager, ManagerContext
from clipper.managers.ray_settings import Placement, RaySettings, parse_ray_url, version_placement
from clipper.registry import ModelVersion

__all__ = ["RayManager", "RayReplica", "build_ray"]

log = logging.getLogger("clipper.manager")

T = TypeVar("T")

_CALL_TIMEOUT_S = 10.0
_DEAD = "dead"


@dataclass(slots=True)
class RayReplica:
    """One slot as the last status poll saw it (the manager's ReplicaStatus)."""

    model: str
    version: str
    slot: int
    actor_name: str
    token: str = ""
    pid: int | None = None
    restarts: int = 0
    last_exit: int | None = None
    state: str = "starting"
    location: str = "ray"
    node_id: str = ""
    ready: bool = False
    log: str = ""
    # Bookkeeping of the poll: the actor process last seen, and restarts of earlier actors.
    actor_pid: int | None = field(default=None, repr=False)
    actor_restarts: int = 0
    earlier_restarts: int = field(default=0, repr=False)
    container_restarts: int = field(default=0, repr=False)
    misses: int = field(default=0, repr=False)  # polls in a row without an answer
    spec: dict[str, Any] = field(default_factory=dict, repr=False)  # what it should run

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.splitlines()[-lines:])


class RayManager:
    def __init__(self, settings: RaySettings, ctx: ManagerContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="clipper-ray")
        self._groups: dict[tuple[str, str], list[RayReplica]] = {}
        self._handles: dict[str, Any] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._started_at: float | None = None
        self._actor_class: Any = None

    # -- the protocol -------------------------------------------------------------------------

    def replicas(self, name: str, version: str) -> list[RayReplica]:
        return list(self._groups.get((name, version), ()))

    def all_replicas(self) -> list[RayReplica]:
        return [r for group in self._groups.values() for r in group]

    def logs(self, max_bytes: int) -> list[tuple[str, str]]:
        return [
            (f"{r.model}-{r.version}-{r.slot}.log", r.log[-max_bytes:]) for r in self.all_replicas()
        ]

    def log_files(self, name: str, version: str) -> dict[int, Path] | None:
        return None  # the logs live on the Ray nodes, with the actors (a tail: logs())

    async def forget(self, name: str, version: str) -> None:
        await asyncio.sleep(0)  # the logs live with the actors, gone with them

    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        if replicas and mv.artifact is None:
            raise ReplicaError(
                f"model {mv.name}:{mv.version} has no artifact to run; its containers are "
                "started outside clipper-serve"
            )
        placement = version_placement(self.settings.placement, mv)
        await self._call(self._connect)
        self._watch()
        group = self._groups.setdefault(mv.key, [])
        spec = self._spec(mv)
        keys = await asyncio.to_thread(self._keys)
        created = []
        while len(group) < replicas:
            replica = RayReplica(mv.name, mv.version, len(group), self._actor_name(mv, len(group)))
            group.append(replica)
            created.append(replica)
        await asyncio.gather(*(
            self._call(self._create, r.actor_name, spec, keys, placement) for r in created
        ))  # fmt: skip
        for r in group:
            r.spec = spec
        surplus = group[replicas:]
        del group[replicas:]
        # Also what an earlier run of this frontend left beyond the count (adopted, unwanted).
        kept = [r.actor_name for r in group]
        leftovers = await self._call(self._named_beyond, mv, replicas, kept)
        await asyncio.gather(
            *(self._retire(r.actor_name, r.token) for r in surplus),
            *(self._retire(name, "") for name in leftovers if name not in {
                r.actor_name for r in surplus}),
        )  # fmt: skip
        if not group:
            self._groups.pop(mv.key, None)

    async def stop_all(self) -> None:
        """The frontend is stopping: its replicas keep running (detached), so that a restarted
        frontend adopts them; only the status poll and the thread pool stop."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        self._groups.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- on the event loop --------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def _actor_name(self, mv: ModelVersion, slot: int) -> str:
        return f"{self._prefix()}{mv.name}/{mv.version}/{slot}"

    def _prefix(self) -> str:
        return f"clipper/{self.ctx.node_id() or 'frontend'}/"

    def _spec(self, mv: ModelVersion) -> dict[str, Any]:
        return {
            "name": mv.name,
            "version": mv.version,
            "input_type": mv.input_type.readable,
            "host": self.ctx.rpc_host(),
            "port": self.ctx.rpc_port(),
            "heartbeat_interval_s": self.ctx.heartbeat_interval_s,
            "cache_dir": self.settings.cache_dir,
        }

    def _keys(self) -> dict[str, bytes] | None:
        """What a container needs of the CURVE keys (sent through Ray, never on a command
        line): the server's public key and the deployment's client secret key."""
        if self.ctx.rpc_keys is None:
            return None
        return {n: (Path(self.ctx.rpc_keys) / n).read_bytes()
                for n in ("server.key", "client.key_secret")}  # fmt: skip

    async def _retire(self, actor_name: str, token: str) -> None:
        """Drain (the frontend sends it no more batches and waits for those in flight), then
        stop the container and kill the actor for good."""
        if self.ctx.drain is not None and token:
            with contextlib.suppress(Exception):
                await self.ctx.drain(token)
        await self._call(self._kill, actor_name)

    def _watch(self) -> None:
        if self._watcher is None and not self._stopping.is_set():
            self._started_at = self.ctx.clock.now()
            self._watcher = asyncio.create_task(self._poll_forever(), name="clipper-ray-status")

    async def _poll_forever(self) -> None:
        while not await wait_event(self.ctx.clock, self._stopping, self.settings.poll_s):
            replicas = self.all_replicas()
            try:
                seen = await self._call(self._statuses, [r.actor_name for r in replicas])
            except Exception as e:  # the cluster unreachable for a moment: keep the last view
                log.warning("ray status poll failed: %s", e)
                continue
            try:
                for replica, status in zip(replicas, seen, strict=True):
                    self._update(replica, status)
                stale = [
                    (r.actor_name, r.spec) for r, st in zip(replicas, seen, strict=True)
                    if isinstance(st, dict) and r.spec and st.get("spec") != r.spec
                ]  # fmt: skip
                if stale:  # restarted by Ray with an older address: tell it the current one
                    await self._call(self._reconfigure, stale)
                started = self._started_at or 0.0
                if self.ctx.clock.now() - started >= self.settings.sweep_after_s:
                    await self._sweep()
            except Exception:  # the poll must go on: it is the only view of the replicas
                log.exception("ray status poll: updating the replica view failed")

    def _update(self, r: RayReplica, status: dict[str, Any] | str | None) -> None:
        if status is None:
            # No answer in time: a busy node, or an actor Ray is restarting or cannot place
            # (its calls wait for it). Two polls in a row: reported as restarting.
            r.misses += 1
            if r.misses >= 2 and r.state == "running":
                r.state = "restarting"
            return
        r.misses = 0
        if isinstance(status, str):  # the actor is dead or being restarted, or not yet placed
            if r.state != "stopping":
                r.state = "restarting" if r.actor_pid is not None else "starting"
            if r.token and self.ctx.on_exit is not None:
                self.ctx.on_exit(r.token)  # its container went with the actor
            r.pid = None
            return
        if r.actor_pid is not None and status["actor_pid"] != r.actor_pid:
            r.actor_restarts += 1
            r.earlier_restarts += r.container_restarts
        if r.token and status["token"] != r.token and self.ctx.on_exit is not None:
            self.ctx.on_exit(r.token)  # a new container: the old one's connection is dead
        r.actor_pid = status["actor_pid"]
        r.container_restarts = int(status["restarts"])
        r.restarts = r.actor_restarts + r.earlier_restarts + r.container_restarts
        r.token = str(status["token"])
        r.pid = status["pid"]
        r.last_exit = status["last_exit"]
        r.state = str(status["state"])
        r.node_id = str(status["node_id"])
        r.location = f"ray:{r.node_id[:12]}@{status['node_ip']}"
        r.ready = bool(status["ready"])
        r.log = str(status["log"])

    async def _sweep(self) -> None:
        """Kill this frontend's actors of versions it no longer runs (deleted, or scaled to 0,
        while it was away); it has been up long enough to have ensured every version."""
        wanted = {r.actor_name for r in self.all_replicas()}
        try:
            names = await self._call(self._own_names)
        except Exception:
            return
        stale = [n for n in names if n not in wanted and tuple(
            n.removeprefix(self._prefix()).split("/")[:2]) not in self._groups]  # fmt: skip
        for name in stale:
            log.info("ray actor %s belongs to no version this frontend runs: retired", name)
        await asyncio.gather(*(self._retire(n, "") for n in stale))

    # -- in the thread pool (Ray blocks) ------------------------------------------------------

    def _connect(self) -> None:
        import ray

        from clipper.managers.ray_replica import ReplicaSupervisor

        if not ray.is_initialized():
            ray.init(
                address=self.settings.address,
                namespace=self.settings.namespace,
                log_to_driver=False,
                configure_logging=False,
            )
        if self._actor_class is None:
            self._actor_class = ray.remote(ReplicaSupervisor)

    def _create(self, actor_name: str, spec: dict[str, Any], keys: dict[str, bytes] | None,
                placement: Placement) -> None:  # fmt: skip
        import ray

        handle = self._actor_class.options(
            name=actor_name,
            namespace=self.settings.namespace,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=0,
            max_concurrency=4,  # a status poll is answered while stop() waits
            **placement.options(),
        ).remote(actor_name, spec, keys)
        self._handles[actor_name] = handle
        # Adopted (it ran before this frontend started): tell it our address. A new actor
        # already has it; this call then also waits until it is placed (bounded). One not
        # placed yet, or restarting, gets it when it runs; the status poll reports it meanwhile.
        with contextlib.suppress(ray.exceptions.GetTimeoutError, ray.exceptions.RayError):
            ray.get(handle.configure.remote(spec), timeout=_CALL_TIMEOUT_S)

    def _reconfigure(self, stale: list[tuple[str, dict[str, Any]]]) -> None:
        import ray

        for actor_name, spec in stale:
            with contextlib.suppress(ValueError, ray.exceptions.RayError):
                self._handle(actor_name).configure.remote(spec)  # not waited for

    def _handle(self, actor_name: str) -> Any:
        import ray

        handle = self._handles.get(actor_name)
        if handle is None:
            handle = ray.get_actor(actor_name, namespace=self.settings.namespace)
            self._handles[actor_name] = handle
        return handle

    def _kill(self, actor_name: str) -> None:
        import ray

        try:
            handle = self._handle(actor_name)
        except ValueError:
            return  # already gone
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(handle.stop.remote(self.settings.stop_timeout_s),
                    timeout=self.settings.stop_timeout_s + _CALL_TIMEOUT_S)  # fmt: skip
        with contextlib.suppress(ValueError, ray.exceptions.RayError):
            ray.kill(handle, no_restart=True)
        self._handles.pop(actor_name, None)

    def _statuses(self, names: list[str]) -> list[dict[str, Any] | str | None]:
        """Per actor: its status, ``"dead"`` (gone or being restarted by Ray), or None (no
        answer within a poll period: a busy node; nothing is concluded from it)."""
        import ray

        refs: list[Any] = []
        for name in names:
            try:
                refs.append(self._handle(name).status.remote())
            except (ValueError, ray.exceptions.RayError):
                refs.append(None)
        pending = [ref for ref in refs if ref is not None]
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=self.settings.poll_s)
        done = set(ready)
        out: list[dict[str, Any] | str | None] = []
        for ref in refs:
            if ref is None:
                out.append(_DEAD)
            elif ref not in done:
                out.append(None)
            else:
                try:
                    out.append(ray.get(ref))
                except ray.exceptions.RayError:
                    out.append(_DEAD)
        return out

    def _own_names(self) -> list[str]:
        import ray.util

        prefix = self._prefix()
        return [str(a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)
                if a.get("namespace") == self.settings.namespace
                and str(a["name"]).startswith(prefix)]  # fmt: skip

    def _named_beyond(self, mv: ModelVersion, count: int, keep: list[str]) -> list[str]:
        """This version's actors of an earlier run at slots >= ``count``."""
        stem = f"{self._prefix()}{mv.name}/{mv.version}/"
        out = []
        for name in self._own_names():
            slot = name.removeprefix(stem)
            if name.startswith(stem) and slot.isdigit() and int(slot) >= count and name not in keep:
                out.append(name)
        return out


def build_ray(rest: str, ctx: ManagerContext) -> ContainerManager:
    """``ray://ADDRESS?...`` (the MANAGERS table); Ray itself is imported on first use."""
    settings = parse_ray_url(rest)
    try:
        import ray
    except ImportError:
        ray = None
    # A directory named ray on sys.path (Ray's own /tmp/ray, with the cwd /tmp) imports as an
    # empty namespace package: not Ray either.
    if getattr(ray, "init", None) is None:
        raise ConfigError("the ray:// manager needs Ray: pip install 'clipper-serve[ray]'")
    return RayManager(settings, ctx)

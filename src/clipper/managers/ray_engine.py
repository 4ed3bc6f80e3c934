"""The Ray container manager (``--manager ray://ADDRESS?namespace=...``): Ray places and supervises
the replicas, ZeroMQ stays the data path.

Each replica slot is a named, detached, restartable actor
(:class:`clipper.managers.ray_replica.ReplicaSupervisor`) called
``clipper/<frontend node id>/<model>/<version>/<slot>[.<generation>]`` in the manager's
namespace. The name makes it idempotent: a restarted frontend (same state directory, so the same
node id) finds its actors by name and adopts those that still run (``get_if_exists``), telling
them its current address, instead of starting duplicates. Actors of its own that it no longer
wants (a version deleted, or scaled down, while it was away) are drained and killed once it has
been up for a while.

Each new actor is pinned to the node the planner (:mod:`clipper.managers.ray_spread`) chose
(``NodeAffinitySchedulingStrategy(node, soft=False)``), within the version's per-node limit. A
replica whose node died is re-placed at once (a new generation on another node); one with no
node to go to waits unplaced, its status saying why. Once the set of alive nodes has stayed the
same ``settle_s``, a version spread unevenly (a node came back, or a new one joined) has one
replica at a time moved: a replacement started on the emptier node, and only once it is
connected to this frontend is the old one drained and retired.

Every Ray call blocks (:mod:`clipper.managers.ray_actors`), so each runs on the manager's own
small thread pool, never on the event loop; the replica view (:meth:`RayManager.replicas`) is
what a status poll, every ``poll_s``, last saw: container pid, state, node, restarts (of the
container and of the actor).

Placement (:mod:`clipper.managers.ray_settings`), from the URL's parameters, overridden per
model version by its labels ``ray:<param>=<value>`` (see docs/scale-out.md): ``num_cpus``
(default 1), ``num_gpus``
(fractional shares a GPU), ``resource.<NAME>`` (custom resources), ``node`` (hard affinity to
a node id), ``strategy`` (``default`` or ``spread``), ``max_per_node`` (the hard per-node
limit).
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
from clipper.managers.ray_actors import GONE, RayActors, actor_name
from clipper.managers.ray_settings import Placement, RaySettings, parse_ray_url, version_placement
from clipper.managers.ray_spread import Move, NodeState, plan_spread
from clipper.registry import ModelVersion

__all__ = ["RayManager", "RayReplica", "build_ray"]

log = logging.getLogger("clipper.manager")

T = TypeVar("T")

Key = tuple[str, str]


@dataclass(slots=True)
class RayReplica:
    """One slot as the last status poll saw it (the manager's ReplicaStatus)."""

    model: str
    version: str
    slot: int
    actor_name: str
    generation: int = 0  # 0: the slot's first actor; +1 for each that replaced it
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
    # Placement: whether an actor was asked for, on which node (the planner's choice; "" for
    # an adopted one until its status says), and why it waits when it has none.
    placed: bool = True
    target: str = ""
    waiting: str = ""
    placed_at: float = field(default=0.0, repr=False)  # when its actor was asked for

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.splitlines()[-lines:])


@dataclass(slots=True)
class _Wanted:
    """What a version's replicas run and reserve (from its last ensure)."""

    placement: Placement
    spec: dict[str, Any]
    keys: dict[str, bytes] | None


class RayManager:
    def __init__(self, settings: RaySettings, ctx: ManagerContext) -> None:
        self.settings = settings
        self.ctx = ctx
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="clipper-ray")
        self._actors = RayActors(
            settings.namespace, stop_timeout_s=settings.stop_timeout_s, poll_s=settings.poll_s
        )
        self._groups: dict[Key, list[RayReplica]] = {}
        self._wanted: dict[Key, _Wanted] = {}
        self._locks: dict[Key, asyncio.Lock] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._mover: asyncio.Task[None] | None = None
        self._moving: set[str] = set()  # replacements being started by the mover
        self._stopping = asyncio.Event()
        self._started_at: float | None = None
        self._alive: frozenset[str] | None = None  # the alive nodes the last poll saw
        self._nodes_changed_at = 0.0
        self._no_node_view = False
        # Nodes where a pinned actor did not start within start_timeout_s: not chosen for a
        # new actor until the time given (a hung raylet, resources Ray will not free).
        self._avoid: dict[str, float] = {}

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
        await self._call(self._actors.connect, self.settings.address)
        self._watch()
        spec = self._spec(mv)
        keys = await asyncio.to_thread(self._keys)
        stem = self._stem(mv.name, mv.version)
        async with self._lock(mv.key):
            group = self._groups.setdefault(mv.key, [])
            wanted = self._wanted[mv.key] = _Wanted(placement, spec, keys)
            adopted: list[RayReplica] = []
            if len(group) < replicas:
                # An earlier run's actors (any generation) are adopted, the newest of a slot.
                existing = await self._call(self._actors.versions_actors, stem)
                while len(group) < replicas:
                    slot = len(group)
                    if existing.get(slot):
                        generation, name = max(existing[slot])
                        group.append(RayReplica(mv.name, mv.version, slot, name, generation))
                        adopted.append(group[-1])
                    else:
                        name = actor_name(stem, slot, 0)
                        group.append(RayReplica(mv.name, mv.version, slot, name, placed=False))
            for r in group:
                r.spec = spec
            surplus = group[replicas:]
            del group[replicas:]
            await asyncio.gather(*(
                self._call(self._actors.create, r.actor_name, spec, keys, placement.options())
                for r in adopted
            ))  # fmt: skip
            if any(not r.placed for r in group):
                await self._place(mv.key, await self._node_view())
            # Also what an earlier run of this frontend left (beyond the count, or an older
            # generation of a slot): adopted, unwanted.
            kept = {r.actor_name for r in group} | self._moving
            gone = {r.actor_name for r in surplus}
            leftovers = [
                n for n in await self._call(self._actors.names, stem)
                if n not in kept and n not in gone
            ]  # fmt: skip
            await asyncio.gather(
                *(self._retire(r.actor_name, r.token) for r in surplus),
                *(self._retire(name, "") for name in leftovers),
            )
            if not group:
                self._groups.pop(mv.key, None)
                if self._wanted.get(mv.key) is wanted:
                    self._wanted.pop(mv.key, None)

    async def stop_all(self) -> None:
        """The frontend is stopping: its replicas keep running (detached), so that a restarted
        frontend adopts them; only the status poll, a move under way and the thread pool
        stop (a replacement already started is adopted with the others)."""
        self._stopping.set()
        for task in (self._watcher, self._mover):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watcher = self._mover = None
        self._groups.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- on the event loop --------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def _lock(self, key: Key) -> asyncio.Lock:
        """One version's placement at a time: ensure, the poll's re-placing, a move's swap."""
        return self._locks.setdefault(key, asyncio.Lock())

    def _stem(self, model: str, version: str) -> str:
        return f"{self._prefix()}{model}/{version}/"

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

    async def _retire(self, name: str, token: str) -> None:
        """Drain (the frontend sends it no more batches and waits for those in flight), then
        stop the container and kill the actor for good."""
        if self.ctx.drain is not None and token:
            with contextlib.suppress(Exception):
                await self.ctx.drain(token)
        await self._call(self._actors.kill, name, True)

    def _watch(self) -> None:
        if self._watcher is None and not self._stopping.is_set():
            self._started_at = self.ctx.clock.now()
            self._watcher = asyncio.create_task(self._poll_forever(), name="clipper-ray-status")

    async def _poll_forever(self) -> None:
        while not await wait_event(self.ctx.clock, self._stopping, self.settings.poll_s):
            await self._poll_once()

    async def _poll_once(self) -> None:
        """One status poll: the replica view, then placement (:meth:`_keep_placement`)."""
        replicas = [r for r in self.all_replicas() if r.placed]
        try:
            seen = await self._call(self._actors.statuses, [r.actor_name for r in replicas])
        except Exception as e:  # the cluster unreachable for a moment: keep the last view
            log.warning("ray status poll failed: %s", e)
            return
        try:
            for replica, status in zip(replicas, seen, strict=True):
                self._update(replica, status)
            stale = [
                (r.actor_name, r.spec) for r, st in zip(replicas, seen, strict=True)
                if isinstance(st, dict) and r.spec and st.get("spec") != r.spec
            ]  # fmt: skip
            if stale:  # restarted by Ray with an older address: tell it the current one
                await self._call(self._actors.reconfigure, stale)
            await self._keep_placement(replicas, seen)
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
        wanted = {r.actor_name for r in self.all_replicas()} | self._moving
        try:
            names = await self._call(self._actors.names, self._prefix())
        except Exception:
            return
        stale = [n for n in names if n not in wanted and tuple(
            n.removeprefix(self._prefix()).split("/")[:2]) not in self._groups]  # fmt: skip
        for name in stale:
            log.info("ray actor %s belongs to no version this frontend runs: retired", name)
        await asyncio.gather(*(self._retire(n, "") for n in stale))

    # -- placement ----------------------------------------------------------------------------

    async def _node_view(self) -> list[NodeState] | None:
        """The nodes now; None without a node table (Ray then places the actors itself)."""
        if self._no_node_view:
            return None
        try:
            nodes = await self._call(self._actors.nodes)
        except Exception as e:
            log.warning("ray node view failed: %s; Ray places the actors itself", e)
            return None
        if nodes is None:
            self._no_node_view = True
            log.warning("this Ray has no node table: Ray places the actors itself, no limit")
        return nodes

    def _with_reservations(self, nodes: list[NodeState]) -> list[NodeState]:
        """``nodes`` less what this manager's actors placed but not yet running will take (the
        cluster's free view does not count them yet; counting them twice only delays)."""
        pending: dict[str, dict[str, float]] = {}
        for key, group in self._groups.items():
            wanted = self._wanted.get(key)
            demand = wanted.placement.demand() if wanted is not None else {}
            for r in group:
                if r.placed and r.target and r.actor_pid is None:
                    held = pending.setdefault(r.target, {})
                    for k, v in demand.items():
                        held[k] = held.get(k, 0.0) + v
        out = []
        for n in nodes:
            free = dict(n.free)
            for k, v in pending.get(n.node_id, {}).items():
                free[k] = free.get(k, 0.0) - v
            out.append(NodeState(n.node_id, n.alive, n.total, free))
        return out

    async def _place(self, key: Key, nodes: list[NodeState] | None) -> None:
        """Under the version's lock: an actor, on the planner's node, for each of its slots
        that has none; a slot with no node to go to waits, its status saying why."""
        group = self._groups.get(key, [])
        wanted = self._wanted.get(key)
        todo = [r for r in group if not r.placed]
        if not todo or wanted is None:
            return
        placement = wanted.placement
        chosen: dict[int, str] = {}
        if nodes is None:  # Ray's own placement, as before the planner
            chosen = {r.slot: "" for r in todo}
        else:
            plan = plan_spread(
                self._with_reservations(nodes),
                placement.demand(),
                {r.slot: (r.node_id or r.target) if r.placed else None for r in group},
                max_per_node=placement.max_per_node,
                pinned=placement.node,
            )
            chosen = dict(plan.placed)
            for r in todo:
                reason = plan.waiting.get(r.slot)
                if reason is None:
                    continue
                if r.waiting != reason:
                    log.warning("ray replica %s:%s slot %d is not placed: %s",
                                r.model, r.version, r.slot, reason)  # fmt: skip
                r.waiting, r.location, r.log = reason, "ray:unplaced", f"not placed: {reason}"
        placing = [r for r in todo if r.slot in chosen]
        now = self.ctx.clock.now()
        for r in placing:
            r.target, r.waiting, r.location = chosen[r.slot], "", "ray"
            r.placed_at = now
        await asyncio.gather(*(
            self._call(self._actors.create, r.actor_name, wanted.spec, wanted.keys,
                       placement.options(r.target or None))
            for r in placing
        ))  # fmt: skip
        for r in placing:  # the status poll judges it from now on
            r.placed = True

    async def _keep_placement(
        self, polled: list[RayReplica], seen: list[dict[str, Any] | str | None]
    ) -> None:
        """After a status poll: re-place at once each replica whose actor is gone or whose
        node died, place those still waiting, and, once the nodes have settled, start moving
        one replica toward the spread."""
        nodes = await self._node_view()
        alive = None if nodes is None else {n.node_id for n in nodes if n.alive}
        now = self.ctx.clock.now()
        lost: dict[Key, list[RayReplica]] = {}
        for r, status in zip(polled, seen, strict=True):
            node = r.node_id or r.target
            if status == GONE or (alive is not None and node and node not in alive):
                lost.setdefault((r.model, r.version), []).append(r)
            elif self._never_started(r, status, now):
                timeout = self.settings.start_timeout_s
                log.warning("ray replica %s:%s slot %d has not started on node %s in %g s: "
                            "placing it again, avoiding that node for as long",
                            r.model, r.version, r.slot, r.target[:12], timeout)  # fmt: skip
                self._avoid[r.target] = now + timeout
                lost.setdefault((r.model, r.version), []).append(r)
        self._avoid = {n: until for n, until in self._avoid.items() if until > now}
        placeable = nodes
        if nodes is not None and self._avoid:
            placeable = [
                NodeState(n.node_id, n.alive and n.node_id not in self._avoid, n.total, n.free)
                for n in nodes
            ]
        waiting = {k for k, g in self._groups.items() if any(not r.placed for r in g)}
        dead: list[str] = []
        for key in sorted(set(lost) | waiting):
            lock = self._lock(key)
            if lock.locked():  # an ensure of it under way places it; next poll otherwise
                continue
            async with lock:
                group = self._groups.get(key, [])
                dead.extend(
                    self._lose(r) for r in lost.get(key, [])
                    if r.placed and any(x is r for x in group)
                )  # fmt: skip
                await self._place(key, placeable)
        await asyncio.gather(*(self._call(self._actors.kill, name, False) for name in dead))
        if alive is None or nodes is None:
            return
        if frozenset(alive) != self._alive:
            if self._alive is not None:
                log.info("ray nodes changed: %d alive (+%d, -%d); moves wait %g s",
                         len(alive), len(alive - self._alive), len(self._alive - alive),
                         self.settings.settle_s)  # fmt: skip
            self._alive, self._nodes_changed_at = frozenset(alive), now
        if self._mover is not None or now - self._nodes_changed_at < self.settings.settle_s:
            return
        for key in sorted(self._groups):
            move = self._move_for(key, nodes)
            if move is not None:
                self._mover = asyncio.create_task(self._move(key, move), name="clipper-ray-move")
                return

    def _never_started(
        self, r: RayReplica, status: dict[str, Any] | str | None, now: float
    ) -> bool:
        """An actor pinned to a live node that has not started in ``start_timeout_s``: Ray
        keeps a hard-affinity actor pending for ever rather than run it elsewhere."""
        return (
            r.placed
            and bool(r.target)
            and r.actor_pid is None
            and not isinstance(status, dict)
            and r.placed_at > 0.0
            and now - r.placed_at >= self.settings.start_timeout_s
        )

    def _lose(self, r: RayReplica) -> str:
        """``r``'s actor is gone or its node died: a new generation of the slot, to be placed
        (returns the old actor's name, to kill for good)."""
        old = r.actor_name
        log.warning("ray replica %s:%s slot %d lost (node %s): placing it again",
                    r.model, r.version, r.slot, (r.node_id or r.target)[:12])  # fmt: skip
        if r.token and self.ctx.on_exit is not None:
            self.ctx.on_exit(r.token)
        r.generation += 1
        r.actor_name = actor_name(self._stem(r.model, r.version), r.slot, r.generation)
        if r.actor_pid is not None:
            r.actor_restarts += 1
        r.earlier_restarts += r.container_restarts
        r.container_restarts = 0
        r.restarts = r.actor_restarts + r.earlier_restarts
        r.placed, r.target, r.node_id, r.token = False, "", "", ""
        r.actor_pid, r.pid, r.ready, r.state = None, None, False, "restarting"
        return old

    def _move_for(self, key: Key, nodes: list[NodeState]) -> Move | None:
        """The one move the planner wants for a version all of whose replicas run, are
        placed on a known node and are connected (nothing is moved while one starts)."""
        group = self._groups.get(key)
        wanted = self._wanted.get(key)
        if not group or wanted is None:
            return None
        connected = self.ctx.connected
        for r in group:
            if not r.placed or not r.node_id or r.state != "running":
                return None
            if connected is not None and not connected(r.token):
                return None
        placement = wanted.placement
        plan = plan_spread(
            self._with_reservations(nodes),
            placement.demand(),
            {r.slot: r.node_id for r in group},
            max_per_node=placement.max_per_node,
            pinned=placement.node,
            rebalance=True,
        )
        return plan.move

    async def _move(self, key: Key, move: Move) -> None:
        try:
            await self._move_one(key, move)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ray: moving a replica of %s:%s failed", *key)
        finally:
            self._mover = None

    async def _move_one(self, key: Key, move: Move) -> None:
        """Start the slot's replacement on the target node; once it is connected, put it in
        the slot's place and drain and retire the old one (so no query is lost)."""
        started = self.ctx.clock.now()
        async with self._lock(key):
            wanted = self._wanted.get(key)
            old = next((r for r in self._groups.get(key, [])
                        if r.slot == move.slot and r.node_id == move.source), None)  # fmt: skip
            if old is None or wanted is None:
                return
            generation = old.generation + 1
            name = actor_name(self._stem(*key), move.slot, generation)
            self._moving.add(name)
        log.info("ray: moving %s:%s slot %d from node %s to node %s (spread)",
                 *key, move.slot, move.source[:12], move.target[:12])  # fmt: skip
        status: dict[str, Any] | None = None
        try:
            await self._call(self._actors.create, name, wanted.spec, wanted.keys,
                             wanted.placement.options(move.target))  # fmt: skip
            status = await self._until_connected(name)
            async with self._lock(key):
                group = self._groups.get(key, [])
                at = next((i for i, r in enumerate(group) if r is old), None)
                if status is not None and at is not None:
                    new = RayReplica(*key, move.slot, name, generation, target=move.target,
                                     spec=old.spec, earlier_restarts=old.restarts)  # fmt: skip
                    self._update(new, status)
                    group[at] = new
                else:
                    status = None
        finally:
            self._moving.discard(name)
        if status is None:  # not connected in time, or the slot went meanwhile
            await self._call(self._actors.kill, name, True)
            if not self._stopping.is_set():
                log.warning("ray: the replacement of %s:%s slot %d on node %s did not connect "
                            "in %g s: retired; tried again after the nodes settle", *key,
                            move.slot, move.target[:12], self.settings.start_timeout_s)  # fmt: skip
                self._nodes_changed_at = self.ctx.clock.now()
            return
        await self._retire(old.actor_name, old.token)
        log.info("ray: moved %s:%s slot %d to node %s in %.1f s",
                 *key, move.slot, move.target[:12], self.ctx.clock.now() - started)  # fmt: skip

    async def _until_connected(self, name: str) -> dict[str, Any] | None:
        """The new actor's status once its container is connected to this frontend; None
        after ``start_timeout_s`` or when the frontend stops."""
        deadline = self.ctx.clock.now() + self.settings.start_timeout_s
        while not self._stopping.is_set():
            [status] = await self._call(self._actors.statuses, [name])
            if isinstance(status, dict) and status.get("token"):
                token = str(status["token"])
                check = self.ctx.connected
                if check(token) if check is not None else bool(status.get("ready")):
                    return status
            if status == GONE or self.ctx.clock.now() >= deadline:
                return None
            await wait_event(self.ctx.clock, self._stopping, self.settings.poll_s)
        return None


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

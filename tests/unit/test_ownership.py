"""Shared replicas, frontend side, without a process or real time: the owner lease and the live
frontends (:class:`Ownership` on a memory store and a FakeClock), the reconciler's gate (only
the owner calls the manager; a new owner adopts first), and the local manager's shared mode
(command line, records in the store, adoption, retire, detach) with fake child processes."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from clipper.batching.scheduler import ModelScheduler
from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.managers.local import LocalManager
from clipper.managers.shared import SharedReplicas
from clipper.persistence import StoreSync
from clipper.registry import ModelVersion, Registry
from clipper.runtime.catalog import Catalog, SchedulerTable
from clipper.runtime.control import Control
from clipper.runtime.ownership import FRONTENDS, LEASE, Ownership
from clipper.runtime.reconciler import Reconciler
from clipper.store import MemoryStore, StoreError
from tests.unit.test_local_manager import FakeChild
from tests.unit.test_runtime import FakeManager, FakeScheduler, turns

MV = ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, artifact="/a")


class Feed:
    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.sockets: list[dict[str, str]] = []

    def set_frontends(
        self, addresses: Sequence[str], local: Mapping[str, str] | None = None
    ) -> None:
        self.sent.append(list(addresses))
        self.sockets.append(dict(local or {}))


def ownership(
    store: MemoryStore,
    clock: FakeClock,
    node: str,
    port: int,
    feed: object | None = None,
    *,
    local: str | None = None,
) -> Ownership:
    return Ownership(
        store,
        node_id=lambda: node,
        address=lambda: f"tcp://127.0.0.1:{port}",
        clock=clock,
        shared=True,
        ttl_s=3.0,
        announce_s=1.0,
        feed=feed,
        local=lambda: local,
    )


async def tick(clock: FakeClock, seconds: float) -> None:
    """Move the clock a second at a time, letting each woken loop run."""
    for _ in range(round(seconds)):
        await turns(50)  # loops woken before arm their next timer from now
        clock.advance(1.0)
        await turns(50)


@pytest.fixture
async def store_clock() -> tuple[MemoryStore, FakeClock]:
    clock = FakeClock(start=0.0)
    store = MemoryStore(clock=clock)
    await store.open()
    return store, clock


# -- the lease and the live frontends ------------------------------------------------------------


async def test_one_frontend_owns_and_every_frontend_sees_all_addresses(
    store_clock: tuple[MemoryStore, FakeClock],
) -> None:
    store, clock = store_clock
    feed_a, feed_b = Feed(), Feed()
    a = ownership(store, clock, "a", 7000, feed_a)
    b = ownership(store, clock, "b", 7001, feed_b)
    await a.start()
    await b.start()
    try:
        assert a.is_owner and not b.is_owner
        assert b.owner == a.holder and a.owner == a.holder
        await tick(clock, 1)
        both = ["tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"]
        assert a.frontends == both and b.frontends == both
        assert feed_a.sent[-1] == both and feed_b.sent[-1] == both
        assert await a.others() == ["tcp://127.0.0.1:7001"]
        status = b.describe()
        assert status["owner"] == a.holder and status["is_owner"] is False
        assert status["shared_replicas"] is True and status["frontends"] == both
    finally:
        await a.stop()
        await b.stop()


async def test_frontends_with_a_unix_socket_announce_it_and_the_feed_gets_them(
    store_clock: tuple[MemoryStore, FakeClock],
) -> None:
    # Replicas on a frontend's machine dial its private socket (clipper.container.dial): the
    # feed gets each live frontend's socket by its TCP address; one without a socket (or with
    # a value that is no ipc:/// address) is simply absent.
    store, clock = store_clock
    feed = Feed()
    a = ownership(store, clock, "a", 7000, local="ipc:///tmp/a/rpc")
    b = ownership(store, clock, "b", 7001, feed)
    c = ownership(store, clock, "c", 7002, local="tcp://127.0.0.1:9")
    for o in (a, b, c):
        await o.start()
    try:
        await tick(clock, 1)
        assert feed.sent[-1] == [f"tcp://127.0.0.1:{p}" for p in (7000, 7001, 7002)]
        assert feed.sockets[-1] == {"tcp://127.0.0.1:7000": "ipc:///tmp/a/rpc"}
        await a.stop()
        await tick(clock, 4)  # a's announcement expires: its socket goes with it
        assert feed.sent[-1] == ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002"]
        assert feed.sockets[-1] == {}
    finally:
        for o in (a, b, c):
            await o.stop()


async def test_a_dead_owners_lease_expires_and_another_frontend_takes_it(
    store_clock: tuple[MemoryStore, FakeClock],
) -> None:
    store, clock = store_clock
    a = ownership(store, clock, "a", 7000)
    b = ownership(store, clock, "b", 7001)
    changes: list[bool] = []
    b.subscribe(changes.append)
    await a.start()
    await b.start()
    await tick(clock, 2)
    await a.stop()  # dies: renews nothing, releases nothing
    await tick(clock, 1)
    assert not b.is_owner  # the lease (3 s, last renewed within the last 2 s) still runs
    await tick(clock, 3)
    assert b.is_owner and changes == [True]
    await tick(clock, 3)  # a's address expired from the list too
    assert b.frontends == ["tcp://127.0.0.1:7001"]
    await b.stop()


async def test_a_released_lease_is_taken_at_the_next_announcement(
    store_clock: tuple[MemoryStore, FakeClock],
) -> None:
    store, clock = store_clock
    a = ownership(store, clock, "a", 7000)
    b = ownership(store, clock, "b", 7001)
    await a.start()
    await b.start()
    await a.stop()
    await a.withdraw()
    await a.release()
    assert not a.is_owner
    await tick(clock, 1)
    assert b.is_owner
    assert set(await store.live(FRONTENDS)) == {b.holder}
    await b.stop()


async def test_a_restarted_frontend_with_the_same_node_id_is_a_new_claimant(
    store_clock: tuple[MemoryStore, FakeClock],
) -> None:
    store, clock = store_clock
    first = ownership(store, clock, "a", 7000)
    await first.start()
    await first.stop()  # killed
    again = ownership(store, clock, "a", 7000)
    await again.start()
    # Not the holder of its predecessor's lease: it waits for it like anyone else.
    assert again.holder != first.holder and not again.is_owner
    await tick(clock, 3)
    assert again.is_owner
    await again.stop()


class FailingStore(MemoryStore):
    failing = False

    async def claim(self, name: str, holder: str, ttl_s: float) -> Any:
        if self.failing:
            raise StoreError("unreachable")
        return await super().claim(name, holder, ttl_s)


async def test_an_owner_that_cannot_renew_stops_owning_when_its_lease_runs_out() -> None:
    clock = FakeClock(start=0.0)
    store = FailingStore(clock=clock)
    await store.open()
    a = ownership(store, clock, "a", 7000)
    await a.start()
    assert a.is_owner
    store.failing = True
    await tick(clock, 2)
    assert a.is_owner  # the lease it renewed at 0 s lasts until 3 s
    await tick(clock, 1)
    assert not a.is_owner
    store.failing = False
    await tick(clock, 1)
    assert a.is_owner
    await a.stop()


async def test_without_sharing_a_frontend_owns_its_replicas_and_writes_nothing() -> None:
    clock = FakeClock(start=0.0)
    store = MemoryStore(clock=clock)
    await store.open()
    own = Ownership(
        store,
        node_id=lambda: "a",
        address=lambda: "tcp://127.0.0.1:7000",
        clock=clock,
        shared=False,
    )
    await own.start()
    assert own.is_owner and own.frontends == ["tcp://127.0.0.1:7000"]
    assert await store.live(FRONTENDS) == {}
    assert (await store.claim(LEASE, "other", 3.0)).holder == "other"
    assert own.describe()["shared_replicas"] is False
    await own.stop()


# -- the reconciler's gate -----------------------------------------------------------------------


@dataclass
class AdoptingManager(FakeManager):
    adopted: list[Callable[[str, str], bool]] = field(default_factory=list)
    detached: int = 0

    async def adopt(self, wanted: Callable[[str, str], bool]) -> None:
        await asyncio.sleep(0)
        self.adopted.append(wanted)

    def detach(self) -> None:
        self.detached += 1


async def gated() -> tuple[Control, Reconciler, AdoptingManager, Registry]:
    store = MemoryStore()
    await store.open()
    registry = Registry()
    manager = AdoptingManager()
    schedulers = SchedulerTable()
    sync = StoreSync(registry, store)
    reconciler = Reconciler(
        registry,
        manager,
        schedulers,
        clock=FakeClock(),
        make_scheduler=lambda mv, slo: cast(ModelScheduler, FakeScheduler(mv, slo)),
        remove_replicas=lambda sched: None,
        acting=False,
    )
    control = Control(
        registry, sync, reconciler, Catalog(registry, schedulers), manager, node_id="a"
    )
    await sync.start()
    await control.recover()
    reconciler.resume()
    return control, reconciler, manager, registry


def mv(n: int = 2) -> ModelVersion:
    return ModelVersion("m", "1", InputType.DOUBLES, artifact="/models/m/1", num_replicas=n)


async def test_only_the_owner_calls_the_manager_and_a_new_owner_adopts_first() -> None:
    control, reconciler, manager, _ = await gated()
    await control.deploy(mv(), set_current=False, wait=False)
    await reconciler.settled("m", "1")  # not the owner: nothing to wait for
    await turns()
    assert manager.calls == [] and not reconciler.acting
    reconciler.set_owner(True)
    await turns(50)
    await reconciler.settled("m", "1")
    assert len(manager.adopted) == 1
    assert manager.adopted[0]("m", "1") and not manager.adopted[0]("m", "2")
    assert manager.calls == [("m", "1", 2)] and manager.running == {("m", "1"): 2}
    reconciler.set_owner(False)
    assert manager.detached == 1
    await control.scale("m", 3, "1", wait=False)
    await turns(50)
    assert manager.calls == [("m", "1", 2)]  # lost the lease: never acts, never kills
    reconciler.set_owner(True)  # the scale made while not owning is converged on taking over
    await turns(50)
    await reconciler.settled("m", "1")
    assert manager.calls[-1] == ("m", "1", 3) and len(manager.adopted) == 2
    await reconciler.stop()


async def test_a_non_owner_still_closes_a_deleted_versions_scheduler() -> None:
    control, reconciler, manager, _ = await gated()
    await control.deploy(mv(1), set_current=False, wait=False)
    await turns()
    sched = reconciler.schedulers.get(("m", "1"))
    assert sched is not None
    await control.delete_version("m", "1")
    await turns(50)
    assert cast(FakeScheduler, sched).closed is not None
    assert manager.calls == []
    await reconciler.stop()


# -- the local manager, shared -------------------------------------------------------------------


class SharedChild(FakeChild):
    pids = itertools.count(5000)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.pid = next(self.pids)


class SharedSpawner:
    """Stands in for ``asyncio.create_subprocess_exec``; keeps each call's arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.children: list[SharedChild] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> SharedChild:
        self.calls.append((args, kwargs))
        child = SharedChild(exit_code=None, ignores_term=False, eof=True)
        self.children.append(child)
        return child


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (the fake clock stands still; a log file is opened on a real
    thread, so real time must pass); bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.001)


@pytest.fixture
def spawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[SharedSpawner]:
    spawner = SharedSpawner()
    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawner)
    yield spawner


@dataclass
class Peers:
    """The frontend side a shared manager calls: who is connected here, what was retired."""

    connected: set[str] = field(default_factory=set)
    retired: list[str] = field(default_factory=list)
    frontends: list[str] = field(
        default_factory=lambda: ["tcp://127.0.0.1:7000", "tcp://10.0.0.2:7000"]
    )

    def retire(self, token: str) -> bool:
        if token not in self.connected:
            return False
        self.retired.append(token)
        return True


async def shared_manager(
    tmp_path: Path, clock: FakeClock, peers: Peers
) -> tuple[LocalManager, MemoryStore]:
    store = MemoryStore(clock=clock)
    await store.open()
    shared = SharedReplicas(
        store=store,
        frontends=lambda: peers.frontends,
        connected=peers.connected.__contains__,
        retire=peers.retire,
        grace_s=6.0,
    )
    m = LocalManager(
        rpc_host=lambda: "127.0.0.1",
        rpc_port=lambda: 7000,
        state_dir=tmp_path,
        clock=clock,
        heartbeat_interval_s=0.5,
        shared=shared,
    )
    return m, store


async def test_a_shared_replica_dials_every_frontend_in_its_own_session_and_is_recorded(
    tmp_path: Path, spawn: SharedSpawner
) -> None:
    clock = FakeClock(start=0.0)
    peers = Peers()
    m, store = await shared_manager(tmp_path, clock, peers)
    await m.ensure(MV, 2)
    await until(lambda: len(m.all_replicas()) == 2 and all(p.pid for p in m.all_replicas()), "2")
    await turns()
    assert len(spawn.calls) == 2
    args, kwargs = spawn.calls[0]
    assert "--shared" in args and "--parent-pid" not in args
    frontends = [args[i + 1] for i, a in enumerate(args) if a == "--frontend"]
    assert frontends == ["tcp://10.0.0.2:7000"]  # the others; this one is --ip/--port
    assert kwargs["start_new_session"] is True
    records = await store.records("replica")
    assert set(records) == {"m/1/0", "m/1/1"}
    procs = m.replicas("m", "1")
    for proc in procs:  # the slots' starts race (each opens its log on a thread)
        assert records[f"m/1/{proc.slot}"]["token"] == proc.token
        assert records[f"m/1/{proc.slot}"]["pid"] == proc.pid
    assert {r["pid"] for r in records.values()} == {c.pid for c in spawn.children}
    # Stopped: retired (it serves other frontends' batches too), then its record goes.
    peers.connected.add(procs[1].token)
    stopping = asyncio.create_task(m.ensure(MV, 1))
    await turns()
    assert peers.retired == [procs[1].token]
    [retired] = [c for c in spawn.children if c.pid == procs[1].pid]
    retired.exit(0)  # the replica drained its links and exited
    await stopping
    assert set(await store.records("replica")) == {"m/1/0"}
    assert retired.signals == []  # no signal was needed
    await m.stop_all()
    assert await store.records("replica") == {}


async def test_detach_leaves_the_processes_running_and_their_records(
    tmp_path: Path, spawn: SharedSpawner
) -> None:
    clock = FakeClock(start=0.0)
    m, store = await shared_manager(tmp_path, clock, Peers())
    await m.ensure(MV, 2)
    await until(lambda: all(p.pid for p in m.all_replicas()), "both started")
    await turns()
    m.detach()
    await turns()
    assert all(c.signals == [] and c.returncode is None for c in spawn.children)
    assert m.all_replicas() == []
    assert len(await store.records("replica")) == 2
    await m.stop_all()
    assert all(c.signals == [] for c in spawn.children)


def record(slot: int, token: str, version: str = "1") -> dict[str, Any]:
    return {"name": "m", "version": version, "slot": slot, "token": token, "pid": None,
            "host": "elsewhere", "location": "local"}  # fmt: skip


async def test_a_new_owner_adopts_connected_replicas_and_restarts_a_missing_one(
    tmp_path: Path, spawn: SharedSpawner
) -> None:
    clock = FakeClock(start=0.0)
    peers = Peers(connected={"t0"})
    m, store = await shared_manager(tmp_path, clock, peers)
    await store.put("replica", "m/1/0", record(0, "t0"))
    await store.put("replica", "m/1/1", record(1, "t1"))  # its process died with the owner
    await store.put("replica", "m/9/0", record(0, "t9", version="9"))  # a deleted version
    peers.connected.add("t9")
    await m.adopt(lambda name, version: version == "1")
    await turns()
    assert peers.retired == ["t9"]  # not registered any more: stopped at once
    peers.connected.discard("t9")  # it drained and hung up
    procs = m.replicas("m", "1")
    assert [(p.slot, p.token, p.location) for p in procs] == [
        (0, "t0", "adopted"),
        (1, "t1", "adopted"),
    ]
    await m.ensure(MV, 2)
    assert spawn.calls == []  # two slots run: nothing to start
    clock.advance(5.0)
    await turns(50)
    assert spawn.calls == []  # within the grace period
    clock.advance(1.5)
    await until(lambda: len(spawn.calls) == 1, "t1's slot started anew")
    await turns()
    # t1 never connected: its slot starts anew here
    assert [p.location for p in m.replicas("m", "1")] == ["adopted", "local"]
    records = await store.records("replica")
    assert set(records) == {"m/1/0", "m/1/1"}
    assert records["m/1/1"]["token"] not in ("t1", "")
    # Stopped: the adopted one with RETIRE (it is no child of ours), the new one by signal
    # (not connected: nothing to retire), and both records go.
    stopping = asyncio.create_task(m.ensure(MV, 0))
    await turns(50)
    assert "t0" in peers.retired
    peers.connected.discard("t0")  # it drained its links and hung up
    clock.advance(0.5)
    await turns(50)
    await stopping
    assert spawn.children[0].signals == [signal.SIGTERM]
    assert await store.records("replica") == {}
    assert m.all_replicas() == []

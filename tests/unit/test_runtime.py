"""The write side, the reconciler and the registry's store view, in process with fakes: a
store that can be made to fail, a container manager that records what it is asked."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from clipper.batching.scheduler import ModelScheduler
from clipper.clock import Clock, FakeClock, MonotonicClock
from clipper.config import BatchingConfig
from clipper.errors import RegistryError, ReplicaError
from clipper.inputs import InputType
from clipper.managers.base import ReplicaStatus
from clipper.persistence import StoreSync, delta_of, diff_registries
from clipper.registry import Application, Change, ModelVersion, Registry
from clipper.runtime.catalog import Catalog, SchedulerTable
from clipper.runtime.control import Control
from clipper.runtime.reconciler import Reconciler
from clipper.store import MemoryStore, StoreError
from clipper.store.base import Delete, Op, Put

# -- fakes -------------------------------------------------------------------------------------


class FlakyStore(MemoryStore):
    """A memory store whose commits fail while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.commits: list[list[Op]] = []

    async def commit(self, ops: Sequence[Op]) -> None:
        if self.down:
            raise StoreError("memory store: the disk is full (test)")
        self.commits.append(list(ops))
        await super().commit(ops)


class StallingStore(FlakyStore):
    """A memory store whose state writes wait until ``released`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.states: list[str] = []

    async def put(self, kind: Any, key: str, value: Any) -> None:
        await self.released.wait()
        self.states.append(key)
        await super().put(kind, key, value)


@dataclass
class FakeReplica:
    model: str
    version: str
    slot: int
    token: str = ""
    pid: int | None = 1
    restarts: int = 0
    last_exit: int | None = None
    state: str = "running"
    location: str = "local"

    def log_tail(self, lines: int = 20) -> str:
        return ""


@dataclass
class FakeManager:
    running: dict[tuple[str, str], int] = field(default_factory=dict)
    calls: list[tuple[str, str, int]] = field(default_factory=list)
    forgotten: list[tuple[str, str]] = field(default_factory=list)

    async def ensure(self, mv: ModelVersion, replicas: int) -> None:
        await asyncio.sleep(0)
        self.calls.append((mv.name, mv.version, replicas))
        if replicas:
            self.running[mv.key] = replicas
        else:
            self.running.pop(mv.key, None)

    async def stop_all(self) -> None:
        self.running.clear()

    def replicas(self, name: str, version: str) -> Sequence[ReplicaStatus]:
        return [FakeReplica(name, version, i) for i in range(self.running.get((name, version), 0))]

    def all_replicas(self) -> Sequence[ReplicaStatus]:
        return [r for (n, v) in self.running for r in self.replicas(n, v)]

    def logs(self, max_bytes: int) -> list[tuple[str, str]]:
        return []

    def log_files(self, name: str, version: str) -> dict[int, Path] | None:
        return None

    async def forget(self, name: str, version: str) -> None:
        self.forgotten.append((name, version))


class FakeScheduler:
    """What the reconciler touches of a scheduler; replicas 'connect' when the test says."""

    def __init__(self, mv: ModelVersion, slo_s: float) -> None:
        self.mv = mv
        self.slo_s = slo_s
        self.queue: list[Any] = []
        self.replicas: list[Any] = []
        self.on_drained: Any = None
        self.closed: BaseException | None = None

    def reconfigure(self, mv: ModelVersion) -> None:
        self.mv = mv

    def set_slo(self, slo_s: float) -> None:
        self.slo_s = slo_s

    def close(self, reason: BaseException) -> None:
        self.closed = reason


@dataclass
class Runtime:
    registry: Registry
    store: FlakyStore
    sync: StoreSync
    manager: FakeManager
    schedulers: SchedulerTable
    reconciler: Reconciler
    control: Control
    forgotten: list[str]


async def runtime(
    store: FlakyStore | None = None, node: str = "node-a", clock: Clock | None = None
) -> Runtime:
    """A frontend's services as the composition root wires them, started the same way."""
    store = store or FlakyStore()
    if not store._open:
        await store.open()
    registry = Registry()
    manager = FakeManager()
    schedulers = SchedulerTable()
    forgotten: list[str] = []
    sync = StoreSync(registry, store, clock=clock)
    reconciler = Reconciler(
        registry,
        manager,
        schedulers,
        clock=clock or MonotonicClock(),
        make_scheduler=lambda mv, slo: cast(ModelScheduler, FakeScheduler(mv, slo)),
        remove_replicas=lambda sched: None,
        on_app_deleted=forgotten.append,
    )
    control = Control(
        registry, sync, reconciler, Catalog(registry, schedulers), manager, node_id=node,
        clock=clock,
    )  # fmt: skip
    await sync.start()
    await control.recover()
    reconciler.resume()
    return Runtime(registry, store, sync, manager, schedulers, reconciler, control, forgotten)


def app(name: str = "a") -> Application:
    return Application(name, InputType.DOUBLES, "-1", 20_000)


def version(v: str = "1", n: int = 2, **kw: Any) -> ModelVersion:
    return ModelVersion("m", v, InputType.DOUBLES, artifact=f"/models/m/{v}", num_replicas=n, **kw)


def connect(rt: Runtime, v: str, n: int) -> None:
    sched = cast(FakeScheduler, rt.schedulers[("m", v)])
    sched.replicas = [SimpleNamespace(in_flight={}) for _ in range(n)]
    rt.control.replicas_changed(cast(ModelScheduler, sched))


async def until(condition: Any, what: str) -> None:
    """Let the loop run (no time passes) until ``condition()``; bounded."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def turns(n: int = 20) -> None:
    """Let the loop run ``n`` turns (no time passes): what a fake clock's timer woke goes on."""
    for _ in range(n):
        await asyncio.sleep(0)


async def settle(rt: Runtime) -> None:
    for name, versions in list(rt.registry.models.items()):
        for v in list(versions):
            await rt.reconciler.settled(name, v)
    await asyncio.sleep(0)


# -- the registry as the store sees it ---------------------------------------------------------


def test_a_draft_diff_applied_as_a_delta_round_trips() -> None:
    r = Registry()
    r.add_app(app())
    before = r.records()
    draft = r.copy()
    draft.add_model(version())
    draft.set_model_version("m", "1")
    draft.link("a", "m")
    draft.delete_app("a")
    draft.add_app(app("b"))
    ops = diff_registries(r, draft)
    assert Delete("app", "a") in ops and Put("current", "m", "1") in ops
    assert r.records() == before  # the draft never touched the registry
    r.apply_delta(delta_of(ops))
    assert r.records() == draft.records()


def test_apply_snapshot_announces_each_difference_in_dependency_order() -> None:
    source = Registry()
    source.add_app(app())
    source.add_model(version())
    source.set_model_version("m", "1")
    source.link("a", "m")
    r = Registry()
    seen: list[Change] = []
    r.subscribe(seen.append)
    r.apply_snapshot(source.records())
    assert [(c.kind, c.op) for c in seen] == [
        ("app", "add"), ("model", "add"), ("version", "update"), ("link", "update")
    ]  # fmt: skip
    assert r.records() == source.records()
    seen.clear()
    assert r.apply_snapshot(source.records()) == []  # nothing differs: nothing announced
    r.apply_snapshot({"app": {}, "model": {}, "current": {}, "links": {}, "intent": {}})
    assert [(c.kind, c.op) for c in seen] == [
        ("version", "delete"), ("model", "delete"), ("app", "delete")
    ]  # fmt: skip


def test_a_bad_record_is_skipped_not_fatal() -> None:
    r = Registry()
    good = app().to_record()
    r.apply_snapshot({"app": {"a": good, "bad": {"name": "bad"}}, "links": {"a": []}})
    assert list(r.apps) == ["a"]


# -- acknowledged means durable ----------------------------------------------------------------


async def test_a_change_the_store_refuses_leaves_the_registry_unchanged() -> None:
    rt = await runtime()
    await rt.control.add_app(app())
    before = rt.registry.records()
    rt.store.down = True
    with pytest.raises(StoreError, match="disk is full"):
        await rt.control.add_app(app("b"))
    with pytest.raises(StoreError):
        await rt.control.update_app("a", latency_slo_micros=5)
    with pytest.raises(StoreError):
        await rt.control.delete_app("a")
    assert rt.registry.records() == before
    rt.store.down = False
    assert (await rt.store.load())["app"] == {"a": app().to_record()}


async def test_a_change_is_stored_before_the_registry_shows_it() -> None:
    rt = await runtime()
    seen_in_store: list[bool] = []

    async def check(change: Change) -> None:
        seen_in_store.append(change.name in (await rt.store.load())["app"])

    tasks: list[asyncio.Task[None]] = []
    rt.registry.subscribe(lambda c: tasks.append(asyncio.create_task(check(c))))
    await rt.control.add_app(app())
    await asyncio.gather(*tasks)
    assert seen_in_store == [True]


async def test_invalid_changes_write_nothing() -> None:
    rt = await runtime()
    with pytest.raises(RegistryError, match="does not exist"):
        await rt.control.update_app("nope", latency_slo_micros=5)
    with pytest.raises(RegistryError):
        await rt.control.link("nope", "m")
    assert rt.store.commits == []


async def test_deleting_an_app_forgets_its_learned_states() -> None:
    rt = await runtime()
    await rt.control.add_app(app())
    await rt.control.add_app(app("ab"))
    await rt.store.put("state", "a:user-1", {"w": 1})
    await rt.store.put("state", "ab:user-1", {"w": 2})
    await rt.control.delete_app("a")
    assert rt.forgotten == ["a"]
    assert await rt.store.get("state", "a:user-1") is None
    assert await rt.store.get("state", "ab:user-1") == {"w": 2}  # a prefix, not a substring


# -- the reconciler ----------------------------------------------------------------------------


async def test_deploy_runs_the_version_switches_then_retires_the_previous() -> None:
    rt = await runtime()
    deploy = asyncio.create_task(rt.control.deploy(version("1")))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    assert rt.registry.intents["m"].version == "1"  # recorded before it started
    assert rt.manager.running == {("m", "1"): 2}
    connect(rt, "1", 2)
    await deploy
    assert rt.registry.current["m"] == "1" and not rt.registry.intents
    deploy = asyncio.create_task(rt.control.deploy(version("2")))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    connect(rt, "2", 2)
    await deploy
    await settle(rt)
    assert rt.manager.running == {("m", "2"): 2}  # version 1 drained and stopped
    assert rt.registry.models["m"]["1"].num_replicas == 2  # kept for a rollback
    connect(rt, "1", 0)  # its containers went with their processes
    # a rollback starts it again, as the current version runs
    switch = asyncio.create_task(rt.control.set_version("m", "1"))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    assert rt.manager.running == {("m", "1"): 2, ("m", "2"): 2}
    connect(rt, "1", 2)
    await switch
    await settle(rt)
    assert rt.manager.running == {("m", "1"): 2}


async def test_a_deploy_whose_replicas_fail_is_undone() -> None:
    clock = FakeClock()
    rt = await runtime(clock=clock)
    failing = asyncio.create_task(rt.control.deploy(version("1"), ready_timeout_s=0.05))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await turns()
    clock.advance(0.05)
    with pytest.raises(ReplicaError, match="connected within"):
        await failing
    await settle(rt)
    assert "m" not in rt.registry.models and not rt.registry.intents
    assert rt.manager.running == {}
    assert (await rt.store.load())["model"] == {}
    # and the same call can be made again
    deploy = asyncio.create_task(rt.control.deploy(version("1")))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    connect(rt, "1", 2)
    await deploy
    # repeating a completed deploy is a no-op
    await rt.control.deploy(version("1"))
    assert rt.registry.current["m"] == "1"


async def test_the_ready_timeout_fires_when_the_clock_passes_it_not_before() -> None:
    clock = FakeClock(start=0.0)
    rt = await runtime(clock=clock)
    deploy = asyncio.create_task(rt.control.deploy(version("1"), ready_timeout_s=5.0))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    connect(rt, "1", 1)  # one of the two: not enough
    await turns()
    for _ in range(19):  # to 4.75 s, waking at every 0.5 s re-check on the way
        clock.advance(0.25)
        await turns()
    assert not deploy.done()
    clock.advance(0.25)  # exactly 5 s
    await turns()
    assert deploy.done()
    with pytest.raises(ReplicaError, match=r"1 of 2 replicas of m:1 connected within 5.0 s"):
        await deploy
    await settle(rt)
    assert "m" not in rt.registry.models  # undone


async def test_a_crashing_replica_is_noticed_at_the_next_half_second_recheck(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(start=0.0)
    rt = await runtime(clock=clock)
    deploy = asyncio.create_task(rt.control.deploy(version("1"), ready_timeout_s=60.0))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    await turns()
    # No replica connects, so nothing wakes the wait but its re-check timer.
    crashed = [FakeReplica("m", "1", 0, restarts=3, last_exit=1)]
    monkeypatch.setattr(rt.manager, "replicas", lambda name, version: crashed)
    clock.advance(0.49)
    await turns()
    assert not deploy.done()
    clock.advance(0.01)
    await turns()
    with pytest.raises(ReplicaError, match="exited 3 times"):
        await deploy


async def test_stop_gives_queued_state_writes_ten_seconds_on_the_clock_then_gives_up() -> None:
    clock = FakeClock(start=0.0)
    store = StallingStore()
    rt = await runtime(store, clock=clock)
    rt.sync.write_state("a:u1", {"n": 1})
    rt.sync.write_state("a:u2", {"n": 2})
    await turns()  # the writer holds the first, its put stalled
    stopping = asyncio.create_task(rt.sync.stop())
    await turns()
    clock.advance(9.75)
    await turns()
    assert not stopping.done()
    clock.advance(0.25)  # exactly 10 s
    await turns()
    assert stopping.done()
    await stopping
    assert store.states == []  # the writer was cancelled: nothing written after all
    assert rt.sync._writer is None


async def test_stop_returns_once_the_queued_state_writes_are_done() -> None:
    clock = FakeClock(start=0.0)
    store = StallingStore()
    rt = await runtime(store, clock=clock)
    rt.sync.write_state("a:u1", {"n": 1})
    rt.sync.write_state("a:u2", {"n": 2})
    stopping = asyncio.create_task(rt.sync.stop())
    await turns()
    clock.advance(5.0)
    store.released.set()  # within the ten seconds: both are written, no timeout needed
    await turns()
    assert stopping.done()
    await stopping
    assert store.states == ["a:u1", "a:u2"]
    assert clock.pending() == 0  # the timeout's timer was disarmed


async def test_kept_versions_run_and_others_do_not() -> None:
    rt = await runtime()
    await rt.control.deploy(version("1", n=1), set_current=False, wait=False)
    await settle(rt)
    assert rt.registry.models["m"]["1"].keep and rt.manager.running == {("m", "1"): 1}
    await rt.control.scale("m", 3, "1", wait=False)
    await settle(rt)
    assert rt.manager.running == {("m", "1"): 3}
    await rt.control.delete_version("m", "1")
    assert rt.manager.running == {}
    assert cast(FakeScheduler, rt.reconciler._retiring.get(("m", "1"))) is None


async def test_new_batching_settings_reach_the_scheduler() -> None:
    rt = await runtime()
    await rt.control.register_model(version("1", n=0))
    new = replace(version("1", n=0), batching=BatchingConfig(controller="fixed", max_batch_size=8))
    await rt.control.replace_model(new)
    assert rt.schedulers[("m", "1")].mv.batching.controller == "fixed"


async def test_slo_targets_follow_links() -> None:
    rt = await runtime()
    await rt.control.register_model(version("1", n=0))
    await rt.control.add_app(replace(app(), latency_slo_micros=30_000))
    await rt.control.link("a", "m")
    assert rt.schedulers[("m", "1")].slo_s == pytest.approx(0.03)
    await rt.control.update_app("a", latency_slo_micros=10_000)
    assert rt.schedulers[("m", "1")].slo_s == pytest.approx(0.01)


# -- crash-safe version changes ----------------------------------------------------------------


async def test_a_restart_rolls_back_its_own_unfinished_deploy_and_switch() -> None:
    store = FlakyStore()
    rt = await runtime(store)
    first = asyncio.create_task(rt.control.deploy(version("1")))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    connect(rt, "1", 2)
    await first
    # the frontend 'dies' mid-deploy of version 2 (its task never finishes)
    crashed = asyncio.create_task(rt.control.deploy(version("2")))
    await until(lambda: "m" in rt.registry.intents, "the intent")
    await settle(rt)
    assert rt.manager.running == {("m", "1"): 2, ("m", "2"): 2}
    crashed.cancel()
    rt.store.down = True  # not even the rollback reaches the store
    with pytest.raises(asyncio.CancelledError):
        await crashed
    assert (await store.load())["intent"]["m"]["version"] == "2"
    rt.store.down = False
    await rt.reconciler.stop()

    again = await runtime(store)
    assert set(again.registry.models["m"]) == {"1"} and not again.registry.intents
    assert again.registry.current["m"] == "1"
    await settle(again)
    assert again.manager.running == {("m", "1"): 2}  # no orphan of version 2
    # retrying the same call succeeds
    retry = asyncio.create_task(again.control.deploy(version("2")))
    await until(lambda: "m" in again.registry.intents, "the intent")
    await settle(again)
    connect(again, "2", 2)
    await retry
    assert again.registry.current["m"] == "2"


async def test_a_restart_leaves_other_frontends_changes_alone() -> None:
    store = FlakyStore()
    other = await runtime(store, node="node-b")
    pending = asyncio.create_task(other.control.deploy(version("1")))
    await until(lambda: "m" in other.registry.intents, "the intent")
    await settle(other)
    mine = await runtime(store, node="node-a")
    assert mine.registry.intents["m"].owner == "node-b"
    assert "1" in mine.registry.models["m"]
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    await other.reconciler.stop()
    await mine.reconciler.stop()


async def test_a_version_deleted_and_registered_again_keeps_its_scheduler() -> None:
    rt = await runtime()
    await rt.control.register_model(version("1", n=0))
    sched = rt.schedulers[("m", "1")]

    def again(d: Registry) -> None:
        d.delete_model_version("m", "1")

    await rt.sync.commit(again)
    # registered again before the reconciler's worker for it ran
    await rt.control.register_model(version("1", n=0))
    await settle(rt)
    assert rt.schedulers[("m", "1")] is sched
    assert cast(FakeScheduler, sched).closed is None


async def test_changing_only_the_replica_count_keeps_the_batch_controllers() -> None:
    rt = await runtime()
    await rt.control.register_model(version("1", n=0))
    reconfigured: list[ModelVersion] = []
    sched = cast(FakeScheduler, rt.schedulers[("m", "1")])
    sched.reconfigure = reconfigured.append  # type: ignore[method-assign,assignment]
    await rt.control.scale("m", 3, "1", wait=False)
    assert reconfigured == [] and sched.mv.num_replicas == 3
    await rt.control.replace_model(
        replace(sched.mv, batching=BatchingConfig(controller="fixed", max_batch_size=4))
    )
    assert [mv.batching.controller for mv in reconfigured] == ["fixed"]


async def test_a_commit_touches_only_what_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admin calls must not slow down as applications accumulate: a commit turns only the
    changed entries into records, and parses only those back."""
    rt = await runtime()
    for i in range(200):
        await rt.control.add_app(app(f"app-{i}"))
    calls = {"to_record": 0, "from_record": 0}
    to_record, from_record = Application.to_record, Application.from_record.__func__  # type: ignore[attr-defined]

    def counting_to(self: Application) -> dict[str, Any]:
        calls["to_record"] += 1
        return to_record(self)

    def counting_from(cls: type[Application], r: dict[str, Any]) -> Application:
        calls["from_record"] += 1
        return from_record(cls, r)  # type: ignore[no-any-return]

    monkeypatch.setattr(Application, "to_record", counting_to)
    monkeypatch.setattr(Application, "from_record", classmethod(counting_from))
    await rt.control.update_app("app-7", latency_slo_micros=9_000)
    await rt.control.add_app(app("one-more"))
    assert calls["to_record"] <= 6 and calls["from_record"] <= 2, calls


async def test_a_deleted_versions_logs_are_forgotten_after_the_grace_period() -> None:
    clock = FakeClock()
    rt = await runtime(clock=clock)
    for v in ("1", "2"):
        await rt.control.register_model(version(v, n=0))
    await settle(rt)
    for v in ("1", "2"):
        await rt.control.delete_version("m", v)
        await rt.reconciler.settled("m", v)
    await rt.control.register_model(version("2", n=0))  # back within the grace period
    await settle(rt)
    clock.advance(299.0)
    await asyncio.sleep(0)
    assert rt.manager.forgotten == []  # still within the default 300 s grace
    clock.advance(2.0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert rt.manager.forgotten == [("m", "1")]  # "2" was registered again: its logs stay


async def test_a_second_frontend_on_one_state_directory_is_refused_with_the_first_ones_ports(
    tmp_path: Path,
) -> None:
    from clipper import Clipper
    from clipper.errors import ConfigError

    async with Clipper(state_dir=tmp_path) as first:
        second = Clipper(state_dir=tmp_path)
        with pytest.raises(ConfigError) as refused:
            await second.start()
        message = str(refused.value)
        assert f"pid {os.getpid()}" in message
        assert f"query port {first.query_port}" in message
        assert f"admin port {first.admin_http.port}" in message
        assert "--state-dir" in message
    # once the first has stopped, the directory is free again
    async with Clipper(state_dir=tmp_path) as again:
        assert again.query_port > 0


def test_the_frontend_hands_its_clock_to_the_control_plane(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    from clipper.frontend.grpc.native import NativeGrpcServer
    from clipper.managers.kubernetes import KubernetesManager
    from clipper.server import Clipper
    from clipper.store.redis import RedisStore

    clock = FakeClock()
    c = Clipper(
        state_dir=tmp_path,
        clock=clock,
        store="redis://127.0.0.1:1/0",  # never opened: nothing connects
        manager="k8s://clipper",
        grpc_port=0,
        grpc_transport="native",
    )
    assert isinstance(c.store, RedisStore) and isinstance(c.manager, KubernetesManager)
    assert isinstance(c.grpc, NativeGrpcServer)
    for part in (c.control, c.sync, c.store, c.manager, c.grpc):
        assert part.clock is clock, part

"""The ray:// manager's placement loop without Ray: its calls into Ray (RayActors) replaced by an
in-memory cluster, time by the fake clock. What a node's death, a frontend's restart in the
middle of a move, and a node's return do to the actors it asks for (the real cluster:
tests/integration/test_ray_manager.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.managers.base import ManagerContext
from clipper.managers.ray_actors import GONE
from clipper.managers.ray_engine import RayManager
from clipper.managers.ray_settings import Placement, parse_ray_url
from clipper.managers.ray_spread import NodeState
from clipper.registry import ModelVersion

STEM = "clipper/fe/m/1/"


class FakeActors:
    """Actors by name, each on a node; every call answers at once."""

    def __init__(self, *nodes: str) -> None:
        self.alive = dict.fromkeys(nodes, True)
        self.actors: dict[str, str] = {}  # name -> node
        self.created: list[tuple[str, str | None]] = []
        self.killed: list[tuple[str, bool]] = []
        self.hung: set[str] = set()  # nodes alive in the table whose actors never start

    def connect(self, address: str) -> None:
        pass

    def create(self, name: str, spec: Any, keys: Any, options: dict[str, Any]) -> None:
        node = options["node"] or sorted(n for n, up in self.alive.items() if up)[0]
        self.actors.setdefault(name, node)  # get_if_exists
        self.created.append((name, options["node"]))

    def reconfigure(self, stale: Any) -> None:
        pass

    def kill(self, name: str, graceful: bool = True) -> None:
        self.actors.pop(name, None)
        self.killed.append((name, graceful))

    def statuses(self, names: list[str]) -> list[dict[str, Any] | str | None]:
        out: list[dict[str, Any] | str | None] = []
        for name in names:
            node = self.actors.get(name)
            if node is None:
                out.append(GONE)
                continue
            if node in self.hung:  # pending: its calls wait, the poll gets no answer
                out.append(None)
                continue
            out.append({
                "actor_pid": 100 + len(name), "pid": 200, "token": f"{name}#1", "restarts": 0,
                "last_exit": None, "state": "running", "node_id": node, "node_ip": "10.0.0.1",
                "ready": True, "log": "",
            })  # fmt: skip
        return out

    def names(self, prefix: str) -> list[str]:
        return sorted(n for n in self.actors if n.startswith(prefix))

    def versions_actors(self, stem: str) -> dict[int, list[tuple[int, str]]]:
        out: dict[int, list[tuple[int, str]]] = {}
        for name in self.names(stem):
            slot, _, gen = name.removeprefix(stem).partition(".")
            out.setdefault(int(slot), []).append((int(gen or 0), name))
        return out

    def nodes(self) -> list[NodeState]:
        return [NodeState(n, up, {"CPU": 8.0}, {"CPU": 8.0}) for n, up in self.alive.items()]

    def die(self, node: str) -> None:  # a node lost: its pinned actors with it
        self.alive[node] = False
        self.actors = {k: v for k, v in self.actors.items() if v != node}


@pytest.fixture(autouse=True)
def no_ray_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real options() builds Ray's NodeAffinitySchedulingStrategy: say the node instead.
    monkeypatch.setattr(Placement, "options", lambda self, on_node=None: {"node": on_node})


class Frontend:
    """What the manager sees of a frontend: which tokens are connected, what it drained."""

    def __init__(self) -> None:
        self.connected: set[str] = set()
        self.drained: list[str] = []
        self.exited: list[str] = []

    async def drain(self, token: str) -> None:
        self.drained.append(token)


def manager(tmp_path: Path, fake: FakeActors, fe: Frontend, clock: FakeClock,
            query: str = "") -> RayManager:  # fmt: skip
    ctx = ManagerContext(
        rpc_host=lambda: "127.0.0.1", rpc_port=lambda: 7000, state_dir=tmp_path, clock=clock,
        heartbeat_interval_s=1.0, python=None, on_exit=fe.exited.append, drain=fe.drain,
        nice=0, node_id=lambda: "fe", connected=fe.connected.__contains__,
    )  # fmt: skip
    mgr = RayManager(parse_ray_url("auto?" + "&".join(["poll_s=1", *filter(None, [query])])), ctx)
    mgr._actors = fake  # type: ignore[assignment]
    return mgr


def version(*labels: str) -> ModelVersion:
    return ModelVersion("m", "1", InputType.DOUBLES, labels=labels, artifact="a" * 64)


def nodes_of(mgr: RayManager) -> list[str]:
    return sorted(r.node_id for r in mgr.replicas("m", "1"))


async def test_a_lost_node_gets_its_replica_placed_again_within_the_limit(tmp_path: Path) -> None:
    fake, fe, clock = FakeActors("a", "b", "c"), Frontend(), FakeClock()
    mgr = manager(tmp_path, fake, fe, clock)
    try:
        await mgr.ensure(version("ray:max_per_node=1"), 2)
        assert sorted(fake.created) == [(STEM + "0", "a"), (STEM + "1", "b")]
        await mgr._poll_once()
        assert nodes_of(mgr) == ["a", "b"]
        fake.die("b")
        await mgr._poll_once()
        # Slot 1's next generation on c (a holds one already), the old actor killed at once
        # (no graceful stop: its node is gone), its connection dropped.
        assert fake.created[-1] == (STEM + "1.1", "c")
        assert fake.killed == [(STEM + "1", False)] and set(fe.exited) == {STEM + "1#1"}
        await mgr._poll_once()
        assert nodes_of(mgr) == ["a", "c"] and mgr.replicas("m", "1")[1].restarts == 1
        # Then c too: slot 1 waits (one node left, at most one per node), saying why.
        fake.die("c")
        await mgr._poll_once()
        waiting = mgr.replicas("m", "1")[1]
        assert not waiting.placed and waiting.location == "ray:unplaced"
        assert "max_per_node=1" in waiting.log_tail()
        fake.alive["d"] = True  # a node joins: placed on it at the next poll
        await mgr._poll_once()
        assert fake.created[-1] == (STEM + "1.2", "d")
    finally:
        await mgr.stop_all()


async def test_a_restarted_frontend_adopts_the_newest_generation_of_each_slot(
    tmp_path: Path,
) -> None:
    fake, fe, clock = FakeActors("a", "b"), Frontend(), FakeClock()
    # Left by a frontend that stopped in the middle of moving slot 0: both generations run.
    fake.actors = {STEM + "0": "a", STEM + "0.1": "b", STEM + "1": "a"}
    mgr = manager(tmp_path, fake, fe, clock)
    try:
        await mgr.ensure(version(), 2)
        assert [r.actor_name for r in mgr.replicas("m", "1")] == [STEM + "0.1", STEM + "1"]
        assert [name for name, _ in fake.created] == [STEM + "0.1", STEM + "1"]  # adopted
        assert fake.killed == [(STEM + "0", True)]  # the older generation, stopped gracefully
    finally:
        await mgr.stop_all()


async def test_a_node_back_gets_one_replica_moved_once_settled_and_connected(
    tmp_path: Path,
) -> None:
    fake, fe, clock = FakeActors("a"), Frontend(), FakeClock()
    mgr = manager(tmp_path, fake, fe, clock, "settle_s=10")
    try:
        await mgr.ensure(version(), 2)  # one node: both on it (the soft spread)
        await mgr._poll_once()
        assert nodes_of(mgr) == ["a", "a"]
        fe.connected |= {r.token for r in mgr.replicas("m", "1")}
        fake.alive["b"] = True
        await mgr._poll_once()
        clock.advance(5)
        await mgr._poll_once()
        assert mgr._mover is None and len(fake.created) == 2  # not settled yet
        fe.connected.add(STEM + "1.1#1")  # the replacement connects as soon as it runs
        clock.advance(5)
        await mgr._poll_once()
        mover = mgr._mover
        assert mover is not None
        await mover
        assert fake.created[-1] == (STEM + "1.1", "b")
        # The old one drained (by its token) before it was stopped; the slot is the new one.
        assert fe.drained == [STEM + "1#1"] and fake.killed == [(STEM + "1", True)]
        assert [r.actor_name for r in mgr.replicas("m", "1")] == [STEM + "0", STEM + "1.1"]
        await mgr._poll_once()
        assert nodes_of(mgr) == ["a", "b"]
        await mgr._poll_once()
        assert mgr._mover is None and len(fake.created) == 3  # even now: nothing more moves
    finally:
        await mgr.stop_all()


async def test_a_pinned_actor_that_never_starts_is_placed_again_elsewhere(tmp_path: Path) -> None:
    fake, fe, clock = FakeActors("a", "b", "c"), Frontend(), FakeClock()
    fake.hung.add("b")  # alive in Ray's table, but nothing it is given ever runs
    mgr = manager(tmp_path, fake, fe, clock, "start_timeout_s=60")
    try:
        await mgr.ensure(version("ray:max_per_node=1"), 2)
        assert sorted(fake.created) == [(STEM + "0", "a"), (STEM + "1", "b")]
        await mgr._poll_once()
        clock.advance(59)
        await mgr._poll_once()
        assert len(fake.created) == 2  # within its start allowance: left alone
        clock.advance(1)
        await mgr._poll_once()
        # Slot 1's next generation on c; the pending actor killed; b avoided meanwhile.
        assert fake.created[-1] == (STEM + "1.1", "c")
        assert fake.killed == [(STEM + "1", False)]
        await mgr._poll_once()
        assert nodes_of(mgr) == ["a", "c"]
        # c lost too: b is still avoided, so the slot waits rather than go back to it ...
        fake.die("c")
        await mgr._poll_once()
        assert not mgr.replicas("m", "1")[1].placed and len(fake.created) == 3
        # ... until the avoidance ends (b may have recovered by then).
        fake.hung.clear()
        clock.advance(60)
        await mgr._poll_once()
        assert fake.created[-1] == (STEM + "1.2", "b")
    finally:
        await mgr.stop_all()

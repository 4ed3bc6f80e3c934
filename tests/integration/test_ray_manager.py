"""The ray:// manager on a real 3-node Ray cluster (``tests/raycluster.py``): replicas as named,
detached actors, one per node, whose containers fetch the model from the frontend; an actor
SIGKILLed comes back connected within 5 s; a node removed leaves the others answering and the
count comes back with a node; a restarted frontend adopts the same actors. Placement: a
per-node limit holds through a node's loss (extra replicas wait, saying why), and a node that
joins gets one replica moved to it, with queries running through the move.

Run with ``-m ray`` in a venv with Ray (``.ci/run`` builds one); skipped without Ray.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import orjson
import pytest

from clipper import Clipper
from clipper.managers.ray_engine import RayManager
from tests.integration.frontend_process import SRC, FrontendProcess
from tests.integration.helpers import predict_ok, request, wait_for
from tests.integration.redis_server import free_port
from tests.raycluster import RayCluster, ray_cluster

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.timeout(300)]


def node_sums(xs: Any) -> list[float]:
    return [float(x.sum()) for x in xs]


cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster(nodes=3) as c:
        yield c


class ClosedLoop:
    """Clients asking one after another; every answer checked, defaults counted."""

    def __init__(self, c: Clipper, clients: int = 3) -> None:
        self.url = c.query_url
        self.answers = 0
        self.defaults = 0
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._client(k)) for k in range(clients)]

    async def _client(self, k: int) -> None:
        i = 0
        while not self._stop.is_set():
            doc = await predict_ok(self.url, "app", {"input": [float(k), float(i)]})
            if doc["default"]:
                self.defaults += 1
            else:
                assert doc["output"] == float(k + i)
                self.answers += 1
            i += 1

    async def more(self, n: int, limit_s: float = 30) -> None:
        target = self.answers + n
        await wait_for(lambda: self.answers >= target, limit_s=limit_s, what=f"{n} answers")

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def manager_of(c: Clipper) -> RayManager:
    assert isinstance(c.manager, RayManager)
    return c.manager


def process_of(pid: int | None) -> tuple[list[bytes], Path]:
    """A process's command line and working directory."""
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return argv, Path(f"/proc/{pid}/cwd").resolve()


def fetched(c: Clipper) -> float:
    value = c.metrics.registry.get_sample_value(
        "clipper_artifact_fetches_total", {"model": "m", "version": "1"}
    )
    return value or 0.0


@pytest.fixture
async def frontend_factory(cluster: RayCluster, tmp_path: Path) -> AsyncIterator[Any]:
    started: list[Clipper] = []
    rpc_port = free_port()

    async def start(port: int | None = None, **params: str) -> Clipper:
        url = cluster.manager_url(cache_dir=f"{tmp_path}/cache/{{node}}", poll_s="0.3", **params)
        c = Clipper(
            query_port=0, admin_port=0, rpc_port=port or rpc_port, state_dir=tmp_path / "state",
            store=f"sqlite:///{tmp_path / 'state'}", replica_timeout_s=1.0, manager=url,
        )  # fmt: skip
        await c.start()
        started.append(c)
        return c

    yield start
    for c in started:
        await c.stop()
    # The actors outlive a frontend by design: remove this test's.
    import ray

    for name in cluster.named_actors():
        ray.kill(ray.get_actor(name, namespace=cluster.namespace), no_restart=True)


async def test_replicas_on_ray_nodes_survive_kills_node_loss_and_a_frontend_restart(
    cluster: RayCluster, frontend_factory: Any
) -> None:
    c = await frontend_factory()
    await c.register_application("app", "doubles", "-1", 2_000_000)
    await c.deploy_model("m", "1", node_sums, input_type="doubles", num_replicas=3)
    await c.link_model_to_app("app", "m")
    sched = c.schedulers[("m", "1")]
    assert len(sched.replicas) == 3
    mgr = manager_of(c)
    await wait_for(
        lambda: all(r.pid is not None for r in mgr.all_replicas()), limit_s=10, what="statuses"
    )

    # One replica per node (each node has one CPU; each replica asks for one).
    nodes = {r.node_id for r in mgr.all_replicas()}
    assert len(nodes) == 3, mgr.all_replicas()
    names = cluster.named_actors()
    assert names == sorted(f"clipper/{c.control.node_id}/m/1/{i}" for i in range(3))
    # The model came from the frontend, once per node cache, never from its disk.
    assert fetched(c) == 3
    artifact = c.registry.get_model("m", "1").artifact or ""
    for r in mgr.all_replicas():
        argv, cwd = await asyncio.to_thread(process_of, r.pid)
        assert b"--fetch-artifact" in argv and artifact.encode() not in b" ".join(argv)
        assert cwd != Path.cwd() and cwd.name.startswith("clipper-replica-")
    # The admin replica view: state, node, restarts.
    resp = await request(c.admin_url + "/admin/get_replicas", "POST", b"{}")
    view = resp.json()
    assert {v["location"].split("@")[0] for v in view} == {f"ray:{n[:12]}" for n in nodes}
    assert all(v["state"] == "running" and v["restarts"] == 0 for v in view)

    loop = ClosedLoop(c)
    try:
        await loop.more(20)

        # An actor SIGKILLed: Ray restarts it, its new container connects within 5 s.
        victim = mgr.all_replicas()[0]
        old_token, actor_pid = victim.token, victim.actor_pid
        assert actor_pid is not None
        t0 = time.monotonic()
        os.kill(actor_pid, signal.SIGKILL)
        await wait_for(lambda: victim.actor_pid not in (None, actor_pid), limit_s=5, interval=0.05)
        print(f"actor SIGKILL -> new actor seen: {time.monotonic() - t0:.2f} s")
        await wait_for(
            lambda: victim.token not in ("", old_token) and len(sched.replicas) == 3
            and any(r.address == victim.token for r in sched.replicas),
            limit_s=max(5 - (time.monotonic() - t0), 0.1), interval=0.05,
            what="the replacement connected within 5 s of the kill",
        )  # fmt: skip
        print(f"actor SIGKILL -> replacement connected: {time.monotonic() - t0:.2f} s")
        await wait_for(lambda: victim.restarts >= 1, limit_s=5, what="the restart reported")
        await loop.more(20)

        # A node removed: the others keep answering; a node back, the count is restored.
        gone = cluster.workers[0]
        lost = [r for r in mgr.all_replicas() if r.node_id == gone.node_id]
        assert len(lost) == 1
        cluster.remove_node(gone)
        await wait_for(lambda: len(sched.replicas) == 2, limit_s=20, what="the lost replica")

        async def lost_slot_shown() -> bool:  # the admin view shows the slot, unconnected
            resp = await request(
                c.admin_url + "/admin/get_replicas", "POST", b'{"unconnected": true}'
            )
            return any(v["replica_id"] is None and v["state"] in ("restarting", "starting")
                       for v in resp.json())  # fmt: skip

        await wait_for(lost_slot_shown, limit_s=10, what="the lost slot in get_replicas")
        defaults = loop.defaults
        await loop.more(30)
        assert loop.defaults == defaults  # the two others answer everything
        t0 = time.monotonic()
        cluster.add_node()  # on the main thread (Ray installs signal handlers); holds the loop

        await wait_for(lambda: len(sched.replicas) == 3, limit_s=30, what="the count restored")
        print(f"node back -> replica connected: {time.monotonic() - t0:.2f} s")
        await loop.more(20)
    finally:
        await loop.stop()

    # A frontend restart (same state directory and RPC port): the same actors are adopted.
    await wait_for(  # the manager's view is current: each slot's token is a connected replica
        lambda: {r.token for r in mgr.all_replicas()} == {x.address for x in sched.replicas},
        limit_s=10, what="the replica view to catch up",
    )  # fmt: skip
    before = {r.actor_name: r.actor_pid for r in mgr.all_replicas()}
    await c.stop()
    c2 = await frontend_factory()
    sched2 = c2.schedulers[("m", "1")]
    await wait_for(lambda: len(sched2.replicas) == 3, limit_s=30, what="adopted replicas")
    mgr2 = manager_of(c2)
    await wait_for(
        lambda: all(r.actor_pid is not None for r in mgr2.all_replicas()),
        limit_s=10, what="statuses after the restart",
    )  # fmt: skip
    assert {r.actor_name: r.actor_pid for r in mgr2.all_replicas()} == before
    # None duplicated; the slot lost with its node runs as its next generation (".1").
    assert cluster.named_actors() == sorted(before)
    assert sum(n.endswith(".1") for n in before) == 1 and len(names) == 3
    doc = await predict_ok(c2.query_url, "app", {"input": [1.0, 2.0]})
    assert doc["output"] == 3.0 and doc["default"] is False


async def test_actors_of_versions_the_frontend_no_longer_runs_are_retired(
    cluster: RayCluster, frontend_factory: Any
) -> None:
    import ray

    from clipper.managers.ray_replica import ReplicaSupervisor

    c = await frontend_factory(sweep_after_s="1")
    # What a crashed frontend may leave: an actor of a version deleted while it was down.
    stray = f"clipper/{c.control.node_id}/gone/1/0"
    spec = {"name": "gone", "version": "1", "input_type": "doubles", "host": "127.0.0.1",
            "port": c.rpc.port, "heartbeat_interval_s": 1.0, "cache_dir": ""}  # fmt: skip
    ray.remote(ReplicaSupervisor).options(
        name=stray, namespace=cluster.namespace, lifetime="detached", num_cpus=0
    ).remote(stray, spec, None)
    await wait_for(lambda: stray in cluster.named_actors(), limit_s=10, what="the stray actor")
    await c.register_application("app", "doubles", "-1", 2_000_000)
    await c.deploy_model("m", "1", node_sums, input_type="doubles", num_replicas=1)
    await wait_for(
        lambda: cluster.named_actors() == [f"clipper/{c.control.node_id}/m/1/0"],
        limit_s=20, what="the stray actor retired, the wanted one kept",
    )  # fmt: skip


async def test_adopted_actors_follow_a_frontend_to_a_new_port_even_after_a_restart(
    cluster: RayCluster, frontend_factory: Any
) -> None:
    c = await frontend_factory()
    await c.register_application("app", "doubles", "-1", 2_000_000)
    await c.deploy_model("m", "1", node_sums, input_type="doubles", num_replicas=1)
    await c.link_model_to_app("app", "m")
    await c.stop()
    # Restarted on another RPC port: the adopted actor is told it, its container follows.
    c2 = await frontend_factory(port=free_port())
    sched = c2.schedulers[("m", "1")]
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=30, what="the adopted replica")
    mgr = manager_of(c2)
    await wait_for(lambda: mgr.all_replicas()[0].actor_pid is not None, limit_s=10,
                   what="its status")  # fmt: skip
    [replica] = mgr.all_replicas()
    old_actor = replica.actor_pid
    assert old_actor is not None
    # Ray restarts a killed actor with its creation arguments (the old port): the status poll
    # sees that and configures it again.
    os.kill(old_actor, signal.SIGKILL)
    await wait_for(
        lambda: replica.actor_pid not in (None, old_actor) and len(sched.replicas) == 1
        and sched.replicas[0].address == replica.token,
        limit_s=30, interval=0.05, what="the restarted actor's container on the new port",
    )  # fmt: skip
    doc = await predict_ok(c2.query_url, "app", {"input": [2.0, 3.0]})
    assert doc["output"] == 5.0 and doc["default"] is False


async def test_placement_by_labels_shares_a_gpu_and_pins_a_node(
    cluster: RayCluster, frontend_factory: Any
) -> None:
    # A node with one (logical) GPU and a custom resource; the others have neither.
    gpu_node = cluster.cluster.add_node(
        num_cpus=1, num_gpus=1, resources={"accel": 2}, node_ip_address="127.0.0.1"
    )
    try:
        c = await frontend_factory()
        await c.register_application("app", "doubles", "-1", 2_000_000)
        # Two replicas sharing the GPU (half each, no CPU reserved): both on that node.
        await c.deploy_model(
            "g", "1", node_sums, input_type="doubles", num_replicas=2,
            labels=["ray:num_gpus=0.5", "ray:num_cpus=0"],
        )  # fmt: skip
        # One pinned by a custom resource only that node has.
        await c.deploy_model(
            "a", "1", node_sums, input_type="doubles", num_replicas=1,
            labels=["ray:resource:accel=1", "ray:num_cpus=0"],
        )  # fmt: skip
        mgr = manager_of(c)
        await wait_for(
            lambda: all(r.node_id for r in mgr.all_replicas()), limit_s=10, what="statuses"
        )
        assert {r.node_id for r in mgr.all_replicas()} == {gpu_node.node_id}
        for r in mgr.replicas("g", "1"):
            assert r.pid is not None
            environ = await asyncio.to_thread(Path(f"/proc/{r.pid}/environ").read_bytes)
            assert b"CUDA_VISIBLE_DEVICES=0" in environ.split(b"\0")  # Ray's, inherited
        # Node affinity: a version pinned to a worker node by its id.
        other = next(n for n in cluster.workers if n.node_id != gpu_node.node_id)
        await c.deploy_model(
            "n", "1", node_sums, input_type="doubles", num_replicas=1,
            labels=[f"ray:node={other.node_id}", "ray:num_cpus=0"],
        )  # fmt: skip
        await wait_for(
            lambda: [r.node_id for r in mgr.replicas("n", "1")] == [other.node_id],
            limit_s=10, what="the pinned replica's node",
        )  # fmt: skip
        for name in ("g", "a", "n"):
            await c.stop_model(name, "1")
        assert cluster.named_actors() == []  # deleting a version removes its actors
    finally:
        cluster.remove_node(gpu_node)


async def test_clipper_start_with_a_ray_manager_end_to_end(
    cluster: RayCluster, tmp_path: Path
) -> None:
    """``clipper start --manager ray://...`` as its own process (it joins the cluster itself,
    off its event loop), driven by the CLI: deploy, predict, and ``clipper status`` shows where
    the replicas run."""
    url = cluster.manager_url(poll_s="0.5")

    class RayFrontend(FrontendProcess):
        def command(self) -> list[str]:
            return [*super().command(), "--manager", url]

    fe = RayFrontend(tmp_path / "state")
    model_file = tmp_path / "sums.pkl"
    model_file.write_bytes(cloudpickle.dumps(node_sums))
    env = {**os.environ, "CLIPPER_ADMIN_URL": fe.admin_url,
           "CLIPPER_URL": f"http://127.0.0.1:{fe.ports.query}", "PYTHONPATH": SRC}  # fmt: skip

    async def cli(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clipper", *args, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    try:
        await fe.start()
        await cli("app", "register", "s", "--input-type", "doubles", "--default-output", "-1",
                  "--slo-micros", "2000000")  # fmt: skip
        out = await cli("model", "deploy", str(model_file), "--name", "m", "--version", "1",
                        "--input-type", "doubles", "--replicas", "2")  # fmt: skip
        assert "2 replicas ready" in out
        await cli("link", "s", "m")
        assert orjson.loads(await cli("predict", "s", "[1, 2]"))["output"] == 3.0

        async def placed() -> bool:
            status = orjson.loads(await cli("status", "--json"))
            return sorted(r["state"] for r in status["replicas"]) == ["ready", "ready"] and all(
                str(r["location"]).startswith("ray:") for r in status["replicas"]
            )

        await wait_for(placed, limit_s=20, what="clipper status showing the ray replicas")
        assert "ray:" in await cli("status")  # the table has the location column
        await cli("model", "delete", "m", "1", "--force")  # the live version of a linked model
        assert cluster.named_actors() == []
    finally:
        fe.cleanup()


def spread_of(mgr: RayManager, name: str) -> list[str]:
    """The nodes a version's placed replicas run on (one entry per replica)."""
    return sorted(r.node_id for r in mgr.replicas(name, "1") if r.node_id)


async def two_replicas(c: Clipper, *labels: str) -> tuple[RayManager, Any]:
    """Version m:1 with two replicas (no CPU reserved) and ``labels``, linked to an app, once
    both are placed: its manager and its scheduler."""
    await c.register_application("app", "doubles", "-1", 2_000_000)
    await c.deploy_model("m", "1", node_sums, input_type="doubles", num_replicas=2,
                         labels=[*labels, "ray:num_cpus=0"])  # fmt: skip
    await c.link_model_to_app("app", "m")
    mgr = manager_of(c)
    await wait_for(lambda: len(spread_of(mgr, "m")) == 2, limit_s=15, what="statuses")
    return mgr, c.schedulers[("m", "1")]


async def test_a_per_node_limit_holds_through_a_node_loss_and_extra_replicas_wait(
    cluster: RayCluster, frontend_factory: Any
) -> None:
    c = await frontend_factory()
    # No CPU reserved: only the limit keeps the replicas apart (resources would not).
    mgr, sched = await two_replicas(c, "ray:max_per_node=1")
    first = spread_of(mgr, "m")
    assert len(set(first)) == 2, first

    loop = ClosedLoop(c)
    try:
        await loop.more(20)
        victim = next(w for w in cluster.workers if w.node_id in first)
        worst = 1

        def replaced() -> bool:  # and never two on one node meanwhile
            nonlocal worst
            now = spread_of(mgr, "m")
            worst = max([worst, *(now.count(n) for n in now)])
            return (len(now) == 2 and victim.node_id not in now and len(sched.replicas) == 2
                    and {r.token for r in mgr.replicas("m", "1")}
                    == {x.address for x in sched.replicas})  # fmt: skip

        t0 = time.monotonic()
        cluster.remove_node(victim)
        await wait_for(replaced, limit_s=30, interval=0.05, what="the replacement connected")
        print(f"node removed -> replacement connected on the third node: "
              f"{time.monotonic() - t0:.2f} s")  # fmt: skip
        now = spread_of(mgr, "m")
        assert worst == 1 and len(set(now)) == 2, now
        assert [r.generation for r in mgr.replicas("m", "1")].count(1) == 1
        await loop.more(20)

        # Three replicas, two nodes left, at most one per node: the third waits and says why.
        await c.set_num_replicas("m", 3, "1", wait=False)

        async def waiting_shown() -> bool:
            resp = await request(
                c.admin_url + "/admin/get_replicas", "POST", b'{"unconnected": true}'
            )
            return any(v["location"] == "ray:unplaced" for v in resp.json())

        await wait_for(waiting_shown, limit_s=15, what="the unplaced slot in get_replicas")
        [waiting] = [r for r in mgr.replicas("m", "1") if not r.placed]
        assert "max_per_node=1" in waiting.log_tail() and waiting.state == "starting"
        assert len(set(spread_of(mgr, "m"))) == 2
        # A node joins: the waiting replica is placed on it at once (no settling for that).
        t0 = time.monotonic()
        cluster.add_node()
        await wait_for(lambda: len(sched.replicas) == 3, limit_s=30, what="the third replica")
        print(f"node added -> waiting replica connected: {time.monotonic() - t0:.2f} s")
        # Its node is known from the manager's next status poll, which may come just after
        # the container connected.
        await wait_for(lambda: len(spread_of(mgr, "m")) == 3, limit_s=10, what="its node")
        now = spread_of(mgr, "m")
        assert len(now) == 3 and len(set(now)) == 3, now
        await loop.more(20)
    finally:
        await loop.stop()


async def test_a_node_that_joins_gets_one_replica_moved_to_it_without_a_failed_query(
    cluster: RayCluster, frontend_factory: Any
) -> None:
    # Nodes of a "zone" (a custom resource the others lack) hold this version's replicas.
    n1, n2 = cluster.add_node(zone=10), cluster.add_node(zone=10)
    added = [n1, n2]
    try:
        c = await frontend_factory(settle_s="2")
        mgr, sched = await two_replicas(c, "ray:resource:zone=1")
        assert spread_of(mgr, "m") == sorted([n1.node_id, n2.node_id])

        loop = ClosedLoop(c)
        try:
            await loop.more(20)
            # One zone node lost: its replica goes beside the other (the soft spread: one
            # zone node alive, so two per node).
            t0 = time.monotonic()
            cluster.remove_node(n2)
            added.remove(n2)
            await wait_for(
                lambda: spread_of(mgr, "m") == [n1.node_id, n1.node_id]
                and len(sched.replicas) == 2,
                limit_s=30, interval=0.05, what="both replicas on the surviving zone node",
            )  # fmt: skip
            print(f"zone node removed -> replacement connected beside the other: "
                  f"{time.monotonic() - t0:.2f} s")  # fmt: skip
            await loop.more(20)

            # A zone node joins: after settle_s, one replica moves to it, draining first.
            t0 = time.monotonic()
            n3 = cluster.add_node(zone=10)  # holds the event loop while the node starts
            added.append(n3)
            joined = time.monotonic()
            await loop.more(10)
            defaults = loop.defaults
            await wait_for(
                lambda: spread_of(mgr, "m") == sorted([n1.node_id, n3.node_id])
                and len(sched.replicas) == 2
                and {r.token for r in mgr.replicas("m", "1")}
                == {x.address for x in sched.replicas},
                limit_s=60, interval=0.05, what="one replica moved to the new node",
            )  # fmt: skip
            moved = time.monotonic()
            await wait_for(  # the old actor stopped and killed after its drain
                lambda: len([n for n in cluster.named_actors() if "/m/1/" in n]) == 2,
                limit_s=30, interval=0.05, what="the old actor retired",
            )  # fmt: skip
            print(
                f"zone node added (add_node {joined - t0:.2f} s) -> replacement serving and "
                f"the old one drained: {moved - t0:.2f} s, the old actor gone: "
                f"{time.monotonic() - t0:.2f} s (settle_s 2)"
            )
            assert moved - joined >= 2  # not before the nodes settled
            await loop.more(30)
            assert loop.defaults == defaults  # every query of the move answered by a model
        finally:
            await loop.stop()
        # One slot re-placed (its node lost) and one moved: two new generations in all.
        assert sum(r.generation for r in mgr.replicas("m", "1")) == 2
        await c.stop_model("m", "1")
    finally:
        for n in added:
            cluster.remove_node(n)

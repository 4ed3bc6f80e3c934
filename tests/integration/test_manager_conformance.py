"""One suite, every container manager: what the runtime may count on whoever runs the replicas.

* ensure 2 -> 2 replicas connected;
* scale to 1 under a steady closed loop -> the one stopped is drained first: no query fails;
* a replica's process crashes -> it is back, and the admin replica view reports the restart.

``local://`` restarts its children; ``ray://`` (a real Ray cluster, ``-m ray`` in a venv with Ray)
restarts through its actors; ``k8s://`` (``-m k8s`` in a venv with the kubernetes client and the
kmock API emulator) through Deployments that a local kubelet runs; with ``external://`` an
outside engine (here the test: containers started by hand, fetching their model from the
frontend) starts, stops (SIGTERM: the container drains itself) and restarts them, and the
frontend reports what connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from clipper import Clipper
from tests.integration.helpers import post_json, predict_ok, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SRC = str(Path(__file__).resolve().parents[2] / "src")


def paced_sums(xs: Any) -> list[float]:
    import time

    time.sleep(0.01)  # batches stay in flight long enough to be caught by a scale-down
    return [float(x.sum()) for x in xs]


cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Engine:
    """How the test drives one kind of manager."""

    def __init__(self, c: Clipper, tmp: Path) -> None:
        self.c = c
        self.tmp = tmp

    async def ensure(self, n: int) -> None:
        await self.c.deploy_model("m", "1", paced_sums, input_type="doubles", num_replicas=n)

    async def scale(self, n: int) -> None:
        await self.c.set_num_replicas("m", n, "1")

    def pids(self) -> list[int]:
        return [p.pid for p in self.c.manager.all_replicas() if p.pid is not None]

    async def crash_one(self) -> None:
        [pid, *_] = self.pids()
        os.kill(pid, signal.SIGKILL)

    async def restarted(self, view: list[dict[str, Any]]) -> bool:
        return len(view) == 2 and sum(v["restarts"] or 0 for v in view) >= 1

    def close(self) -> None:
        pass


class ExternalEngine(Engine):
    """The orchestrator outside: containers by hand (model fetched from the frontend)."""

    def __init__(self, c: Clipper, tmp: Path) -> None:
        super().__init__(c, tmp)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.first_ids: set[int] = set()

    def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
        env.update(PYTHONPATH=SRC, XDG_CACHE_HOME=str(self.tmp / "cache"))
        keys = str(self.c.state_dir / "rpc-keys")
        cmd = [sys.executable, "-m", "clipper.container", "--fetch-artifact", "--name", "m",
               "--version", "1", "--input-type", "doubles", "--port", str(self.c.rpc.port),
               "--heartbeat-interval", "0.2", "--rpc-keys", keys]  # fmt: skip
        self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))

    async def ensure(self, n: int) -> None:
        deploy = asyncio.create_task(super().ensure(n))
        await wait_for(lambda: ("m", "1") in self.c.schedulers, limit_s=30, what="the version")
        for _ in range(n):
            self._start()
        await deploy
        self.first_ids = {r.replica_id for r in self.c.schedulers[("m", "1")].replicas}

    async def scale(self, n: int) -> None:
        live = [p for p in self.procs if p.poll() is None]
        for _ in range(n - len(live)):
            self._start()
        await super().scale(n)
        for proc in live[n:]:
            proc.send_signal(signal.SIGTERM)  # what an orchestrator does: the container drains
            assert await asyncio.to_thread(proc.wait, 15) == 0

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    async def crash_one(self) -> None:
        await super().crash_one()
        # The frontend sees the replica go silent; the orchestrator starts another.
        await wait_for(
            lambda: len(self.c.schedulers[("m", "1")].replicas) == 1,
            limit_s=10, what="the crashed replica removed",
        )  # fmt: skip
        self._start()

    async def restarted(self, view: list[dict[str, Any]]) -> bool:
        # The frontend cannot know a restart it did not make: it reports a new replica.
        return len(view) == 2 and {v["replica_id"] for v in view} - self.first_ids != set()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


class KubernetesEngine(Engine):
    """``k8s://`` against an API emulator, with a local kubelet running the Deployments the
    manager creates (tests/integration/kubelet.py): Kubernetes restarts and removes pods."""

    def __init__(self, c: Clipper, tmp: Path, kubelet: Any) -> None:
        super().__init__(c, tmp)
        self.kubelet = kubelet

    def pids(self) -> list[int]:
        return [p.proc.pid for pods in self.kubelet.pods.values() for p in pods]


@pytest.fixture(scope="module")
def ray_cluster_for_suite() -> Iterator[Any]:
    from tests.raycluster import ray_cluster

    with ray_cluster(nodes=3) as cluster:
        yield cluster


@pytest.fixture(
    params=[
        "local",
        "external",
        pytest.param("ray", marks=pytest.mark.ray),
        pytest.param("k8s", marks=pytest.mark.k8s),
    ]
)
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    kind = request.param
    settings: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        kubelet: Any = None
        if kind == "ray":
            from tests.raycluster import require_ray

            require_ray()
            cluster = request.getfixturevalue("ray_cluster_for_suite")
            settings["manager"] = cluster.manager_url(poll_s="0.3")
        elif kind == "external":
            settings["manager"] = "external://"
        elif kind == "k8s":
            kmock = pytest.importorskip("kmock", reason="-m k8s runs in .ci/run's k8s venv")
            pytest.importorskip("kubernetes", reason="-m k8s runs in .ci/run's k8s venv")
            from tests.integration.kubelet import LocalKubelet

            emulator = await stack.enter_async_context(kmock.KubernetesEmulator())
            await stack.enter_async_context(kmock.Server(emulator))
            api = str(emulator.url).rstrip("/")
            settings["manager"] = f"k8s://conformance?api={api}&drain_timeout=5"
            kubelet = LocalKubelet(api, "conformance", tmp_path / "kubelet")
            kubelet.start()
            stack.push_async_callback(kubelet.stop)
        c = Clipper(
            query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "state",
            replica_timeout_s=1.0, **settings,
        )  # fmt: skip
        await c.start()
        engine: Engine
        if kind == "k8s":
            engine = KubernetesEngine(c, tmp_path, kubelet)
        else:
            engine = (ExternalEngine if kind == "external" else Engine)(c, tmp_path)
        try:
            await c.register_application("app", "doubles", "-1", 2_000_000)
            yield engine
        finally:
            engine.close()
            if kind == "ray":  # its actors outlive the frontend by design
                await c.set_num_replicas("m", 0, "1", wait=False)
            await c.stop()


async def replica_view(c: Clipper) -> list[dict[str, Any]]:
    resp = await post_json(f"{c.admin_url}/admin/get_replicas", {})
    assert resp.status == 200
    view: list[dict[str, Any]] = resp.json()
    return view


async def test_ensure_scale_down_with_drain_and_crash_restart(engine: Engine) -> None:
    c = engine.c
    await engine.ensure(2)
    await c.link_model_to_app("app", "m")
    sched = c.schedulers[("m", "1")]
    assert len(sched.replicas) == 2

    answers = failures = 0
    stop = asyncio.Event()

    async def client(k: int) -> None:
        nonlocal answers, failures
        i = 0
        while not stop.is_set():
            doc = await predict_ok(c.query_url, "app", {"input": [float(k), float(i)]})
            if doc["default"] or doc["output"] != float(k + i):
                failures += 1
            else:
                answers += 1
            i += 1

    clients = [asyncio.create_task(client(k)) for k in range(4)]
    try:
        await wait_for(lambda: answers >= 40, limit_s=30, what="steady traffic")
        await engine.scale(1)
        await wait_for(lambda: len(sched.replicas) == 1, limit_s=20, what="one replica left")
        seen = answers
        await wait_for(lambda: answers >= seen + 40, limit_s=30, what="traffic on one replica")
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert failures == 0, f"{failures} queries failed around the scale-down"

    await engine.scale(2)
    await wait_for(lambda: len(sched.replicas) == 2, limit_s=30, what="two again")
    await engine.crash_one()
    await wait_for(lambda: len(sched.replicas) == 2, limit_s=30, what="the crashed one back")

    async def reported() -> bool:
        return await engine.restarted(await replica_view(c))

    await wait_for(reported, limit_s=15, what="the restart reported")
    doc = await predict_ok(c.query_url, "app", {"input": [1.0, 2.0]})
    assert doc["output"] == 3.0 and doc["default"] is False

"""One replica serving every frontend of a deployment (``--shared``), with real processes.

Two ``clipper start`` frontends (``--manager external://``, ``--store memory://``: neither
starts replicas) and ONE ``python -m clipper.container --shared`` given both RPC ports: both
answer predictions from it; SIGKILL of one leaves the other answering; with both gone it exits
after its orphan timeout. Then, with embedded frontends (so the test can call the RpcServer
API the lease holder calls): ``set_frontends`` on one makes the replica link to a frontend
started later, and ``retire`` makes it drain every link and exit 0.

Every frontend uses the same CURVE keys (as a deployment's frontends do); the container holds
them.
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from clipper import BatchingConfig, Clipper
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from clipper.rpc.auth import ensure_keys
from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import predict, wait_for
from tests.integration.redis_server import terminate

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")
START_S = 60.0


def doubled_sums(xs: Any) -> list[float]:
    return [float(x.sum()) * 2 for x in xs]


class ExternalFrontend(FrontendProcess):
    """A ``clipper start`` that starts no replicas and keeps its state in memory, with the
    deployment's shared RPC keys."""

    def __init__(self, state_dir: Path, keys: Path, name: str) -> None:
        super().__init__(state_dir, name=name)
        self.keys = keys

    def command(self) -> list[str]:
        return [*super().command(), "--manager", "external://", "--store", "memory://",
                "--rpc-keys-dir", str(self.keys)]  # fmt: skip

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"

    async def serve_model(self) -> None:
        """The app and the model version the container registers as (no replicas started)."""
        for route, doc in (
            ("add_app", {"name": "app", "input_type": "doubles", "default_output": "-1",
                         "latency_slo_micros": 5_000_000}),
            ("add_model", {"model_name": "m", "model_version": "1", "input_type": "doubles"}),
            ("add_model_links", {"app_name": "app", "model_names": ["m"]}),
        ):  # fmt: skip
            resp = await self.admin(route, doc)
            assert resp.status == 200, (route, resp.status, resp.body)


class Container:
    """The shared replica: one process, its log in the test's directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "container.log"

    def start(self, keys: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
        model = self.root / "model.pkl"
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        try:
            model.write_bytes(cloudpickle.dumps(doubled_sums))
        finally:
            cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
        env["PYTHONPATH"] = SRC
        cmd = [sys.executable, "-m", "clipper.container", "--model-path", str(model),
               "--name", "m", "--version", "1", "--input-type", "doubles",
               "--port", str(port), "--rpc-keys", str(keys), "--heartbeat-interval", "0.2",
               "--shared", "--orphan-timeout-s", "1.5", *args]  # fmt: skip
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        return self.proc

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, grace_s=10.0)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return ensure_keys(tmp_path / "keys").directory


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Container]:
    c = Container(tmp_path)
    try:
        yield c
    finally:
        c.stop()


async def answers(url: str, value: float) -> bool:
    """The app answers [1, 2] from the model (not its default output)."""
    resp = await predict(url, "app", {"input": [1.0, 2.0]})
    if resp.status != 200:
        return False
    doc = resp.json()
    return doc.get("default") is False and doc.get("output") == value


@pytest.fixture
async def two_frontends(tmp_path: Path, keys: Path) -> AsyncIterator[list[ExternalFrontend]]:
    fronts = [ExternalFrontend(tmp_path / f"f{i}", keys, f"frontend{i}") for i in range(2)]
    try:
        await asyncio.gather(*(f.start(limit_s=START_S) for f in fronts))
        await asyncio.gather(*(f.serve_model() for f in fronts))
        yield fronts
    finally:
        for f in fronts:
            await asyncio.to_thread(f.stop)


async def test_one_replica_serves_two_frontends_outlives_one_and_exits_orphaned(
    two_frontends: list[ExternalFrontend], container: Container, keys: Path
) -> None:
    a, b = two_frontends
    proc = container.start(keys, a.ports.rpc, "--frontend", f"tcp://127.0.0.1:{b.ports.rpc}")
    for f in (a, b):
        await wait_for(
            functools.partial(answers, f.query_url, 6.0), limit_s=30, interval=0.1,
            what=f"{f.name} to answer from the shared replica",
        )  # fmt: skip
    assert proc.poll() is None

    a.kill()  # no goodbye, no lease: the replica must notice by itself
    for _ in range(5):
        assert await answers(b.query_url, 6.0), container.text()
    assert proc.poll() is None  # one frontend is enough to keep it

    b.kill()
    # Nobody heard on any link for 1.5 s: it exits by itself (its orphan timeout).
    await wait_for(lambda: proc.poll() is not None, limit_s=20, what="the orphaned replica")
    assert proc.returncode == 0
    assert "no frontend heard from on any link" in container.text()


async def embedded(state_dir: Path, keys: Path) -> Clipper:
    c = Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=state_dir, manager="external://",
        rpc_keys_dir=keys, replica_timeout_s=2.0,
    )  # fmt: skip
    await c.start()
    await c.control.register_model(
        ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, num_replicas=1,
                     batching=BatchingConfig(max_wait_micros=0))
    )  # fmt: skip
    await c.register_application("app", "doubles", "-1", 5_000_000)
    await c.link_model_to_app("app", "m")
    return c


async def test_frontends_list_links_a_later_frontend_and_retire_drains_and_exits_zero(
    tmp_path: Path, container: Container, keys: Path
) -> None:
    first = await embedded(tmp_path / "first", keys)
    later: Clipper | None = None
    try:
        proc = container.start(keys, first.rpc.port, "--replica-token", "slot-7")
        await wait_for(
            lambda: answers(first.query_url, 6.0), limit_s=30, interval=0.1,
            what="the first frontend to answer",
        )  # fmt: skip

        later = await embedded(tmp_path / "later", keys)
        sched = later.schedulers[("m", "1")]
        assert sched.replicas == []  # nobody told the replica about it yet
        first.rpc.set_frontends([first.rpc.address, later.rpc.address])
        await wait_for(lambda: len(sched.replicas) == 1, limit_s=20, what="the new link")
        assert await answers(later.query_url, 6.0)
        assert await answers(first.query_url, 6.0)  # its first link stays
        assert f"frontend {later.rpc.address} listed by" in container.text()

        assert later.rpc.retire("slot-8") is False  # no such replica
        assert later.rpc.retire("slot-7") is True
        await wait_for(lambda: proc.poll() is not None, limit_s=20, what="the retired replica")
        assert proc.returncode == 0
        assert "drained; exiting" in container.text()
        first_sched = first.schedulers[("m", "1")]
        # It said goodbye on both links: each frontend dropped it at once.
        await wait_for(
            lambda: not first_sched.replicas and not sched.replicas, limit_s=5,
            what="both frontends to drop the retired replica",
        )  # fmt: skip
    finally:
        container.stop()
        if later is not None:
            await later.stop()
        await first.stop()

"""Containers on other hosts, with real processes on loopback: the model fetched from the
frontend (authenticated, checksummed, cached by checksum, never read from the frontend's disk),
clear log lines while the frontend cannot be reached or refuses the keys, readiness (file and
HTTP), a drain on SIGTERM that loses no query, and the advertised address.

Each container is a real ``python -m clipper.container`` process started by hand (as an engine
on another host would), in a working directory and HOME of its own, and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from clipper import BatchingConfig, Clipper
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from clipper.rpc.artifacts import pack_artifact
from clipper.rpc.auth import ensure_keys
from tests.integration.helpers import predict_ok, wait_for
from tests.integration.redis_server import free_port

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")


def scaled_sums(xs: Any) -> list[float]:
    return [float(x.sum()) * 10 for x in xs]


def slow_sums(xs: Any) -> list[float]:
    import time

    time.sleep(0.3)  # a batch outlasts the container's 0.1 s turn to notice SIGTERM
    return [float(x.sum()) for x in xs]


def model_file(path: Path, model: Any) -> Path:
    # By value: the containers cannot import this test module (deploy_model's packaging
    # registers and unregisters the module by value itself, so register here each time).
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        path.write_bytes(cloudpickle.dumps(model))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return path


class Containers:
    """Hand-started containers, each in a directory of its own (cwd and HOME), logging to a
    file there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, port: int, *args: str, home: Path | None = None
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """A container; ``home``: on the host (directory) of an earlier one, else a new one."""
        if home is None:
            home = self.root / f"host{len(self.procs)}"
            home.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
        env.update(PYTHONPATH=SRC, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
        log = home / "container.log"
        cmd = [sys.executable, "-m", "clipper.container", "--name", "m", "--version", "1",
               "--input-type", "doubles", "--port", str(port), "--heartbeat-interval", "0.2",
               *args]  # fmt: skip
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        self.procs.append(proc)
        return proc, home

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[Containers]:
    c = Containers(tmp_path / "hosts")
    try:
        yield c
    finally:
        c.stop()


def log_text(home: Path) -> str:
    return (home / "container.log").read_text(errors="replace")


def fetches(c: Clipper, model: str = "m") -> float:
    value = c.metrics.registry.get_sample_value(
        "clipper_artifact_fetches_total", {"model": model, "version": "1"}
    )
    return value or 0.0


@pytest.fixture
async def external(tmp_path: Path) -> AsyncIterator[Clipper]:
    """A frontend whose replicas are started by someone else (here: by the test)."""
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "frontend",
        manager="external://", replica_timeout_s=2.0,
    ) as c:  # fmt: skip
        await c.register_application("app", "doubles", "-1", 2_000_000)
        yield c


async def test_a_container_fetches_its_artifact_checksummed_and_cached_by_checksum(
    external: Clipper, containers: Containers
) -> None:
    c = external
    keys = str(c.state_dir / "rpc-keys")
    # The deploy waits for its replica; the engine (here: the test) starts it meanwhile.
    deploy = asyncio.create_task(c.deploy_model("m", "1", scaled_sums, input_type="doubles"))
    await wait_for(lambda: ("m", "1") in c.schedulers, limit_s=30, what="the version")
    artifact = Path(c.registry.get_model("m", "1").artifact or "")
    assert await asyncio.to_thread(artifact.is_dir)

    # No --model-path: the frontend's artifact path is not given, and its cwd and HOME are
    # elsewhere. The model comes over the authenticated RPC connection.
    proc, home = containers.start(c.rpc.port, "--fetch-artifact", "--rpc-keys", keys)
    await deploy
    await c.link_model_to_app("app", "m")
    sched = c.schedulers[("m", "1")]
    assert len(sched.replicas) == 1
    doc = await predict_ok(c.query_url, "app", {"input": [1.0, 2.0]})
    assert doc["output"] == 30.0 and doc["default"] is False
    assert fetches(c) == 1

    # Cached under its checksum, the same one the frontend computes for its pack.
    expected = pack_artifact(artifact, c.state_dir / "check-pack", "check").sha256
    cache = home / ".cache" / "clipper-serve" / "artifacts"
    assert [p.name for p in cache.iterdir()] == [expected]
    assert (cache / expected / "tree" / "clipper-model.json").is_file()
    assert "fetched the artifact of m:1" in log_text(home)

    # A restart on the same host (same cache) fetches nothing: the checksum is there.
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 10) == 0
    containers.start(c.rpc.port, "--fetch-artifact", "--rpc-keys", keys, home=home)
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=30, what="the restarted container")
    assert (await predict_ok(c.query_url, "app", {"input": [4.0]}))["output"] == 40.0
    assert fetches(c) == 1
    assert "artifact of m:1 found in the cache" in log_text(home)


async def test_artifacts_pack_to_a_stable_checksum(
    tmp_path: Path,
) -> None:
    source = model_file(tmp_path / "model.pkl", scaled_sums)
    packed = pack_artifact(source, tmp_path / "packs", "x")
    assert packed.kind == "file" and packed.path == source
    assert packed.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    # A directory packs to the same checksum every time (sorted, no owners or times).
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.bin").write_bytes(b"a" * 1000)
    (tree / "sub" / "b.bin").write_bytes(b"b" * 10)
    first = pack_artifact(tree, tmp_path / "packs", "t1")
    os.utime(tree / "a.bin", (1, 1))
    second = pack_artifact(tree, tmp_path / "packs", "t2")
    assert first.kind == "tar" and first.sha256 == second.sha256


@pytest.mark.slow
async def test_unreachable_then_refused_then_reached_is_logged_clearly_and_readiness_follows(
    tmp_path: Path, containers: Containers
) -> None:
    keys_dir = ensure_keys(tmp_path / "keys").directory
    rpc_port, ready_port = free_port(), free_port()
    ready_file = tmp_path / "ready" / "m-0"
    model = model_file(tmp_path / "model.pkl", scaled_sums)

    # Nothing listens yet: it says so (once, not once per retry), and it is not ready.
    _, home = containers.start(
        rpc_port, "--model-path", str(model), "--rpc-keys", str(keys_dir),
        "--ready-file", str(ready_file), "--ready-port", str(ready_port),
        "--ready-host", "127.0.0.1",
    )  # fmt: skip
    await wait_for(
        lambda: f"cannot reach the frontend at tcp://127.0.0.1:{rpc_port}" in log_text(home),
        limit_s=20, what="the unreachable line",
    )  # fmt: skip
    assert await probe(ready_port, "/live") == 200
    assert await probe(ready_port, "/ready") == 503
    assert not ready_file.exists()
    await asyncio.sleep(0.5)  # several retries happen meanwhile (100 ms, doubling)
    assert log_text(home).count("cannot reach the frontend") == 1

    # Without keys against an authenticating frontend: the line names the flag that fixes it.
    async with Clipper(
        query_port=0, rpc_port=rpc_port, admin_port=0, state_dir=tmp_path / "frontend",
        manager="external://", rpc_keys_dir=keys_dir,
    ) as c:  # fmt: skip
        await c.control.register_model(
            ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, num_replicas=1,
                         batching=BatchingConfig(max_wait_micros=0))
        )  # fmt: skip
        await c.register_application("app", "doubles", "-1", 2_000_000)
        await c.link_model_to_app("app", "m")
        await wait_for(ready_file.exists, limit_s=30, what="the ready file once registered")
        assert "reached the frontend at" in log_text(home)
        assert await probe(ready_port, "/ready") == 200
        assert (await predict_ok(c.query_url, "app", {"input": [1.0]}))["output"] == 10.0

        _, nokeys = containers.start(rpc_port, "--model-path", str(model))
        await wait_for(
            lambda: "requires RPC authentication: start the container with --rpc-keys"
            in log_text(nokeys),
            limit_s=20, what="the missing-keys line",
        )  # fmt: skip
        other = ensure_keys(tmp_path / "other-keys").directory
        mixed = tmp_path / "mixed-keys"  # the right server key, a client key it does not know
        mixed.mkdir(mode=0o700)
        (mixed / "server.key").write_bytes((keys_dir / "server.key").read_bytes())
        (mixed / "client.key_secret").write_bytes((other / "client.key_secret").read_bytes())
        os.chmod(mixed / "client.key_secret", 0o600)
        _, wrong = containers.start(rpc_port, "--model-path", str(model), "--rpc-keys", str(mixed))
        await wait_for(
            lambda: "refused this container's CURVE keys" in log_text(wrong),
            limit_s=20, what="the refused-keys line",
        )  # fmt: skip
        assert len(c.schedulers[("m", "1")].replicas) == 1  # only the genuine one

    # The frontend is gone: no longer ready (it reconnects after its activity timeout).
    await wait_for(lambda: not ready_file.exists(), limit_s=20, what="readiness withdrawn")
    assert await probe(ready_port, "/ready") == 503


async def probe(port: int, path: str) -> int:
    def get() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    for _ in range(100):  # the probe server starts with the process
        try:
            return await asyncio.to_thread(get)
        except urllib.error.URLError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"nothing answers on port {port}")


async def test_sigterm_drains_in_flight_batches_and_loses_no_query(
    external: Clipper, containers: Containers, tmp_path: Path
) -> None:
    c = external
    keys = str(c.state_dir / "rpc-keys")
    # Batches of at most 3 for 6 closed-loop clients: both replicas always have work (with no
    # cap the clients fall into step, all 6 riding each batch of whichever replica is first).
    batching = BatchingConfig(controller="fixed", max_batch_size=3, max_wait_micros=0)
    deploy = asyncio.create_task(
        c.deploy_model("m", "1", slow_sums, input_type="doubles", batching=batching)
    )
    await wait_for(lambda: ("m", "1") in c.schedulers, limit_s=30, what="the version")
    model = Path(c.registry.get_model("m", "1").artifact or "")
    ready = [tmp_path / "ready-a", tmp_path / "ready-b"]
    leaver, leaver_home = containers.start(
        c.rpc.port, "--model-path", str(model), "--rpc-keys", keys,
        "--ready-file", str(ready[0]), "--replica-token", "leaver",
    )  # fmt: skip
    stayer, _ = containers.start(
        c.rpc.port, "--model-path", str(model), "--rpc-keys", keys, "--ready-file", str(ready[1])
    )
    await deploy
    await c.link_model_to_app("app", "m")
    sched = c.schedulers[("m", "1")]
    await wait_for(lambda: all(p.exists() for p in ready), limit_s=30, what="both ready")
    assert len(sched.replicas) == 2

    answers: list[dict[str, Any]] = []
    stop = asyncio.Event()

    async def closed_loop(k: int) -> None:
        i = 0
        while not stop.is_set():
            doc = await predict_ok(c.query_url, "app", {"input": [float(k), float(i)]})
            answers.append(doc)
            assert doc["output"] == float(k + i), doc
            i += 1

    clients = [asyncio.create_task(closed_loop(k)) for k in range(6)]
    try:
        await wait_for(lambda: len(answers) >= 20, limit_s=30, what="steady traffic")

        # SIGTERM while the leaver holds a batch (its token names it among the replicas): one
        # sent 100 ms ago, so the container has read it (a batch sent a moment ago may still
        # be in the socket) and is still in its 300 ms.
        def holding() -> bool:
            now = c.clock.now()
            return any(
                now - sent >= 0.1
                for r in sched.replicas if r.address == "leaver"
                for _, sent, _ in r.in_flight.values()
            )  # fmt: skip

        await wait_for(holding, limit_s=15, interval=0.001, what="a batch held by the leaver")
        leaver.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(leaver.wait, 15)
        assert code == 0
        assert not ready[0].exists()  # readiness withdrawn on leaving
        held = re.search(r"draining (\d+) batches", log_text(leaver_home))
        assert held is not None and int(held.group(1)) >= 1  # it answered what it held
        # It told the frontend: removed as its last batch came back, well before the 2 s
        # heartbeat timeout would have removed it.
        await wait_for(lambda: len(sched.replicas) == 1, limit_s=1.0, what="the leaver removed")
        before = len(answers)
        await wait_for(lambda: len(answers) >= before + 20, limit_s=30, what="traffic after")
    finally:
        stop.set()
        await asyncio.gather(*clients)
    assert all(doc["default"] is False for doc in answers), "a query lost to the drain"
    assert stayer.poll() is None


async def test_local_replicas_are_told_the_advertised_host(tmp_path: Path) -> None:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "s",
        advertise_host="localhost", rpc_local_socket=False,  # TCP, not the private socket
    ) as c:  # fmt: skip
        await c.deploy_model("m", "1", scaled_sums, input_type="doubles")
        await c.register_application("app", "doubles", "-1", 2_000_000)
        await c.link_model_to_app("app", "m")
        doc = await predict_ok(c.query_url, "app", {"input": [2.0]})
        assert doc["output"] == 20.0  # it dialled localhost (a name) and got through
        [proc] = c.manager.all_replicas()
        assert proc.pid is not None
        cmdline = await asyncio.to_thread(Path(f"/proc/{proc.pid}/cmdline").read_bytes)
        argv = cmdline.split(b"\0")
        assert argv[argv.index(b"--ip") + 1] == b"localhost"

"""Authenticated replicas on real sockets: containers without this deployment's CURVE keys are
refused at the handshake and counted (and never answer a query), a hand-started container with
``--rpc-keys`` joins, the local manager's containers join with keys, the answers of a replica
removed as failed leave the cache, and a held event loop removes no replica.

Rogue containers run :func:`clipper.container.runtime.serve` on threads (cheap); the genuine
hand-started one is a real ``python -m clipper.container`` process, stopped by its PID.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import uvloop
import zmq

from clipper import BatchingConfig, Clipper
from clipper.container.runtime import serve
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from clipper.rpc.auth import ClientKeys, ensure_keys, load_client_keys
from tests.integration.helpers import predict_ok, wait_for

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")


def refused(c: Clipper, reason: str) -> float:
    value = c.metrics.registry.get_sample_value("clipper_rpc_refused_total", {"reason": reason})
    return value or 0.0


@pytest.fixture
async def frontend(tmp_path: Path) -> AsyncIterator[Clipper]:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "state", replica_timeout_s=1.0
    ) as c:
        # A model whose containers are started by hand (no artifact).
        await c.control.register_model(
            ModelVersion(
                name="m",
                version="1",
                input_type=InputType.DOUBLES,
                num_replicas=1,
                batching=BatchingConfig(max_wait_micros=0),
            )
        )
        await c.register_application("app", "doubles", "-1", 2_000_000)
        await c.link_model_to_app("app", "m")
        yield c


@pytest.fixture
def rogues() -> Iterator[Callable[[Clipper, ClientKeys | None], None]]:
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(c: Clipper, keys: ClientKeys | None) -> None:
        stop = threading.Event()
        thread = threading.Thread(
            target=serve,
            args=(lambda xs: ["rogue"] * len(xs),),
            kwargs={
                "name": "m",
                "version": "1",
                "input_type": InputType.DOUBLES,
                "address": f"tcp://127.0.0.1:{c.rpc.port}",
                "heartbeat_interval": 0.1,
                "activity_timeout": 1.0,  # reconnects (and is refused again) every second
                "stop_event": stop,
                "keys": keys,
            },
            daemon=True,
        )
        thread.start()
        stops.append((stop, thread))

    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(5)
        assert not thread.is_alive()


@pytest.fixture
async def processes() -> AsyncIterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            # Waited for off the loop: the embedded frontend runs on it and must acknowledge
            # the leaving container's goodbye, or the container waits out its drain timeout.
            try:
                await asyncio.to_thread(proc.wait, 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def genuine_model(xs: Any) -> list[str]:
    return [f"genuine {float(x.sum())}" for x in xs]


def start_container(
    tmp_path: Path,
    port: int,
    *args: str,
    procs: list[subprocess.Popen[bytes]],
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    path = tmp_path / "model.pkl"
    path.write_bytes(cloudpickle.dumps(genuine_model))  # by value: a test module function
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
    env.update(env_extra or {}, PYTHONPATH=SRC)
    cmd = [sys.executable, "-m", "clipper.container", "--model-path", str(path), "--name", "m",
           "--input-type", "doubles", "--port", str(port), "--heartbeat-interval", "0.2",
           *args]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL)
    procs.append(proc)
    return proc


def cmdline(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


cloudpickle.register_pickle_by_value(sys.modules[__name__])


async def test_rogue_containers_are_refused_counted_and_never_answer(
    frontend: Clipper,
    rogues: Callable[[Clipper, ClientKeys | None], None],
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = frontend
    caplog.set_level(logging.WARNING, logger="clipper.rpc")
    keys_dir = c.state_dir / "rpc-keys"
    genuine = load_client_keys(keys_dir)
    other = load_client_keys(ensure_keys(tmp_path / "another-deployment").directory)
    foreign_pub, foreign_sec = zmq.curve_keypair()

    rogues(c, None)  # no keys at all: what any local process could do before
    rogues(c, other)  # another deployment's keys: the server key is wrong
    rogues(c, ClientKeys(genuine.server_public, foreign_pub, foreign_sec))  # unknown client key
    await wait_for(
        lambda: refused(c, "no_keys") >= 4 and refused(c, "unknown_key") >= 2,
        limit_s=15,
        what="the rogues to be refused (and refused again on reconnecting)",
    )
    sched = c.schedulers[("m", "1")]
    assert sched.replicas == [] and c.rpc.replicas() == []
    doc = await predict_ok(c.query_url, "app", {"input": [1.0]})
    assert doc["default"] is True  # nobody may answer yet

    # One log line for all those refusals (rate-limited), naming the flag that fixes it.
    lines = [r for r in caplog.records if r.name == "clipper.rpc" and "refused" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "--rpc-keys" in lines[0].getMessage()
    metrics = c.metrics.render().decode()
    assert 'clipper_rpc_refused_total{reason="no_keys"}' in metrics

    # A container started by hand with the keys directory joins; the rogues keep trying.
    start_container(tmp_path, c.rpc.port, "--rpc-keys", str(keys_dir), procs=processes)
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=30, what="the genuine container")
    before = refused(c, "no_keys")
    for i in range(40):
        doc = await predict_ok(c.query_url, "app", {"input": [float(i), 1.0]})
        assert doc == {"query_id": doc["query_id"], "output": f"genuine {i + 1.0}",
                       "default": False}  # fmt: skip
    await wait_for(lambda: refused(c, "no_keys") > before, limit_s=5, what="more refusals")
    assert len(sched.replicas) == 1


async def test_a_container_with_the_keys_in_the_environment_joins(
    frontend: Clipper, processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    c = frontend
    keys_dir = c.state_dir / "rpc-keys"
    start_container(
        tmp_path, c.rpc.port, procs=processes, env_extra={"CLIPPER_RPC_KEYS": str(keys_dir)}
    )
    sched = c.schedulers[("m", "1")]
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=30, what="the container")
    doc = await predict_ok(c.query_url, "app", {"input": [2.0]})
    assert doc["output"] == "genuine 2.0"


async def test_answers_of_a_replica_removed_as_silent_leave_the_cache(
    frontend: Clipper, processes: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    c = frontend
    keys = str(c.state_dir / "rpc-keys")
    proc = start_container(tmp_path, c.rpc.port, "--rpc-keys", keys, procs=processes)
    sched = c.schedulers[("m", "1")]
    await wait_for(lambda: len(sched.replicas) == 1, limit_s=30, what="the container")
    doc = await predict_ok(c.query_url, "app", {"input": [5.0]})
    assert doc["output"] == "genuine 5.0"
    assert c.cache.stats.entries == 1
    hits = c.cache.stats.hits
    assert (await predict_ok(c.query_url, "app", {"input": [5.0]}))["output"] == "genuine 5.0"
    assert c.cache.stats.hits == hits + 1  # served from the cache while the replica lives

    proc.send_signal(signal.SIGSTOP)  # hung: silent, not exited
    try:
        await wait_for(lambda: sched.replicas == [], limit_s=10, what="removal as silent")
        assert c.cache.stats.entries == 0
        doc = await predict_ok(c.query_url, "app", {"input": [5.0]})
        assert doc["default"] is True  # not the removed replica's cached answer
    finally:
        proc.send_signal(signal.SIGCONT)


async def test_local_manager_containers_join_with_keys_passed_by_path(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=state, rpc_local_socket=False
    ) as c:
        t0 = time.monotonic()
        await c.deploy_model("sum", "1", genuine_model, input_type="doubles")
        deploy_s = time.monotonic() - t0
        await c.register_application("s", "doubles", "-1", 2_000_000)
        await c.link_model_to_app("s", "sum")
        doc = await predict_ok(c.query_url, "s", {"input": [1.0, 2.0]})
        assert doc["output"] == "genuine 3.0"
        keys_dir = state / "rpc-keys"
        assert stat.S_IMODE(keys_dir.stat().st_mode) == 0o700
        for name in ("server.key_secret", "client.key_secret"):
            assert stat.S_IMODE((keys_dir / name).stat().st_mode) == 0o600
        [proc] = c.manager.all_replicas()
        assert proc.pid is not None
        argv = cmdline(proc.pid)
        assert argv[argv.index(b"--rpc-keys") + 1] == str(keys_dir).encode()
        secret = load_client_keys(keys_dir).secret
        assert secret not in b" ".join(argv)
        assert refused(c, "no_keys") == refused(c, "unknown_key") == 0
        print(f"deploy to connected with CURVE: {deploy_s * 1e3:.0f} ms")


OTHER_USER_CONNECTS = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("refused")
else:
    print("connected")
"""


async def test_local_manager_containers_dial_a_private_unix_socket(
    tmp_path: Path, rogues: Callable[[Clipper, ClientKeys | None], None]
) -> None:
    state = tmp_path / "state"
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=state) as c:
        await c.deploy_model("sum", "1", genuine_model, input_type="doubles")
        await c.register_application("s", "doubles", "-1", 2_000_000)
        await c.link_model_to_app("s", "sum")
        doc = await predict_ok(c.query_url, "s", {"input": [1.0, 2.0]})
        assert doc["output"] == "genuine 3.0"
        address = c.rpc.local_address
        assert address is not None and address.startswith("ipc://")
        path = Path(address.removeprefix("ipc://"))
        modes = await asyncio.to_thread(lambda: (path.stat().st_mode, path.parent.stat().st_mode))
        assert stat.S_ISSOCK(modes[0])
        assert stat.S_IMODE(modes[1]) == 0o700  # this user (and root) only
        [proc] = c.manager.all_replicas()
        assert proc.pid is not None
        argv = cmdline(proc.pid)
        assert argv[argv.index(b"--ipc") + 1] == str(path).encode()
        assert b"--rpc-keys" not in argv and b"--port" not in argv
        # The TCP port still wants the keys: a container without them is refused there.
        await c.control.register_model(
            ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, num_replicas=1)
        )
        rogues(c, None)
        await wait_for(lambda: refused(c, "no_keys") >= 1, limit_s=15, what="the refusal")
        assert c.schedulers[("m", "1")].replicas == []
        # Another user cannot even open the socket (root may switch to one; the test's own
        # interpreter may sit where that user cannot read, so the system's runs the probe).
        python = shutil.which("python3", path="/usr/bin:/bin")
        if os.geteuid() == 0 and python is not None:
            out = await asyncio.to_thread(
                subprocess.run, [python, "-c", OTHER_USER_CONNECTS, str(path)], user=65534,
                cwd="/", capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            assert out.stdout.strip() == "refused"
    assert not await asyncio.to_thread(path.parent.exists)  # removed with the frontend


def test_a_held_event_loop_removes_no_replica(tmp_path: Path) -> None:
    """On uvloop, as ``clipper start`` runs, with the loop held inside an I/O callback (as a
    huge request's parse holds it): libuv then runs the due timers before it polls sockets
    again, so the silence check runs before the heartbeats waiting in the socket are read."""

    async def scenario() -> None:
        async with Clipper(
            query_port=0,
            rpc_port=0,
            admin_port=0,
            state_dir=tmp_path / "state",
            replica_timeout_s=1.0,
            heartbeat_interval_s=0.2,
        ) as c:
            await c.deploy_model("sum", "1", genuine_model, input_type="doubles")
            [replica] = c.schedulers[("sum", "1")].replicas
            loop = asyncio.get_running_loop()
            a, b = socket.socketpair()
            held = asyncio.Event()

            def hold() -> None:  # the point: one I/O callback holds the loop for 2.5 s
                loop.remove_reader(a.fileno())
                time.sleep(2.5)
                held.set()

            try:
                loop.add_reader(a.fileno(), hold)
                b.send(b"x")
                await held.wait()
                await asyncio.sleep(0.6)  # the overdue checks run, the heartbeats are read
            finally:
                a.close()
                b.close()
            assert c.schedulers[("sum", "1")].replicas == [replica]
            assert c.rpc.replicas() == [replica.link]

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())

"""Shared replicas end to end: two ``clipper start`` frontends on one redis-server, one model
version with ``num_replicas: 2``, and the replicas serving both.

Contract (docs/scale-out.md, "One replica owner per deployment"):

* the deployment runs exactly 2 replica processes (counted in /proc by their command line),
  started by the owner with ``--shared``, and both frontends answer from them;
* SIGKILL of the owner while a client queries the other frontend: 0 failed queries, the other
  frontend becomes the owner (it adopts the replicas), and the count stays 2;
* the killed frontend restarted on its state directory is not the owner and starts nothing: the
  count stays 2 while it connects to the same replicas;
* the last frontend stopping gracefully retires them: the count goes to 0.

Both frontends hold the deployment's CURVE keys (one ``--rpc-keys-dir``), as frontends sharing
replicas must. Skipped only when redis-server is not installed and ``CLIPPER_REQUIRE_REDIS``
is not set.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from clipper.rpc.auth import ensure_keys
from clipper.runtime.processes import containers_with
from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import predict, wait_for, write_row_sums
from tests.integration.redis_server import REDIS_SERVER, start_redis, stop_redis

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        REDIS_SERVER is None and not os.environ.get("CLIPPER_REQUIRE_REDIS"),
        reason="redis-server is not installed (apt-get install -y redis-server); "
        "set CLIPPER_REQUIRE_REDIS=1 to fail instead",
    ),
]

MODEL = "shared-sums"
LEASE_TTL_S = 3.0
# The owner lease expires, the other frontend takes it and adopts: a few TTLs at most.
TAKEOVER_S = 30.0


class SharingFrontend(FrontendProcess):
    """A frontend of the deployment: the shared store, the deployment's RPC keys."""

    def __init__(self, state_dir: Path, *, store: str, keys: Path, name: str) -> None:
        super().__init__(state_dir, store=store, name=name)
        self.keys = keys

    def command(self) -> list[str]:
        return [*super().command(), "--rpc-keys-dir", str(self.keys),
                "--owner-lease-ttl-s", str(LEASE_TTL_S)]  # fmt: skip

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"

    async def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = await self.admin_ok("get_status", {})
        return doc

    async def owner(self) -> dict[str, Any]:
        owner: dict[str, Any] = (await self.status())["replica_owner"]
        return owner

    async def connected(self) -> int:
        for m in (await self.status())["models"]:
            if m["model_name"] == MODEL:
                return int(m["connected_replicas"])
        return 0


def replica_pids() -> list[int]:
    """Live ``clipper.container`` processes of MODEL, whoever started them."""
    return containers_with(b"--name", MODEL.encode())


def tcp_peer_ports(pid: int) -> set[int]:
    """The remote ports of the TCP connections process ``pid`` holds (its sockets' inodes
    looked up in /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def shared_flags(pid: int) -> tuple[bool, bool]:
    """(has --shared, has --parent-pid) in the replica's command line."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return b"--shared" in args, b"--parent-pid" in args


@pytest.fixture
def redis_url() -> Iterator[str]:
    proc, port = start_redis()
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_redis(proc)


@pytest.fixture
async def frontends(
    tmp_path: Path, redis_url: str
) -> AsyncIterator[tuple[SharingFrontend, SharingFrontend]]:
    keys = ensure_keys(tmp_path / "keys").directory
    a = SharingFrontend(tmp_path / "a" / "state", store=redis_url, keys=keys, name="frontend-a")
    b = SharingFrontend(tmp_path / "b" / "state", store=redis_url, keys=keys, name="frontend-b")
    try:
        yield a, b
    finally:
        a.cleanup()
        b.cleanup()
        # Replicas outlive their frontend by design: any left (a failed test) go by PID.
        for pid in replica_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def query_until(
    url: str, stop: asyncio.Event, outcomes: dict[str, int], answered: asyncio.Event
) -> None:
    """A closed-loop client: [i, 1] answered i + 1 by a replica, or counted as a failure."""
    for i in itertools.count():
        if stop.is_set():
            return
        try:
            resp = await predict(url, "sums", {"input": [float(i), 1.0]}, limit_s=5.0)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            what = f"error {type(exc).__name__}"
            outcomes[what] = outcomes.get(what, 0) + 1
            continue
        doc = resp.json() if resp.status == 200 else None
        if doc is None or doc.get("default") or doc.get("output") != float(i + 1):
            what = f"status {resp.status}" if doc is None else f"bad answer {doc}"
            outcomes[what] = outcomes.get(what, 0) + 1
        else:
            outcomes["ok"] = outcomes.get("ok", 0) + 1
            answered.set()


async def test_two_frontends_share_two_replicas_through_the_owners_death(
    frontends: tuple[SharingFrontend, SharingFrontend], tmp_path: Path
) -> None:
    a, b = frontends
    await a.start()
    await b.start()

    async def both_listed() -> bool:
        return [len((await fe.owner())["frontends"]) for fe in (a, b)] == [2, 2]

    await wait_for(both_listed, limit_s=15.0, interval=0.2, what="both frontends listed")
    owners = [fe for fe in (a, b) if (await fe.owner())["is_owner"]]
    assert len(owners) == 1, [await fe.owner() for fe in (a, b)]
    owner = owners[0]
    other = b if owner is a else a
    assert (await other.owner())["owner"] == (await owner.owner())["holder"]

    # Configured on the frontend that does NOT own the replicas: the owner hears it through
    # the store and starts them.
    artifact = write_row_sums(tmp_path)
    app = {"name": "sums", "input_type": "doubles", "default_output": "-1",
           "latency_slo_micros": 5_000_000}  # fmt: skip
    await other.admin_ok("add_app", app)
    await other.admin_ok(
        "deploy_model",
        {"model_name": MODEL, "model_version": "1", "input_type": "doubles",
         "artifact_path": artifact, "num_replicas": 2},
        limit_s=90.0,
    )  # fmt: skip
    await other.admin_ok("add_model_links", {"app_name": "sums", "model_names": [MODEL]})

    async def both_connected() -> bool:
        return [await fe.connected() for fe in (a, b)] == [2, 2]

    await wait_for(both_connected, limit_s=60.0, interval=0.2, what="2 replicas on each frontend")
    pids = replica_pids()
    assert len(pids) == 2, pids
    assert all(shared_flags(pid) == (True, False) for pid in pids)

    # Both frontends are on this machine: the replicas reach each on its private Unix socket
    # (the owner's from the start, the other's once the lists name it), not over TCP.
    async def over_unix_sockets() -> bool:
        rpc_ports = {a.ports.rpc, b.ports.rpc}
        return not any(tcp_peer_ports(pid) & rpc_ports for pid in pids)

    await wait_for(over_unix_sockets, limit_s=15.0, interval=0.2, what="links on Unix sockets")
    await wait_for(both_connected, limit_s=15.0, interval=0.2, what="still 2 on each frontend")
    for fe in (a, b):
        doc = (await predict(fe.query_url, "sums", {"input": [2.0, 3.0]})).json()
        assert doc["output"] == 5.0 and not doc["default"], doc

    # The owner dies while a client queries the other frontend.
    stop, answered = asyncio.Event(), asyncio.Event()
    outcomes: dict[str, int] = {}
    client = asyncio.create_task(query_until(other.query_url, stop, outcomes, answered))
    try:
        await asyncio.wait_for(answered.wait(), 10.0)
        owner.kill()

        async def took_over() -> bool:
            return bool((await other.owner())["is_owner"])

        await wait_for(took_over, limit_s=TAKEOVER_S, interval=0.2, what="the takeover")
        assert replica_pids() == pids  # adopted, not restarted

        # The killed frontend comes back on its state directory: not the owner, no new
        # replica; the replicas dial it again.
        await owner.start()
        await wait_for(
            lambda: _connected_is(owner, 2), limit_s=30.0, interval=0.2, what="reconnected"
        )
        await wait_for(over_unix_sockets, limit_s=15.0, interval=0.2, what="Unix sockets again")
        status = await owner.owner()
        assert status["is_owner"] is False
        assert status["owner"] == (await other.owner())["holder"]
        # Watched for longer than an adopted slot's grace period (2 replica timeouts): no
        # replica is started anew or stopped.
        loop = asyncio.get_running_loop()
        until = loop.time() + 7.0
        while loop.time() < until:
            assert replica_pids() == pids
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await client
    assert outcomes.get("ok", 0) > 0 and set(outcomes) == {"ok"}, outcomes

    # Graceful stops: the non-owner leaves the replicas running; the last one retires them.
    owner.stop()
    assert replica_pids() == pids
    other.stop()
    await wait_for(lambda: not replica_pids(), limit_s=20.0, interval=0.1, what="replicas gone")


async def _connected_is(fe: SharingFrontend, n: int) -> bool:
    return await fe.connected() == n

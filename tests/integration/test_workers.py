"""``clipper start --workers 2``: one query port served by two frontend processes.

The kernel spreads connections over the workers (SO_REUSEPORT); the query port's ``/metrics``
names the worker that answered (``clipper_worker_info``), and each worker's own admin port
(listed in ``<state-dir>/workers.json``) serves its own ``/metrics``. An admin change made on
the deployment's admin port (worker 0) reaches worker 1 through the shared SQLite store. A
worker killed with SIGKILL is restarted by the supervisor while the port keeps answering; a
SIGTERM to the supervisor stops every process of the deployment.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.frontend_process import (
    FrontendProcess,
    container_pids,
    keyed_container_pids,
    live,
)
from tests.integration.helpers import predict, request, wait_for, write_row_sums

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

START_LIMIT_S = 90.0
INPUT = [1.0, 2.0, 3.5]
_WORKER = re.compile(rb'^clipper_worker_info\{[^}]*worker="(\d+)"', re.MULTILINE)
_REQUESTS = re.compile(rb'^clipper_app_requests_total\{app="sums"\} ([0-9.e+]+)$', re.MULTILINE)


class Workers(FrontendProcess):
    """The deployment: the supervisor is the process; its workers are found in workers.json."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir, name="workers")
        self.worker_pids: set[int] = set()

    def command(self) -> list[str]:
        cmd = super().command()
        at = cmd.index("--rpc-port")
        # Without --rpc-port each worker's RPC port is ephemeral (given, worker k's is it + k).
        return [*cmd[:at], *cmd[at + 2 :], "--workers", "2"]

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"

    def listed(self) -> dict[int, dict[str, Any]]:
        """The running workers by index, as the supervisor lists them."""
        try:
            doc = orjson.loads((self.state_dir / "workers.json").read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        found = {int(w["index"]): w for w in doc["workers"]}
        self.worker_pids.update(int(w["pid"]) for w in found.values())
        return found

    async def both_listed(self) -> dict[int, dict[str, Any]]:
        def listed() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            return sorted(self.listed()) == [0, 1]

        await wait_for(
            listed, limit_s=START_LIMIT_S, interval=0.05,
            what="both workers to be listed in workers.json",
        )  # fmt: skip
        return self.listed()

    async def admin_of(self, index: int, route: str, doc: Any) -> Any:
        port = self.listed()[index]["admin_port"]
        resp = await request(
            f"http://127.0.0.1:{port}/admin/{route}", "POST", orjson.dumps(doc), limit_s=10.0
        )
        assert resp.status == 200, (index, route, resp.status, resp.body[:300])
        return resp.json()

    async def requests_counted(self, index: int) -> float:
        port = self.listed()[index]["admin_port"]
        resp = await request(f"http://127.0.0.1:{port}/metrics")
        assert resp.status == 200, resp.body[:300]
        found = _REQUESTS.search(resp.body)
        return float(found.group(1)) if found else 0.0

    def all_pids(self) -> set[int]:
        """Every process the deployment ever had: supervisor, workers, their replicas."""
        pids = set(self.past_pids) | self.worker_pids
        for worker in self.worker_pids:
            pids.update(container_pids(worker))
        # Shared replicas (--workers > 1 shares them): no parent, the deployment's keys.
        pids.update(keyed_container_pids(self.state_dir / "rpc-keys"))
        return pids


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[Workers]:
    d = Workers(tmp_path / "state")
    try:
        yield d
    finally:
        pids = d.all_pids()
        d.cleanup()
        for worker in d.worker_pids:
            for pid in container_pids(worker):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            if live(pid) and pid not in d.past_pids:
                os.kill(pid, signal.SIGKILL)


async def worker_answering(url: str) -> int:
    resp = await request(f"{url}/metrics")
    assert resp.status == 200, resp.body[:300]
    found = _WORKER.search(resp.body)
    assert found is not None, "the query port's /metrics names no worker"
    return int(found.group(1))


async def sums_ok(url: str) -> bool:
    resp = await predict(url, "sums", {"input": INPUT})
    return resp.status == 200 and resp.json().get("default") is False


async def test_two_workers_share_the_port_the_store_and_restart_after_sigkill(
    deployment: Workers, tmp_path: Path
) -> None:
    d = deployment
    await d.start(limit_s=START_LIMIT_S)
    await d.both_listed()

    # Many connections on the one port: both workers take some.
    seen = [await worker_answering(d.query_url) for _ in range(60)]
    assert set(seen) == {0, 1}, seen

    # An admin change on the deployment's admin port (worker 0) reaches worker 1.
    await d.admin_ok(
        "add_app",
        {"name": "sums", "input_type": "doubles", "default_output": "-1.0",
         "latency_slo_micros": 2_000_000},
    )  # fmt: skip
    artifact = write_row_sums(tmp_path)
    await d.admin_ok(
        "deploy_model",
        {"model_name": "summer", "model_version": "1", "input_type": "doubles",
         "artifact_path": artifact, "num_replicas": 1},
        limit_s=120,
    )  # fmt: skip
    await d.admin_ok("add_model_links", {"app_name": "sums", "model_names": ["summer"]})

    async def worker_1_has_it() -> bool:
        app = await d.admin_of(1, "get_application", {"name": "sums"})
        return bool(app) and app.get("linked_models") == ["summer"]

    await wait_for(worker_1_has_it, limit_s=10.0, interval=0.05, what="worker 1 to hear the app")

    async def both_serve() -> bool:
        # Fresh connections, so each worker is reached; each runs its own replica until
        # replicas are shared.
        answers = [await sums_ok(d.query_url) for _ in range(8)]
        return all(answers)

    await wait_for(both_serve, limit_s=START_LIMIT_S, interval=0.2, what="both workers to serve")
    before = [await d.requests_counted(k) for k in (0, 1)]
    for _ in range(40):
        assert await sums_ok(d.query_url)
    after = [await d.requests_counted(k) for k in (0, 1)]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    assert sum(after) - sum(before) == 40

    # SIGKILL worker 1: the port keeps answering; the supervisor starts it again.
    old = d.listed()[1]["pid"]
    os.kill(old, signal.SIGKILL)
    await wait_for(lambda: not live(old), limit_s=10.0, interval=0.02, what="worker 1 to die")
    # A connection the kernel queued on the killed worker's socket before it died is reset
    # (SO_REUSEPORT's known limit, docs/workers.md): a client retries it; every answer is 200.
    answered, resets = 0, 0
    while answered < 20:
        try:
            resp = await predict(d.query_url, "sums", {"input": INPUT})
        except ConnectionResetError:
            resets += 1
            assert resets <= 5, "more resets than the killed worker's queue could hold"
            continue
        assert resp.status == 200, resp.body[:300]
        answered += 1
    await wait_for(
        lambda: d.listed().get(1, {}).get("pid") not in (None, old), limit_s=START_LIMIT_S,
        interval=0.05, what="the supervisor to restart worker 1",
    )  # fmt: skip
    assert "worker 1 exited with status -9" in d.log_tail(20_000)
    seen = [await worker_answering(d.query_url) for _ in range(60)]
    assert set(seen) == {0, 1}, seen
    await wait_for(both_serve, limit_s=START_LIMIT_S, interval=0.2, what="worker 1 to serve again")

    # SIGTERM the supervisor: every worker drains and exits, and so does every replica.
    pids = d.all_pids()
    # The supervisor, 3 workers over time, and the one replica both workers share.
    assert len(keyed_container_pids(d.state_dir / "rpc-keys")) == 1, pids
    assert len(pids) >= 5, pids
    proc = d.proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGTERM)
    await wait_for(
        lambda: proc.poll() is not None, limit_s=60.0, interval=0.05,
        what="the supervisor to exit",
    )  # fmt: skip
    assert proc.returncode == 0, d.log_tail()
    await wait_for(
        lambda: not any(live(p) for p in d.all_pids() | pids), limit_s=20.0, interval=0.05,
        what="every process of the deployment to exit",
    )  # fmt: skip
    assert not (d.state_dir / "workers.json").exists()


async def test_workers_refuse_a_memory_store(tmp_path: Path) -> None:
    d = Workers(tmp_path / "state")
    d.store = "memory://"
    proc = d._spawn()
    try:
        rc = await asyncio.to_thread(proc.wait, 60)
    finally:
        d.cleanup()
    assert rc == 1
    assert "needs a store its workers share" in d.log_tail()

"""Two frontends on one real redis-server behind a real HAProxy (Debian's package).

The set-up docs/scale-out.md documents: every frontend owns its replicas (they dial the frontend
that started them) and shares applications, models and links through the Redis store; the load
balancer sends each request to a frontend that answers ``GET /ready``, retries a request whose
frontend died before answering on the other one, and takes a dead frontend out of rotation
within a few health checks.

Contract:

* configuration made on one frontend is served by the other (directly and through the balancer);
* the balancer spreads a steady closed loop over both frontends;
* one frontend SIGKILLed in the middle of that loop: the other keeps serving, every request the
  clients sent gets a 200 with a model's answer (the in-flight ones are retried by HAProxy; the
  test allows at most the in-flight count to fail, and reports how many did), and requests sent
  after the kill all succeed.

Skipped only when haproxy or redis-server is not installed and ``CLIPPER_REQUIRE_LB`` is not
set (``.ci/run`` installs both and sets it).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import predict, request, wait_for, write_row_sums
from tests.integration.redis_server import free_port, terminate
from tests.integration.test_store_convergence import DurableRedis

HAPROXY = shutil.which("haproxy")
REDIS_SERVER = shutil.which("redis-server")
REQUIRE = bool(os.environ.get("CLIPPER_REQUIRE_LB"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        (HAPROXY is None or REDIS_SERVER is None) and not REQUIRE,
        reason="haproxy or redis-server is not installed (apt-get install -y haproxy "
        "redis-server); set CLIPPER_REQUIRE_LB=1 to fail instead",
    ),
]

APP = "lb"
MODEL = "sums"
CLIENTS = 8
# The closed loop runs until each frontend has served this many of its requests, then one
# frontend is killed, and it runs on until this many more requests succeeded.
BEFORE_KILL = 30
AFTER_KILL = 300

HAPROXY_CFG = """\
global
    maxconn 512
defaults
    mode http
    timeout connect 1s
    timeout client 10s
    timeout server 5s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response response-timeout
frontend query
    bind 127.0.0.1:{port}
    default_backend frontends
backend frontends
    balance roundrobin
    option httpchk GET /ready
    http-check expect status 200
    default-server inter 250ms fall 2 rise 2
{servers}
"""


class HAProxy:
    """HAProxy in the foreground (``-db``), configured by the test, stopped by PID."""

    def __init__(self, directory: Path, backends: list[int]) -> None:
        self.port = free_port()
        self.cfg = directory / "haproxy.cfg"
        servers = "\n".join(f"    server fe{i} 127.0.0.1:{p} check" for i, p in enumerate(backends))
        self.cfg.write_text(HAPROXY_CFG.format(port=self.port, servers=servers))
        self.log = directory / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert HAPROXY is not None, "CLIPPER_REQUIRE_LB is set: install haproxy"
        check = subprocess.run(
            [HAPROXY, "-c", "-f", str(self.cfg)], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [HAPROXY, "-db", "-f", str(self.cfg)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)


@pytest.fixture
async def cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[FrontendProcess, FrontendProcess, HAProxy]]:
    store = DurableRedis(tmp_path / "redis")
    await store.start()
    fes = [
        FrontendProcess(tmp_path / f"state-{n}", store=store.url, name=f"frontend-{n}")
        for n in ("a", "b")
    ]
    lb = HAProxy(tmp_path, [fe.ports.query for fe in fes])
    try:
        await asyncio.gather(*(fe.start() for fe in fes))
        lb.start()
        yield fes[0], fes[1], lb
    finally:
        lb.stop()
        for fe in fes:
            fe.cleanup()
        store.stop()


async def ready(url: str) -> bool:
    try:
        resp = await request(f"{url}/ready", limit_s=2.0)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    return resp.status == 200


async def answered(url: str, x: float) -> bool:
    try:
        resp = await predict(url, APP, {"input": [x, 1.0]}, limit_s=5.0)
    except (OSError, TimeoutError, asyncio.IncompleteReadError):
        return False
    if resp.status != 200:
        return False
    doc: dict[str, Any] = resp.json()
    return doc.get("default") is False and doc.get("output") == x + 1.0


async def served_requests(fe: FrontendProcess) -> float:
    resp = await request(
        f"http://127.0.0.1:{fe.ports.query}/metrics", headers={"Accept": "text/plain"}
    )
    for line in resp.body.decode().splitlines():
        if line.startswith(f'clipper_app_requests_total{{app="{APP}"}}'):
            return float(line.split()[-1])
    return 0.0


class ClosedLoop:
    """CLIENTS clients, each one request at a time through the balancer; every outcome kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = 0
        self.failed: list[str] = []
        self.failed_after: list[str] = []  # sent after `mark` was set
        self.mark = False
        self.stop = asyncio.Event()

    async def client(self, c: int) -> None:
        i = 0
        while not self.stop.is_set():
            sent_after_mark = self.mark
            x = float(c * 1_000_000 + i)
            i += 1
            try:
                resp = await predict(self.url, APP, {"input": [x, 1.0]}, limit_s=10.0)
                doc = resp.json() if resp.status == 200 else None
                good = doc is not None and doc["default"] is False and doc["output"] == x + 1.0
                why = f"{resp.status} {resp.body[:200]!r}"
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                good, why = False, repr(e)
            if good:
                self.ok += 1
            elif sent_after_mark:
                self.failed_after.append(why)
            else:
                self.failed.append(why)


async def test_two_frontends_behind_haproxy_share_config_and_survive_one_killed(
    cluster: tuple[FrontendProcess, FrontendProcess, HAProxy], tmp_path: Path
) -> None:
    a, b, lb = cluster
    # Configuration made on frontend a only.
    await a.admin_ok(
        "add_app",
        {
            "name": APP,
            "input_type": "doubles",
            "default_output": "-1",
            "latency_slo_micros": 2_000_000,
        },
    )
    await a.admin_ok(
        "deploy_model",
        {
            "model_name": MODEL,
            "model_version": "1",
            "input_type": "doubles",
            "artifact_path": write_row_sums(tmp_path),
            "num_replicas": 1,
        },
        limit_s=60,
    )
    await a.admin_ok("add_model_links", {"app_name": APP, "model_names": [MODEL]})
    b_url = f"http://127.0.0.1:{b.ports.query}"
    # ... is served by frontend b, with its own replica, and through the balancer.
    await wait_for(lambda: ready(b_url), limit_s=60, interval=0.1, what="frontend b ready")
    await wait_for(lambda: answered(b_url, 1.0), limit_s=30, interval=0.1, what="b answers")
    await wait_for(lambda: answered(lb.url, 2.0), limit_s=30, interval=0.1, what="lb answers")
    b_replicas = await b.admin_ok("get_replicas", {})
    assert [r["model_name"] for r in b_replicas] == [MODEL], b_replicas

    loop = ClosedLoop(lb.url)
    before = {fe.name: await served_requests(fe) for fe in (a, b)}
    spread: dict[str, float] = {}

    async def both_served() -> bool:
        for fe in (a, b):
            spread[fe.name] = await served_requests(fe) - before[fe.name]
        return all(n >= BEFORE_KILL for n in spread.values())

    clients = [asyncio.create_task(loop.client(c)) for c in range(CLIENTS)]
    try:
        await wait_for(both_served, limit_s=60, interval=0.05, what="both frontends serving")
        a.kill()
        loop.mark = True
        ok_at_kill = loop.ok
        await wait_for(
            lambda: loop.ok >= ok_at_kill + AFTER_KILL or len(loop.failed_after) > 10,
            limit_s=60, interval=0.05, what="the survivor to serve",
        )  # fmt: skip
    finally:
        loop.stop.set()
        await asyncio.gather(*clients)
    # Both frontends served the steady loop.
    assert all(n > 0 for n in spread.values()), spread
    # The survivor kept serving: requests sent after the kill all got a model's answer...
    assert loop.failed_after == [], loop.failed_after[:5]
    assert loop.ok >= ok_at_kill + AFTER_KILL, (ok_at_kill, loop.ok)
    # ... and of those in flight at the kill, at most all of them failed (HAProxy retries them).
    assert len(loop.failed) <= CLIENTS, loop.failed[:5]
    print(
        f"\nserved before the kill {spread}; ok {loop.ok}, failed in flight "
        f"{len(loop.failed)}, failed after the kill {len(loop.failed_after)}",
        file=sys.stderr,
    )

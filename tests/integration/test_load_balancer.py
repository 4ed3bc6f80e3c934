"""Two frontends on one real redis-server behind a real HAProxy (Debian's package), configured
exactly as docs/scale-out.md prints it: zero requests lost when a frontend is SIGKILLed.

The set-up docs/scale-out.md documents: the frontends share one set of replicas (started by
the frontend that holds the owner lease, dialling every frontend) and applications, models and
links through the Redis store; the load
balancer buffers each request, sends it to a frontend that answers ``GET /ready``, resends a
request whose frontend died before answering to the other one, and takes a dead frontend out of
rotation within a few health checks. The HAProxy configuration is read from the page's block;
the test only puts loopback addresses in place of the page's three addresses (and adds a stats
listener of its own, to count HAProxy's retries).

Contract, for clients that keep one connection to HAProxy open (keep-alive) and for clients
that open one per request (``Connection: close``), each a variant:

* configuration made on one frontend is served by the other (directly and through the balancer);
  feedback (``POST /<app>/update``) reaches the page's ``feedback`` backend;
* a steady closed loop of CLIENTS clients runs through the balancer for the whole test, and
  every request of it gets a 200 with its own model answer (the answer names its input): **0
  failed requests**, while the frontends are, in turn, SIGKILLed three times (a, b, a; each
  restarted on its ports and state directory and back in rotation before the next) and once
  stopped gracefully with ``--drain-delay-s`` (the planned restart the page documents). The
  clients send a request's body in a write after its headers, as most HTTP clients do: without
  ``option http-buffer-request`` that loses a few requests per run;
* before each kill or stop both frontends were serving the loop (the victim had requests in
  flight), and after each kill HAProxy retried something (the kill was exercised, not missed).

Skipped only when haproxy or redis-server is not installed and ``CLIPPER_REQUIRE_LB`` is not
set (``.ci/run`` installs both and sets it).
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from clipper.rpc.auth import ensure_keys
from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import (
    Response,
    post_json,
    predict,
    request,
    wait_for,
    write_row_sums,
)
from tests.integration.redis_server import free_port, terminate
from tests.integration.test_store_convergence import DurableRedis

HAPROXY = shutil.which("haproxy")
REDIS_SERVER = shutil.which("redis-server")
REQUIRE = bool(os.environ.get("CLIPPER_REQUIRE_LB"))

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        (HAPROXY is None or REDIS_SERVER is None) and not REQUIRE,
        reason="haproxy or redis-server is not installed (apt-get install -y haproxy "
        "redis-server); set CLIPPER_REQUIRE_LB=1 to fail instead",
    ),
]

DOC = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"
APP = "lb"
MODEL = "sums"
CLIENTS = 8
# Before each kill (or stop) the loop runs until each frontend has served this many requests
# since the last one came back; after it, until this many more requests got an answer.
BEFORE_EVENT = 30
AFTER_EVENT = 300
# Which frontend (0: a, 1: b) each event hits, in order.
EVENTS = [("kill", 0), ("kill", 1), ("kill", 0), ("stop", 1)]
# The page's planned-restart setting: longer than HAProxy's `fall 2` checks at `inter 250ms`.
DRAIN_DELAY_S = 1.0
# The page's addresses, and what the test runs instead of each.
LB_ADDRESS = "0.0.0.0:1337"
FE_ADDRESSES = ("10.0.0.11:1337", "10.0.0.12:1337")


def documented_config() -> str:
    """The first fenced block under docs/scale-out.md's "### HAProxy" heading."""
    text = DOC.read_text()
    section = text[text.index("\n### HAProxy\n") :]
    start = section.index("```\n") + len("```\n")
    return section[start : section.index("```\n", start)]


def render(doc: str, port: int, backends: list[int], stats_port: int) -> str:
    """The page's configuration on loopback, plus a stats listener (the test's, not the page's)."""
    for address in (LB_ADDRESS, *FE_ADDRESSES):
        assert address in doc, f"docs/scale-out.md's HAProxy block no longer uses {address}"
    cfg = doc.replace(LB_ADDRESS, f"127.0.0.1:{port}")
    for address, backend in zip(FE_ADDRESSES, backends, strict=True):
        cfg = cfg.replace(address, f"127.0.0.1:{backend}")
    assert "0.0.0.0" not in cfg and "10.0.0." not in cfg, cfg
    return cfg + (
        f"frontend stats\n    bind 127.0.0.1:{stats_port}\n    stats enable\n    stats uri /stats\n"
    )


def test_the_documented_config_is_what_the_test_runs() -> None:
    """The parts docs/scale-out.md gives reasons for are in its block (a guard against an edit
    that drops one and a test that then runs something else)."""
    doc = documented_config()
    for line in (
        "option http-buffer-request",
        "retries 3",
        "option redispatch 1",
        "retry-on conn-failure empty-response response-timeout",
        "option httpchk GET /ready?ignore=model_errors",
        "default-server inter 250ms fall 2 rise 2",
        "use_backend feedback if METH_POST feedback",
        "http-reuse never",
    ):
        assert f"    {line}\n" in doc, line
    feedback = doc[doc.index("backend feedback\n") :]
    assert "    retry-on conn-failure\n" in feedback, feedback


class HAProxy:
    """HAProxy in the foreground (``-db``), configured from the page, stopped by PID."""

    def __init__(self, directory: Path, backends: list[int]) -> None:
        self.port = free_port()
        self.stats_port = free_port()
        self.cfg = directory / "haproxy.cfg"
        self.cfg.write_text(render(documented_config(), self.port, backends, self.stats_port))
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

    async def stats(self, backend: str) -> dict[str, str]:
        """HAProxy's stats CSV row for ``backend`` (its totals)."""
        async with asyncio.timeout(5.0):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.stats_port)
            try:
                writer.write(b"GET /stats;csv HTTP/1.0\r\n\r\n")
                await writer.drain()
                raw = await reader.read()  # the answer ends at the close
            finally:
                writer.close()
        head, rest = raw.split(b"\r\n\r\n", 1)
        if b"transfer-encoding: chunked" in head.lower():  # HAProxy 2.6 chunks it
            chunks = b""
            while True:
                size_line, rest = rest.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    break
                chunks, rest = chunks + rest[:size], rest[size + 2 :]
            rest = chunks
        body = rest.decode().lstrip("# ")
        for row in csv.DictReader(io.StringIO(body)):
            if row["pxname"] == backend and row["svname"] == "BACKEND":
                return row
        raise AssertionError(f"no backend {backend!r} in HAProxy's stats: {body[:500]}")

    async def retries(self) -> int:
        """Retries plus redispatches of the predict backend so far."""
        row = await self.stats("frontends")
        return int(row["wretr"] or 0) + int(row["wredis"] or 0)


class LbFrontend(FrontendProcess):
    """A frontend started with the page's planned-restart drain delay and the deployment's RPC
    keys (frontends sharing replicas hold one key pair: docs/scale-out.md)."""

    def __init__(self, state_dir: Path, *, store: str, keys: Path, name: str) -> None:
        super().__init__(state_dir, store=store, name=name)
        self.keys = keys

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--drain-delay-s", f"{DRAIN_DELAY_S:g}",
            "--rpc-keys-dir", str(self.keys),
        ]  # fmt: skip


@pytest.fixture
async def cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[LbFrontend, LbFrontend, HAProxy]]:
    store = DurableRedis(tmp_path / "redis")
    await store.start()
    keys = ensure_keys(tmp_path / "keys").directory
    fes = [
        LbFrontend(tmp_path / f"state-{n}", store=store.url, keys=keys, name=f"frontend-{n}")
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


class KeptConnection:
    """One client's HTTP/1.1 connection to HAProxy, kept open from request to request (opened
    again only after HAProxy closes it or a request on it fails)."""

    def __init__(self, port: int, *, close_each: bool) -> None:
        self.port = port
        self.close_each = close_each  # `Connection: close`: a new connection per request
        self.opened = 0
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None

    async def post(self, path: str, body: bytes, limit_s: float) -> Response:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(limit_s):
                if self.streams is None:
                    self.streams = await asyncio.open_connection("127.0.0.1", self.port)
                    self.opened += 1
                reader, writer = self.streams
                close = "Connection: close\r\n" if self.close_each else ""
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n{close}"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                    .encode()
                )  # fmt: skip
                await writer.drain()
                # The body in a write of its own, as most HTTP clients send it (http.client,
                # requests, aiohttp): HAProxy may see the headers before the body.
                writer.write(body)
                await writer.drain()
                lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                hdrs: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        hdrs[name.strip().lower()] = value.strip()
                data = await reader.readexactly(int(hdrs.get("content-length", "0")))
        except BaseException:
            self.close()
            raise
        status = int(lines[0].split(" ", 2)[1])
        if self.close_each or status != 200 or hdrs.get("connection", "").lower() == "close":
            self.close()
        return Response(status, hdrs, data, time.monotonic() - t0)


@dataclass
class ClosedLoop:
    """CLIENTS clients, each one request at a time through the balancer; every outcome kept,
    a failure with the phase (``phase``: what the test was doing) its request was sent in."""

    url: str
    port: int
    keep_alive: bool
    ok: int = 0
    phase: str = "before the first kill"
    failed: list[tuple[str, str]] = field(default_factory=list)
    connections: list[KeptConnection] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, c: int) -> None:
        conn = KeptConnection(self.port, close_each=not self.keep_alive)
        self.connections.append(conn)
        i = 0
        try:
            while not self.stop.is_set():
                phase = self.phase
                x = float(c * 1_000_000 + i)
                i += 1
                try:
                    body = orjson.dumps({"input": [x, 1.0]})
                    resp = await conn.post(f"/{APP}/predict", body, limit_s=10.0)
                    doc = resp.json() if resp.status == 200 else None
                    good = doc is not None and doc["default"] is False and doc["output"] == x + 1.0
                    why = f"{resp.status} {resp.body[:200]!r}"
                except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                    good, why = False, repr(e)
                if good:
                    self.ok += 1
                else:
                    self.failed.append((phase, why))
        finally:
            conn.close()


@pytest.mark.parametrize("keep_alive", [True, False], ids=["keep-alive", "new-connection"])
async def test_two_frontends_behind_haproxy_lose_no_request_when_one_is_killed(
    cluster: tuple[LbFrontend, LbFrontend, HAProxy], tmp_path: Path, keep_alive: bool
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
    # ... is served by frontend b, from the shared replica, and through the balancer.
    await wait_for(lambda: ready(b_url), limit_s=60, interval=0.1, what="frontend b ready")
    await wait_for(lambda: answered(b_url, 1.0), limit_s=30, interval=0.1, what="b answers")
    await wait_for(lambda: answered(lb.url, 2.0), limit_s=30, interval=0.1, what="lb answers")
    b_replicas = await b.admin_ok("get_replicas", {})
    assert [r["model_name"] for r in b_replicas] == [MODEL], b_replicas
    # Feedback goes to the backend that retries only refused connections; predicts do not.
    before = int((await lb.stats("feedback"))["hrsp_2xx"] or 0)
    fb = await post_json(f"{lb.url}/{APP}/update", {"input": [1.0, 2.0], "label": 3.0})
    assert fb.status == 200, (fb.status, fb.body)
    assert int((await lb.stats("feedback"))["hrsp_2xx"] or 0) == before + 1

    fes = (a, b)
    loop = ClosedLoop(lb.url, lb.port, keep_alive)
    report: list[str] = []
    retried: list[int] = []

    async def event(n: int, how: str, victim: LbFrontend) -> None:
        """Kill (or stop) ``victim`` under the loop, then bring it back into rotation."""
        # Both frontends in rotation and serving the loop (the victim has requests in flight
        # when it goes).
        base = {fe.name: await served_requests(fe) for fe in fes}
        spread: dict[str, float] = {}

        async def both_served() -> bool:
            for fe in fes:
                spread[fe.name] = await served_requests(fe) - base[fe.name]
            return all(s >= BEFORE_EVENT for s in spread.values())

        await wait_for(both_served, limit_s=60, interval=0.05, what="both frontends serving")
        retries_before, ok_before = await lb.retries(), loop.ok
        loop.phase = f"{how} {n + 1} ({victim.name})"
        if how == "kill":
            victim.kill()
        else:
            # A planned stop: SIGTERM, the drain (readiness withdrawn, DRAIN_DELAY_S of serving
            # while HAProxy's checks see it), then exit 0. Polled, not waited on: the loop's
            # clients run on this event loop.
            proc = victim.proc
            assert proc is not None
            os.kill(proc.pid, signal.SIGTERM)
            await wait_for(
                lambda: proc.poll() is not None, limit_s=30, interval=0.05,
                what=f"{victim.name} to drain and exit",
            )  # fmt: skip
            assert proc.returncode == 0, victim.log_tail()
        await wait_for(
            lambda: loop.ok >= ok_before + AFTER_EVENT or len(loop.failed) > 10,
            limit_s=60, interval=0.05, what="the survivor to serve",
        )  # fmt: skip
        retried.append(await lb.retries() - retries_before)
        report.append(
            f"{loop.phase}: served before {spread}, HAProxy retries {retried[-1]}, "
            f"failed so far {len(loop.failed)}"
        )
        # Back on its ports and state directory: it adopts the configuration from the store
        # and connects the shared replica; HAProxy takes it back after `rise 2` good checks.
        loop.phase = f"{victim.name} restarting after {how} {n + 1}"
        await victim.start()
        url = f"http://127.0.0.1:{victim.ports.query}"
        await wait_for(lambda: ready(url), limit_s=60, interval=0.1, what="restart ready")

    clients = [asyncio.create_task(loop.client(c)) for c in range(CLIENTS)]
    try:
        for n, (how, which) in enumerate(EVENTS):
            await event(n, how, fes[which])
        loop.phase = "after the last restart"
    finally:
        loop.stop.set()
        await asyncio.gather(*clients)
    opened = sum(c.opened for c in loop.connections)
    print(
        f"\n{'keep-alive' if keep_alive else 'new-connection'} clients: ok {loop.ok}, failed "
        f"{len(loop.failed)}, client connections opened {opened}\n  " + "\n  ".join(report),
        file=sys.stderr,
    )
    # Not one request of the loop failed: not in flight at a kill, not while HAProxy still
    # had the dead frontend in rotation, not during a restart or the planned stop.
    assert loop.failed == [], loop.failed[:10]
    assert loop.ok >= len(EVENTS) * AFTER_EVENT, loop.ok
    # Each kill was exercised: HAProxy resent requests that had gone to the dead frontend.
    kills = [r for r, (how, _) in zip(retried, EVENTS, strict=True) if how == "kill"]
    assert all(r > 0 for r in kills), report
    if keep_alive:
        # The keep-alive clients kept their connections through the kills: HAProxy, not the
        # client, absorbed every failure (a client opens again only after a failed request).
        assert opened == CLIENTS, (opened, report)
    else:
        assert opened >= loop.ok, (opened, loop.ok)  # one connection per request

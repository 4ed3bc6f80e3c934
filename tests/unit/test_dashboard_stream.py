"""The dashboard's routes on a real HTTP server on loopback, its sampler on a fake clock: the
token on the data (and not on the page), the event stream (a snapshot, then a sample per
interval), the bound on streams, slow clients dropped, the page and plotly.js."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
import pytest_asyncio

from clipper.clock import FakeClock
from clipper.dashboard import Dashboard
from clipper.dashboard.assets import INSTALL_HINT, Assets, plotly_js
from clipper.dashboard.routes import loopback_host
from clipper.frontend.admin import AdminApi
from clipper.frontend.http import HttpServer
from clipper.frontend.routes import AdminRoutes
from clipper.inputs import InputType
from clipper.managers.base import ExternalManager
from clipper.metrics import Metrics
from clipper.registry import Application, Registry
from tests.catalogs import catalog_of
from tests.integration.helpers import wait_for

TOKEN = "s3cret"


@dataclass
class Served:
    port: int
    clock: FakeClock
    dashboard: Dashboard
    metrics: Metrics
    registry: Registry


class StubApi:
    """The admin API behind the dashboard: every request that reaches it answers 200."""

    def route(self, method: bytes, path: str, headers: Any, body: bytes, respond: Any) -> None:
        respond(200, b"admin", b"text/plain")


@contextlib.asynccontextmanager
async def serving(token: str | None, **options: Any) -> AsyncIterator[Served]:
    """A dashboard behind the admin routes on a real loopback port; stopped on exit."""
    clock, metrics, registry = FakeClock(), Metrics(), Registry()
    dashboard = Dashboard(
        clock=clock, metrics=metrics, catalog=catalog_of(registry, {}),
        manager=ExternalManager(), selection=lambda _: None, interval_s=1.0, history_s=10.0,
        token_required=token is not None, **options,
    )  # fmt: skip
    routes = AdminRoutes(cast(AdminApi, StubApi()), token, dashboard)
    server = HttpServer(routes, host="127.0.0.1", port=0, max_body_bytes=1024, streaming=True)
    await server.start()
    dashboard.start()
    try:
        yield Served(server.port, clock, dashboard, metrics, registry)
    finally:
        await server.stop()
        await dashboard.stop()


@pytest_asyncio.fixture
async def served() -> AsyncIterator[Served]:
    async with serving(TOKEN, max_clients=2) as s:
        yield s


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    status: int
    headers: dict[str, str]

    async def event(self, limit_s: float = 5.0) -> tuple[str, Any]:
        async with asyncio.timeout(limit_s):
            block = (await self.reader.readuntil(b"\n\n")).decode()
        name, data = "", ""
        for line in block.strip().split("\n"):
            key, _, value = line.partition(": ")
            if key == "event":
                name = value
            elif key == "data":
                data += value
        return name, orjson.loads(data)

    async def body(self) -> bytes:
        async with asyncio.timeout(5.0):
            return await self.reader.readexactly(int(self.headers["content-length"]))

    def close(self) -> None:
        self.writer.close()


async def _open(port: int, path: str, headers: dict[str, str] | None = None) -> Conn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    async with asyncio.timeout(5.0):
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    hdrs = {}
    for line in head[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    return Conn(reader, writer, status, hdrs)


async def _raw(port: int, head: bytes) -> bytes:
    """Send a request's head as given (no Host added); the answer's head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"\r\n\r\n")
        async with asyncio.timeout(5.0):
            return await reader.readuntil(b"\r\n\r\n")
    finally:
        writer.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_data_needs_the_token_and_the_page_does_not(served: Served) -> None:
    for path in ("/dashboard/events", "/dashboard/state"):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            c = await _open(served.port, path, headers)
            assert c.status == 401, path
            assert "Authorization: Bearer" in orjson.loads(await c.body())["cause"]
            c.close()
    c = await _open(served.port, "/dashboard/auth")
    assert c.status == 200
    assert orjson.loads(await c.body()) == {"token_required": True}
    c.close()
    c = await _open(served.port, "/dashboard/state", AUTH)
    assert c.status == 200
    doc = orjson.loads(await c.body())
    assert doc["interval_s"] == 1.0 and doc["capacity"] == 10
    assert doc["state"] == {"apps": [], "models": [], "replicas": [], "rollouts": []}
    assert doc["decisions"] == []
    c.close()
    # The admin API behind it still wants the token, as before.
    c = await _open(served.port, "/admin/ping")
    assert c.status == 401
    c.close()


async def test_a_stream_gets_a_snapshot_then_one_sample_per_interval(served: Served) -> None:
    served.clock.advance(3.0)  # history before the client came
    c = await _open(served.port, "/dashboard/events", AUTH)
    assert c.status == 200
    assert c.headers["content-type"].startswith("text/event-stream")
    assert "content-length" not in c.headers
    assert c.headers["cache-control"] == "no-store"
    name, snap = await c.event()
    assert name == "snapshot"
    assert len(snap["history"]["t"]) == 3
    assert snap["history"]["series"]["frontend/loop_lag_ms"] == [0.0, 0.0, 0.0]
    served.metrics.requests.labels(app="a").inc(4)
    served.registry.apps["a"] = Application("a", InputType.DOUBLES, "-1", 10_000)
    served.clock.advance(1.0)
    name, sample = await c.event()
    assert name == "sample"
    assert sample["values"]["app/a/qps"] == 4.0
    assert sample["state"]["apps"][0]["name"] == "a"
    served.clock.advance(1.0)
    name, sample = await c.event()
    assert name == "sample" and sample["values"]["app/a/qps"] == 0.0
    c.close()
    await wait_for(
        lambda: len(served.dashboard.hub) == 0,
        limit_s=5.0,
        what="the closed stream to be forgotten",
    )


async def test_streams_beyond_the_limit_are_refused_until_one_closes(served: Served) -> None:
    first = await _open(served.port, "/dashboard/events", AUTH)
    second = await _open(served.port, "/dashboard/events", AUTH)
    assert (first.status, second.status) == (200, 200)
    third = await _open(served.port, "/dashboard/events", AUTH)
    assert third.status == 503
    cause = orjson.loads(await third.body())["cause"]
    assert "already serves 2 live streams" in cause and "--dashboard-max-clients" in cause
    assert served.dashboard.hub.refused == 1
    third.close()
    first.close()
    await wait_for(
        lambda: len(served.dashboard.hub) == 1,
        limit_s=5.0,
        what="the closed stream to be forgotten",
    )
    again = await _open(served.port, "/dashboard/events", AUTH)
    assert again.status == 200
    assert (await again.event())[0] == "snapshot"
    again.close()
    second.close()


async def test_a_client_that_stops_reading_is_dropped_and_the_others_go_on() -> None:
    async with serving(None, max_clients=4, max_client_buffer=64 * 1024) as s:
        slow = await _open(s.port, "/dashboard/events")  # never read again
        fast = await _open(s.port, "/dashboard/events")
        await fast.event()  # its snapshot
        hub = s.dashboard.hub
        chunk = b"event: x\ndata: " + b"0" * (256 * 1024) + b"\n\n"
        got = 0
        for _ in range(400):  # until the kernel's buffers for the slow one are full
            if hub.dropped:
                break
            hub.publish(chunk)
            async with asyncio.timeout(5.0):
                got += len(await fast.reader.readexactly(len(chunk)))
        assert hub.dropped == 1
        assert len(hub) == 1
        assert got > 0
        # The fast one keeps getting samples.
        s.clock.advance(1.0)
        name, _ = await fast.event()
        assert name == "sample"
        slow.close()
        fast.close()


async def test_without_a_token_only_loopback_host_names_are_served() -> None:
    async with serving(None) as s:
        c = await _open(s.port, "/dashboard/state", {})  # Host: 127.0.0.1:<port>
        assert c.status == 200
        c.close()
        head = await _raw(s.port, b"GET /dashboard/state HTTP/1.1\r\nHost: evil.example:80")
        assert head.startswith(b"HTTP/1.1 403")
    for host, ok in (
        (b"127.0.0.1:1338", True), (b"localhost:1338", True), (b"[::1]:1338", True),
        (b"127.0.0.2", True), (b"LOCALHOST", True), (b"evil.example", False),
        (b"10.0.0.1:1338", False), (b"", False), (None, False), (b"[::1", False),
    ):  # fmt: skip
        assert loopback_host(host) is ok, host


async def test_other_methods_and_unknown_files_are_refused(served: Served) -> None:
    head = await _raw(served.port, b"POST /dashboard/events HTTP/1.1\r\nContent-Length: 0")
    assert head.startswith(b"HTTP/1.1 405")
    served.dashboard._assets = Assets({})
    c = await _open(served.port, "/dashboard/nothing.js")
    assert c.status == 404
    assert "GET /dashboard/events" in orjson.loads(await c.body())["cause"]
    c.close()


async def test_without_plotly_the_page_says_how_to_install_it() -> None:
    async with serving(None, load=lambda: Assets({}, INSTALL_HINT)) as s:
        c = await _open(s.port, "/dashboard")
        assert c.status == 503
        assert "pip install 'clipper-serve[dashboard]'" in (await c.body()).decode()
        c.close()


async def test_the_page_and_plotly_js_are_served_from_the_installed_package() -> None:
    found = plotly_js()
    if found is None:
        pytest.skip("plotly is not installed (the dashboard extra)")
    path, version = found
    async with serving(TOKEN) as s:
        page = await _open(s.port, "/dashboard/")  # no token: the page holds no data
        assert page.status == 200
        html = (await page.body()).decode()
        assert f'src="/dashboard/plotly-{version}.min.js"' in html
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        page.close()
        js = await _open(
            s.port, f"/dashboard/plotly-{version}.min.js", {"Accept-Encoding": "gzip, br"}
        )
        assert js.status == 200
        assert js.headers["content-encoding"] == "gzip"
        assert "immutable" in js.headers["cache-control"]
        assert gzip.decompress(await js.body()) == path.read_bytes()  # unmodified
        js.close()
        plain = await _open(s.port, f"/dashboard/plotly-{version}.min.js")
        assert "content-encoding" not in plain.headers
        assert int(plain.headers["content-length"]) == path.stat().st_size
        plain.close()
        for name in ("dashboard.js", "dashboard.css"):
            c = await _open(s.port, f"/dashboard/{name}")
            assert c.status == 200 and c.headers["cache-control"] == "no-cache"
            c.close()


async def test_stopping_closes_every_stream(served: Served) -> None:
    c = await _open(served.port, "/dashboard/events", AUTH)
    await c.event()
    await served.dashboard.stop()
    assert len(served.dashboard.hub) == 0
    assert not served.dashboard.sampler.running
    # Cut: an end of stream, or a reset where either side had unread data.
    async with asyncio.timeout(5.0):
        with contextlib.suppress(ConnectionResetError):
            assert await c.reader.read() == b""
    c.close()
    late = await _open(served.port, "/dashboard/events", AUTH)
    assert late.status == 503
    assert orjson.loads(await late.body())["cause"] == "the frontend is stopping"
    assert len(served.dashboard.hub) == 0
    late.close()


async def test_a_replica_change_is_pushed_at_once_not_at_the_next_sample(served: Served) -> None:
    c = await _open(served.port, "/dashboard/events", AUTH)
    assert (await c.event())[0] == "snapshot"
    served.registry.apps["a"] = Application("a", InputType.DOUBLES, "-1", 10_000)
    for _ in range(3):  # several changes in one loop turn: one event
        served.dashboard.replicas_changed()
    served.clock.advance(0.0)  # the next turn, well before the next sample
    name, doc = await c.event()
    assert name == "state"
    assert doc["state"]["apps"][0]["name"] == "a"
    served.clock.advance(1.0)
    assert (await c.event())[0] == "sample"  # nothing else came between
    c.close()

"""Hostile clients on real sockets (port 0, loopback): each bounded in time and count.

Most tests run a bare :class:`HttpServer` with a two-route router and small limits, so each
limit is reached in a fraction of a second; the flood and huge-batch tests run a frontend.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import AsyncIterator

import numpy as np
import orjson
import pytest
import pytest_asyncio

from clipper.config import BatchingConfig
from clipper.frontend.http import HttpLimits, HttpServer, Respond, json_response
from clipper.server import Clipper
from tests.integration import models
from tests.integration.helpers import predict, request

pytestmark = pytest.mark.timeout(60)

LIMIT_S = 5.0  # every read below gives up after this: a hang fails, it never blocks the run


def _router(
    method: bytes,
    path: str,
    headers: dict[bytes, bytes],
    body: bytes,
    respond: Respond,
    *,
    t0: float | None = None,
) -> None:
    if path == "/health":
        json_response(respond, 200, {"status": "ok"})
    elif path == "/echo":
        json_response(respond, 200, {"length": len(body)})
    else:
        json_response(respond, 404, {"error": "Not Found", "cause": path})


SMALL = HttpLimits(
    max_header_bytes=2048,
    max_header_line_bytes=512,
    max_connections=50,
    header_timeout_s=0.3,
    body_timeout_s=0.3,
    idle_timeout_s=0.3,
)


@pytest_asyncio.fixture
async def server() -> AsyncIterator[HttpServer]:
    srv = HttpServer(_router, host="127.0.0.1", port=0, max_body_bytes=1024, limits=SMALL)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), LIMIT_S)


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (a reset counts as closed)."""
    try:
        return await asyncio.wait_for(reader.read(), LIMIT_S)
    except ConnectionResetError:
        return b""


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), LIMIT_S)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r")[0])
    return int(head.split(b" ")[1]), await asyncio.wait_for(reader.readexactly(length), LIMIT_S)


def _statuses(raw: bytes) -> list[int]:
    return [
        int(line.split(b" ")[1]) for line in raw.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")
    ]


def _json_body(raw: bytes) -> dict[str, str]:
    doc = orjson.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert isinstance(doc, dict)
    return doc


async def test_slowloris_is_closed_by_the_header_timeout(server: HttpServer) -> None:
    conns = [await _open(server.port) for _ in range(5)]
    t0 = time.monotonic()
    for _, w in conns[:4]:
        w.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
    for r, _ in conns[:4]:
        raw = await _read_all(r)
        assert _statuses(raw) == [408]
        assert "header_timeout_s" in _json_body(raw)["cause"]
    assert await _read_all(conns[4][0]) == b""  # sent nothing: closed without an answer
    assert time.monotonic() - t0 < 3.0  # 0.3 s timeout, generous bound for a shared machine
    for _, w in conns:
        w.close()
    assert not server.connections


async def test_dripping_headers_do_not_reset_the_header_timeout(server: HttpServer) -> None:
    r, w = await _open(server.port)
    w.write(b"GET /health HTTP/1.1\r\n")
    t0 = time.monotonic()
    closed = asyncio.ensure_future(_read_all(r))
    for i in range(40):  # one header line per 50 ms: 2 s if the timeout were per read
        if closed.done():
            break
        w.write(b"X-%d: y\r\n" % i)
        await asyncio.sleep(0.05)
    assert _statuses(await closed) == [408]
    assert time.monotonic() - t0 < 1.5
    w.close()


async def test_oversized_headers_get_431(server: HttpServer) -> None:
    # In total: many short header lines, sent in pieces; the server stops at its cap.
    r, w = await _open(server.port)
    w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    for i in range(200):
        w.write(b"X-Pad-%03d: %s\r\n" % (i, b"p" * 40))
    raw = await _read_all(r)
    assert _statuses(raw) == [431]
    assert "max_header_bytes" in _json_body(raw)["cause"]
    w.close()
    # One line over the per-line cap.
    raw = await _exchange(
        server.port, b"GET /health HTTP/1.1\r\nX-Big: " + b"b" * 600 + b"\r\n\r\n"
    )
    assert _statuses(raw) == [431]
    assert "max_header_line_bytes" in _json_body(raw)["cause"]
    # A request line over it.
    raw = await _exchange(server.port, b"GET /" + b"u" * 600 + b" HTTP/1.1\r\n\r\n")
    assert _statuses(raw) == [414]
    # Under the caps, the same server still answers.
    raw = await _exchange(server.port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert _statuses(raw) == [200]


async def _exchange(port: int, data: bytes) -> bytes:
    r, w = await _open(port)
    try:
        w.write(data)
        return await _read_all(r)
    finally:
        w.close()


async def test_unterminated_chunked_body_is_closed_by_the_body_timeout(
    server: HttpServer,
) -> None:
    r, w = await _open(server.port)
    t0 = time.monotonic()
    w.write(b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
    raw = await _read_all(r)
    assert _statuses(raw) == [408]
    assert "body_timeout_s" in _json_body(raw)["cause"]
    assert time.monotonic() - t0 < 3.0
    w.close()


async def test_expect_100_continue_is_answered(server: HttpServer) -> None:
    r, w = await _open(server.port)
    w.write(b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n")
    interim = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), LIMIT_S)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    w.write(b"0123456789")
    status, body = await _read_response(r)
    assert (status, orjson.loads(body)) == (200, {"length": 10})
    w.close()
    # Over the body limit: 413 at once, without waiting for a body the client holds back.
    raw = await _exchange(
        server.port,
        b"POST /echo HTTP/1.1\r\nContent-Length: 999999\r\nExpect: 100-continue\r\n\r\n",
    )
    assert _statuses(raw) == [413]


async def test_upgrade_gets_exactly_one_response(server: HttpServer) -> None:
    raw = await _exchange(
        server.port,
        b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    assert _statuses(raw) == [400]
    assert "upgrade" in _json_body(raw)["cause"].lower()


async def test_idle_keep_alive_is_closed_after_the_idle_timeout(server: HttpServer) -> None:
    r, w = await _open(server.port)
    w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await _read_response(r))[0] == 200
    t0 = time.monotonic()
    assert await _read_all(r) == b""  # closed silently: no unsolicited response
    assert 0.15 < time.monotonic() - t0 < 3.0
    w.close()


async def test_closed_connections_are_freed_without_the_garbage_collector(
    server: HttpServer,
) -> None:
    gc.collect()
    gc.disable()
    try:
        r, w = await _open(server.port)
        w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), LIMIT_S)
        (conn,) = server.connections
        ref = weakref.ref(conn)
        del conn
        w.close()
        await w.wait_closed()
        for _ in range(200):  # connection_lost arrives within a few loop turns
            if not server.connections:
                break
            await asyncio.sleep(0.005)
        assert not server.connections
        await asyncio.sleep(0)
        assert ref() is None, gc.get_referrers(ref())
    finally:
        gc.enable()


PARTIAL = b"GET /health HTTP/1.1\r\nHost: flood\r\n"  # headers begun, never finished


async def _until_all_reading(server: HttpServer, n: int) -> None:
    """Until ``server`` holds ``n`` connections, each with a request begun."""
    for _ in range(400):
        conns = list(server.connections)
        if len(conns) >= n and all(conn._head_bytes > 0 for conn in conns):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the server holds {len(server.connections)} connections, not {n}")


async def test_connection_flood_leaves_health_and_admin_reachable() -> None:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, max_connections=20,
        health_reserve_connections=2, admin_max_connections=8, header_timeout_s=30.0,
    ) as c:  # fmt: skip
        port = c.http.port
        # Each flood connection has begun a request (an idle one would be closed to make
        # room: see test_idle_connections_make_room_for_new_clients).
        flood = [await _open(port) for _ in range(20)]
        for _, fw in flood:
            fw.write(PARTIAL)
        await _until_all_reading(c.http, 20)
        # The reserve: health answers (and the connection closes after it) ...
        health = await request(c.query_url + "/health", limit_s=LIMIT_S)
        assert health.status == 200
        ready = await request(c.query_url + "/ready", limit_s=LIMIT_S)
        assert ready.status == 200
        # One application's readiness too: the router answers it (here: no such application).
        app_ready = await request(c.query_url + "/nope/ready", limit_s=LIMIT_S)
        assert app_ready.status == 404
        assert app_ready.json()["cause"] == "no application named 'nope'"
        # ... and nothing else does.
        refused = await request(c.query_url + "/metrics", limit_s=LIMIT_S)
        assert refused.status == 503
        assert "max_connections" in refused.json()["cause"]
        # Past the reserve too: 503 (or a reset if the request was still unread) and close.
        extra = []
        for n in (21, 22):  # one by one: a reserve connection that sent nothing is idle
            extra.append(await _open(port))
            extra[-1][1].write(PARTIAL)
            await _until_all_reading(c.http, n)
        r, w = await _open(port)
        w.write(b"GET /health HTTP/1.1\r\n\r\n")
        raw = await _read_all(r)
        assert raw == b"" or _statuses(raw) == [503]
        w.close()
        assert c.http.refused >= 1
        # The admin port has its own limit: untouched by the flood.
        pong = await request(c.admin_url + "/admin/ping", limit_s=LIMIT_S)
        assert (pong.status, pong.body) == (200, b"PONG")
        for _, fw in flood + extra:
            fw.close()
        for _ in range(400):
            if not c.http.connections:
                break
            await asyncio.sleep(0.005)
        ok = await request(c.query_url + "/metrics", limit_s=LIMIT_S)
        assert ok.status == 200  # freed connections are served again


SLO_US = 500_000  # the good client's SLO: generous, the machine is shared


async def test_huge_batch_gets_413_fast_while_others_keep_their_slo() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, max_items_per_request=100) as c:
        await c.deploy_model(
            "sums", "1", models.row_sums, input_type="doubles",
            batching=BatchingConfig(max_wait_micros=0),
        )  # fmt: skip
        await c.register_application("sums", "doubles", "-1.0", SLO_US, cache=False)
        await c.link_model_to_app("sums", "sums")
        latencies: list[float] = []
        stop = asyncio.Event()

        async def good_client() -> None:
            i = 0
            while not stop.is_set() and i < 500:
                i += 1
                resp = await predict(
                    c.query_url, "sums", {"input": [float(i), 1.0]}, limit_s=LIMIT_S
                )
                doc = resp.json()
                assert resp.status == 200, doc
                assert doc["default"] is False, doc
                assert doc["output"] == i + 1.0
                latencies.append(resp.elapsed)

        # Warm up: the replica is connected and answering.
        first = await predict(c.query_url, "sums", {"input": [1.0, 2.0]}, limit_s=LIMIT_S)
        assert first.json()["output"] == 3.0
        client = asyncio.ensure_future(good_client())
        try:
            await asyncio.sleep(0.1)
            big = await predict(c.query_url, "sums", {"input_batch": [[1.0]] * 100_000})
            assert big.status == 413
            assert "max_items_per_request" in big.json()["cause"] and "100" in big.json()["cause"]
            assert big.elapsed < 1.0, big.elapsed  # 100k items took 0.85 s before the cap
            head = orjson.dumps(
                {"inputs": [{"name": "x", "shape": [300_000, 1], "datatype": "FP64",
                             "parameters": {"binary_data_size": 300_000 * 8}}]}
            )  # fmt: skip
            v2big = await request(
                c.query_url + "/v2/models/sums/infer", "POST",
                head + np.zeros(300_000).tobytes(),
                headers={"Inference-Header-Content-Length": str(len(head))}, limit_s=LIMIT_S,
            )  # fmt: skip
            assert v2big.status == 413, v2big.body
            assert "300000" in v2big.json()["error"]
            assert v2big.elapsed < 1.0
            await asyncio.sleep(0.2)
        finally:
            stop.set()
            await asyncio.wait_for(client, 30)
        assert len(latencies) >= 5
        assert max(latencies) < SLO_US / 1e6

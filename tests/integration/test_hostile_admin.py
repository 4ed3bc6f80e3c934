"""Hostile clients of the admin port and of the connection limit (port 0, loopback), each
bounded in time and count: the token is checked before a body is read, a reserve of admin
slots is kept for token-bearing connections, idle keep-alive connections make room for new
clients, and an oversized ``input_batch`` is refused before its parse.
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import pytest

from clipper.config import BatchingConfig
from clipper.server import Clipper
from tests.integration import models
from tests.integration.helpers import predict, request, wait_for

pytestmark = pytest.mark.timeout(90)

LIMIT_S = 5.0
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UPLOAD_BYTES = 9 * 2**20  # each attacker's body: 9 of the 10 MiB cap


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), LIMIT_S)


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(), LIMIT_S)
    except ConnectionResetError:
        return b""


def _upload_head(token: str | None = None, *, expect: bool = False) -> bytes:
    head = (
        b"POST /admin/upload_model?name=m&version=1 HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/gzip\r\nContent-Length: %d\r\n" % UPLOAD_BYTES
    )
    if token is not None:
        head += b"Authorization: Bearer %s\r\n" % token.encode()
    if expect:
        head += b"Expect: 100-continue\r\n"
    return head + b"\r\n"


async def test_a_request_without_the_token_is_refused_before_its_body() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, admin_token=TOKEN) as c:
        port = c.admin_http.port
        for expect in (True, False):
            r, w = await _open(port)
            w.write(_upload_head(None, expect=expect))  # the headers only: no body sent
            raw = await _read_until_closed(r)  # the server answers and closes
            w.close()
            assert raw.startswith(b"HTTP/1.1 401 "), raw[:200]
            assert b"100 Continue" not in raw  # never invited to send the body
            assert b"Connection: close" in raw
            assert b"Authorization: Bearer" in raw  # the cause names what is expected
        # A wrong token is refused the same way; a right one is invited to send the body.
        r, w = await _open(port)
        w.write(_upload_head("wrong", expect=True))
        assert (await _read_until_closed(r)).startswith(b"HTTP/1.1 401 ")
        w.close()
        r, w = await _open(port)
        w.write(_upload_head(TOKEN, expect=True))
        interim = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), LIMIT_S)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        w.close()
        # Over the body cap, with the token: 413 before 100-continue.
        r, w = await _open(port)
        w.write(_upload_head(TOKEN, expect=True).replace(b"%d" % UPLOAD_BYTES, b"%d" % 2**30))
        assert (await _read_until_closed(r)).startswith(b"HTTP/1.1 413 ")
        w.close()
        pong = await request(c.admin_url + "/admin/ping", headers=AUTH, limit_s=LIMIT_S)
        assert (pong.status, pong.body) == (200, b"PONG")


async def _ping_within(admin_url: str, limit_s: float) -> int:
    """An authorized ping as a client sends it: a connection refused at the limit (503) or
    lost in the flood's churn is tried again, within ``limit_s`` in all (the target: 200
    within 1 s). The status of the last try."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    status = 0
    while loop.time() < end:
        try:
            pong = await request(
                admin_url + "/admin/ping", headers=AUTH, limit_s=max(end - loop.time(), 0.01)
            )
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            continue
        status = pong.status
        if status == 200:
            break
    return status


async def test_unauthenticated_uploads_cannot_lock_out_an_authorized_ping() -> None:
    """The issue's attack, scaled to a 16-slot admin port: 20 connections (more than the
    limit, as 70 are more than 64) each uploading 9 MB without a token, reconnecting when
    cut; an authorized ping beside them is answered every time, and memory stays flat."""
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, admin_token=TOKEN,
        admin_max_connections=16, admin_reserve_connections=4,
    ) as c:  # fmt: skip
        port = c.admin_http.port
        chunk = b"\0" * 2**20
        stop = asyncio.Event()
        attempts = 0
        cut = 0  # uploads the server stopped before their body was all sent

        async def attacker() -> None:
            nonlocal attempts, cut
            while not stop.is_set():
                attempts += 1
                sent = 0
                try:
                    r, w = await _open(port)
                    w.write(_upload_head(None))
                    while sent < UPLOAD_BYTES and not r.at_eof():
                        w.write(chunk)
                        sent += len(chunk)
                        await asyncio.wait_for(w.drain(), LIMIT_S)
                    await _read_until_closed(r)
                    w.close()
                except (ConnectionError, TimeoutError):
                    pass  # reset mid-upload: the server closed it unread
                cut += sent < UPLOAD_BYTES

        rss0 = _rss_bytes()
        tasks = [asyncio.ensure_future(attacker()) for _ in range(20)]
        statuses = []
        try:
            await wait_for(lambda: attempts >= 40, limit_s=LIMIT_S)  # the attack is under way
            statuses.extend([await _ping_within(c.admin_url, 1.0) for _ in range(20)])
            rss_delta = _rss_bytes() - rss0
        finally:
            stop.set()
            for t in tasks:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(t, 10)
        assert statuses == [200] * 20
        assert cut >= 40  # the uploads were cut short, not read
        assert rss_delta < 64 * 2**20, rss_delta


async def test_the_reserve_keeps_admin_slots_for_the_token() -> None:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, admin_token=TOKEN,
        admin_max_connections=8, admin_reserve_connections=3,
    ) as c:  # fmt: skip
        port = c.admin_http.port
        page = b"GET /dashboard/auth HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"  # needs no token
        held = []
        for _ in range(5):  # the unreserved share: 8 - 3
            r, w = await _open(port)
            w.write(page)
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), LIMIT_S)
            assert head.startswith(b"HTTP/1.1 200 ")
            held.append(w)
        assert c.admin_http.unauthenticated == 5
        # A sixth connection without the token: 503 and closed, naming the reserve.
        r, w = await _open(port)
        w.write(page)
        raw = await _read_until_closed(r)
        w.close()
        assert raw.startswith(b"HTTP/1.1 503 "), raw[:200]
        assert b"keeps 3 of its 8 connections" in raw
        # With the token: served, on a reserved slot.
        pong = await request(c.admin_url + "/admin/ping", headers=AUTH, limit_s=LIMIT_S)
        assert (pong.status, pong.body) == (200, b"PONG")
        for w in held:
            w.close()


async def test_idle_connections_make_room_for_new_clients() -> None:
    """limit + 500 idle keep-alive connections: each new one closes the oldest idle one, so
    fresh health checks and predictions are answered (the issue's target: >= 95%)."""
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, max_connections=50, health_reserve_connections=2,
    ) as c:  # fmt: skip
        await c.deploy_model(
            "sums", "1", models.row_sums, input_type="doubles",
            batching=BatchingConfig(max_wait_micros=0),
        )  # fmt: skip
        await c.register_application("sums", "doubles", "-1.0", 500_000, cache=False)
        await c.link_model_to_app("sums", "sums")
        first = await predict(c.query_url, "sums", {"input": [1.0, 2.0]}, limit_s=LIMIT_S)
        assert first.json()["output"] == 3.0
        port = c.http.port
        idle = []
        for _ in range(550):  # each asks once and then sits idle, keeping its connection
            r, w = await _open(port)
            w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            # Evicted before its answer was read, it is still an idle client.
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), LIMIT_S)
            idle.append(w)
        assert len(c.http.connections) <= 52
        assert c.http.evicted >= 450
        ok = 0
        for i in range(20):
            health = await request(c.query_url + "/health", limit_s=LIMIT_S)
            pred = await predict(c.query_url, "sums", {"input": [float(i), 1.0]}, limit_s=LIMIT_S)
            ok += health.status == 200
            ok += pred.status == 200 and pred.json()["output"] == i + 1.0
        assert ok >= 38, ok  # >= 95% of 40
        for w in idle:
            w.close()


async def test_a_million_item_batch_is_refused_before_its_parse() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await c.register_application("big", "doubles", "-1.0", 100_000, cache=False)
        body = orjson.dumps({"input_batch": [[0.5]] * 1_000_000})
        assert 2**20 < len(body) < c.config.max_body_bytes
        resp = await request(c.query_url + "/big/predict", "POST", body, limit_s=LIMIT_S)
        assert resp.status == 413, resp.body[:200]
        cause = resp.json()["cause"]
        assert "1000000 items" in cause and "max_items_per_request" in cause
        # Both keys, or the key twice: no way around the count.
        both = b'{"input": [1.0], ' + body[1:]
        resp = await request(c.query_url + "/big/predict", "POST", both, limit_s=LIMIT_S)
        assert resp.status == 413
        twice = b'{"input_batch": [[1.0]], ' + body[1:]
        resp = await request(c.query_url + "/big/predict", "POST", twice, limit_s=LIMIT_S)
        assert resp.status == 400
        assert "more than once" in resp.json()["cause"]
        # V2 JSON: the batch dimension, read before the data is parsed.
        v2 = orjson.dumps(
            {"inputs": [{"name": "x", "shape": [1_000_000, 1], "datatype": "FP64",
                         "data": [0.5] * 1_000_000}]}
        )  # fmt: skip
        resp = await request(c.query_url + "/v2/models/big/infer", "POST", v2, limit_s=LIMIT_S)
        assert resp.status == 413, resp.body[:200]
        assert "1000000" in resp.json()["error"]


async def test_a_large_body_counted_off_the_loop_keeps_its_place_and_may_be_abandoned() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await c.register_application("big", "doubles", "-1.0", 100_000, cache=False)
        big = orjson.dumps({"input_batch": [[0.5]] * 1_000_000})
        assert len(big) > 2**20  # over OFFLOAD_BYTES: counted in the parse pool
        head = b"POST /big/predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        # Pipelined: the large body's 413 comes first, then the health check behind it.
        reader, writer = await _open(c.http.port)
        writer.write(head % len(big) + big + health)
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), LIMIT_S)
        assert first.startswith(b"HTTP/1.1 413"), first
        length = int(first.lower().split(b"content-length: ")[1].split(b"\r")[0])
        await asyncio.wait_for(reader.readexactly(length), LIMIT_S)
        second = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), LIMIT_S)
        assert second.startswith(b"HTTP/1.1 200"), second
        writer.close()
        # A client that leaves while its body is counted: nothing is owed to it, and the
        # pool's place comes back.
        for _ in range(3):
            _r, w = await _open(c.http.port)
            w.write(head % len(big) + big)
            await w.drain()
            w.close()
        await wait_for(lambda: c.parse_pool.in_flight == 0 and c.http.owed() == 0, limit_s=LIMIT_S)
        # An accepted large body is parsed and predicted (a one-input body over 1 MiB).
        one = orjson.dumps({"input": [0.25] * 300_000})
        assert len(one) > 2**20
        resp = await request(c.query_url + "/big/predict", "POST", one, limit_s=LIMIT_S)
        assert resp.status == 200, resp.body[:200]

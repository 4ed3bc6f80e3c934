"""The in-process client (tests/inprocess.py) against the real HTTP server: a router gets the
same arguments from both, and a frontend gives the same answers through its routers as on
its sockets. This keeps the in-process tests honest about what the wire does."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from clipper.frontend.http import HttpServer, Respond
from clipper.server import Clipper
from tests.inprocess import RouterClient, RouterResponse
from tests.integration.helpers import request

pytestmark = pytest.mark.integration

Seen = tuple[bytes, str, dict[bytes, bytes], bytes]


async def raw_exchange(port: int, data: bytes, *, limit_s: float = 10.0) -> bytes:
    """Send ``data`` as it is on a fresh connection; return everything the server writes
    until it closes the connection."""
    async with asyncio.timeout(limit_s):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(data)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()


@pytest.mark.parametrize(
    ("method", "target", "headers", "body"),
    [
        ("POST", "/app/predict?trace=1&x=%20y", {"Content-Type": "application/json"}, b"{}"),
        ("GET", "/metrics?", {"Accept": "*/*", "X-Mixed-Case": "Value"}, b""),
        ("GET", "/health", {"X-Twice": "a", "x-twice": "b"}, b""),
        ("GET", "/v2/models/m", {}, b""),
        ("POST", "/admin/upload_model?name=a&version=1", {"X-Clipper-Name": "n"}, b"\x1f\x8bxx"),
    ],
)
async def test_a_router_gets_the_same_request_from_the_server_and_the_client(
    method: str, target: str, headers: dict[str, str], body: bytes
) -> None:
    seen: list[Seen] = []

    def recorder(
        method: bytes,
        path: str,
        hdrs: dict[bytes, bytes],
        data: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        seen.append((method, path, hdrs, data))
        respond(200, b"ok", b"text/plain")

    server = HttpServer(recorder, host="127.0.0.1", port=0, max_body_bytes=1024)
    await server.start()
    try:
        sent = {"Host": "h", **headers, "Connection": "close"}
        head = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in sent.items())]
        if body:
            head.append(f"Content-Length: {len(body)}")
        wire = await raw_exchange(server.port, ("\r\n".join(head) + "\r\n\r\n").encode() + body)
        assert wire.startswith(b"HTTP/1.1 200 OK\r\n"), wire
        resp = await RouterClient(recorder, max_body_bytes=1024).request(
            method, target, body=body, headers=sent
        )
        assert (resp.status, resp.body) == (200, b"ok")
    finally:
        await server.stop()
    assert len(seen) == 2
    assert seen[0] == seen[1]


def same_answer(
    wire_status: int, wire_headers: dict[str, str], body: bytes, r: RouterResponse
) -> None:
    assert (r.status, r.body) == (wire_status, body)
    assert r.content_type == wire_headers["content-type"]
    assert r.headers["content-length"] == wire_headers["content-length"]


async def test_routers_answer_as_the_sockets_do(frontend_on_port_0: Clipper) -> None:
    c = frontend_on_port_0
    await c.register_application("lonely", "doubles", "-1.0", 2_000_000)
    query = RouterClient.for_server(c.http)
    admin = RouterClient.for_server(c.admin_http)
    cases: list[tuple[RouterClient, str, str, str, bytes | None]] = [
        (query, c.query_url, "GET", "/health", None),
        (query, c.query_url, "GET", "/ready", None),
        (query, c.query_url, "POST", "/no-app/predict", b'{"input": [1.0]}'),
        (query, c.query_url, "POST", "/lonely/predict", b"{oops"),
        (query, c.query_url, "POST", "/lonely/explode", b"{}"),
        (query, c.query_url, "GET", "/v2", None),
        (query, c.query_url, "GET", "/v2/health/live", None),
        (query, c.query_url, "GET", "/v2/models/lonely", None),
        (query, c.query_url, "POST", "/v2/models/nope/infer", b"{}"),
        (admin, c.admin_url, "GET", "/admin/ping", None),
        (admin, c.admin_url, "GET", "/admin/add_app", None),
        (admin, c.admin_url, "POST", "/admin/nope", b"{}"),
        (admin, c.admin_url, "POST", "/admin/add_app", b'{"name": 1}'),
        (admin, c.admin_url, "POST", "/admin/get_all_applications", b"{}"),
    ]
    for client, base, method, path, body in cases:
        wire = await request(base + path, method, body)
        mine = await client.request(method, path, body=body)
        same_answer(wire.status, wire.headers, wire.body, mine)
    # A model-less prediction differs only in its query id.
    wire = await request(c.query_url + "/lonely/predict", "POST", b'{"input": [1.0]}')
    mine = await query.post("/lonely/predict", body=b'{"input": [1.0]}')
    assert wire.status == mine.status == 200
    w, m = orjson.loads(wire.body), mine.json()
    assert m["query_id"] == w["query_id"] + 1
    assert {**m, "query_id": 0} == {**w, "query_id": 0}

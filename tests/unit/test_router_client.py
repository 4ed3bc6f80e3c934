"""The in-process client itself (tests/inprocess.py), against stub routers: what it hands a
router, how it waits for answers given later, and how it renders what the server renders."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from clipper.errors import NotFoundError
from clipper.frontend.http import JSON, Respond
from tests.inprocess import HOST, RouterClient, build_request

Seen = tuple[bytes, str, dict[bytes, bytes], bytes]


class Recorder:
    """A router that records its call and answers 200 ``ok`` at once."""

    def __init__(self) -> None:
        self.calls: list[Seen] = []

    def __call__(
        self,
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        self.calls.append((method, path, headers, body))
        respond(200, b"ok", b"text/plain")


async def test_the_router_gets_the_request_as_the_server_builds_it() -> None:
    router = Recorder()
    client = RouterClient(router)
    resp = await client.post(
        "/app/predict?trace=1&x=%20y", json={"input": [1.0]}, headers={"X-Trace": "A"}
    )
    assert (resp.status, resp.body, resp.content_type) == (200, b"ok", "text/plain")
    [(method, path, headers, body)] = router.calls
    assert (method, path) == (b"POST", "/app/predict")
    assert body == b'{"input":[1.0]}'
    assert headers == {
        b"host": HOST.encode(),
        b"content-length": str(len(body)).encode(),
        b"content-type": b"application/json",
        b"x-trace": b"A",
        b":query": b"trace=1&x=%20y",
    }


def test_build_request_query_and_header_rules() -> None:
    assert build_request("/metrics", None, b"") == ("/metrics", {b"host": HOST.encode()})
    path, headers = build_request("/metrics?", {"Accept": "*/*", "ACCEPT": "text/plain"}, b"")
    assert path == "/metrics"
    assert headers[b":query"] == b""  # a bare "?" still makes the pseudo-header
    assert headers[b"accept"] == b"*/*, text/plain"  # repeated names join, as the server does
    assert build_request("/a?b?c", None, b"")[1][b":query"] == b"b?c"
    with pytest.raises(ValueError, match="starts with ':'"):
        build_request("/x", {":query": "format=json"}, b"")


async def test_a_later_answer_is_awaited() -> None:
    tasks: set[asyncio.Task[None]] = set()

    def later(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        async def work() -> None:
            for _ in range(3):
                await asyncio.sleep(0)  # yields to the loop: the answer comes on a later turn
            respond(201, orjson.dumps({"path": path}), JSON)

        tasks.add(asyncio.get_running_loop().create_task(work()))

    resp = await RouterClient(later).get("/x")
    assert (resp.status, resp.json(), resp.content_type) == (
        201,
        {"path": "/x"},
        "application/json",
    )


async def test_no_answer_times_out_naming_the_request() -> None:
    def silent(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        return None

    with pytest.raises(TimeoutError, match=r"GET /quiet: the router did not respond within"):
        await RouterClient(silent).get("/quiet", limit_s=0.05)


async def test_errors_are_rendered_as_the_server_renders_them() -> None:
    def raising(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        if path == "/missing":
            raise NotFoundError("nothing here")
        raise RuntimeError("bug")

    client = RouterClient(raising)
    resp = await client.get("/missing")
    assert (resp.status, resp.content_type) == (404, "application/json")
    assert resp.json() == {"error": "Not found", "cause": "nothing here"}
    with pytest.raises(RuntimeError, match="bug"):  # by default a bug reaches the test
        await client.get("/bug")
    quiet = RouterClient(raising, raise_server_exceptions=False)
    resp = await quiet.get("/bug")
    assert (resp.status, resp.body, resp.content_type) == (
        500,
        b"An unexpected error occurred!",
        "text/plain",
    )


async def test_body_over_the_limit_is_413_before_routing() -> None:
    router = Recorder()
    client = RouterClient(router, max_body_bytes=8)
    resp = await client.post("/a/predict", body=b"x" * 9)
    assert resp.status == 413
    assert resp.json() == {
        "error": "Payload too large",
        "cause": "request body exceeds the limit of 8 bytes",
    }
    assert router.calls == []
    assert (await client.post("/a/predict", body=b"x" * 8)).status == 200


async def test_header_lines_after_the_content_type_are_headers() -> None:
    def binary(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        respond(
            200, b"{}\x00\x01", b"application/octet-stream\r\nInference-Header-Content-Length: 2"
        )

    resp = await RouterClient(binary).get("/v2/models/m/infer")
    assert resp.headers == {
        "content-type": "application/octet-stream",
        "content-length": "4",
        "inference-header-content-length": "2",
    }


async def test_a_second_respond_is_recorded_not_returned() -> None:
    def twice(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        respond(200, b"first", b"text/plain")
        respond(500, b"second", b"text/plain")

    client = RouterClient(twice)
    resp = await client.get("/twice")
    assert resp.body == b"first"
    [(what, extra)] = client.double_responds
    assert (what, extra.status, extra.body) == ("GET /twice", 500, b"second")


async def test_respond_off_the_loop_thread_fails_the_request() -> None:
    def threaded(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        thread = threading.Thread(target=respond, args=(200, b"x", b"text/plain"))
        thread.start()
        thread.join(timeout=5)

    with pytest.raises(AssertionError, match="off the event loop's thread"):
        await RouterClient(threaded).get("/thread", limit_s=5)

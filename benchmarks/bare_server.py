"""The throughput ceiling: a bare uvloop + httptools + orjson prediction endpoint.

One process, one event loop, no model, no batching, no RPC. It answers
``POST /<anything>/predict`` with a body ``{"input": [...]}`` by parsing the JSON with orjson
(the same minimum of work clipper-serve's frontend has to do per query) and replying
``{"query_id": n, "output": 0, "default": false}`` over keep-alive HTTP/1.1.

    python benchmarks/bare_server.py --port 18080

Prints ``ready`` on stdout once listening; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Sequence
from typing import cast

import httptools
import orjson
import uvloop


def _response(status: bytes, body: bytes, keep_alive: bool) -> bytes:
    conn = b"keep-alive" if keep_alive else b"close"
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\nConnection: "
        + conn
        + b"\r\n\r\n"
        + body
    )


_BAD_INPUT = b'{"error": "expected {\\"input\\": [...]}"}'


class _Counter:
    query_id = 0


class PredictProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive connection answering ``POST */predict``."""

    def __init__(self, counter: _Counter) -> None:
        self.counter = counter
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._reply(b"400 Bad Request", b'{"error": "bad HTTP request"}', keep_alive=False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, self.url = self.url, b""
        body = b"".join(self.body)
        self.body.clear()
        keep_alive = self.parser.should_keep_alive()
        method = self.parser.get_method()
        path = url.split(b"?", 1)[0]
        if method != b"POST" or not path.endswith(b"/predict"):
            self._reply(b"404 Not Found", b'{"error": "not found"}', keep_alive)
            return
        try:
            doc = orjson.loads(body)
            ok = isinstance(doc, dict) and isinstance(doc.get("input"), list)
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            self._reply(b"400 Bad Request", _BAD_INPUT, keep_alive)
            return
        self.counter.query_id += 1
        out = orjson.dumps({"query_id": self.counter.query_id, "output": 0, "default": False})
        self._reply(b"200 OK", out, keep_alive)

    def _reply(self, status: bytes, body: bytes, keep_alive: bool) -> None:
        if self.transport is None:
            return
        self.transport.write(_response(status, body, keep_alive))
        if not keep_alive:
            self.transport.close()


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    counter = _Counter()
    server = await loop.create_server(
        lambda: PredictProtocol(counter), host, port, reuse_address=True, backlog=4096
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18080)
    p.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 0")
    args = p.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    uvloop.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

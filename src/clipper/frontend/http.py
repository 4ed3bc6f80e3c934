"""The query API's HTTP/1.1 server: an asyncio Protocol over httptools, no framework.

Keep-alive and pipelining (answers leave in request order), bounded bodies (413), and
back-pressure: a client that does not read its answers stops being read.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, Protocol, cast

import httptools
import orjson

from clipper.errors import PayloadTooLarge, RequestError

__all__ = ["HttpServer", "Router"]

log = logging.getLogger("clipper.http")

# A router takes (method, path, headers, body, respond) and calls respond(status, body,
# content_type) exactly once, now or later; it raises RequestError for a client error.


class Respond(Protocol):
    """``respond(status, body[, content_type])``. ``content_type`` may carry further header
    lines after it, CRLF-separated (the V2 binary extension's Inference-Header-Content-Length);
    routes build it themselves, never from request data."""

    def __call__(self, status: int, data: bytes, content_type: bytes = ..., /) -> None: ...


Router = Callable[[bytes, str, dict[bytes, bytes], bytes, Respond], None]

JSON = b"application/json"
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


_OK_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "


def _head(status: int, content_type: bytes, length: int, keep_alive: bool) -> bytes:
    if status == 200 and keep_alive and content_type is JSON:
        return b"%s%d\r\n\r\n" % (_OK_JSON, length)  # the common answer, kept cheap
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        length,
        b"" if keep_alive else b"Connection: close\r\n",
    )


def error_body(err: RequestError) -> bytes:
    """The Clipper REST error document; every Clipper REST error is rendered here."""
    return orjson.dumps({"error": err.error, "cause": err.cause})


class _Slot:
    __slots__ = ("data", "keep_alive")

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.data: bytes | None = None


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_body_size",
        "_closed",
        "_headers",
        "_paused",
        "_slots",
        "_too_large",
        "_url",
        "parser",
        "server",
        "transport",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        self._too_large = False
        self._slots: deque[_Slot] = deque()
        self._closed = False
        self._paused = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = cast(asyncio.Transport, transport)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as e:
            self._fail(400, f"malformed HTTP request: {e}")

    def pause_writing(self) -> None:
        assert self.transport is not None
        self._paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        assert self.transport is not None
        self._paused = False
        self.transport.resume_reading()

    # httptools callbacks
    def _reset(self) -> None:
        # Done at the end of a message rather than in on_message_begin: one Python callback
        # less per request.
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self._headers[name] = value
        if (
            name == b"content-length"
            and value.isdigit()
            and int(value) > self.server.max_body_bytes
        ):
            self._too_large = True

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_size += len(body)
        if self._body_size > self.server.max_body_bytes:
            self._too_large = True
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        slot = _Slot(keep_alive)
        self._slots.append(slot)
        too_large, body_parts, url, headers = self._too_large, self._body, self._url, self._headers
        self._reset()
        if too_large:
            slot.keep_alive = False  # the client may still be streaming; stop reading it
            err = PayloadTooLarge(
                f"request body exceeds the limit of {self.server.max_body_bytes} bytes"
            )
            self._answer(slot, err.status, error_body(err), JSON)
            return
        body = body_parts[0] if len(body_parts) == 1 else b"".join(body_parts)
        q = url.find(b"?")
        path = (url if q < 0 else url[:q]).decode("utf-8", "replace")
        if q >= 0:
            # Routes that take parameters read them here; no client can send a header
            # whose name starts with ":".
            headers[b":query"] = url[q + 1 :]

        def respond(status: int, data: bytes, content_type: bytes = JSON) -> None:
            self._answer(slot, status, data, content_type)

        try:
            self.server.router(self.parser.get_method(), path, headers, body, respond)
        except RequestError as err:
            if slot.data is None:
                self._answer(slot, err.status, error_body(err), JSON)
        except Exception:
            log.exception("unexpected error serving %s", path)
            if slot.data is None:
                self._answer(slot, 500, b"An unexpected error occurred!", b"text/plain")

    # responses, in request order
    def _answer(self, slot: _Slot, status: int, data: bytes, content_type: bytes) -> None:
        if slot.data is not None:
            return
        slot.data = _head(status, content_type, len(data), slot.keep_alive) + data
        if self._closed or self.transport is None:
            return
        slots = self._slots
        while slots and slots[0].data is not None:
            done = slots.popleft()
            assert done.data is not None
            self.transport.write(done.data)
            if not done.keep_alive:
                self._closed = True
                self.transport.close()
                slots.clear()
                return

    def _fail(self, status: int, cause: str) -> None:
        if self.transport is None or self._closed:
            return
        body = error_body(RequestError(cause))  # {"error": "Bad request", "cause": ...}
        self.transport.write(_head(status, JSON, len(body), False) + body)
        self._closed = True
        self.transport.close()


class HttpServer:
    """Owns the listening socket and its connections."""

    def __init__(self, router: Router, *, host: str, port: int, max_body_bytes: int) -> None:
        self.router = router
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True, backlog=1024
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        await self._server.wait_closed()
        self._server = None


def json_response(respond: Respond, status: int, doc: Any) -> None:
    respond(status, orjson.dumps(doc), JSON)

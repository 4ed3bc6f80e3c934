"""The query API's HTTP/1.1 server: an asyncio Protocol over httptools, no framework.

Keep-alive and pipelining (answers leave in request order), bounded bodies (413), and
back-pressure: a client that does not read its answers stops being read.

Hostile clients are bounded as nginx/uvicorn bound them (:class:`HttpLimits`): header size
(431), concurrent connections (at the limit the oldest idle keep-alive connection is closed to
admit the new one; with none idle a small reserve serves only health paths, then connections
are answered 503 and closed), header, body and idle keep-alive timeouts (the connection is
closed), ``Expect: 100-continue`` answered, and exactly one response per request (an
``Upgrade`` request gets one 400 and the connection closes). One lazily re-armed timer per
connection keeps the per-request cost to a few attribute writes.

A server may have a :class:`Gate` (the admin port's token check): it judges each request when
its headers are complete, before its body is read or ``100 Continue`` is granted; a refused
request is answered (401) and its connection closed with the body unread. The gate also says
whether the request carried a credential: the last ``auth_reserve_connections`` slots are only
for connections whose first request did.

On a server built with ``streaming=True`` (the admin port) a route may answer with a
:class:`Stream` instead of a body (the dashboard's server-sent events): a head without a length,
then writes as they come, until either side closes the connection; such a connection has no
timeouts and reads no further requests.

A stop is a drain (:meth:`HttpServer.begin_drain`): the listening socket closes (new connections
are refused), open connections go on being read, and every answer that leaves the last one a
connection owes carries ``Connection: close`` and closes it; :meth:`HttpServer.owed` counts the
requests still to answer, and :meth:`HttpServer.abandon` answers them 503 when the drain's time
is up. Nothing is cut mid-answer.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import sys
import termios
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import httptools
import orjson

from clipper.clock import Clock, MonotonicClock, TimerHandle
from clipper.errors import PayloadTooLarge, RequestError
from clipper.logs import PROTOCOL_LOG

if TYPE_CHECKING:
    from clipper.config import FrontendConfig

__all__ = [
    "HEALTH_PATHS",
    "ClientWatcher",
    "Gate",
    "HttpLimits",
    "HttpServer",
    "Refusal",
    "Router",
    "Stream",
    "StreamingRespond",
    "is_health_path",
    "is_owed",
    "watch_client",
]

log = logging.getLogger("clipper.http")

# A router takes (method, path, headers, body, respond) and calls respond(status, body,
# content_type) exactly once, now or later; it raises RequestError for a client error.


class Respond(Protocol):
    """``respond(status, body[, content_type[, headers]])``. ``headers``: further header lines,
    each ending in CRLF (a 429's Retry-After and RateLimit fields); routes build them
    themselves, never from request data. (``content_type`` may also carry lines after it,
    CRLF-separated: the V2 binary extension's Inference-Header-Content-Length.)"""

    def __call__(
        self, status: int, data: bytes, content_type: bytes = ..., headers: bytes = ..., /
    ) -> None: ...


class Stream:
    """A streamed response (server-sent events) that a route opened with
    :meth:`StreamingRespond.stream`: its head is sent, then whatever :meth:`write` is given,
    until either side closes the connection (the response has no length: it ends with the
    connection). Writes never block: :attr:`buffered` says how much the client has not taken
    yet, and an owner that finds it too large cuts the stream (:meth:`abort`). ``on_close``
    runs once when the connection is gone, whoever closed it."""

    __slots__ = ("_transport", "closed", "on_close")

    def __init__(self, transport: asyncio.Transport | None) -> None:
        self._transport = transport
        self.closed = False
        self.on_close: Callable[[], None] | None = None

    @property
    def buffered(self) -> int:
        """Bytes written and not yet sent to the client."""
        t = self._transport
        return t.get_write_buffer_size() if t is not None else 0

    def write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def close(self) -> None:
        """End the response (the connection closes once what is buffered is sent)."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Close the connection now, dropping what is buffered (a client that stopped
        reading would otherwise hold it open)."""
        if self._transport is not None:
            self._transport.abort()

    def _lost(self) -> None:
        self._transport = None
        if not self.closed:
            self.closed = True
            if self.on_close is not None:
                self.on_close()


@runtime_checkable
class StreamingRespond(Respond, Protocol):
    """The ``respond`` of a server built with ``streaming=True`` (the admin port): it may also
    answer with a stream instead of a body."""

    def stream(self, status: int, content_type: bytes, /) -> Stream:
        """Send the head of a response without a length and hand back its :class:`Stream`;
        nothing more is read from this connection. Only for a request with no answer owed
        before it (no pipelining); a :class:`RequestError` otherwise."""
        ...


class Router(Protocol):
    """What an HTTP server calls for each request. ``t0`` is when the request's first byte was
    read, on the server's clock: latency and deadlines count from it, not from the parse."""

    def __call__(
        self,
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        /,
        *,
        t0: float | None = ...,
    ) -> None: ...


JSON = b"application/json"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A :class:`Gate`'s answer to a request it will not let read its body."""

    status: int
    body: bytes
    content_type: bytes = JSON


class Gate(Protocol):
    """Judges a request when its headers are complete: ``True`` when it carries a valid
    credential, ``False`` when it may go on without one (a route that checks for itself or
    needs none), or a :class:`Refusal`, answered at once before the body is read, and the
    connection closed. ``has_body``: the request announced a body (a length or chunks)."""

    def __call__(
        self, method: bytes, path: str, headers: Mapping[bytes, bytes], has_body: bool, /
    ) -> bool | Refusal: ...


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


_OK_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "


def _head(
    status: int, content_type: bytes, length: int, keep_alive: bool, headers: bytes = b""
) -> bytes:
    if status == 200 and keep_alive and content_type is JSON and not headers:
        return b"%s%d\r\n\r\n" % (_OK_JSON, length)  # the common answer, kept cheap
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        length,
        headers,
        b"" if keep_alive else b"Connection: close\r\n",
    )


def _closing(answer: bytes) -> bytes:
    """A keep-alive answer rewritten to close its connection (a drain's last answer)."""
    end = answer.index(b"\r\n\r\n") + 2
    return answer[:end] + b"Connection: close\r\n" + answer[end:]


def error_body(err: RequestError) -> bytes:
    """The Clipper REST error document; every Clipper REST error is rendered here."""
    return orjson.dumps({"error": err.error, "cause": err.cause})


# What a connection in the health reserve may ask for (the query port's liveness/readiness
# paths, Clipper's and V2's, and one application's readiness: any path ending in /ready);
# anything else there is answered 503.
HEALTH_PATHS = frozenset(
    ("/health", "/healthz", "/health/live", "/ready", "/health/ready", "/v2/health/live",
     "/v2/health/ready")
)  # fmt: skip


def is_health_path(path: str) -> bool:
    """A path the health reserve serves: :data:`HEALTH_PATHS`, ``/<app>/ready`` and V2's
    ``/v2/models/<m>[/versions/<v>]/ready`` (a load balancer checking one application must
    not see it as down because the frontend holds its connection limit)."""
    return path in HEALTH_PATHS or path.endswith("/ready")


# File descriptors kept for everything but this server's connections (replica sockets, the
# other HTTP port, the store, logs) when the connection limit is clamped to RLIMIT_NOFILE.
_FD_HEADROOM = 256


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may hold of an :class:`HttpServer`; see docs/query-api.md, "Limits"."""

    max_header_bytes: int = 32 * 1024  # request line and headers together -> 431
    max_header_line_bytes: int = 8 * 1024  # the request line, or one header line -> 431
    max_connections: int = 10_000  # open connections; beyond: the reserve, then 503 + close
    reserve_connections: int = 0  # beyond max_connections, served only HEALTH_PATHS
    # Within max_connections, kept for connections whose first request a Gate found to carry
    # a credential: an unauthenticated one over the rest gets 503 and close.
    auth_reserve_connections: int = 0
    header_timeout_s: float = 10.0  # from a request's first byte (or the connection's open)
    body_timeout_s: float = 30.0  # from the end of the headers to the end of the body
    idle_timeout_s: float = 30.0  # keep-alive: an answered connection with no new request

    @classmethod
    def query_port(cls, c: FrontendConfig) -> HttpLimits:
        return cls(
            max_header_bytes=c.max_header_bytes,
            max_header_line_bytes=c.max_header_line_bytes,
            max_connections=c.max_connections,
            reserve_connections=c.health_reserve_connections,
            header_timeout_s=c.header_timeout_s,
            body_timeout_s=c.body_timeout_s,
            idle_timeout_s=c.keepalive_timeout_s,
        )

    @classmethod
    def admin_port(cls, c: FrontendConfig) -> HttpLimits:
        """The admin port: its own (small) connection limit, so a flood of the query port
        never reaches it; the other limits as the query port's."""
        return cls(
            max_header_bytes=c.max_header_bytes,
            max_header_line_bytes=c.max_header_line_bytes,
            max_connections=c.admin_max_connections,
            # Only a token can tell an operator from anyone else; at least one open slot.
            auth_reserve_connections=(
                min(c.admin_reserve_connections, c.admin_max_connections - 1)
                if c.admin_token
                else 0
            ),
            header_timeout_s=c.header_timeout_s,
            body_timeout_s=c.body_timeout_s,
            idle_timeout_s=c.keepalive_timeout_s,
        )


def _error_doc(status: int, cause: str) -> bytes:
    return orjson.dumps({"error": HTTPStatus(status).phrase, "cause": cause})


# A connection's reading state, for its timeout: waiting between requests (idle keep-alive),
# reading a request's line and headers, reading its body.
_IDLE, _HEAD, _BODY = 0, 1, 2
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class ClientWatcher(Protocol):
    """Told once when a request's client goes away before its answer (see :func:`watch_client`)."""

    def client_gone(self) -> None: ...


class _Slot:
    """One request's place in its connection's answer order; on the query port it is also
    the request's ``respond`` (an object, not a closure: it can carry a watcher)."""

    __slots__ = ("conn", "data", "keep_alive", "watcher")

    def __init__(self, conn: _Connection, keep_alive: bool) -> None:
        self.conn = conn
        self.keep_alive = keep_alive
        self.data: bytes | None = None
        self.watcher: ClientWatcher | None = None

    def __call__(
        self, status: int, data: bytes, content_type: bytes = JSON, headers: bytes = b"", /
    ) -> None:
        self.conn._answer(self, status, data, content_type, headers)


def watch_client(respond: Respond, watcher: ClientWatcher) -> None:
    """Tell ``watcher`` if the connection of the request that ``respond`` answers closes (the
    client closed or reset it) before the answer is written: every request it holds, the
    pipelined ones too, is then owed to nobody. A ``respond`` of another kind (a test's, the
    admin port's) has no such signal: nothing is watched."""
    if type(respond) is _Slot:
        respond.watcher = watcher
    elif type(respond) is _StreamingResponder:
        respond._slot.watcher = watcher


def is_owed(respond: Respond) -> bool:
    """Whether the request that ``respond`` answers is still owed an answer: False once it was
    answered (a drain's 503) or its connection closed. A route that resumes a request later
    (its body parsed off the loop) checks this first. Other kinds of ``respond``: True."""
    if type(respond) is _StreamingResponder:
        respond = respond._slot
    if type(respond) is _Slot:
        return respond.data is None and not respond.conn._closed
    return True


class _Connection(asyncio.Protocol):
    __slots__ = (
        "__weakref__",
        "_arrived",
        "_authed",
        "_body",
        "_body_size",
        "_broken",
        "_chunk_at",
        "_closed",
        "_due",
        "_head_bytes",
        "_headers",
        "_headers_done",
        "_health_only",
        "_paused",
        "_since",
        "_slots",
        "_state",
        "_stream",
        "_timer",
        "_too_large",
        "_upgrade",
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
        self._upgrade = False
        # When the current request's first byte was read, and when the current chunk was:
        # requests pipelined behind it in the same chunk arrived with that chunk.
        self._arrived = 0.0
        self._chunk_at = 0.0
        self._slots: deque[_Slot] = deque()
        self._closed = False
        self._broken = False  # a framing error was answered: nothing more is read
        self._paused = False
        self._health_only = False
        self._state = _HEAD  # a new connection owes its first request's headers
        self._since = 0.0  # when _state began (the server's clock)
        self._head_bytes = 0  # header bytes fed for the current request
        self._headers_done = 0  # requests whose headers completed (see _feed_capped)
        self._timer: TimerHandle | None = None
        self._due = 0.0
        self._stream: Stream | None = None
        # What the server's Gate found of the first request: a credential (True), none
        # (False, counted in server.unauthenticated), not judged yet (None).
        self._authed: bool | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.transport = t = cast(asyncio.Transport, transport)
        server = self.server
        limits = server.limits
        n = len(server.connections)
        if n >= server.max_connections and server.evict_idle():
            n -= 1  # an idle keep-alive connection made room (fair slots: oldest idle first)
        if n >= server.max_connections + limits.reserve_connections:
            # Accept-and-close keeps file descriptors for the connections within the limit.
            server.refused += 1
            self._closed = True
            self.transport = None
            del self.parser  # no cycle left for the garbage collector
            t.write(server.refusal)
            t.close()
            server.log_refusal()
            return
        self._health_only = n >= server.max_connections
        server.connections.add(self)
        server.idle[self] = None  # nothing asked yet: a later client may take its place
        now = server.clock.now()
        self._since = now
        self._arm(now + limits.header_timeout_s, now)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._closed and self.transport is None:
            return  # refused in connection_made
        self._closed = True
        self.server.release(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # The parser holds this protocol and the transport holds it too: dropping both
        # frees the connection at once rather than at the next cyclic garbage collection.
        self.transport = None
        del self.parser
        if self._slots:
            self._owed_to_nobody()
        self._headers = {}
        self._body = []
        if self._stream is not None:
            self._stream._lost()

    def _owed_to_nobody(self) -> None:
        """The connection is gone with answers owed: tell each request's watcher (a query
        still waiting is abandoned, and its inputs leave the queue)."""
        slots = list(self._slots)
        self._slots.clear()
        for slot in slots:
            watcher = slot.watcher
            if watcher is not None and slot.data is None:
                slot.watcher = None
                try:
                    watcher.client_gone()
                except Exception:  # one broken watcher must not keep the others waiting
                    PROTOCOL_LOG.exception(
                        log, self.server.clock, "telling a request that its client went away failed"
                    )

    def data_received(self, data: bytes) -> None:
        if self._broken or self._closed:
            return
        server = self.server
        self._chunk_at = now = server.clock.now()
        if not server.turn_open:
            server.begin_turn(now)
        if self._state != _BODY:
            if self._head_bytes == 0:
                self._arrived = now  # a request's first byte
                server.idle.pop(self, None)  # a request in progress: never evicted
            if self._state == _IDLE:
                self._begin(_HEAD, self.server.limits.header_timeout_s)
            room = self.server.limits.max_header_bytes - self._head_bytes
            if len(data) > room:
                self._feed_capped(data, room)
                return
            self._head_bytes += len(data)
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # on_message_complete answered it (400) and closes the connection
        except httptools.HttpParserError as e:
            self._fail(400, f"malformed HTTP request: {e}")

    def _feed_capped(self, data: bytes, room: int) -> None:
        """``data`` runs past the header cap: feed what fits; unless a request's headers end
        within it, answer 431 without buffering more (httptools would keep the rest)."""
        done = self._headers_done
        if room > 0:
            self._head_bytes += room
            self._feed(data[:room])
            if self._broken or self._closed:
                return
        if self._headers_done == done:
            cap = self.server.limits.max_header_bytes
            self._fail(431, f"the request line and headers exceed {cap} bytes (max_header_bytes)")
            return
        self.data_received(data[room:])

    def pause_writing(self) -> None:
        if self.transport is None:
            return
        self._paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is None:
            return
        self._paused = False
        if not self._broken:
            self.transport.resume_reading()

    # timeouts: one timer per connection, re-armed lazily when it fires
    def _arm(self, due: float, now: float) -> None:
        self._due = due
        self._timer = self.server.clock.call_later(max(due - now, 0.0), self._on_timer)

    def _begin(self, state: int, limit_s: float) -> None:
        """Enter a reading state; the timer moves earlier only when this state's deadline
        comes before the armed one (else it re-checks when it fires)."""
        now = self.server.clock.now()
        self._state = state
        self._since = now
        due = now + limit_s
        if due < self._due and self._timer is not None:
            self._timer.cancel()
            self._arm(due, now)

    def _on_timer(self) -> None:
        self._timer = None
        if self._closed:
            return
        server = self.server
        limits = server.limits
        now = server.clock.now()
        if self._slots:  # answers owed by us, not the client: look again later
            self._arm(now + limits.idle_timeout_s, now)
            return
        state = self._state
        if state == _IDLE:
            limit = limits.idle_timeout_s
        elif state == _HEAD:
            limit = limits.header_timeout_s
        else:
            limit = limits.body_timeout_s
        due = self._since + limit
        if now < due - 0.002:  # uvloop may fire a millisecond early
            self._arm(due, now)
            return
        if state == _IDLE or (state == _HEAD and self._head_bytes == 0):
            self._close()  # nothing asked: a silent close, as keep-alive timeouts do
        elif state == _HEAD:
            self._fail(408, f"the request headers took longer than {limit:g} s (header_timeout_s)")
        else:
            self._fail(408, f"the request body took longer than {limit:g} s (body_timeout_s)")

    def _close(self) -> None:
        self._closed = True
        if self.transport is not None:
            self.transport.close()

    def _unread(self) -> bool:
        """Bytes wait in the socket that the loop has not read yet (a new connection's first
        request, a keep-alive one's next): such a connection is not idle, only early. A flood
        of reconnecting clients evicted an authorized client's new connection that way."""
        t = self.transport
        sock = t.get_extra_info("socket") if t is not None else None
        if sock is None:
            return False
        try:
            waiting = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        except (OSError, ValueError):
            return False
        return int.from_bytes(waiting, sys.byteorder, signed=True) > 0

    def _is_idle(self) -> bool:
        """Nothing owed either way: no answer owed, no request begun (not even one pipelined
        behind an answered one, whose URL the parser has started), not a stream."""
        return (
            not self._closed
            and not self._broken
            and not self._slots
            and not self._url
            and self._head_bytes == 0
            and self._state != _BODY
        )

    def _owes(self) -> int:
        """Requests this connection read and has not answered, counting one it is reading
        (its first byte is in): what a drain waits for."""
        if self._closed:
            return 0
        reading = self._state == _BODY or self._head_bytes > 0
        return sum(slot.data is None for slot in self._slots) + reading

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
        if len(self._url) > self.server.limits.max_header_line_bytes:
            self._fail(
                414,
                f"the request target exceeds {self.server.limits.max_header_line_bytes} bytes "
                "(max_header_line_bytes)",
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) + len(value) > self.server.limits.max_header_line_bytes:
            self._fail(
                431,
                f"header {name[:40].decode('latin-1')!r} exceeds "
                f"{self.server.limits.max_header_line_bytes} bytes (max_header_line_bytes)",
            )
            return
        name = name.lower()
        prev = self._headers.get(name)
        # Repeated fields join with ", " (RFC 9110 5.3): a route can see a duplicate (a second
        # Authorization is refused) instead of silently getting the last one.
        self._headers[name] = value if prev is None else prev + b", " + value
        if (
            name == b"content-length"
            and value.isdigit()
            and int(value) > self.server.max_body_bytes
        ):
            self._too_large = True

    def on_headers_complete(self) -> None:
        self._headers_done += 1
        self._head_bytes = 0
        if self._broken:
            return
        self._begin(_BODY, self.server.limits.body_timeout_s)
        if self.parser.should_upgrade():
            self._upgrade = True  # answered once, in on_message_complete
            return
        if self.server.gate is not None and not self._judge(self.server.gate):
            return
        expect = self._headers.get(b"expect")
        if expect is not None:
            if expect.lower() != b"100-continue":
                self._fail(417, f"unsupported expectation {expect[:40]!r}; only 100-continue")
            elif self._too_large:
                # At once: the client has not sent the body and need not.
                self._fail(
                    413,
                    f"request body exceeds the limit of {self.server.max_body_bytes} bytes",
                )
            elif not self._slots and self.transport is not None:
                # Only when no earlier answer is owed: interim responses keep request order.
                self.transport.write(_CONTINUE)

    def _judge(self, gate: Gate) -> bool:
        """The gate's verdict on the request whose headers just completed, before its body
        is read: False when it was refused (answered, the connection closing)."""
        headers = self._headers
        url = self._url
        q = url.find(b"?")
        path = (url if q < 0 else url[:q]).decode("utf-8", "replace")
        length = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or (length is not None and length != b"0")
        verdict = gate(self.parser.get_method(), path, headers, has_body)
        if type(verdict) is Refusal:
            self._refuse(verdict)
            return False
        if self._authed is None:  # the first request decides which share the slot is in
            server = self.server
            if not verdict and not server.admit_unauthenticated():
                reserve = server.limits.auth_reserve_connections
                self._refuse(Refusal(503, _error_doc(503, (
                    f"this port keeps {reserve} of its {server.max_connections} connections "
                    "for requests that carry its token, and the rest are in use: retry later"
                ))))  # fmt: skip
                return False
            self._authed = bool(verdict)
        return True

    def _refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` now and close: what the client sends after the headers is
        dropped unread (no body buffered, no ``100 Continue``)."""
        self._too_large = True  # on_body drops what this chunk still holds
        if self._broken or self._closed or self.transport is None:
            return
        self._broken = True
        self.transport.pause_reading()
        slot = _Slot(self, False)
        self._slots.append(slot)
        self._answer(slot, refusal.status, refusal.body, refusal.content_type)

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
        self._state = _IDLE
        t0, self._arrived = self._arrived, self._chunk_at
        if self._broken:
            return
        if self._upgrade:
            self._fail(400, "protocol upgrades (Upgrade, CONNECT) are not supported: send "
                       "plain HTTP/1.1 requests")  # fmt: skip
            return
        keep_alive = self.parser.should_keep_alive() and not self._health_only
        slot = _Slot(self, keep_alive)
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
        if self._health_only and not is_health_path(path):
            limit = self.server.max_connections
            self._answer(slot, 503, _error_doc(503, (
                f"the server holds its limit of {limit} connections (max_connections); "
                "beyond it only health and readiness paths are served: retry later"
            )), JSON)  # fmt: skip
            return

        respond: Respond = _StreamingResponder(self, slot) if self.server.streaming else slot
        try:
            self.server.router(self.parser.get_method(), path, headers, body, respond, t0=t0)
        except RequestError as err:
            if slot.data is None:
                self._answer(slot, err.status, error_body(err), JSON, err.headers)
        except Exception:
            PROTOCOL_LOG.exception(log, self.server.clock, "unexpected error serving %s", path)
            if slot.data is None:
                self._answer(slot, 500, b"An unexpected error occurred!", b"text/plain")

    # responses, in request order
    def _answer(
        self, slot: _Slot, status: int, data: bytes, content_type: bytes, headers: bytes = b""
    ) -> None:
        if slot.data is not None:
            return
        slot.data = _head(status, content_type, len(data), slot.keep_alive, headers) + data
        # Answered: nobody is owed a closed connection's news. The watcher (the request's
        # reply) holds this slot as its respond: left set, the pair would be a reference
        # cycle, and every query the cyclic collector's to free.
        slot.watcher = None
        if self._closed or self.transport is None:
            return
        slots = self._slots
        while slots and slots[0].data is not None:
            done = slots.popleft()
            out = done.data
            assert out is not None
            if done.keep_alive and self.server.draining and not slots and self._state == _IDLE:
                # The server drains: the last answer owed, with no request begun behind it,
                # tells the client to go elsewhere next, and the connection closes after it.
                done.keep_alive = False
                out = _closing(out)
            self.transport.write(out)
            if not done.keep_alive:
                self._closed = True
                self.transport.close()
                slots.clear()
                return
        if not slots and self._state == _IDLE:
            self._since = self.server.clock.now()  # keep-alive idleness starts now
            self.server.idle[self] = None  # the newest idle one: evicted last

    def open_stream(self, slot: _Slot, status: int, content_type: bytes) -> Stream:
        """Answer ``slot`` with a head and no length, and turn the connection into a stream:
        no timeouts, nothing more read as requests (what the client sends is ignored)."""
        if slot.data is not None or list(self._slots) != [slot]:
            raise RequestError(
                "a streamed response must be the only request on its connection: send it "
                "without pipelining"
            )
        transport = self.transport
        if self._closed or transport is None:
            stream = Stream(None)
            stream._lost()
            return stream
        slot.data = b""
        self._slots.clear()
        self._broken = True  # what the client sends from now on is not read as requests
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-store\r\n"
            b"Connection: close\r\n\r\n" % (status, _REASONS.get(status, b"Unknown"), content_type)
        )
        self._stream = stream = Stream(transport)
        return stream

    def _fail(self, status: int, cause: str) -> None:
        """Answer a request that cannot be read on (framing, limits, timeouts) after the
        answers owed before it, then close: the one response this request gets."""
        if self._broken or self._closed or self.transport is None:
            return
        self._broken = True
        self.transport.pause_reading()
        slot = _Slot(self, False)
        self._slots.append(slot)
        self._answer(slot, status, _error_doc(status, cause), JSON)


class _StreamingResponder:
    """``respond`` on a streaming server: it can also open a stream."""

    __slots__ = ("_conn", "_slot")

    def __init__(self, conn: _Connection, slot: _Slot) -> None:
        self._conn = conn
        self._slot = slot

    def __call__(
        self, status: int, data: bytes, content_type: bytes = JSON, headers: bytes = b"", /
    ) -> None:
        self._conn._answer(self._slot, status, data, content_type, headers)

    def stream(self, status: int, content_type: bytes, /) -> Stream:
        return self._conn.open_stream(self._slot, status, content_type)


class HttpServer:
    """Owns the listening socket and its connections. ``streaming=True`` hands routes a
    :class:`StreamingRespond` (for the admin port's dashboard)."""

    def __init__(
        self,
        router: Router,
        *,
        host: str,
        port: int,
        max_body_bytes: int,
        limits: HttpLimits | None = None,
        clock: Clock | None = None,
        streaming: bool = False,
        on_turn: Callable[[float, float], None] | None = None,
        gate: Gate | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.router = router
        # SO_REUSEPORT: the worker processes of one machine share the port, the kernel spreads
        # the connections (clipper.workers); off, a second process on the port is refused.
        self.reuse_port = reuse_port
        self.streaming = streaming
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.limits = limits or HttpLimits()
        self.clock: Clock = clock or MonotonicClock()
        self.max_connections = self.limits.max_connections  # clamped to the fd limit at start
        self.connections: set[_Connection] = set()
        # Connections that became idle (opened, or answered everything), oldest first: at the
        # limit the oldest still idle is closed to admit a new client. Entries may be stale
        # (a request began since); evict_idle() checks and skips them.
        self.idle: dict[_Connection, None] = {}
        self.evicted = 0  # idle connections closed to make room
        self.gate = gate
        self.unauthenticated = 0  # connections whose first request carried no credential
        self.refused = 0  # connections answered 503 and closed beyond the limit and reserve
        self._refusals_logged = 0
        self._last_refusal_log = float("-inf")
        self._server: asyncio.Server | None = None
        self.refusal = _head(503, JSON, 0, False)  # replaced in start(), once the limit is known
        self._turn_at = 0.0
        self.turn_open = False
        # Told of each loop turn that read requests: (first read, end of the turn's work).
        self.on_turn = on_turn
        self.draining = False  # begin_drain(): no new connections, each closes when answered

    def evict_idle(self) -> bool:
        """Close the connection that has been idle longest (HTTP lets a server close an idle
        keep-alive connection at any time; the client reconnects): True when one was."""
        idle = self.idle
        for conn in list(idle):
            if not conn._is_idle():
                del idle[conn]  # stale: a request began since
            elif not conn._unread():
                del idle[conn]
                self.release(conn)
                conn._close()
                self.evicted += 1
                return True
            # else its next request is in the socket, not read yet: early, not idle
        return False

    def release(self, conn: _Connection) -> None:
        """``conn`` no longer holds a slot (closed, or evicted ahead of its close)."""
        if conn in self.connections:
            self.connections.discard(conn)
            if conn._authed is False:
                self.unauthenticated -= 1
        self.idle.pop(conn, None)

    def admit_unauthenticated(self) -> bool:
        """A connection whose first request carries no credential takes a slot outside the
        reserve, if one is left."""
        if self.unauthenticated >= self.max_connections - self.limits.auth_reserve_connections:
            return False
        self.unauthenticated += 1
        return True

    def begin_turn(self, now: float) -> None:
        """The loop's current turn read its first request bytes at ``now``. Under saturation
        one turn reads hundreds of requests one after another, and a request that arrives
        during a turn waits in its socket for the next: neither is visible from the request's
        own first read. The turn's length, reported to :attr:`on_turn` when it ends, measures
        both (one clock read and one callback per turn, not per request)."""
        self._turn_at = now
        self.turn_open = True
        self.clock.call_soon(self._end_turn)  # runs after this turn's I/O callbacks

    def _end_turn(self) -> None:
        self.turn_open = False
        if self.on_turn is not None:
            self.on_turn(self._turn_at, self.clock.now())

    def log_refusal(self) -> None:
        """One line per 10 s at most, with the count since the last one: a flood must not
        also flood the log."""
        now = self.clock.now()
        if now - self._last_refusal_log >= 10.0:
            log.warning(
                "%s:%s refused %d connections beyond its limit of %d (+%d reserved for health)",
                self.host, self.port, self.refused - self._refusals_logged,
                self.max_connections, self.limits.reserve_connections,
            )  # fmt: skip
            self._last_refusal_log = now
            self._refusals_logged = self.refused

    def _clamp_to_fd_limit(self) -> None:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return
        fit = max(soft - _FD_HEADROOM - self.limits.reserve_connections, 16)
        if self.max_connections > fit:
            log.warning(
                "max_connections %d does not fit the file descriptor limit (ulimit -n %d): "
                "using %d; raise ulimit -n to use more",
                self.max_connections, soft, fit,
            )  # fmt: skip
            self.max_connections = fit

    async def start(self) -> None:
        self._clamp_to_fd_limit()
        body = _error_doc(503, (
            f"too many connections: this server holds its limit of {self.max_connections} "
            "(max_connections); retry later"
        ))  # fmt: skip
        self.refusal = _head(503, JSON, len(body), False) + body
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True, backlog=1024,
            reuse_port=self.reuse_port,
        )  # fmt: skip
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    def begin_drain(self) -> None:
        """Stop accepting connections (the listening socket closes: a new connection is
        refused) and drain the open ones: what they send is still read and answered, and each
        closes after the last answer it owes (``Connection: close``). An idle keep-alive
        connection stays open until :meth:`stop`: a request it carries meanwhile (a load
        balancer's health check, a client's next query) is answered, and told to close,
        rather than cut."""
        if self.draining:
            return
        self.draining = True
        if self._server is not None:
            self._server.close()

    def owed(self) -> int:
        """Requests read (or being read) and not answered yet, over all connections."""
        return sum(conn._owes() for conn in self.connections)

    def abandon(self, cause: str) -> int:
        """Answer every request still owed ``503`` with ``cause`` (a drain's time is up) and
        close the connections after those answers; how many were answered so."""
        body = _error_doc(503, cause)
        n = 0
        for conn in list(self.connections):
            for slot in list(conn._slots):
                if slot.data is None:
                    n += 1
                    conn._answer(slot, 503, body, JSON)
            conn._close()
        return n

    async def stop(self) -> None:
        """Close: the listening socket, then every connection (after what was written to it
        is sent). A drain, if one is wanted, comes first (:meth:`begin_drain`)."""
        if self._server is None:
            return
        self.draining = True
        self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        await self._server.wait_closed()
        self._server = None


def json_response(respond: Respond, status: int, doc: Any) -> None:
    respond(status, orjson.dumps(doc), JSON)

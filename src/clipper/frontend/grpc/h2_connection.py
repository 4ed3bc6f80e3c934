"""One HTTP/2 connection of the native gRPC transport (:mod:`clipper.frontend.grpc.native`):
an :class:`asyncio.Protocol` on the frontend's loop that serves unary calls. ``ModelInfer``
runs on callbacks, without a task per call; the other methods run the grpcio servicer's
coroutines (:class:`~clipper.frontend.grpc.server.Servicer`).

HTTP/2 is what a gRPC client needs: SETTINGS, PING, WINDOW_UPDATE both ways, RST_STREAM,
GOAWAY, HEADERS + CONTINUATION, DATA with padding; a protocol error is answered by GOAWAY and
the connection closed. Request header blocks go through :class:`~clipper.frontend.grpc.
hpack_blocks.HeaderCache` (judged before decoding, small ones cached); responses use constant
header blocks that never touch the peer's dynamic table. A hostile peer meets the limits of
:mod:`clipper.frontend.grpc.h2_limits`: budgets for resets, control frames and decode time
(GOAWAY ENHANCE_YOUR_CALM), a share of each loop turn, receive windows refilled only as calls
are dispatched, and timeouts for a request's body and for an answer the peer's window holds.
See docs/v2-protocol.md and docs/security.md.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, cast

import hpack
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from clipper.clock import Clock, TimerHandle
from clipper.errors import ClipperError, RequestError
from clipper.frontend import request_trace
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc.h2_frames import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEAD,
    HEADERS,
    INTERNAL_ERROR,
    MAX_FRAME,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PREFIX,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SERVICE,
    SETTING,
    SETTINGS,
    U32,
    WINDOW,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
)
from clipper.frontend.grpc.h2_limits import GOAWAY_LINGER_S, H2Limits, WindowBudget
from clipper.frontend.grpc.hpack_blocks import (
    CACHE_BLOCK_BYTES,
    MAX_HEADER_LIST,
    Decoded,
    HeaderCache,
    HeaderLimitError,
    error_block,
    error_metadata,
    header_block,
    table_size_update,
)
from clipper.frontend.grpc.server import (
    InferReply,
    error_status,
    submit_infer,
)
from clipper.logs import PROTOCOL_LOG
from clipper.query.prediction import answer_failed

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from clipper.query.runtime import QueryServices


class Host(Protocol):
    """What a connection needs of the server that accepted it
    (:class:`~clipper.frontend.grpc.native.NativeGrpcServer`)."""

    svc: QueryServices
    clock: Clock
    limits: H2Limits
    max_message_bytes: int
    max_connections: int
    refused: int
    buffered: int  # request body bytes held by all connections (limits.buffered_bytes)
    connections: set[Connection]
    tasks: set[asyncio.Future[Any]]
    methods: dict[bytes, tuple[Any, Callable[[Any, Any], Coroutine[Any, Any, Any]]]]
    soon: Callable[[Callable[[], None]], object]


__all__ = ["Connection", "Host", "NativeReply", "Stream"]

log = logging.getLogger(__name__)

_HPACK_TABLE = 4096  # the dynamic table size both sides start with (RFC 7541)
# Why reading is paused (Connection.paused): the peer does not read, or it used its turn.
_WRITING, _BUSY, _CLOSING = 0x1, 0x2, 0x4

_OK_HEAD = header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
_OK_TRAILERS = header_block([(b"grpc-status", b"0")])


class _Abort(ClipperError):
    """A servicer method's ``context.abort``: a trailers-only error response."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Context:
    """The one part of a grpc.aio context the servicer's methods use."""

    async def abort(self, code: Any, details: str = "") -> NoReturn:
        raise _Abort(int(code.value[0]), details)


_CONTEXT = _Context()


class Stream:
    __slots__ = (
        "body", "complete", "ctype", "done", "held", "id", "meta", "moved", "opened", "path",
        "pending", "recv", "reply", "task", "window",
    )  # fmt: skip

    def __init__(self, sid: int, window: int, now: float) -> None:
        self.id = sid
        self.window = window  # what we may still send on it
        self.recv = 0  # request bytes consumed since our last WINDOW_UPDATE for it
        self.body = bytearray()
        self.held = 0  # body bytes counted against the connection's and the server's budgets
        self.opened = now  # its HEADERS: the body timeout counts from here
        self.complete = False  # its request is all in (dispatched)
        self.moved = now  # the last time its blocked answer moved (the send timeout)
        self.path = b""
        self.ctype = b""
        self.meta: dict[bytes, bytes] = {}  # the call's API key and priority, when it has them
        self.pending: deque[bytes] | None = None  # DATA payloads waiting for window
        self.done = False  # answered or reset: a late answer is dropped
        self.reply: InferReply | None = None  # a ModelInfer waiting for its answer
        self.task: asyncio.Future[Any] | None = None  # another method's servicer coroutine


class NativeReply(InferReply):
    __slots__ = ("conn", "stream")

    def __init__(self, conn: Connection, stream: Stream) -> None:
        super().__init__()
        self.conn = conn
        self.stream = stream

    def deliver(self, response: Any) -> None:
        self.conn.send_message(self.stream, response.SerializeToString())

    def refuse(self, err: RequestError) -> None:
        code, message = error_status(err)
        metadata = error_metadata(err.headers) if err.headers else ()
        self.conn.send_error(self.stream, int(code.value[0]), message, metadata)
        if self.span is not None:
            request_trace.failed(self.span, err)

    def hold_s(self) -> float:
        """How long the query may still run: the call's timeout, else its application's SLO."""
        infer, app = self.infer, self.app
        if infer is not None and infer.slo_s:
            return infer.slo_s
        return app.slo_s if app is not None else 0.0


class Connection(asyncio.Protocol):
    def __init__(self, server: Host) -> None:
        self.server = server
        self.limits = limits = server.limits
        now = server.clock.now()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.buf = bytearray()
        self.preface = False
        self.streams: dict[int, Stream] = {}
        self.last_id = 0
        self.cache = HeaderCache()
        self.send_window = 65_535  # the peer's connection window
        self.peer_initial = 65_535  # the peer's initial stream window
        self.peer_max_frame = 16_384
        # Our connection receive window: what the peer may still send, and the bytes released
        # (dispatched or dropped) not yet given back by WINDOW_UPDATE.
        self.recv_left = limits.connection_window
        self.credit = 0
        self.refill_at = limits.connection_window // 4
        self.blocked: dict[int, Stream] = {}  # streams with DATA waiting for window
        self.block: bytearray | None = None  # a header block awaiting CONTINUATION
        self.block_stream = 0
        self.block_flags = 0
        self.block_frames = 0  # CONTINUATION frames in it so far
        self.resets = WindowBudget(limits.reset_budget, limits.reset_window_s, now)
        self.control = WindowBudget(limits.control_budget, limits.control_window_s, now)
        self.decoding = WindowBudget(limits.decode_budget_s, limits.decode_window_s, now)
        self.held: list[float] = []  # heap: until when each reset call's query may still run
        self.enc_table = _HPACK_TABLE  # the dynamic table size our (index-free) encoder uses
        self.table_update = b""  # a size update owed at the start of our next header block
        self.paused = 0  # why reading is paused (_WRITING, _BUSY, _CLOSING)
        self.scheduled = False  # a later turn will parse what is buffered
        self.out: list[bytes] | None = None  # writes gathered while a read is parsed
        self.closed = False
        self.goaway = False
        self.linger: TimerHandle | None = None  # the close after a GOAWAY's half-close
        self.opened = self.last_active = now

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is no subclass
        server = self.server
        if len(server.connections) >= server.max_connections:
            # Refused at once, with the reason: a flood of connections must not take the
            # descriptors that the other ports (health checks, the admin API) need.
            server.refused += 1
            self.closed = True
            self.transport.write(
                frame(
                    GOAWAY,
                    0,
                    0,
                    U32.pack(0)
                    + U32.pack(ENHANCE_YOUR_CALM)
                    + f"the server holds its limit of {server.max_connections} connections "
                    "(max_connections)".encode(),
                )
            )
            self.transport.close()
            return
        server.connections.add(self)
        ours = ((0x3, self.limits.max_streams), (0x4, WINDOW), (0x6, MAX_HEADER_LIST))
        settings = b"".join(SETTING.pack(k, v) for k, v in ours)
        self.transport.write(
            frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, U32.pack(self.limits.connection_window - 65_535))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self.server.connections.discard(self)
        streams = list(self.streams.values())
        self.streams.clear()
        self.blocked.clear()
        for s in streams:
            s.done = True
            self.server.buffered -= s.held
            s.held = 0
            s.body = bytearray()
            self._cancelled(s)

    def _cancelled(self, stream: Stream) -> None:
        """The client reset ``stream`` or its connection went before the answer: the query
        waiting for it is abandoned (its inputs leave the queue), a servicer call cancelled."""
        reply, stream.reply = stream.reply, None
        if reply is not None:
            try:
                reply.client_gone()
            except Exception:  # one broken query must not keep the connection's others
                PROTOCOL_LOG.exception(
                    log, self.server.clock, "abandoning a cancelled ModelInfer failed"
                )
        task, stream.task = stream.task, None
        if task is not None:
            task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_active = self.server.clock.now()
        self.buf += data
        if not self.scheduled:
            self._turn()

    def _turn(self) -> None:
        """Parse what is buffered, up to this connection's share of a loop turn; if frames are
        left, stop reading and parse them on a later turn, so one peer cannot own the loop."""
        self.scheduled = False
        if self.closed:
            return
        self.out = []
        more = False
        try:
            more = self._parse()
        except ProtocolError as e:
            self._goaway(e.code, str(e))
        except Exception as e:  # a bug: the connection goes, the server stays
            PROTOCOL_LOG.exception(log, self.server.clock, "gRPC connection failed")
            self._goaway(INTERNAL_ERROR, f"internal error: {type(e).__name__}")
        out, self.out = self.out, None
        if self.closed:
            return
        if out:
            self.transport.write(b"".join(out))
        if more:
            self._pause(_BUSY)
            self.scheduled = True
            self.server.soon(self._turn)
        elif self.paused & _BUSY:
            self._resume(_BUSY)

    def _pause(self, why: int) -> None:
        if not self.paused:
            self.transport.pause_reading()
        self.paused |= why

    def _resume(self, why: int) -> None:
        if self.paused & why:
            self.paused &= ~why
            if not self.paused and not self.closed:
                self.transport.resume_reading()

    def pause_writing(self) -> None:
        # A peer that does not read its answers stops being read: bounded buffers.
        self._pause(_WRITING)

    def resume_writing(self) -> None:
        self._resume(_WRITING)

    # -- output --------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.out is not None:
            self.out.append(data)
        elif not self.closed:
            self.transport.write(data)

    def _block(self, block: bytes) -> bytes:
        """A header block we send, after the table size update the peer is owed, if any."""
        update = self.table_update
        if update:
            self.table_update = b""
            return update + block
        return block

    def _goaway(self, code: int, why: str) -> None:
        if self.closed:
            return
        if code != NO_ERROR:
            PROTOCOL_LOG.info(log, self.server.clock, "gRPC connection error %d: %s", code, why)
        out = b"".join(self.out or ()) + frame(
            GOAWAY, 0, 0, U32.pack(self.last_id) + U32.pack(code) + why.encode()[:256]
        )
        self.out = None
        transport = self.transport
        transport.write(out)
        self.closed = True  # what the peer still sends is discarded unread
        # What it buffered goes now, not when the linger ends: a flood of short-lived
        # connections must not hold a second's worth of them.
        self.buf = bytearray()
        self.block = None
        for stream in self.streams.values():
            stream.body = bytearray()
            self._release(stream)
        if transport.can_write_eof():
            # Half-close and linger: closing with the peer's bytes unread would reset the
            # connection, and a peer still sending (a flood) would never see why it ended.
            # Reading stops: a flood then fills its own socket buffer, not our loop.
            self._pause(_CLOSING)
            transport.write_eof()
            self.linger = self.server.clock.call_later(GOAWAY_LINGER_S, transport.close)
        else:
            transport.close()

    def _end(self, stream: Stream) -> None:
        stream.done = True
        stream.reply = None
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)
        stream.pending = None
        self._release(stream)

    def send_error(
        self,
        stream: Stream,
        code: int,
        message: str,
        metadata: Sequence[tuple[bytes, bytes]] = (),
    ) -> None:
        """A trailers-only response (``metadata``: its trailing metadata)."""
        if stream.done or self.closed:
            return
        self._end(stream)
        block = self._block(error_block(code, message, metadata))
        self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))

    def _refuse(self, stream: Stream, code: int, message: str) -> None:
        """A trailers-only error before the request is all in, then RST_STREAM NO_ERROR: the
        peer stops sending it (RFC 9113 section 8.1)."""
        if stream.done or self.closed:
            return
        self.send_error(stream, code, message)
        self._write(frame(RST_STREAM, 0, stream.id, U32.pack(NO_ERROR)))

    def send_message(self, stream: Stream, message: bytes) -> None:
        """HEADERS, the message in DATA (as far as the peer's windows allow), trailers."""
        if stream.done or self.closed:
            return
        sid = stream.id
        data = PREFIX.pack(0, len(message)) + message
        head = frame(HEADERS, END_HEADERS, sid, self._block(_OK_HEAD))
        n = len(data)
        if n <= self.send_window and n <= stream.window and n <= self.peer_max_frame:
            self.send_window -= n
            self._end(stream)
            trailers = frame(HEADERS, END_HEADERS | END_STREAM, sid, _OK_TRAILERS)
            self._write(b"".join((head, frame(DATA, 0, sid, data), trailers)))
            return
        self._write(head)
        stream.pending = deque([data])
        stream.moved = self.server.clock.now()
        self._flush(stream)

    def _flush(self, stream: Stream) -> None:
        """Send what the windows allow of ``stream``'s pending DATA; the trailers when done
        (built then: a table size update may be owed by that time)."""
        pending = stream.pending
        assert pending is not None
        out: list[bytes] = []
        while pending:
            data = pending[0]
            room = min(self.send_window, stream.window, self.peer_max_frame)
            if room <= 0:
                break
            chunk = data[:room]
            if len(chunk) == len(data):
                pending.popleft()
            else:
                pending[0] = data[room:]
            self.send_window -= len(chunk)
            stream.window -= len(chunk)
            out.append(frame(DATA, 0, stream.id, chunk))
        if out:
            stream.moved = self.server.clock.now()
        if not pending:
            self._end(stream)
            block = self._block(_OK_TRAILERS)
            out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))
        else:
            self.blocked[stream.id] = stream
        if out:
            self._write(b"".join(out))

    def _unblock(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self._flush(stream)

    # -- budgets -------------------------------------------------------------------------------
    def _count_reset(self) -> None:
        """One more stream reset (by the peer, or refused by us): rapid reset's budget."""
        if not self.resets.spend(self.server.clock.now()):
            limits = self.limits
            raise ProtocolError(
                ENHANCE_YOUR_CALM,
                f"more than {limits.reset_budget} stream resets in {limits.reset_window_s:g} s",
            )

    def _control_frame(self, what: str) -> None:
        """A frame that asks work of us but opens no call (PING, SETTINGS, ...)."""
        if not self.control.spend(self.server.clock.now()):
            limits = self.limits
            raise ProtocolError(
                ENHANCE_YOUR_CALM,
                f"more than {limits.control_budget} control frames ({what} the last) in "
                f"{limits.control_window_s:g} s without a call",
            )

    def _running(self) -> int:
        """Open streams plus reset ones whose queries may still run: what the stream limit
        counts."""
        held = self.held
        if held:
            now = self.server.clock.now()
            while held and held[0] <= now:
                heapq.heappop(held)
        return len(self.streams) + len(held)

    def _release(self, stream: Stream) -> None:
        """``stream``'s buffered body bytes leave the budgets; the peer may send as many."""
        n = stream.held
        if n:
            stream.held = 0
            self.server.buffered -= n
            self._credit(n)

    def _credit(self, n: int) -> None:
        if n <= 0:
            return
        self.credit += n
        if self.credit >= self.refill_at:
            self._write(frame(WINDOW_UPDATE, 0, 0, U32.pack(self.credit)))
            self.recv_left += self.credit
            self.credit = 0

    def expire(self, now: float) -> None:
        """The sweep's check of each stream: a request whose body is late is answered
        DEADLINE_EXCEEDED and reset; an answer the peer's window has held too long is reset."""
        limits = self.limits
        for stream in list(self.streams.values()):
            if not stream.complete and now - stream.opened >= limits.body_timeout_s:
                self._refuse(
                    stream, 4,
                    f"the request message was not complete within {limits.body_timeout_s:g} s "
                    "of its headers (body_timeout_s)",
                )  # fmt: skip
            elif stream.pending is not None and now - stream.moved >= limits.send_timeout_s:
                # Our answer waited that long for the peer's window: give it up.
                self._reset(stream, CANCEL)

    # -- input ---------------------------------------------------------------------------------
    def _parse(self) -> bool:
        """Handle the whole frames buffered, up to the turn's share; whether frames are left."""
        buf = self.buf
        pos = 0
        if not self.preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(bytes(buf)):
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return False
            if buf[: len(PREFACE)] != PREFACE:
                raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self.preface = True
            pos = len(PREFACE)
        end = len(buf)
        limits = self.limits
        frames_left = limits.max_frames_per_turn
        bytes_end = pos + limits.max_bytes_per_turn
        more = False
        try:
            while end - pos >= 9 and not self.closed:
                if not frames_left or pos >= bytes_end:
                    more = True
                    break
                hi, lo, kind, flags, sid = HEAD.unpack_from(buf, pos)
                length = (hi << 16) | lo
                if length > MAX_FRAME:
                    raise ProtocolError(FRAME_SIZE_ERROR, f"a {length}-byte frame")
                if end - pos < 9 + length:
                    break
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                frames_left -= 1
                self._frame(kind, flags, sid & 0x7FFFFFFF, payload)
        finally:
            del buf[:pos]
        return more

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self.block is not None and kind != CONTINUATION:
            raise ProtocolError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            self._headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, sid, payload)
        elif kind == SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == PING:
            if len(payload) != 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "PING is 8 bytes")
            if sid != 0:
                raise ProtocolError(PROTOCOL_ERROR, "PING on a stream")
            self._control_frame("PING")  # we never ping: an ACK is as unasked as a PING
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError(FRAME_SIZE_ERROR, "RST_STREAM is 4 bytes")
            if sid == 0:
                raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
            self._count_reset()
            stream = self.streams.get(sid)
            if stream is not None:
                self._dropped(stream)
        elif kind == GOAWAY:
            if sid != 0 or len(payload) < 8:
                raise ProtocolError(PROTOCOL_ERROR, "malformed GOAWAY")
            self.goaway = True  # answer what is in flight; the peer closes
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "PRIORITY is 5 bytes")
            if sid == 0:
                raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
            self._control_frame("PRIORITY")
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        else:  # unknown frame types are ignored (RFC 9113 section 4.1), but not for free
            self._control_frame(f"type {kind}")

    def _dropped(self, stream: Stream) -> None:
        """The peer reset ``stream``: its query is abandoned, but keeps its place among the
        connection's streams until its deadline (at most reset_hold_max_s): resets cannot
        start more queries than the stream limit."""
        reply = stream.reply
        hold = 0.0
        if reply is not None and isinstance(reply, NativeReply):
            hold = min(reply.hold_s(), self.limits.reset_hold_max_s)
        self._cancelled(stream)
        self._end(stream)
        if hold > 0:
            heapq.heappush(self.held, self.server.clock.now() + hold)

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE is 4 bytes")
        inc = U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise ProtocolError(PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self.streams.get(sid)
            if stream is not None:
                stream.window += inc
                if inc == 0 or stream.window > MAX_WINDOW:
                    self._reset(stream, PROTOCOL_ERROR if inc == 0 else FLOW_CONTROL_ERROR)
        if self.blocked:
            self._unblock()

    def _continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self.block is None or sid != self.block_stream:
            raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        limits = self.limits
        self.block_frames += 1
        if self.block_frames > limits.max_continuations:  # empty ones count: the 2024 flood
            raise ProtocolError(
                ENHANCE_YOUR_CALM,
                f"more than {limits.max_continuations} CONTINUATION frames in a header block",
            )
        self.block += payload
        if len(self.block) > limits.max_header_block:
            raise ProtocolError(
                ENHANCE_YOUR_CALM, f"a header block over {limits.max_header_block} bytes"
            )
        if flags & END_HEADERS:
            block, self.block = bytes(self.block), None
            self._header_block(self.block_stream, self.block_flags, block)

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        self._control_frame("SETTINGS")
        for i in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, i)
            if key == 0x4:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta, self.peer_initial = value - self.peer_initial, value
                for stream in self.streams.values():
                    stream.window += delta
            elif key == 0x5:
                if not 16_384 <= value <= 2**24 - 1:
                    raise ProtocolError(PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == 0x2 and value > 1:
                raise ProtocolError(PROTOCOL_ERROR, "ENABLE_PUSH must be 0 or 1")
            elif key == 0x1 and value < self.enc_table:
                # The peer's decoder shrinks its table: our next block starts by saying we
                # use no more (RFC 7541 section 4.2). We only ever shrink it, so the last size
                # we announce is also the smallest.
                self.enc_table = value
                self.table_update = table_size_update(value)
        self._write(frame(SETTINGS, ACK, 0))
        if self.blocked:
            self._unblock()

    def _consume(self, n: int, stream: Stream | None) -> None:
        """Flow control of request bytes on arrival: the connection window is given back only
        as bodies are dispatched or dropped (:meth:`_release`); a stream's, once half used."""
        self.recv_left -= n
        if self.recv_left < 0:  # more than we allowed
            raise ProtocolError(FLOW_CONTROL_ERROR, "the peer overran our window")
        if stream is not None:
            stream.recv += n
            if stream.recv >= WINDOW // 2:
                self._write(frame(WINDOW_UPDATE, 0, stream.id, U32.pack(stream.recv)))
                stream.recv = 0

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ProtocolError(PROTOCOL_ERROR, "padding exceeds the frame")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ProtocolError(PROTOCOL_ERROR, "DATA on stream 0")
        stream = self.streams.get(sid)
        if stream is not None and stream.complete:
            stream = None  # DATA after END_STREAM: dropped
        self._consume(len(payload), stream)
        if stream is None:
            if sid > self.last_id:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            self._credit(len(payload))  # a stream we answered or reset: nothing is kept
            return
        data = self._unpad(flags, payload)
        self._credit(len(payload) - len(data))  # padding is not kept either
        if not data and not flags & END_STREAM:
            self._control_frame("empty DATA")
        server = self.server
        n = len(data)
        if n and server.buffered + n > self.limits.buffered_bytes:
            self._credit(n)
            self._refuse(
                stream, 8,  # RESOURCE_EXHAUSTED
                f"the server holds its limit of {self.limits.buffered_bytes} buffered request "
                "bytes (grpc_max_buffered_bytes): retry later",
            )  # fmt: skip
            return
        stream.body += data
        stream.held += n
        server.buffered += n
        if len(stream.body) > server.max_message_bytes + 5:
            self._refuse(
                stream,
                8,  # RESOURCE_EXHAUSTED, as grpcio answers an oversized message
                f"request message exceeds the limit of {server.max_message_bytes} bytes",
            )
            return
        if flags & END_STREAM:
            self._dispatch(stream)

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS priority fields missing")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(sid, flags, block)
        else:
            self.block = bytearray(block)
            self.block_stream = sid
            self.block_flags = flags
            self.block_frames = 0

    def _decode(self, block: bytes) -> Decoded:
        """``(:path, content-type, metadata)``; the time a large block takes is charged to the
        budget."""
        big = len(block) > CACHE_BLOCK_BYTES  # small blocks cost little and are cached
        clock = self.server.clock
        started = clock.now() if big else 0.0
        try:
            got = self.cache.decode_call(block)
        except HeaderLimitError as e:
            raise ProtocolError(ENHANCE_YOUR_CALM, str(e)) from e
        except hpack.HPACKError as e:
            raise ProtocolError(COMPRESSION_ERROR, f"HPACK: {e}") from e
        if big:
            now = clock.now()
            if not self.decoding.spend(now, now - started):
                limits = self.limits
                raise ProtocolError(
                    ENHANCE_YOUR_CALM,
                    f"header blocks took over {limits.decode_budget_s:g} s to decode in "
                    f"{limits.decode_window_s:g} s",
                )
        return got

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        # Every block is decoded, even one we refuse: the decoder's table must stay in step.
        path, ctype, meta = self._decode(block)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client end its request
            if flags & END_STREAM and not stream.complete:
                self._dispatch(stream)
            return
        if sid % 2 == 0 or sid <= self.last_id:
            if sid <= self.last_id and sid % 2:
                return  # trailers of a stream we already answered
            raise ProtocolError(PROTOCOL_ERROR, f"HEADERS opening stream {sid}")
        self.last_id = sid
        if self.goaway:
            self._write(frame(RST_STREAM, 0, sid, U32.pack(REFUSED_STREAM)))
            return
        if self._running() >= self.limits.max_streams:
            self._count_reset()  # refusals count as resets: opening only to be refused is abuse
            self._write(frame(RST_STREAM, 0, sid, U32.pack(REFUSED_STREAM)))
            return
        self.control.refill()  # a call: the control frames before it were not a flood
        stream = Stream(sid, self.peer_initial, self.server.clock.now())
        stream.path = path
        stream.ctype = ctype
        if meta:
            stream.meta = meta
        self.streams[sid] = stream
        if flags & END_STREAM:
            self._dispatch(stream)

    # -- calls ---------------------------------------------------------------------------------
    def _dispatch(self, stream: Stream) -> None:
        stream.complete = True
        body = stream.body
        stream.body = bytearray()
        self._release(stream)  # what the call holds from here on is the query's, not ours
        if not stream.ctype.startswith(b"application/grpc"):
            self.send_error(stream, 13, "content-type must be application/grpc")
            return
        if len(body) < 5:
            self.send_error(stream, 13, "a gRPC request carries one length-prefixed message")
            return
        compressed, n = PREFIX.unpack_from(body)
        if n != len(body) - 5:
            self.send_error(stream, 13, "a gRPC request carries one length-prefixed message")
            return
        if compressed:
            self.send_error(stream, 12, "compressed messages are not supported")
            return
        path = stream.path
        method = path[len(SERVICE) :] if path.startswith(SERVICE) else b""
        if method == b"ModelInfer":
            self._infer(stream, bytes(body[5:]))
            return
        handler = self.server.methods.get(method)
        if handler is None:
            self.send_error(stream, 12, f"unknown method {path.decode(errors='replace')}")
            return
        request_type, call = handler
        try:
            request = request_type.FromString(bytes(body[5:]))
        except DecodeError:
            self.send_error(stream, 13, "cannot parse the request message")
            return
        task = asyncio.ensure_future(call(request, _CONTEXT))
        self.server.tasks.add(task)
        stream.task = task
        task.add_done_callback(lambda t: self._finish(stream, t))

    def _finish(self, stream: Stream, task: asyncio.Task[Any]) -> None:
        self.server.tasks.discard(task)
        stream.task = None
        if task.cancelled():
            self.send_error(stream, 1, "cancelled")
            return
        exc = task.exception()
        if exc is None:
            self.send_message(stream, task.result().SerializeToString())
        elif isinstance(exc, _Abort):
            self.send_error(stream, exc.code, exc.message)
        else:
            code, message = error_status(answer_failed("a V2 gRPC call", exc))
            self.send_error(stream, int(code.value[0]), message)

    def _infer(self, stream: Stream, message: bytes) -> None:
        try:
            request = pb.ModelInferRequest.FromString(message)
        except DecodeError:
            self.send_error(stream, 13, "cannot parse the ModelInferRequest")
            return
        reply = NativeReply(self, stream)
        try:
            submit_infer(self.server.svc, request, reply, stream.meta)
        except RequestError as err:
            reply.fail(err)
            return
        if not stream.done:
            stream.reply = reply  # waits: a reset of the stream abandons the query

    def _reset(self, stream: Stream, code: int) -> None:
        self._cancelled(stream)  # no answer can go on a stream we reset
        self._end(stream)
        self._write(frame(RST_STREAM, 0, stream.id, U32.pack(code)))

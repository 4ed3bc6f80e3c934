"""A lean gRPC transport for the V2 service: HTTP/2 (h2c, prior knowledge) on the event loop.

grpc.aio hands every call from its completion-queue thread to the loop; that hand-off, not our
code, capped V2 gRPC at a fraction of V2 REST. This transport is an :class:`asyncio.Protocol`
on the frontend's own loop, like the REST server (:mod:`clipper.frontend.http`), and serves
unary calls only, which is all ``inference.GRPCInferenceService`` needs (no streaming method
is served). ``ModelInfer`` runs on callbacks, without a task per call; the other methods run
the grpcio servicer's coroutines (:class:`~clipper.frontend.grpc.server.Servicer`).

HTTP/2 is what a gRPC client needs: SETTINGS, PING, WINDOW_UPDATE both ways, RST_STREAM,
GOAWAY, HEADERS + CONTINUATION, DATA with padding; a protocol error is answered by GOAWAY and
the connection closed. Request header blocks are decoded by :class:`hpack.Decoder`, cached by
(table generation, bytes): a client repeats the same blocks, so after the first calls no
header is decoded. Responses use constant header blocks that never touch the peer's dynamic
table. See docs/v2-protocol.md.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from typing import TYPE_CHECKING, Any, NoReturn, cast

import hpack
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from clipper.clock import Clock, MonotonicClock, TimerHandle, sleep
from clipper.errors import ClipperError, RequestError
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc.server import (
    InferReply,
    Servicer,
    error_status,
    submit_infer,
)
from clipper.logs import PROTOCOL_LOG
from clipper.query.prediction import answer_failed

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from clipper.query.runtime import QueryServices

__all__ = ["NativeGrpcServer", "header_block"]

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
# Error codes.
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

MAX_FRAME = 16_384  # what we accept: the protocol's default, so any peer respects it
WINDOW = 16 * 2**20  # our receive windows: a request of up to 16 MiB never waits for us
MAX_STREAMS = 1024
MAX_HEADER_BLOCK = 64 * 1024
MAX_WINDOW = 2**31 - 1
_CACHE_ENTRIES = 512  # decoded header blocks per connection

_HEAD = struct.Struct(">BHBBI")  # 24-bit length as a byte and a short, type, flags, stream id
_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")
_PREFIX = struct.Struct(">BI")  # gRPC message: compressed flag, length
_SERVICE = b"/inference.GRPCInferenceService/"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream) + payload


def _int(value: int, prefix: int, first: int) -> bytes:
    """An HPACK integer with a ``prefix``-bit prefix, ``first`` the bits above it."""
    top = (1 << prefix) - 1
    if value < top:
        return bytes([first | value])
    out = bytearray([first | top])
    value -= top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of literals without indexing (new names, no Huffman): constant, and it
    leaves the peer's dynamic table alone, so responses need no encoder state."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)  # static table entry 8
            continue
        out += b"\x00" + _int(len(name), 7, 0) + name + _int(len(value), 7, 0) + value
    return bytes(out)


_OK_HEAD = header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
_OK_TRAILERS = header_block([(b"grpc-status", b"0")])


def _percent(message: str) -> bytes:
    """grpc-message's percent-encoding: printable ASCII but '%' stays as it is."""
    raw = message.encode()[:4096]  # an error block must fit one frame
    return b"".join(bytes([c]) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)


def error_block(code: int, message: str) -> bytes:
    """A trailers-only response's header block: an error and no message."""
    return _OK_HEAD + header_block(
        [(b"grpc-status", str(code).encode()), (b"grpc-message", _percent(message))]
    )


class ProtocolError(ClipperError):
    """A connection error: answered with GOAWAY ``code`` and a close."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


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


class HeaderCache:
    """Decoded request header blocks by (table generation, bytes). A block is cached only if
    decoding it left the dynamic table as it was; a block that changed it bumps the
    generation, so no cached block can be replayed against a table it was not decoded with."""

    __slots__ = ("_cache", "decoder", "generation")

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK)
        self.generation = 0
        self._cache: dict[tuple[int, bytes], tuple[bytes, bytes]] = {}

    def _state(self) -> tuple[object, int, int, int]:
        table = self.decoder.header_table
        entries = table.dynamic_entries
        # The newest entry itself (held, so its id cannot be reused): any insert replaces it.
        return (entries[0] if entries else None, len(entries), table._current_size, table.maxsize)

    def decode(self, block: bytes) -> tuple[bytes, bytes]:
        """``(:path, content-type)`` of a header block; hpack's errors propagate."""
        key = (self.generation, block)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        before = self._state()
        headers = self.decoder.decode(block, raw=True)
        after = self._state()
        path = ctype = b""
        for name, value in headers:
            if name == b":path":
                path = bytes(value)
            elif name == b"content-type":
                ctype = bytes(value)
        got = (path, ctype)
        if before[0] is after[0] and before[1:] == after[1:]:
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[key] = got
        else:
            self.generation += 1
        return got


class _Stream:
    __slots__ = ("body", "ctype", "done", "id", "path", "pending", "recv", "reply", "window")

    def __init__(self, sid: int, window: int) -> None:
        self.id = sid
        self.window = window  # what we may still send on it
        self.recv = 0  # request bytes consumed since our last WINDOW_UPDATE for it
        self.body = bytearray()
        self.path = b""
        self.ctype = b""
        self.pending: deque[bytes] | None = None  # DATA payloads waiting for window, + trailers
        self.done = False  # answered or reset: a late answer is dropped
        self.reply: InferReply | None = None  # a ModelInfer waiting for its answer


class _NativeReply(InferReply):
    __slots__ = ("conn", "stream")

    def __init__(self, conn: _Connection, stream: _Stream) -> None:
        super().__init__()
        self.conn = conn
        self.stream = stream

    def deliver(self, response: Any) -> None:
        self.conn.send_message(self.stream, response.SerializeToString())

    def fail(self, err: RequestError) -> None:
        code, message = error_status(err)
        self.conn.send_error(self.stream, int(code.value[0]), message)


class _Connection(asyncio.Protocol):
    def __init__(self, server: NativeGrpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.buf = bytearray()
        self.preface = False
        self.streams: dict[int, _Stream] = {}
        self.last_id = 0
        self.cache = HeaderCache()
        self.send_window = 65_535  # the peer's connection window
        self.peer_initial = 65_535  # the peer's initial stream window
        self.peer_max_frame = 16_384
        self.recv = 0  # request bytes consumed since our last connection WINDOW_UPDATE
        self.blocked: dict[int, _Stream] = {}  # streams with DATA waiting for window
        self.block: bytearray | None = None  # a header block awaiting CONTINUATION
        self.block_stream = 0
        self.block_flags = 0
        self.out: list[bytes] | None = None  # writes gathered while a read is parsed
        self.closed = False
        self.goaway = False
        self.opened = self.last_active = server.clock.now()

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
                    _U32.pack(0)
                    + _U32.pack(ENHANCE_YOUR_CALM)
                    + f"the server holds its limit of {server.max_connections} connections "
                    "(max_connections)".encode(),
                )
            )
            self.transport.close()
            return
        server.connections.add(self)
        settings = b"".join(
            _SETTING.pack(k, v)
            for k, v in ((0x3, MAX_STREAMS), (0x4, WINDOW), (0x6, MAX_HEADER_BLOCK))
        )
        self.transport.write(
            frame(SETTINGS, 0, 0, settings) + frame(WINDOW_UPDATE, 0, 0, _U32.pack(WINDOW - 65_535))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        streams = list(self.streams.values())
        self.streams.clear()
        self.blocked.clear()
        for s in streams:
            s.done = True
            self._cancelled(s)

    def _cancelled(self, stream: _Stream) -> None:
        """The client reset ``stream`` or its connection went before the answer: the query
        waiting for it is abandoned (its inputs leave the queue)."""
        reply, stream.reply = stream.reply, None
        if reply is not None:
            try:
                reply.client_gone()
            except Exception:  # one broken query must not keep the connection's others
                PROTOCOL_LOG.exception(
                    log, self.server.clock, "abandoning a cancelled ModelInfer failed"
                )

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_active = self.server.clock.now()
        self.buf += data
        self.out = []
        try:
            self._parse()
        except ProtocolError as e:
            self._goaway(e.code, str(e))
        except Exception as e:  # a bug: the connection goes, the server stays
            PROTOCOL_LOG.exception(log, self.server.clock, "gRPC connection failed")
            self._goaway(INTERNAL_ERROR, f"internal error: {type(e).__name__}")
        out, self.out = self.out, None
        if out and not self.closed:
            self.transport.write(b"".join(out))

    def pause_writing(self) -> None:
        # A peer that does not read its answers stops being read: bounded buffers.
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.closed:
            self.transport.resume_reading()

    # -- output --------------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        if self.out is not None:
            self.out.append(data)
        elif not self.closed:
            self.transport.write(data)

    def _goaway(self, code: int, why: str) -> None:
        if self.closed:
            return
        if code != NO_ERROR:
            PROTOCOL_LOG.info(log, self.server.clock, "gRPC connection error %d: %s", code, why)
        out = b"".join(self.out or ()) + frame(
            GOAWAY, 0, 0, _U32.pack(self.last_id) + _U32.pack(code) + why.encode()[:256]
        )
        self.out = None
        self.transport.write(out)
        self.transport.close()
        self.closed = True

    def _end(self, stream: _Stream) -> None:
        stream.done = True
        stream.reply = None
        self.streams.pop(stream.id, None)
        self.blocked.pop(stream.id, None)

    def send_error(self, stream: _Stream, code: int, message: str) -> None:
        """A trailers-only response."""
        if stream.done or self.closed:
            return
        self._end(stream)
        self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, error_block(code, message)))

    def send_message(self, stream: _Stream, message: bytes) -> None:
        """HEADERS, the message in DATA (as far as the peer's windows allow), trailers."""
        if stream.done or self.closed:
            return
        sid = stream.id
        data = _PREFIX.pack(0, len(message)) + message
        head = frame(HEADERS, END_HEADERS, sid, _OK_HEAD)
        trailers = frame(HEADERS, END_HEADERS | END_STREAM, sid, _OK_TRAILERS)
        n = len(data)
        if n <= self.send_window and n <= stream.window and n <= self.peer_max_frame:
            self.send_window -= n
            self._end(stream)
            self._write(b"".join((head, frame(DATA, 0, sid, data), trailers)))
            return
        self._write(head)
        stream.pending = deque([data])
        self._flush(stream, trailers)

    def _flush(self, stream: _Stream, trailers: bytes | None = None) -> None:
        """Send what the windows allow of ``stream``'s pending DATA; the trailers when done."""
        pending = stream.pending
        assert pending is not None
        if trailers is not None:
            pending.append(trailers)
        out: list[bytes] = []
        while len(pending) > 1:
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
        if len(pending) == 1:  # only the trailers are left
            out.append(pending.popleft())
            self._end(stream)
        else:
            self.blocked[stream.id] = stream
        if out:
            self._write(b"".join(out))

    def _unblock(self) -> None:
        for stream in list(self.blocked.values()):
            if self.send_window <= 0:
                break
            self._flush(stream)

    # -- input ---------------------------------------------------------------------------------
    def _parse(self) -> None:
        buf = self.buf
        pos = 0
        if not self.preface:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(bytes(buf)):
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buf[: len(PREFACE)] != PREFACE:
                raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self.preface = True
            pos = len(PREFACE)
        end = len(buf)
        while end - pos >= 9 and not self.closed:
            hi, lo, kind, flags, sid = _HEAD.unpack_from(buf, pos)
            length = (hi << 16) | lo
            if length > MAX_FRAME:
                raise ProtocolError(FRAME_SIZE_ERROR, f"a {length}-byte frame")
            if end - pos < 9 + length:
                break
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(kind, flags, sid & 0x7FFFFFFF, payload)
        del buf[:pos]

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self.block is not None and kind != CONTINUATION:
            raise ProtocolError(PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._data(flags, sid, payload)
        elif kind == HEADERS:
            self._headers(flags, sid, payload)
        elif kind == CONTINUATION:
            if self.block is None or sid != self.block_stream:
                raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without HEADERS")
            self.block += payload
            if len(self.block) > MAX_HEADER_BLOCK:
                raise ProtocolError(PROTOCOL_ERROR, "header block too large")
            if flags & END_HEADERS:
                block, self.block = bytes(self.block), None
                self._header_block(self.block_stream, self.block_flags, block)
        elif kind == SETTINGS:
            self._settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE is 4 bytes")
            inc = _U32.unpack(payload)[0] & 0x7FFFFFFF
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
        elif kind == PING:
            if len(payload) != 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "PING is 8 bytes")
            if sid != 0:
                raise ProtocolError(PROTOCOL_ERROR, "PING on a stream")
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise ProtocolError(FRAME_SIZE_ERROR, "RST_STREAM is 4 bytes")
            if sid == 0:
                raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
            stream = self.streams.get(sid)
            if stream is not None:
                self._cancelled(stream)
                self._end(stream)
        elif kind == GOAWAY:
            if sid != 0 or len(payload) < 8:
                raise ProtocolError(PROTOCOL_ERROR, "malformed GOAWAY")
            self.goaway = True  # answer what is in flight; the peer closes
        elif kind == PRIORITY:
            if len(payload) != 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "PRIORITY is 5 bytes")
            if sid == 0:
                raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # Unknown frame types are ignored (RFC 9113 section 4.1).

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        for i in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, i)
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
        self._write(frame(SETTINGS, ACK, 0))
        if self.blocked:
            self._unblock()

    def _consume(self, n: int, stream: _Stream | None) -> None:
        """Flow control of request bytes: refill both windows once half is used."""
        self.recv += n
        if self.recv > WINDOW:  # more than we allowed
            raise ProtocolError(FLOW_CONTROL_ERROR, "the peer overran our window")
        if self.recv >= WINDOW // 2:
            self._write(frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv)))
            self.recv = 0
        if stream is not None:
            stream.recv += n
            if stream.recv >= WINDOW // 2:
                self._write(frame(WINDOW_UPDATE, 0, stream.id, _U32.pack(stream.recv)))
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
        self._consume(len(payload), stream)
        if stream is None:
            if sid > self.last_id:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we answered or reset: its late data is dropped
        stream.body += self._unpad(flags, payload)
        if len(stream.body) > self.server.max_message_bytes + 5:
            self.send_error(
                stream,
                8,  # RESOURCE_EXHAUSTED, as grpcio answers an oversized message
                f"request message exceeds the limit of {self.server.max_message_bytes} bytes",
            )
            self._write(frame(RST_STREAM, 0, sid, _U32.pack(NO_ERROR)))
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

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        # Every block is decoded, even one we refuse: the decoder's table must stay in step.
        try:
            path, ctype = self.cache.decode(block)
        except hpack.HPACKError as e:
            raise ProtocolError(COMPRESSION_ERROR, f"HPACK: {e}") from e
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client end its request
            if flags & END_STREAM:
                self._dispatch(stream)
            return
        if sid % 2 == 0 or sid <= self.last_id:
            if sid <= self.last_id and sid % 2:
                return  # trailers of a stream we already answered
            raise ProtocolError(PROTOCOL_ERROR, f"HEADERS opening stream {sid}")
        self.last_id = sid
        if self.goaway or len(self.streams) >= MAX_STREAMS:
            self._write(frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        stream = _Stream(sid, self.peer_initial)
        stream.path = path
        stream.ctype = ctype
        self.streams[sid] = stream
        if flags & END_STREAM:
            self._dispatch(stream)

    # -- calls ---------------------------------------------------------------------------------
    def _dispatch(self, stream: _Stream) -> None:
        if not stream.ctype.startswith(b"application/grpc"):
            self.send_error(stream, 13, "content-type must be application/grpc")
            return
        body = stream.body
        stream.body = bytearray()
        if len(body) < 5:
            self.send_error(stream, 13, "a gRPC request carries one length-prefixed message")
            return
        compressed, n = _PREFIX.unpack_from(body)
        if n != len(body) - 5:
            self.send_error(stream, 13, "a gRPC request carries one length-prefixed message")
            return
        if compressed:
            self.send_error(stream, 12, "compressed messages are not supported")
            return
        path = stream.path
        method = path[len(_SERVICE) :] if path.startswith(_SERVICE) else b""
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
        task.add_done_callback(lambda t: self._finish(stream, t))

    def _finish(self, stream: _Stream, task: asyncio.Task[Any]) -> None:
        self.server.tasks.discard(task)
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

    def _infer(self, stream: _Stream, message: bytes) -> None:
        try:
            request = pb.ModelInferRequest.FromString(message)
        except DecodeError:
            self.send_error(stream, 13, "cannot parse the ModelInferRequest")
            return
        reply = _NativeReply(self, stream)
        try:
            submit_infer(self.server.svc, request, reply)
        except RequestError as err:
            reply.fail(err)
            return
        if not stream.done:
            stream.reply = reply  # waits: a reset of the stream abandons the query

    def _reset(self, stream: _Stream, code: int) -> None:
        self._cancelled(stream)  # no answer can go on a stream we reset
        self._end(stream)
        self._write(frame(RST_STREAM, 0, stream.id, _U32.pack(code)))


class NativeGrpcServer:
    """The V2 gRPC service on the event loop, over a frontend's query services, on
    ``host:port`` (port 0 picks a free port; :attr:`port` is the bound one after :meth:`start`).
    ``max_message_bytes`` bounds a request message (the frontend's max_body_bytes)."""

    def __init__(
        self,
        svc: QueryServices,
        *,
        host: str,
        port: int,
        max_message_bytes: int = 10 * 2**20,
        clock: Clock | None = None,
        max_connections: int = 10_000,
        preface_timeout_s: float = 10.0,
        idle_timeout_s: float = 300.0,
    ) -> None:
        self.svc = svc
        self.host = host
        self.port = port
        self.max_message_bytes = max_message_bytes
        self.clock: Clock = clock or MonotonicClock()
        # Connection hygiene, as on the HTTP ports: a connection limit (refused with GOAWAY
        # ENHANCE_YOUR_CALM), a deadline for the connection preface (a silent or slow client
        # is closed) and an idle limit (no stream open for that long: GOAWAY, then close;
        # gRPC clients reconnect by themselves).
        self.max_connections = max_connections
        self.preface_timeout_s = preface_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.refused = 0
        self._sweeper: TimerHandle | None = None
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Future[Any]] = set()
        self._server: asyncio.Server | None = None
        self.draining = False  # begin_drain(): no new connections or calls, those open answered
        servicer = Servicer(svc)
        self.methods: dict[bytes, tuple[Any, Callable[[Any, Any], Coroutine[Any, Any, Any]]]] = {
            b"ServerLive": (pb.ServerLiveRequest, servicer.ServerLive),
            b"ServerReady": (pb.ServerReadyRequest, servicer.ServerReady),
            b"ModelReady": (pb.ModelReadyRequest, servicer.ModelReady),
            b"ServerMetadata": (pb.ServerMetadataRequest, servicer.ServerMetadata),
            b"ModelMetadata": (pb.ModelMetadataRequest, servicer.ModelMetadata),
            b"ModelConfig": (pb.ModelConfigRequest, servicer.ModelConfig),
        }

    async def start(self) -> None:
        """Bind and serve on the running event loop."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), self.host, self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._arm_sweep()

    def _arm_sweep(self) -> None:
        # One timer for all connections, not one per connection: the hot path stays free of
        # timer handling, and a sweep costs O(connections) a few times per timeout.
        period = max(min(self.preface_timeout_s, self.idle_timeout_s) / 4, 0.01)
        self._sweeper = self.clock.call_later(period, self._sweep)

    def _sweep(self) -> None:
        now = self.clock.now()
        for conn in list(self.connections):
            if conn.closed:
                continue
            if not conn.preface and now - conn.opened >= self.preface_timeout_s:
                conn.closed = True
                conn.transport.close()  # never spoke HTTP/2: nothing to say to it
            elif not conn.streams and now - conn.last_active >= self.idle_timeout_s:
                conn._goaway(NO_ERROR, "idle")
        self._arm_sweep()

    def begin_drain(self) -> None:
        """Stop accepting connections (the listening socket closes) and send every connection
        a GOAWAY naming the last call it opened: calls already opened are answered, new ones
        are refused (REFUSED_STREAM: a client retries those elsewhere)."""
        server = self._server
        if server is None or self.draining:
            return
        self.draining = True
        server.close()
        for conn in list(self.connections):
            conn.goaway = True
            if not conn.closed:
                conn.transport.write(
                    frame(GOAWAY, 0, 0, _U32.pack(conn.last_id) + _U32.pack(NO_ERROR))
                )

    def owed(self) -> int:
        """Calls opened and not answered yet, over all connections."""
        return sum(len(c.streams) for c in self.connections if not c.closed)

    def abandon(self, cause: str) -> int:
        """Answer every call still open UNAVAILABLE with ``cause`` (a drain's time is up);
        how many were answered so."""
        n = 0
        for conn in list(self.connections):
            for stream in list(conn.streams.values()):
                n += 1
                conn.send_error(stream, 14, cause)  # UNAVAILABLE: the client may retry
        return n

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: GOAWAY to every connection (:meth:`begin_drain`), ``grace`` seconds
        for calls in flight, then UNAVAILABLE for those still open, and close."""
        if self._server is None:
            return
        self.begin_drain()
        server, self._server = self._server, None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        deadline = self.clock.now() + (grace or 0.0)
        # Polled: shutdown only, and a drain event per connection would cost the hot path.
        while self.owed() and self.clock.now() < deadline:
            await sleep(self.clock, 0.01)
        self.abandon("the server stopped before this call was answered: retry it")
        for conn in list(self.connections):
            conn.closed = True
            conn.transport.close()
        for task in list(self.tasks):
            task.cancel()
        await server.wait_closed()

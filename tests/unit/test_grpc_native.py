"""The native gRPC transport's HTTP/2 and HPACK handling, driven frame by frame (no sockets).

The client side is ``h2`` (an independent HTTP/2 implementation), so what the server writes is
checked by someone else's parser.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any, cast

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from clipper.clock import FakeClock
from clipper.frontend.grpc import h2_connection, native
from clipper.frontend.grpc.h2_limits import GOAWAY_LINGER_S, H2Limits
from clipper.frontend.grpc.hpack_blocks import (
    CACHE_BLOCK_BYTES,
    CACHE_BYTES,
    MAX_HEADERS,
    count_headers,
)
from clipper.frontend.grpc.native import (
    COMPRESSION_ERROR,
    FRAME_SIZE_ERROR,
    PREFACE,
    PROTOCOL_ERROR,
    HeaderCache,
    NativeGrpcServer,
    error_block,
    frame,
    header_block,
)

GRPC_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ServerLive"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


class _Transport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.data += data

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False  # so a GOAWAY closes at once

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused = True

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False

    def take(self) -> bytes:
        out = bytes(self.data)
        self.data.clear()
        return out


def _connection(**kw: Any) -> tuple[Any, _Transport]:
    kw.setdefault("max_message_bytes", 1024)
    server = NativeGrpcServer(cast(Any, None), host="127.0.0.1", port=0, **kw)
    conn = h2_connection.Connection(server)
    transport = _Transport()
    conn.connection_made(cast(Any, transport))
    return conn, transport


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out = []
    while data:
        hi, lo, kind, flags, sid = struct.unpack_from(">BHBBI", data)
        n = (hi << 16) | lo
        out.append((kind, flags, sid, data[9 : 9 + n]))
        data = data[9 + n :]
    return out


def _goaway_code(transport: _Transport) -> int:
    goaways = [p for kind, _, _, p in _frames(transport.take()) if kind == native.GOAWAY]
    assert goaways, "no GOAWAY"
    assert transport.closed
    return int(struct.unpack(">I", goaways[-1][4:8])[0])


_PING = frame(native.PING, 0, 0, b"x" * 8)


def _settings_frame() -> bytes:
    return frame(native.SETTINGS, 0, 0)


# -- HPACK ---------------------------------------------------------------------------------------
def test_response_header_blocks_decode_with_hpack() -> None:
    decoder = hpack.Decoder()

    def d_decode(block: bytes) -> list[tuple[str, str]]:
        return [(str(n), str(v)) for n, v in decoder.decode(block)]

    block = header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
    assert d_decode(block) == [(":status", "200"), ("content-type", "application/grpc")]
    long = b"x" * 300  # a multi-byte HPACK length
    assert d_decode(header_block([(b"grpc-message", long)])) == [("grpc-message", long.decode())]
    got = d_decode(error_block(5, "unknown model 'ä' 100%\n"))
    assert got[2:] == [("grpc-status", "5"), ("grpc-message", "unknown model '%C3%A4' 100%25%0A")]
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing was indexed


def test_the_header_cache_serves_repeated_blocks() -> None:
    cache = HeaderCache()
    enc = hpack.Encoder()
    first = enc.encode(GRPC_HEADERS)  # inserts into the dynamic table
    again = enc.encode(GRPC_HEADERS)  # all indexed: changes nothing
    path = b"/inference.GRPCInferenceService/ServerLive"
    assert cache.decode(first) == (path, b"application/grpc")
    assert cache.decode(again) == (path, b"application/grpc")
    calls = 0
    decode = cache.decoder.decode

    def counting(block: bytes, raw: bool = False) -> Any:
        nonlocal calls
        calls += 1
        return decode(block, raw=raw)

    cache.decoder.decode = counting  # type: ignore[method-assign,assignment]
    for _ in range(5):
        assert cache.decode(again) == (path, b"application/grpc")
    assert calls == 0


def test_a_block_that_inserts_is_never_served_from_the_cache() -> None:
    cache = HeaderCache()
    enc = hpack.Encoder()
    inserting = enc.encode([(":path", "/a"), ("content-type", "application/grpc")])
    cache.decode(inserting)
    generation = cache.generation
    entries = len(cache.decoder.header_table.dynamic_entries)
    # The same bytes again: decoded again (they insert again), never replayed.
    cache.decode(inserting)
    assert len(cache.decoder.header_table.dynamic_entries) == 2 * entries
    assert cache.generation > generation
    # A block that references the newest entries means something else after an insert.
    d = hpack.Decoder()
    d.decode(inserting)
    d.decode(inserting)
    indexed = bytes([0x80 | 62])  # dynamic entry 62: the newest
    assert cache.decode(indexed)[1] == b"application/grpc"
    cache.decode(enc.encode([("content-type", "application/grpc+proto")]))
    assert cache.decode(indexed)[1] == b"application/grpc+proto"


# -- frames --------------------------------------------------------------------------------------
def test_our_settings_go_first() -> None:
    _, transport = _connection()
    kinds = [kind for kind, *_ in _frames(transport.take())]
    assert kinds == [native.SETTINGS, native.WINDOW_UPDATE]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"GET / HTTP/1.1\r\n\r\n" + b"x" * 20, PROTOCOL_ERROR),
        (PREFACE + struct.pack(">BHBBI", 1, 0, native.DATA, 0, 1), FRAME_SIZE_ERROR),
        (PREFACE + frame(native.SETTINGS, 0, 0, b"\x00" * 5), FRAME_SIZE_ERROR),
        (PREFACE + frame(native.SETTINGS, 0, 1), PROTOCOL_ERROR),
        (PREFACE + frame(native.SETTINGS, 1, 0, b"\x00" * 6), FRAME_SIZE_ERROR),
        (PREFACE + frame(native.PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
        (PREFACE + frame(native.WINDOW_UPDATE, 0, 0, b"\x00" * 4), PROTOCOL_ERROR),
        (PREFACE + frame(native.CONTINUATION, native.END_HEADERS, 1, b""), PROTOCOL_ERROR),
        (PREFACE + frame(native.DATA, 0, 0, b"x"), PROTOCOL_ERROR),
        (PREFACE + frame(native.DATA, 0, 3, b"x"), PROTOCOL_ERROR),
        (PREFACE + frame(native.DATA, native.PADDED, 1, b"\x05ab"), PROTOCOL_ERROR),
        (PREFACE + frame(native.HEADERS, native.END_HEADERS, 2, b"\x88"), PROTOCOL_ERROR),
        (PREFACE + frame(native.HEADERS, native.END_HEADERS, 1, b"\xff" * 3), COMPRESSION_ERROR),
        (PREFACE + frame(native.HEADERS, 0, 1, b"\x88") + _PING, PROTOCOL_ERROR),
        (PREFACE + frame(native.PUSH_PROMISE, 0, 1, b"\x00" * 4), PROTOCOL_ERROR),
        (PREFACE + frame(native.RST_STREAM, 0, 0, b"\x00" * 4), PROTOCOL_ERROR),
        (PREFACE + frame(native.PRIORITY, 0, 1, b"\x00" * 4), FRAME_SIZE_ERROR),
    ],
)  # fmt: skip
def test_malformed_frames_get_goaway_not_a_crash(data: bytes, code: int) -> None:
    conn, transport = _connection()
    transport.take()
    for i in range(0, len(data), 7):  # byte-split reads: the parser waits for whole frames
        conn.data_received(data[i : i + 7])
    assert _goaway_code(transport) == code
    conn.data_received(b"more")  # after the close: ignored
    assert not transport.data


def test_an_endless_header_block_is_cut_off() -> None:
    conn, transport = _connection()
    transport.take()
    conn.data_received(PREFACE + _settings_frame() + frame(native.HEADERS, 0, 1, b"\x88"))
    chunk = frame(native.CONTINUATION, 0, 1, b"\x00" * 16_000)
    for _ in range(5):
        conn.data_received(chunk)
    assert _goaway_code(transport) == native.ENHANCE_YOUR_CALM


def test_ping_is_acked_and_priority_ignored() -> None:
    conn, transport = _connection()
    transport.take()
    conn.data_received(
        PREFACE + _settings_frame() + frame(native.PRIORITY, 0, 1, b"\x00" * 5)
        + frame(native.PING, 0, 0, b"12345678")
    )  # fmt: skip
    got = _frames(transport.take())
    assert (native.SETTINGS, native.ACK, 0, b"") in got
    assert (native.PING, native.ACK, 0, b"12345678") in got
    assert not transport.closed


def _client(window: int = 65_535) -> h2.connection.H2Connection:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
    )
    client.initiate_connection()
    return client


def _exchange(conn: Any, transport: _Transport, client: h2.connection.H2Connection) -> list[Any]:
    """Client -> server -> client: the events the client sees."""
    conn.data_received(client.data_to_send())
    return list(client.receive_data(transport.take()))


def test_a_response_larger_than_the_window_waits_for_window_update() -> None:
    conn, transport = _connection()
    client = _client(window=10)
    client.send_headers(1, GRPC_HEADERS)  # the request is not finished: not dispatched
    _exchange(conn, transport, client)
    message = bytes(range(100))
    conn.send_message(conn.streams[1], message)
    events = list(client.receive_data(transport.take()))
    sent = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert len(sent) == 10  # the stream's window, no more
    assert not any(isinstance(e, h2.events.StreamEnded) for e in events)
    # The client consumes; its WINDOW_UPDATEs let the rest and the trailers through.
    got = bytearray(sent)
    for _ in range(20):
        client.acknowledge_received_data(len(sent), 1)
        events = _exchange(conn, transport, client)
        data = [e.data for e in events if isinstance(e, h2.events.DataReceived)]
        sent = b"".join(data)
        got += sent
        if any(isinstance(e, h2.events.StreamEnded) for e in events):
            break
    assert bytes(got) == struct.pack(">BI", 0, 100) + message
    trailers = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
    assert trailers and (b"grpc-status", b"0") in trailers[0].headers
    assert 1 not in conn.streams


def test_a_reset_stream_is_forgotten_and_its_answer_dropped() -> None:
    conn, transport = _connection()
    client = _client()
    client.send_headers(1, GRPC_HEADERS)
    _exchange(conn, transport, client)
    stream = conn.streams[1]
    client.reset_stream(1)
    _exchange(conn, transport, client)
    assert 1 not in conn.streams
    conn.send_message(stream, b"late")
    assert not transport.data


def test_compressed_and_oversized_messages_are_refused() -> None:
    conn, transport = _connection()
    client = _client()
    client.send_headers(1, GRPC_HEADERS)
    client.send_data(1, struct.pack(">BI", 1, 3) + b"abc", end_stream=True)
    client.send_headers(3, GRPC_HEADERS)
    client.send_data(3, struct.pack(">BI", 0, 2000) + b"x" * 2000, end_stream=True)
    events = _exchange(conn, transport, client)
    statuses = {
        e.stream_id: dict(e.headers)[b"grpc-status"]
        for e in events
        if isinstance(e, h2.events.ResponseReceived)
    }
    assert statuses == {1: b"12", 3: b"8"}  # UNIMPLEMENTED, RESOURCE_EXHAUSTED
    assert not transport.closed


# -- stopping --------------------------------------------------------------------------------------


class _Listener:
    """Stands in for the asyncio server that start() binds: stop() closes it."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False  # so a GOAWAY closes at once

    async def wait_closed(self) -> None:
        pass


def _serving(clock: FakeClock) -> tuple[NativeGrpcServer, Any, _Transport]:
    """A server as start() leaves it (no socket), with one connection and a call in flight."""
    server = NativeGrpcServer(cast(Any, None), host="127.0.0.1", port=0, clock=clock)
    server._server = cast(Any, _Listener())
    conn = h2_connection.Connection(server)
    transport = _Transport()
    conn.connection_made(cast(Any, transport))
    client = _client()
    client.send_headers(1, GRPC_HEADERS)  # its request not finished: the call stays open
    _exchange(conn, transport, client)
    assert conn.streams
    return server, conn, transport


async def _turns(n: int = 10) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_stop_gives_calls_in_flight_the_grace_on_the_clock_then_closes() -> None:
    clock = FakeClock(start=0.0)
    server, conn, transport = _serving(clock)
    stopping = asyncio.create_task(server.stop(grace=1.0))
    await _turns()
    assert conn.goaway and native.GOAWAY in {k for k, _, _, _ in _frames(transport.take())}
    clock.advance(0.75)
    await _turns()
    assert not stopping.done() and not transport.closed  # the call still has its grace
    clock.advance(0.25)  # exactly the grace
    await _turns()
    assert stopping.done() and transport.closed
    await stopping


async def test_stop_returns_at_the_next_poll_once_the_calls_are_done() -> None:
    clock = FakeClock(start=0.0)
    server, conn, transport = _serving(clock)
    stopping = asyncio.create_task(server.stop(grace=10.0))
    await _turns()
    clock.advance(0.5)
    await _turns()
    assert not stopping.done()
    conn.streams.clear()  # the call answered
    clock.advance(0.01)  # one poll later, long before the grace
    await _turns()
    assert stopping.done() and transport.closed
    await stopping


async def test_a_drain_refuses_new_calls_and_answers_open_ones() -> None:
    server = NativeGrpcServer(cast(Any, None), host="127.0.0.1", port=0, clock=FakeClock())
    server._server = cast(Any, _Listener())
    conn = h2_connection.Connection(server)
    transport = _Transport()
    conn.connection_made(cast(Any, transport))
    client = _client()
    client.send_headers(1, GRPC_HEADERS)  # a call opened before the drain, not finished
    _exchange(conn, transport, client)
    assert server.owed() == 1
    server.begin_drain()
    assert server.draining and cast(_Listener, server._server).closed
    events = list(client.receive_data(transport.take()))
    [goaway] = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
    assert goaway.error_code == 0 and goaway.last_stream_id == 1  # stream 1 is still served
    # A call opened after the GOAWAY is refused (the client retries it elsewhere).
    block = header_block([(b":method", b"POST"), (b":path", b"/x"),
                          (b"content-type", b"application/grpc")])  # fmt: skip
    conn.data_received(frame(native.HEADERS, native.END_HEADERS | native.END_STREAM, 3, block))
    [(kind, _, sid, payload)] = _frames(transport.take())
    assert (kind, sid, struct.unpack(">I", payload)[0]) == (native.RST_STREAM, 3, 7)
    # The open call is answered as usual, and then nothing is owed.
    conn.send_message(conn.streams[1], b"")
    assert server.owed() == 0 and server.abandon("the drain ended") == 0
    assert not transport.closed  # the connection closes at stop(), after what it owes


async def test_abandon_answers_an_open_call_unavailable() -> None:
    clock = FakeClock(start=0.0)
    server, _conn, transport = _serving(clock)
    server.begin_drain()
    transport.take()
    assert server.abandon("the drain ended: retry it") == 1
    assert server.owed() == 0
    frames = _frames(transport.take())
    [(kind, flags, sid, block)] = frames
    assert (kind, sid) == (native.HEADERS, 1) and flags & native.END_STREAM
    headers = dict(hpack.Decoder().decode(block, raw=True))
    assert headers[b"grpc-status"] == b"14"
    assert headers[b"grpc-message"] == b"the drain ended: retry it"


# -- hostile peers: the budgets of h2_limits, on a fake clock -------------------------------------
_UNKNOWN = [(k, v) if k != ":path" else (k, "/nope/Nope") for k, v in GRPC_HEADERS]


def _request_block() -> bytes:
    """A request header block that changes no table: the same bytes decode the same."""
    return header_block([(n.encode(), v.encode()) for n, v in GRPC_HEADERS])


def _open(sid: int, end: bool = False) -> bytes:
    flags = native.END_HEADERS | (native.END_STREAM if end else 0)
    return frame(native.HEADERS, flags, sid, _request_block())


def _rst(sid: int) -> bytes:
    return frame(native.RST_STREAM, 0, sid, struct.pack(">I", native.CANCEL))


def _kinds(data: bytes) -> list[int]:
    return [kind for kind, *_ in _frames(data)]


def test_rapid_reset_spends_the_reset_budget_then_goaway() -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock, limits=H2Limits(reset_budget=10))
    conn.data_received(PREFACE + _settings_frame())
    transport.take()
    sid = 1
    for _ in range(10):  # within the budget: nothing happens to the connection
        conn.data_received(_open(sid) + _rst(sid))
        sid += 2
    assert not transport.closed and not conn.streams
    clock.advance(10.0)  # a new window: the budget is whole again
    for _ in range(10):
        conn.data_received(_open(sid) + _rst(sid))
        sid += 2
    assert not transport.closed
    conn.data_received(_open(sid) + _rst(sid))  # the 11th in this window
    assert _goaway_code(transport) == native.ENHANCE_YOUR_CALM


def test_a_reset_calls_query_keeps_its_stream_slot_until_its_deadline() -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock, limits=H2Limits(max_streams=1))
    conn.data_received(PREFACE + _settings_frame() + _open(1))
    stream = conn.streams[1]
    reply = h2_connection.NativeReply(conn, stream)
    reply.app = cast(Any, type("App", (), {"slo_s": 0.5})())  # its query may run 0.5 s
    stream.reply = reply
    transport.take()
    conn.data_received(_rst(1) + _open(3))  # the reset frees no slot: its query still runs
    [(kind, _, sid, payload)] = _frames(transport.take())
    assert (kind, sid, payload) == (native.RST_STREAM, 3, struct.pack(">I", native.REFUSED_STREAM))
    assert 3 not in conn.streams
    clock.advance(0.5)  # the query's deadline: the slot is free again
    conn.data_received(_open(5))
    assert 5 in conn.streams and not transport.take()


def test_a_reset_cancels_a_servicer_call() -> None:
    conn, _ = _connection()
    conn.data_received(PREFACE + _settings_frame() + _open(1))
    stream = conn.streams[1]
    cancelled = []
    stream.task = cast(Any, type("T", (), {"cancel": lambda self: cancelled.append(1)})())
    conn.data_received(_rst(1))
    assert cancelled == [1] and stream.task is None and stream.done


def test_one_connection_gets_a_bounded_share_of_a_loop_turn() -> None:
    conn, transport = _connection(limits=H2Limits(max_frames_per_turn=50, control_budget=1000))
    later: list[Any] = []
    conn.server.soon = later.append
    conn.data_received(PREFACE + _settings_frame() + _PING * 120)
    acks = [k for k in _kinds(transport.take()) if k == native.PING]
    assert len(acks) == 49  # 50 frames: the SETTINGS and 49 PINGs; the rest waits
    assert transport.paused and len(later) == 1
    conn.data_received(_PING)  # already read before the pause took effect: buffered
    assert not _kinds(transport.take())
    turns = 0
    while later:
        later.pop()()
        turns += 1
    assert turns == 2 and not transport.paused  # 50 + 22 frames, then reading resumes
    assert _kinds(transport.take()) == [native.PING] * 72


def test_bytes_per_turn_are_bounded_too() -> None:
    conn, transport = _connection(limits=H2Limits(max_bytes_per_turn=20_000, control_budget=1000))
    later: list[Any] = []
    conn.server.soon = later.append
    padding = frame(99, 0, 0, b"\0" * 10_000)  # unknown frames: ignored, but 10 KB each
    conn.data_received(PREFACE + padding * 5 + _PING)
    assert transport.paused and len(later) == 1
    for _ in range(5):
        if later:
            later.pop()()
    assert _kinds(transport.take()) == [native.SETTINGS, native.WINDOW_UPDATE, native.PING]
    assert not transport.paused


def test_an_empty_continuation_flood_is_cut_off() -> None:
    conn, transport = _connection()
    transport.take()
    conn.data_received(PREFACE + _settings_frame() + frame(native.HEADERS, 0, 1, b"\x88"))
    for _ in range(H2Limits().max_continuations):
        conn.data_received(frame(native.CONTINUATION, 0, 1))
    assert not transport.closed
    conn.data_received(frame(native.CONTINUATION, 0, 1))
    assert _goaway_code(transport) == native.ENHANCE_YOUR_CALM


def test_a_block_of_too_many_headers_is_refused_before_it_is_decoded() -> None:
    conn, transport = _connection()
    transport.take()
    decoded = []
    conn.cache.decoder.decode = lambda *a, **k: decoded.append(1)
    block = b"\x82" * (MAX_HEADERS + 1)  # 129 copies of ":method: GET", one byte each
    conn.data_received(PREFACE + frame(native.HEADERS, native.END_HEADERS, 1, block))
    assert _goaway_code(transport) == native.ENHANCE_YOUR_CALM
    assert not decoded


@pytest.mark.parametrize("huffman", [False, True])
def test_count_headers_counts_what_hpack_decodes(huffman: bool) -> None:
    enc, dec = hpack.Encoder(), hpack.Decoder()
    headers = [*GRPC_HEADERS, ("x-a", "1" * 200), ("x-b", "v"), ("x-a", "1" * 200)]
    for block in (enc.encode(headers, huffman=huffman), enc.encode(headers, huffman=huffman)):
        assert count_headers(block) == len(headers) == len(list(dec.decode(block)))
    assert count_headers(b"\x20" + header_block([(b"a", b"b")])) == 1  # a size update: no field
    assert count_headers(b"\x82" * 1000, limit=10) == 11  # stops once past the limit
    assert count_headers(b"\x00\x05ab") == 1  # cut short: left to the decoder


def test_decoding_large_blocks_has_a_time_budget() -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock)
    transport.take()
    decode = conn.cache.decoder.decode

    def slow(block: bytes, raw: bool = False) -> Any:
        clock.advance(0.02)  # each large block "takes" 20 ms
        return decode(block, raw=raw)

    conn.cache.decoder.decode = slow
    big = _request_block() + header_block([(b"x-pad", b"p" * 2000)])
    assert len(big) > CACHE_BLOCK_BYTES
    conn.data_received(PREFACE + _settings_frame())
    sid = 1
    for _ in range(2):  # 40 ms of the 50 ms budget
        conn.data_received(frame(native.HEADERS, native.END_HEADERS, sid, big) + _rst(sid))
        sid += 2
    assert not transport.closed
    clock.advance(1.0)  # a new window
    for _ in range(2):
        conn.data_received(frame(native.HEADERS, native.END_HEADERS, sid, big) + _rst(sid))
        sid += 2
    assert not transport.closed
    conn.data_received(frame(native.HEADERS, native.END_HEADERS, sid, big))
    assert _goaway_code(transport) == native.ENHANCE_YOUR_CALM


def test_the_header_cache_keeps_only_small_blocks_and_bounded_bytes() -> None:
    cache = HeaderCache()
    big = _request_block() + header_block([(b"x-pad", b"p" * 2000)])
    cache.decode(big)
    assert cache.cached(big) is None and cache.cached_bytes == 0
    for i in range(2000):  # distinct small blocks
        cache.decode(_request_block() + header_block([(b"x-n", str(i).encode())]))
        assert cache.cached_bytes <= CACHE_BYTES
    small = _request_block()
    cache.decode(small)
    assert cache.cached(small) is not None


def test_the_connection_window_is_refilled_as_calls_are_dispatched() -> None:
    conn, transport = _connection(limits=H2Limits(connection_window=131_070))
    conn.data_received(PREFACE + _settings_frame())
    [update] = [p for k, _, sid, p in _frames(transport.take()) if k == native.WINDOW_UPDATE]
    assert struct.unpack(">I", update)[0] == 131_070 - 65_535
    body = struct.pack(">BI", 0, 995) + b"x" * 995  # 1,000 bytes: under max_message_bytes
    streams = range(1, 81, 2)  # 40 streams, 40,000 bytes held
    conn.data_received(b"".join(_open(s) + frame(native.DATA, 0, s, body) for s in streams))
    assert conn.server.buffered == 40_000
    assert native.WINDOW_UPDATE not in _kinds(transport.take())  # arrival refills nothing
    conn.data_received(b"".join(frame(native.DATA, native.END_STREAM, s, b"") for s in streams))
    assert conn.server.buffered == 0
    updates = [
        struct.unpack(">I", p)[0]
        for k, _, sid, p in _frames(transport.take())
        if k == native.WINDOW_UPDATE and sid == 0
    ]
    assert updates == [33_000]  # given back once a quarter of the window was dispatched
    # A peer that sends more than the window allows is a flow-control error.
    tight = H2Limits(connection_window=65_535, max_frames_per_turn=999)
    conn2, transport2 = _connection(limits=tight)
    conn2.data_received(PREFACE + _settings_frame())
    transport2.take()
    many = range(1, 133, 2)  # 66,000 bytes
    conn2.data_received(b"".join(_open(s) + frame(native.DATA, 0, s, body) for s in many))
    assert _goaway_code(transport2) == native.FLOW_CONTROL_ERROR


def _statuses(data: bytes) -> dict[int, bytes]:
    out = {}
    for kind, _, sid, payload in _frames(data):
        if kind == native.HEADERS:
            out[sid] = dict(hpack.Decoder().decode(payload, raw=True))[b"grpc-status"]
    return out


def test_the_server_wide_body_budget_refuses_beyond_it() -> None:
    conn, transport = _connection(max_buffered_bytes=3_000)
    conn.data_received(PREFACE + _settings_frame())
    transport.take()
    body = b"x" * 1000
    conn.data_received(b"".join(_open(s) + frame(native.DATA, 0, s, body) for s in (1, 3, 5, 7)))
    data = transport.take()
    assert _statuses(data) == {7: b"8"}  # RESOURCE_EXHAUSTED for the fourth
    assert (native.RST_STREAM, 0, 7, struct.pack(">I", native.NO_ERROR)) in _frames(data)
    assert conn.server.buffered == 3_000 and set(conn.streams) == {1, 3, 5}
    conn.connection_lost(None)
    assert conn.server.buffered == 0


def test_a_body_not_complete_in_time_is_answered_and_reset() -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock, body_timeout_s=1.0)
    conn.data_received(PREFACE + _settings_frame() + _open(1) + frame(native.DATA, 0, 1, b"x"))
    conn.data_received(_open(3, end=True))  # complete: an answer of its own, not a timeout
    transport.take()
    clock.advance(0.9)
    conn.expire(clock.now())
    assert not transport.data
    clock.advance(0.1)
    conn.expire(clock.now())
    data = transport.take()
    assert _statuses(data) == {1: b"4"}  # DEADLINE_EXCEEDED
    assert (native.RST_STREAM, 0, 1, struct.pack(">I", native.NO_ERROR)) in _frames(data)
    assert conn.server.buffered == 0 and 1 not in conn.streams


def test_an_answer_held_by_a_zero_window_is_given_up_after_the_send_timeout() -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock, limits=H2Limits(send_timeout_s=2.0))
    client = _client(window=0)
    client.send_headers(1, GRPC_HEADERS)
    _exchange(conn, transport, client)
    conn.send_message(conn.streams[1], b"an answer")
    assert 1 in conn.blocked
    transport.take()
    clock.advance(2.0)
    conn.server._sweep()
    [(kind, _, sid, payload)] = _frames(transport.take())
    assert (kind, sid, payload) == (native.RST_STREAM, 1, struct.pack(">I", native.CANCEL))
    assert not conn.blocked and not conn.streams


_PRIORITY = frame(native.PRIORITY, 0, 1, b"\0" * 5)


@pytest.mark.parametrize("flood", [_PING, _settings_frame(), _PRIORITY])
def test_control_frame_floods_get_goaway(flood: bytes) -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock, limits=H2Limits(control_budget=20))
    conn.data_received(PREFACE)
    transport.take()
    conn.data_received(flood * 20)
    clock.advance(1.0)  # a new window
    conn.data_received(flood * 19 + _open(1, end=True))  # a call refills the budget
    conn.data_received(flood * 20)
    assert not transport.closed
    conn.data_received(flood)
    assert _goaway_code(transport) == native.ENHANCE_YOUR_CALM


def test_a_peers_smaller_header_table_gets_a_size_update_first() -> None:
    conn, transport = _connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.HEADER_TABLE_SIZE: 0}
    )
    client.initiate_connection()
    _exchange(conn, transport, client)  # our SETTINGS ACK ...
    client.send_headers(1, _UNKNOWN, end_stream=True)
    client.send_headers(3, _UNKNOWN, end_stream=True)
    data = conn.data_received(client.data_to_send()) or transport.take()
    blocks = [p for k, _, _, p in _frames(data) if k == native.HEADERS]
    assert blocks[0].startswith(b"\x20") and not blocks[1].startswith(b"\x20")  # once, first
    events = list(client.receive_data(data))  # h2's decoder insists on the update
    ended = [e.stream_id for e in events if isinstance(e, h2.events.StreamEnded)]
    assert ended == [1, 3]
    # A peer that keeps the default table size is sent no update.
    conn2, transport2 = _connection()
    client2 = _client()
    _exchange(conn2, transport2, client2)
    client2.send_headers(1, _UNKNOWN, end_stream=True)
    conn2.data_received(client2.data_to_send())
    [block] = [p for k, _, _, p in _frames(transport2.take()) if k == native.HEADERS]
    assert not block.startswith(b"\x20")


def test_limits_are_checked() -> None:
    from clipper.errors import ConfigError

    with pytest.raises(ConfigError, match="reset_budget"):
        H2Limits(reset_budget=0)
    with pytest.raises(ConfigError, match="body_timeout_s"):
        H2Limits(body_timeout_s=0)
    with pytest.raises(ConfigError, match="connection_window"):
        H2Limits(connection_window=2**31)
    # The connection window always holds the largest message a call may carry.
    server = NativeGrpcServer(cast(Any, None), host="h", port=0, max_message_bytes=20 * 2**20)
    assert server.limits.connection_window == 20 * 2**20 + 5


def test_a_goaway_half_closes_and_lingers_before_the_close() -> None:
    clock = FakeClock(start=0.0)
    conn, transport = _connection(clock=clock)
    eof = []
    transport.can_write_eof = lambda: True  # type: ignore[method-assign]
    transport.write_eof = lambda: eof.append(1)  # type: ignore[attr-defined]
    conn.data_received(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 20)
    assert native.GOAWAY in _kinds(transport.take())
    assert eof == [1] and transport.paused and not transport.closed  # the peer can read why
    conn.data_received(b"more")  # discarded
    clock.advance(GOAWAY_LINGER_S)
    assert transport.closed and not transport.data


def test_an_errors_header_lines_become_lower_case_trailing_metadata() -> None:
    from clipper.frontend.grpc.hpack_blocks import error_block, error_metadata

    extra = b'Retry-After: 3\r\nRateLimit-Policy: "all";q=2;w=20\r\n'
    metadata = error_metadata(extra)
    assert metadata == [(b"retry-after", b"3"), (b"ratelimit-policy", b'"all";q=2;w=20')]
    headers = dict(hpack.Decoder().decode(error_block(8, "over", metadata), raw=True))
    assert headers[b"grpc-status"] == b"8" and headers[b"retry-after"] == b"3"
    assert error_metadata(b"") == []

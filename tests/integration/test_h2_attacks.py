"""The HTTP/2 attacks of 2023-2024 against a real ``clipper start`` frontend's gRPC port.

Each attack is one bounded burst (a few seconds at most, loopback) from a raw HTTP/2 client
written here, and asserts what the native transport does about it (docs/security.md, "HTTP/2
(the gRPC port)"): the GOAWAY code it closes with, how much the frontend's RSS grew where the
attack is about memory, and that a REST predict and a gRPC ``ModelInfer`` are still answered
afterwards. Latency under attack is not asserted here: ``benchmarks/h2_attacks.py`` measures it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc.h2_limits import CONNECTION_WINDOW, CONTROL_BUDGET, MAX_STREAMS
from clipper.frontend.grpc.hpack_blocks import header_block
from clipper.frontend.grpc.native import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from tests.integration.frontend_process import FrontendProcess
from tests.integration.helpers import predict_ok, wait_for, write_row_sums

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

APP = "sums"
BODY_TIMEOUT_S = 3.0
MB = 2**20


class GrpcFrontend(FrontendProcess):
    """A ``clipper start`` that serves the native gRPC transport too."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir, grpc_transport="native")

    def command(self) -> list[str]:
        return [*super().command(), "--body-timeout-s", str(BODY_TIMEOUT_S)]

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fe(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GrpcFrontend]:
    root = tmp_path_factory.mktemp("h2")
    front = GrpcFrontend(root / "state")
    try:
        await front.start()
        await front.admin_ok(
            "add_app",
            {"name": APP, "input_type": "doubles", "default_output": "-1",
             "latency_slo_micros": 200_000},
        )  # fmt: skip
        await front.admin_ok(
            "deploy_model",
            {"model_name": APP, "model_version": "1", "input_type": "doubles",
             "artifact_path": write_row_sums(root), "num_replicas": 1},
            limit_s=60,
        )  # fmt: skip
        await front.admin_ok("add_model_links", {"app_name": APP, "model_names": [APP]})
        await _probe(front)
        yield front
    finally:
        front.cleanup()


# -- a raw HTTP/2 peer ------------------------------------------------------------------------


def _infer_message(x: float) -> bytes:
    request = pb.ModelInferRequest(model_name=APP)
    request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
    request.raw_input_contents.append(struct.pack("<2d", x, 0.5))
    message: bytes = request.SerializeToString()
    return struct.pack(">BI", 0, len(message)) + message


_INFER_BLOCK = header_block(
    [(b":method", b"POST"), (b":scheme", b"http"),
     (b":path", b"/inference.GRPCInferenceService/ModelInfer"), (b":authority", b"localhost"),
     (b"content-type", b"application/grpc"), (b"te", b"trailers")]
)  # fmt: skip
_INFER = _infer_message(1.0)


class Peer:
    """One raw HTTP/2 connection: writes what it is told, records every frame it is sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.closed = asyncio.Event()
        self._reading = asyncio.create_task(self._read(reader))

    @classmethod
    async def open(cls, port: int, settings: bytes = b"") -> Peer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + frame(SETTINGS, 0, 0, settings))
        return cls(reader, writer)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        try:
            while data := await reader.read(2**16):
                buf += data
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    sid = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                    self.frames.append((buf[3], buf[4], sid, bytes(buf[9 : 9 + n])))
                    del buf[: 9 + n]
        except OSError:
            pass
        finally:
            self.closed.set()

    async def send(self, data: bytes) -> bool:
        """Whether it could still be written."""
        if self.closed.is_set():
            return False
        self.writer.write(data)
        try:
            await self.writer.drain()
        except OSError:
            return False
        return True

    def goaways(self) -> list[int]:
        return [int.from_bytes(p[4:8], "big") for k, _, _, p in self.frames if k == GOAWAY]

    def count(self, kind: int, stream: int | None = None) -> int:
        return sum(1 for k, _, s, _ in self.frames if k == kind and stream in (None, s))

    async def wait_closed(self, limit_s: float) -> None:
        async with asyncio.timeout(limit_s):
            await self.closed.wait()

    async def close(self) -> None:
        self.writer.close()
        self._reading.cancel()


async def _probe(fe: GrpcFrontend) -> None:
    """A REST predict and a gRPC ModelInfer, each answered by the model."""
    import grpc

    from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc

    doc = await predict_ok(fe.query_url, APP, {"input": [0.25, 0.5]}, limit_s=10)
    assert doc["output"] == 0.75 and doc["default"] is False, doc
    async with grpc.aio.insecure_channel(f"127.0.0.1:{fe.grpc_port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ModelInferRequest(model_name=APP)
        request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
        request.raw_input_contents.append(struct.pack("<2d", 2.0, 0.5))
        response = await stub.ModelInfer(request, timeout=10)
        assert struct.unpack("<d", response.raw_output_contents[0])[0] == 2.5


# -- the attacks ------------------------------------------------------------------------------


async def test_rapid_reset_is_closed_with_goaway(fe: GrpcFrontend) -> None:
    peer = await Peer.open(fe.grpc_port)
    sid, sent = 1, 0
    try:
        while sent < 20 * MAX_STREAMS and not peer.closed.is_set():
            batch = []
            for _ in range(100):  # HEADERS + DATA + RST_STREAM, as fast as we can write
                batch.append(frame(HEADERS, END_HEADERS, sid, _INFER_BLOCK))
                batch.append(frame(DATA, END_STREAM, sid, _INFER))
                batch.append(frame(RST_STREAM, 0, sid, struct.pack(">I", 0x8)))
                sid += 2
            if not await peer.send(b"".join(batch)):
                break
            sent += 100
        await peer.wait_closed(5.0)
    finally:
        await peer.close()
    assert peer.goaways() == [ENHANCE_YOUR_CALM]
    # GOAWAY names the last stream the server read: the one whose reset spent the budget
    # (twice the stream limit), not the thousands more already in the socket's buffers.
    [goaway] = [p for k, _, _, p in peer.frames if k == GOAWAY]
    assert int.from_bytes(goaway[:4], "big") == 2 * (2 * MAX_STREAMS + 1) - 1
    await _probe(fe)


async def test_an_empty_continuation_flood_is_closed_at_once(fe: GrpcFrontend) -> None:
    peer = await Peer.open(fe.grpc_port)
    sent = 0
    try:
        await peer.send(frame(HEADERS, 0, 1, _INFER_BLOCK[:10]))
        empty = frame(CONTINUATION, 0, 1) * 10_000
        while sent < 10_000_000 and not peer.closed.is_set():
            if not await peer.send(empty):
                break
            sent += 10_000
        await peer.wait_closed(2.0)
    finally:
        await peer.close()
    assert peer.goaways() == [ENHANCE_YOUR_CALM]
    assert sent < 10_000_000
    await _probe(fe)


async def test_blocks_of_1900_headers_are_refused_before_decoding(fe: GrpcFrontend) -> None:
    closed = 0
    for i in range(20):  # one connection per block: each closes at its first
        # 1,900 one-byte indexed fields, distinct blocks (a cache would miss each).
        fields = bytes(0x82 + (i + j) % 60 for j in range(1900))
        peer = await Peer.open(fe.grpc_port)
        try:
            await peer.send(frame(HEADERS, END_HEADERS, 1, fields))
            await peer.wait_closed(5.0)
        finally:
            await peer.close()
        assert peer.goaways() == [ENHANCE_YOUR_CALM]
        closed += 1
    assert closed == 20
    await _probe(fe)


async def test_unterminated_streams_hold_one_window_and_are_reset_in_time(
    fe: GrpcFrontend,
) -> None:
    before = fe.rss_mb()
    peer = await Peer.open(fe.grpc_port)
    chunk = b"x" * 16_000
    streams = list(range(1, 81, 2))  # 40 streams of 9.5 MB each, never ended
    want = {sid: int(9.5e6) for sid in streams}
    try:
        await peer.send(b"".join(frame(HEADERS, END_HEADERS, s, _INFER_BLOCK) for s in streams))
        sent, idle = 0, 0
        while any(want.values()) and idle < 20:  # as the connection window allows
            granted = 65_535 + sum(
                int.from_bytes(p, "big")
                for k, _, s, p in peer.frames
                if k == WINDOW_UPDATE and s == 0
            )
            batch = []
            for s in streams:
                if want[s] and granted - sent >= len(chunk):
                    batch.append(frame(DATA, 0, s, chunk))
                    want[s] -= len(chunk)
                    sent += len(chunk)
            if batch:
                idle = 0
                assert await peer.send(b"".join(batch))
            else:
                idle += 1
                await asyncio.sleep(0.05)  # the attacker waits for window it never gets
        grown = fe.rss_mb() - before
        assert sent <= CONNECTION_WINDOW  # the window was not refilled as bytes arrived
        assert grown < 128, f"RSS grew {grown:.0f} MB"
        # Each stream is answered DEADLINE_EXCEEDED and reset within the body timeout
        # (plus the sweep's quarter of it).
        await wait_for(
            lambda: peer.count(RST_STREAM) >= len(streams),
            limit_s=BODY_TIMEOUT_S * 2 + 5, what="the unterminated streams reset",
        )  # fmt: skip
        statuses = [p for k, _, _, p in peer.frames if k == HEADERS]
        assert len(statuses) == len(streams) and all(b"grpc-status" in p for p in statuses)
        assert all(b"\x0bgrpc-status\x014" in p for p in statuses)
        assert not peer.closed.is_set()  # the streams went, not the connection
    finally:
        await peer.close()
    await _probe(fe)


async def test_distinct_56kb_header_blocks_are_refused_unbuffered(fe: GrpcFrontend) -> None:
    before = fe.rss_mb()

    async def one_connection(k: int) -> int:
        refused = 0
        for i in range(50):
            block = (b"%04d" % (k * 50 + i)) * 14_000  # 56 KB, each block distinct
            peer = await Peer.open(fe.grpc_port)
            try:
                await peer.send(frame(HEADERS, 0, 1, block[:16_384]))
                for pos in range(16_384, len(block), 16_384):
                    end = pos + 16_384 >= len(block)
                    piece = block[pos : pos + 16_384]
                    if not await peer.send(
                        frame(CONTINUATION, END_HEADERS if end else 0, 1, piece)
                    ):
                        break
                await peer.wait_closed(5.0)
            finally:
                await peer.close()
            refused += peer.goaways() == [ENHANCE_YOUR_CALM]
        return refused

    refused = await asyncio.gather(*(one_connection(k) for k in range(4)))
    assert refused == [50, 50, 50, 50]
    grown = fe.rss_mb() - before
    assert grown < 64, f"RSS grew {grown:.0f} MB"
    await _probe(fe)


@pytest.mark.parametrize(
    ("flood", "answer"),
    [(frame(PING, 0, 0, b"12345678"), PING), (frame(SETTINGS, 0, 0), SETTINGS)],
    ids=["ping", "settings"],
)
async def test_control_frame_floods_from_a_reading_client_get_goaway(
    fe: GrpcFrontend, flood: bytes, answer: int
) -> None:
    peer = await Peer.open(fe.grpc_port)
    sent = 0
    try:
        while sent < 1_000_000 and not peer.closed.is_set():
            if not await peer.send(flood * 1000):
                break
            sent += 1000
        await peer.wait_closed(5.0)
    finally:
        await peer.close()
    assert peer.goaways() == [ENHANCE_YOUR_CALM]
    # Answered at most a budget's worth (one for our SETTINGS' ACK... counted as ours).
    assert peer.count(answer) <= 2 * CONTROL_BUDGET + 2
    await _probe(fe)

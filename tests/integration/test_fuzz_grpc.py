"""Seeded fuzzing of the native gRPC port: junk before and after the HTTP/2 preface, frames of
every type with random flags, lengths and stream ids, truncated and oversized frames, and
mutated gRPC messages, with real ModelInfer calls from ``grpc.aio`` interleaved.

Each case runs on its own connection with a read limit. The server must close or GOAWAY a
connection it cannot read, never crash or hang, and keep answering the real client
correctly. Bounded: CASES cases from a fixed seed, well under 30 s.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time

import pytest

from clipper import BatchingConfig, Clipper
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc
from clipper.frontend.grpc.native import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    WINDOW_UPDATE,
    NativeGrpcServer,
    frame,
    header_block,
)
from tests.integration import models
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

SEED = 20261130
CASES = 300
GOOD_EVERY = 15
LIMIT_S = 5.0
PATH = b"/inference.GRPCInferenceService/ModelInfer"


def _junk(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def _request_headers(path: bytes = PATH) -> bytes:
    return header_block(
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path),
            (b":authority", b"fuzz"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
    )


def _infer_message(rng: random.Random) -> bytes:
    request = pb.ModelInferRequest(model_name=rng.choice(["doubles", "nope", ""]))
    tensor = request.inputs.add(
        name="input", datatype=rng.choice(["FP64", "FP32", "BYTES", "X"]), shape=[1, 2]
    )
    if rng.random() < 0.5:
        tensor.contents.fp64_contents.extend([1.0, 2.0])
    else:
        request.raw_input_contents.append(struct.pack("<2d", 1.0, 2.0)[: rng.randrange(17)])
    body: bytes = request.SerializeToString()
    if rng.random() < 0.3:  # a corrupted protobuf
        cut = rng.randrange(len(body) + 1)
        body = body[:cut] + _junk(rng, rng.randrange(8))
    flag = 1 if rng.random() < 0.1 else 0  # "compressed"
    length = len(body) if rng.random() < 0.85 else rng.randrange(2**32)
    return bytes([flag]) + struct.pack(">I", length) + body


def _case(rng: random.Random) -> bytes:
    kind = rng.randrange(6)
    settings = frame(SETTINGS, 0, 0)
    if kind == 0:  # not HTTP/2 at all, or a broken preface
        return rng.choice([b"", PREFACE[: rng.randrange(len(PREFACE))]]) + _junk(rng, 64)
    if kind == 1:  # random frames after the preface
        frames = b"".join(
            frame(
                rng.randrange(12),
                rng.randrange(256),
                rng.randrange(8),
                _junk(rng, rng.randrange(40)),
            )
            for _ in range(rng.randrange(1, 6))
        )
        return PREFACE + settings + frames
    if kind == 2:  # a frame header that lies about its length (truncated or oversized)
        length = rng.choice([1 << 20, (1 << 24) - 1, 70_000, 3])
        head = struct.pack(">I", length)[1:] + bytes([rng.randrange(10), 0]) + struct.pack(">I", 1)
        return PREFACE + settings + head + _junk(rng, rng.randrange(32))
    if kind == 3:  # a call with a mutated gRPC message
        sid = rng.choice([1, 3, 2, 0])  # even or zero stream ids are protocol errors
        return (
            PREFACE
            + settings
            + frame(HEADERS, END_HEADERS, sid, _request_headers())
            + frame(DATA, END_STREAM, sid, _infer_message(rng))
        )
    if kind == 4:  # headers split over CONTINUATION frames, some never finished
        block = _request_headers(rng.choice([PATH, b"/x", b"/inference.GRPCInferenceService/"]))
        cut = rng.randrange(len(block) + 1)
        out = frame(HEADERS, 0, 1, block[:cut])
        if rng.random() < 0.7:
            out += frame(CONTINUATION, END_HEADERS, 1, block[cut:])
        return PREFACE + settings + out + frame(DATA, END_STREAM, 1, _infer_message(rng))
    # flow control abuse: window overflow, zero increments
    increment = rng.choice([0, 2**31 - 1, 1])
    return (
        PREFACE
        + settings
        + frame(WINDOW_UPDATE, 0, rng.choice([0, 1]), struct.pack(">I", increment))
        + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1))
    )


async def _send(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(LIMIT_S):
            return await reader.read(-1)  # until the server closes
    except (ConnectionResetError, BrokenPipeError):
        return b""
    finally:
        writer.close()


async def test_fuzzed_frames_never_stop_the_native_grpc_port() -> None:
    import grpc

    rng = random.Random(SEED)
    t_start = time.monotonic()
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport="native"
    ) as c:
        await c.deploy_model(
            "sums", "1", models.row_sums, input_type="doubles",
            batching=BatchingConfig(max_wait_micros=0),
        )  # fmt: skip
        await c.register_application("doubles", "doubles", "-1.0", 10_000_000)
        await c.link_model_to_app("doubles", "sums")
        assert c.grpc is not None
        port = c.grpc.port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            good = 0
            for i in range(CASES):
                await _send(port, _case(rng))  # closed, or answered: never a hang
                if i % GOOD_EVERY == 0:
                    request = pb.ModelInferRequest(model_name="doubles", id=str(i))
                    request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
                    request.raw_input_contents.append(struct.pack("<2d", i, 0.5))
                    response = await stub.ModelInfer(request, timeout=LIMIT_S)
                    [value] = struct.unpack("<d", response.raw_output_contents[0])
                    assert value == i + 0.5, (i, value)
                    good += 1
            assert good == CASES // GOOD_EVERY
        # Every fuzz connection (and the client's, now closed) is gone: none is left holding
        # the server's resources.
        server = c.grpc
        assert isinstance(server, NativeGrpcServer)
        await wait_for(lambda: not server.connections, what="every connection closed")
    assert time.monotonic() - t_start < 60

"""The native gRPC transport under a real grpc client (``grpc.aio`` and the generated stub):
many concurrent calls on one HTTP/2 connection, each answered correctly."""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path
from typing import Any, cast

import pytest

from clipper import BatchingConfig, Clipper
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc
from tests.integration import models
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="function")]


async def test_a_thousand_concurrent_calls_are_answered_correctly() -> None:
    import grpc

    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport="native"
    ) as c:
        await c.deploy_model(
            "sums", "1", models.row_sums, input_type="doubles",
            batching=BatchingConfig(max_wait_micros=1000),
        )  # fmt: skip
        await c.register_application("doubles", "doubles", "-1.0", 10_000_000)
        await c.link_model_to_app("doubles", "sums")
        assert c.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{c.grpc.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]

            async def infer(i: int) -> float:
                request = pb.ModelInferRequest(model_name="doubles", id=str(i))
                request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
                request.raw_input_contents.append(struct.pack("<2d", i, 0.5))
                response = await stub.ModelInfer(request)
                assert response.id == str(i) and response.model_name == "doubles"
                return float(struct.unpack("<d", response.raw_output_contents[0])[0])

            got = await asyncio.gather(*(infer(i) for i in range(1000)))
            assert got == [i + 0.5 for i in range(1000)]
            live = await stub.ServerLive(pb.ServerLiveRequest())
            assert live.live
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ModelReady(pb.ModelReadyRequest(name="nope"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND


# -- HPACK: a peer whose dynamic table is 0 bytes ---------------------------------------------


async def _run(*cmd: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_h2load_and_nghttp_with_a_zero_header_table_get_every_answer(
    tmp_path: Path,
) -> None:
    """nghttp2's clients with ``--header-table-size=0`` insist on the dynamic table size update
    (RFC 7541 section 4.2) at the start of our first header block: without it, every call
    failed with COMPRESSION_ERROR."""
    missing = [tool for tool in ("h2load", "nghttp") if shutil.which(tool) is None]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not installed (Debian: apt-get install nghttp2-client)"
        )
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport="native"
    ) as c:
        await c.deploy_model("sums", "1", models.row_sums, input_type="doubles")
        await c.register_application("doubles", "doubles", "-1.0", 10_000_000)
        await c.link_model_to_app("doubles", "sums")
        assert c.grpc is not None
        request = pb.ModelInferRequest(model_name="doubles")
        request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
        request.raw_input_contents.append(struct.pack("<2d", 1.0, 0.5))
        message = request.SerializeToString()
        body = tmp_path / "infer.bin"
        body.write_bytes(struct.pack(">BI", 0, len(message)) + message)
        url = f"http://127.0.0.1:{c.grpc.port}/inference.GRPCInferenceService/ModelInfer"
        grpc_headers = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        rc, out = await _run(
            "h2load", "-n", "400", "-c", "2", "-m", "10", "--header-table-size=0",
            *grpc_headers, "-d", str(body), url,
        )  # fmt: skip
        assert rc == 0, out
        assert "400 succeeded, 0 failed, 0 errored" in out, out
        assert "status codes: 400 2xx" in out, out
        rc, out = await _run(
            "nghttp", "-v", "--header-table-size=0", *grpc_headers, "-d", str(body), url
        )
        assert rc == 0, out
        assert "grpc-status: 0" in out and "COMPRESSION_ERROR" not in out, out


# -- connection hygiene on the gRPC port -----------------------------------------------------


async def _served(**limits: float) -> tuple[Any, int]:
    from clipper.frontend.grpc.native import NativeGrpcServer

    server = NativeGrpcServer(cast(Any, None), host="127.0.0.1", port=0, **limits)  # type: ignore[arg-type]
    await server.start()
    return server, server.port


async def _frames_until_closed(reader: asyncio.StreamReader, limit_s: float) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    async with asyncio.timeout(limit_s):
        return await reader.read(-1)


def _goaway_codes(data: bytes) -> list[int]:
    from clipper.frontend.grpc.native import GOAWAY

    codes, pos = [], 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        kind = data[pos + 3]
        payload = data[pos + 9 : pos + 9 + length]
        if kind == GOAWAY:
            codes.append(int.from_bytes(payload[4:8], "big"))
        pos += 9 + length
    return codes


async def test_a_client_that_never_sends_the_preface_is_closed() -> None:
    server, port = await _served(preface_timeout_s=0.2)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PRI * HTTP/2.0\r\n")  # half a preface, then silence
        data = await _frames_until_closed(reader, 5.0)
        writer.close()
        assert _goaway_codes(data) == []  # closed, not spoken to: it never spoke HTTP/2
        assert not server.connections
    finally:
        await server.stop()


async def test_an_idle_connection_gets_goaway_then_closes() -> None:
    from clipper.frontend.grpc.native import NO_ERROR, PREFACE, SETTINGS, frame

    server, port = await _served(idle_timeout_s=0.3)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE + frame(SETTINGS, 0, 0))
        data = await _frames_until_closed(reader, 5.0)
        writer.close()
        assert _goaway_codes(data) == [NO_ERROR]
    finally:
        await server.stop()


async def test_connections_past_the_limit_are_refused_with_the_reason() -> None:
    from clipper.frontend.grpc.native import ENHANCE_YOUR_CALM, PREFACE, SETTINGS, frame

    server, port = await _served(max_connections=2)
    held = []
    try:
        for _ in range(2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(PREFACE + frame(SETTINGS, 0, 0))
            held.append(writer)
        await wait_for(lambda: len(server.connections) == 2, what="both connections accepted")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await _frames_until_closed(reader, 5.0)
        writer.close()
        assert _goaway_codes(data) == [ENHANCE_YOUR_CALM]
        assert b"max_connections" in data
        assert server.refused == 1 and len(server.connections) == 2
    finally:
        for w in held:
            w.close()
        await server.stop()

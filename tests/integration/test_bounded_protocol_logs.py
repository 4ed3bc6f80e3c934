"""A client that reconnects and sends garbage in a loop does not flood the frontend's log: on a
real ``clipper start`` process, 200 garbage connections to the native gRPC port and 200
malformed messages to the replicas' RPC port (from 20 reconnecting sockets) leave at most two
lines of each kind: the first, then "... and N more like it" (written when the frontend stops,
since the burst took less than the 10 s interval). The counts add up to every one sent.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from clipper.rpc import wire
from tests.integration.frontend_process import FrontendProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ATTEMPTS = 200
SOCKETS = 20
LIMIT_S = 5.0
_MORE = re.compile(r"\.\.\. and ([\d,]+) more like it")


class _Frontend(FrontendProcess):
    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir, grpc_transport="native")

    def command(self) -> list[str]:
        return [*super().command(), "--no-rpc-auth", "--log-level", "INFO"]


async def _garbage_grpc(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not an HTTP/2 preface
        return await asyncio.wait_for(reader.read(), LIMIT_S)  # until the server closes
    finally:
        writer.close()


async def _garbage_rpc(ctx: zmq.asyncio.Context, port: int, n: int) -> None:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{port}")
    try:
        for i in range(n):
            await sock.send_multipart([b"", b"\xff\xff\xff\xff", b"junk %d" % i])
        # One pipe keeps its order: the answer to this heartbeat comes after the garbage.
        await sock.send_multipart(wire.encode_heartbeat())
        reply = await asyncio.wait_for(sock.recv_multipart(), LIMIT_S)
        assert reply[:1] == [b""], reply
    finally:
        sock.close()


def _kind(log: str, text: str) -> tuple[list[str], int]:
    """The log's lines of one kind and how many events they stand for."""
    lines = [line for line in log.splitlines() if text in line]
    total = 0
    for line in lines:
        m = _MORE.search(line)
        total += int(m.group(1).replace(",", "")) if m else 1
    return lines, total


async def test_a_reconnecting_garbage_client_leaves_two_lines_with_the_count(
    tmp_path: Path,
) -> None:
    fe = _Frontend(tmp_path / "state")
    try:
        await fe.start()
        for _ in range(ATTEMPTS):
            answer = await _garbage_grpc(fe.grpc_port)
            assert b"not an HTTP/2 connection preface" in answer  # a GOAWAY, then closed
        ctx = zmq.asyncio.Context()
        try:
            for _ in range(SOCKETS):
                await _garbage_rpc(ctx, fe.ports.rpc, ATTEMPTS // SOCKETS)
        finally:
            ctx.term()
    finally:
        fe.stop()  # SIGTERM: a clean stop writes the counts not yet written
        fe.cleanup()
    log = fe.log_path.read_text()
    grpc_lines, grpc_total = _kind(log, "gRPC connection error")
    rpc_lines, rpc_total = _kind(log, "dropping a malformed message")
    assert len(grpc_lines) <= 2 and grpc_total == ATTEMPTS, grpc_lines
    assert len(rpc_lines) <= 2 and rpc_total == ATTEMPTS, rpc_lines
    assert "... and 199 more like it" in grpc_lines[-1]
    assert "... and 199 more like it" in rpc_lines[-1]

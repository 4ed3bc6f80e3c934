"""Abandoned queries with real processes: clients that send a predict and go away (their
connection closed or reset, their gRPC stream reset or call cancelled) leave the queue before
their inputs reach the replica, so the next real client is answered with a prediction behind
them, not after them. Counted, not timed: the inputs the replica was sent (the batch-size
histogram's sum) against the abandoned requests."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest

from clipper import BatchingConfig, Clipper
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc
from tests.integration import models
from tests.integration.helpers import predict_ok, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="function")]

N = 1000  # abandoned requests
# The replica takes 0.3 s a batch of at most 8: the abandoned requests alone are ~37 s of
# work, so the next query is answered within its SLO only if they never reach the replica.
SLO_US = 120_000_000
FAR_FEWER = N // 5


@asynccontextmanager
async def slow_model(grpc_transport: str = "native") -> AsyncIterator[Clipper]:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport=grpc_transport
    ) as c:
        await c.deploy_model(
            "sums", "1", models.slow_sums, input_type="doubles",
            batching=BatchingConfig(controller="fixed", max_batch_size=8, max_wait_micros=0),
        )  # fmt: skip
        await c.register_application("app", "doubles", "-1.0", SLO_US)
        await c.link_model_to_app("app", "sums")
        yield c


def sample(c: Clipper, name: str) -> float:
    value = c.metrics.registry.get_sample_value(name, {"model": "sums", "version": "1"})
    return 0.0 if value is None else value


def sent_to_replica(c: Clipper) -> float:
    return sample(c, "clipper_model_batch_size_sum")


def offered(c: Clipper) -> int:
    sched = c.catalog.scheduler("sums", "1")
    assert sched is not None
    return sched.offered


async def all_queued(c: Clipper, n: int) -> None:
    await wait_for(lambda: offered(c) >= n, limit_s=60.0, what=f"{n} queries queued")


async def check_the_next_query_is_answered(c: Clipper) -> None:
    """A real client behind the abandoned ones gets the model's answer, and the replica saw
    far fewer inputs than were abandoned."""
    doc = await predict_ok(f"http://127.0.0.1:{c.http.port}", "app", {"input": [1.0, 2.0]},
                           limit_s=30.0)  # fmt: skip
    assert doc["default"] is False and doc["output"] == 3.0, doc
    assert sent_to_replica(c) < FAR_FEWER, sent_to_replica(c)
    dropped = sample(c, "clipper_model_abandoned_inputs_total")
    assert dropped > N - FAR_FEWER, dropped
    gone = c.metrics.registry.get_sample_value("clipper_queries_abandoned_total", {"app": "app"})
    assert gone is not None and gone >= dropped


def predict_bytes(i: int) -> bytes:
    body = orjson.dumps({"input": [float(i), 0.5]})  # distinct inputs: no joining
    return (
        b"POST /app/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


async def send(port: int, i: int) -> asyncio.StreamWriter:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(predict_bytes(i))
    await writer.drain()
    return writer


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0) rather than a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_rest_clients_that_close_their_connections_leave_the_queue() -> None:
    async with slow_model() as c:
        port = c.http.port

        async def send_and_close(i: int) -> None:
            writer = await send(port, i)
            writer.close()  # FIN, at once after the request
            await writer.wait_closed()

        await asyncio.gather(*(send_and_close(i) for i in range(N)))
        await all_queued(c, N)
        await check_the_next_query_is_answered(c)


async def test_rest_clients_that_reset_their_connections_leave_the_queue() -> None:
    async with slow_model() as c:
        port = c.http.port
        # Queued first (a reset discards what the server has not read yet), then reset.
        writers = await asyncio.gather(*(send(port, i) for i in range(N)))
        await all_queued(c, N)
        for writer in writers:
            reset(writer)
        await check_the_next_query_is_answered(c)


async def test_pipelined_requests_of_a_closed_connection_all_leave_the_queue() -> None:
    async with slow_model() as c:
        _, writer = await asyncio.open_connection("127.0.0.1", c.http.port)
        writer.write(b"".join(predict_bytes(i) for i in range(64)))
        await writer.drain()
        await all_queued(c, 64)
        reset(writer)
        doc = await predict_ok(f"http://127.0.0.1:{c.http.port}", "app",
                               {"input": [1.0, 2.0]}, limit_s=30.0)  # fmt: skip
        assert doc["default"] is False and doc["output"] == 3.0
        # At most the batch in flight when they were queued, and the live query's.
        assert sent_to_replica(c) <= 16
        assert sample(c, "clipper_model_abandoned_inputs_total") >= 64 - 8


def infer_request(i: float) -> Any:
    request = pb.ModelInferRequest(model_name="app")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
    request.raw_input_contents.append(struct.pack("<2d", i, 0.5))
    return request


@pytest.mark.parametrize("transport", ["native", "grpcio"])
async def test_grpc_calls_that_are_cancelled_leave_the_queue(transport: str) -> None:
    import grpc

    async with slow_model(transport) as c:
        assert c.grpc is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{c.grpc.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            calls = [stub.ModelInfer(infer_request(float(i))) for i in range(N)]
            await all_queued(c, N)
            for call in calls:
                call.cancel()  # RST_STREAM (CANCEL) on the wire
            cancelled = 0
            for call in calls:
                try:
                    await call  # answered before the cancel (the batches in flight)
                except asyncio.CancelledError:
                    cancelled += 1
            assert cancelled > N - FAR_FEWER
            live = await asyncio.wait_for(stub.ModelInfer(infer_request(2.5)), 30.0)
            assert float(struct.unpack("<d", live.raw_output_contents[0])[0]) == 3.0
            assert "default" not in live.parameters
        assert sent_to_replica(c) < FAR_FEWER, sent_to_replica(c)
        dropped = sample(c, "clipper_model_abandoned_inputs_total")
        assert dropped > N - FAR_FEWER, dropped

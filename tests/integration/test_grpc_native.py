"""The native gRPC transport under a real grpc client (``grpc.aio`` and the generated stub):
many concurrent calls on one HTTP/2 connection, each answered correctly."""

from __future__ import annotations

import asyncio
import struct

import pytest

from clipper import BatchingConfig, Clipper
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc
from tests.integration import models

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

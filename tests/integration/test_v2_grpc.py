"""The Open Inference Protocol (KServe V2) gRPC service end to end, with real containers and
the real client (``tritonclient.grpc``, synchronous, run in a thread). Spec:
docs/v2-protocol.md.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

import clipper as clipper_pkg
from clipper import BatchingConfig, Clipper
from clipper.choices import GRPC_TRANSPORTS
from tests.integration import models
from tests.integration.helpers import post_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        importlib.util.find_spec("tritonclient") is None
        or importlib.util.find_spec("tritonclient.grpc") is None,
        reason="pip install 'tritonclient[grpc]' to run the real V2 gRPC client",
    ),
]

SLO_US = 2_000_000


# Every test runs against both gRPC transports: the real clients are the interoperability proof.
@pytest_asyncio.fixture(scope="module", loop_scope="module", params=GRPC_TRANSPORTS.names)
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Clipper, str]]:
    # grpc_port=0: the frontend serves the gRPC service itself, on a free port
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport=request.param
    ) as c:
        batching = BatchingConfig(max_wait_micros=2000)
        await asyncio.gather(
            c.deploy_model("sums", "1", models.row_sums, input_type="doubles", batching=batching),
            c.deploy_model("shout", "1", models.shout, input_type="strings", batching=batching),
        )
        await c.register_application("doubles", "doubles", "-1.0", SLO_US)
        await c.link_model_to_app("doubles", "sums")
        await c.register_application("words", "strings", "-1.0", SLO_US)
        await c.link_model_to_app("words", "shout")
        await c.register_application("lonely", "doubles", "-1.0", SLO_US)
        assert c.grpc is not None and c.grpc.port > 0
        yield c, f"127.0.0.1:{c.grpc.port}"


def _call(url: str, fn: Any) -> Any:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url=url)
    try:
        return fn(client)
    finally:
        client.close()


def _in(x: np.ndarray, datatype: str = "FP64") -> Any:
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("input", list(x.shape), datatype)
    inp.set_data_from_numpy(x)  # raw_input_contents
    return inp


def _health(client: Any) -> dict[str, Any]:
    return {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(as_json=True),
        "model_ready": client.is_model_ready("doubles"),
        "model_ready_v1": client.is_model_ready("doubles", "1"),
        "lonely_ready": client.is_model_ready("lonely"),
        "metadata": client.get_model_metadata("doubles", as_json=True),
    }


async def test_health_and_metadata(served: tuple[Clipper, str]) -> None:
    _, url = served
    got = await asyncio.to_thread(_call, url, _health)
    assert got["live"] is True
    assert got["ready"] is True
    assert got["server"]["name"] == "clipper-serve"
    assert got["server"]["version"] == clipper_pkg.__version__
    assert got["model_ready"] is True
    assert got["model_ready_v1"] is True
    assert got["lonely_ready"] is False  # registered, but no model linked
    meta = got["metadata"]
    assert meta["name"] == "doubles"
    assert meta["platform"] == "clipper-serve"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP64", "shape": ["-1", "-1"]}]
    assert meta["outputs"][0]["name"] == "output"


async def test_model_ready_of_an_app_without_replicas_while_another_is_ready(
    served: tuple[Clipper, str],
) -> None:
    c, url = served
    # A model whose containers are started elsewhere, none of which has dialled in.
    added = await post_json(
        f"{c.admin_url}/admin/add_model",
        {"model_name": "elsewhere", "model_version": "1", "input_type": "doubles"},
    )
    assert added.status == 200, added.body
    await c.set_num_replicas("elsewhere", 1, wait=False)
    await c.register_application("waiting", "doubles", "-1.0", SLO_US)
    await c.link_model_to_app("waiting", "elsewhere")

    def ask(client: Any) -> dict[str, bool]:
        return {
            "waiting": client.is_model_ready("waiting"),
            "waiting_v1": client.is_model_ready("waiting", "1"),
            "doubles": client.is_model_ready("doubles"),
            "server": client.is_server_ready(),
        }

    try:
        got = await asyncio.to_thread(_call, url, ask)
        # One application cannot answer, the other can; the whole frontend's rule says no.
        assert got == {"waiting": False, "waiting_v1": False, "doubles": True, "server": False}
    finally:
        await c.delete_application("waiting")
    assert await asyncio.to_thread(_call, url, lambda client: client.is_server_ready()) is True


async def test_infer_raw_fp64(served: tuple[Clipper, str]) -> None:
    import tritonclient.grpc as grpcclient

    _, url = served
    x = np.arange(12, dtype=np.float64).reshape(4, 3) / 4

    def infer(client: Any) -> Any:
        out = grpcclient.InferRequestedOutput("output")
        return client.infer("doubles", [_in(x)], outputs=[out], request_id="req-7")

    result = await asyncio.to_thread(_call, url, infer)
    response = result.get_response()
    assert response.model_name == "doubles"
    assert response.model_version == "1"
    assert response.id == "req-7"
    assert len(response.raw_output_contents) == 1  # raw in, raw out
    got = result.as_numpy("output")
    assert got.dtype == np.float64
    assert got.shape == (4,)
    np.testing.assert_allclose(got, np.array(models.row_sums(x)))


async def test_infer_contents(served: tuple[Clipper, str]) -> None:
    """Inputs in ``contents`` are answered in ``contents`` (a hand-built request through the
    client's stub, since the client always sends raw tensors)."""
    from tritonclient.grpc import service_pb2

    _, url = served
    x = [[1.5, 2.0], [3.0, -1.0], [0.25, 0.25]]
    request = service_pb2.ModelInferRequest(model_name="doubles", model_version="1")
    tensor = request.inputs.add(name="input", datatype="FP64", shape=[3, 2])
    tensor.contents.fp64_contents.extend(v for row in x for v in row)
    words = service_pb2.ModelInferRequest(model_name="words")
    tensor = words.inputs.add(name="input", datatype="BYTES", shape=[2, 1])
    tensor.contents.bytes_contents.extend(["héllo".encode(), b"x"])

    def infer(client: Any) -> tuple[Any, Any]:
        return client._client_stub.ModelInfer(request), client._client_stub.ModelInfer(words)

    response, words_response = await asyncio.to_thread(_call, url, infer)
    assert not response.raw_output_contents
    (out,) = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("output", "FP64", [3])
    assert list(out.contents.fp64_contents) == models.row_sums(x)
    (wout,) = words_response.outputs
    assert wout.datatype == "BYTES"
    assert len(wout.contents.bytes_contents) == 2


async def test_errors_map_to_status_codes(served: tuple[Clipper, str]) -> None:
    import grpc
    from tritonclient.utils import InferenceServerException

    _, url = served
    x = np.ones((2, 3))

    def attempt(fn: Any) -> Any:
        def run(client: Any) -> Any:
            try:
                fn(client)
            except InferenceServerException as e:
                return e
            return None

        return run

    unknown = await asyncio.to_thread(_call, url, attempt(lambda c: c.infer("nope", [_in(x)])))
    assert isinstance(unknown, InferenceServerException)
    assert unknown.status() == str(grpc.StatusCode.NOT_FOUND)
    assert "nope" in (unknown.message() or "")
    meta = await asyncio.to_thread(_call, url, attempt(lambda c: c.get_model_metadata("nope")))
    assert meta is not None
    assert meta.status() == str(grpc.StatusCode.NOT_FOUND)
    ready = await asyncio.to_thread(_call, url, attempt(lambda c: c.is_model_ready("nope")))
    assert ready is not None
    assert ready.status() == str(grpc.StatusCode.NOT_FOUND)
    version = await asyncio.to_thread(
        _call, url, attempt(lambda c: c.infer("doubles", [_in(x)], model_version="9"))
    )
    assert version is not None
    assert version.status() == str(grpc.StatusCode.NOT_FOUND)
    # A strings application does not take FP64 tensors.
    wrong_type = await asyncio.to_thread(_call, url, attempt(lambda c: c.infer("words", [_in(x)])))
    assert wrong_type is not None
    assert wrong_type.status() == str(grpc.StatusCode.INVALID_ARGUMENT)


async def test_bad_raw_tensor_is_invalid_argument(served: tuple[Clipper, str]) -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    _, url = served
    request = service_pb2.ModelInferRequest(model_name="doubles")
    request.inputs.add(name="input", datatype="FP64", shape=[2, 3])
    request.raw_input_contents.append(b"\x00" * 8)  # 1 element for a [2, 3] tensor

    def infer(client: Any) -> Any:
        try:
            client._client_stub.ModelInfer(request)
        except grpc.RpcError as e:
            return e
        return None

    err = await asyncio.to_thread(_call, url, infer)
    assert err is not None
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "48 bytes" in err.details()


@pytest.mark.parametrize("transport", GRPC_TRANSPORTS.names)
async def test_overload_is_unavailable(transport: str) -> None:
    """An application that answers overload with an error (``overload="reject"``): queries
    beyond one running batch and a queue of 2 are refused at once with UNAVAILABLE, the others
    are answered."""
    import grpc
    import tritonclient.grpc.aio as aioclient
    from tritonclient.utils import InferenceServerException

    capacity, n = 2, 10
    async with Clipper(
        query_port=0,
        rpc_port=0,
        admin_port=0,
        grpc_port=0,
        queue_capacity=capacity,
        grpc_transport=transport,
    ) as c:
        one_at_a_time = BatchingConfig(controller="fixed", max_batch_size=1, max_wait_micros=0)
        await c.deploy_model(
            "slow", "1", models.slow_sums, input_type="doubles", batching=one_at_a_time
        )
        await c.register_application("busy", "doubles", "-1.0", 5_000_000, overload="reject")
        await c.link_model_to_app("busy", "slow")
        assert c.grpc is not None
        client = aioclient.InferenceServerClient(url=f"127.0.0.1:{c.grpc.port}")

        async def infer(i: int) -> Any:
            x = np.full((1, 2), float(i))
            inp = aioclient.InferInput("input", [1, 2], "FP64")
            inp.set_data_from_numpy(x)
            try:
                return await client.infer("busy", [inp])
            except InferenceServerException as e:
                return e

        try:
            results = await asyncio.gather(*(infer(i) for i in range(n)))
        finally:
            await client.close()
    refused = [r for r in results if isinstance(r, InferenceServerException)]
    answered = [r for r in results if not isinstance(r, InferenceServerException)]
    assert len(answered) == 1 + capacity
    assert len(refused) == n - 1 - capacity
    for e in refused:
        assert e.status() == str(grpc.StatusCode.UNAVAILABLE)
        assert "queue is full" in (e.message() or ""), e.message()
    for i, r in enumerate(results):
        if not isinstance(r, InferenceServerException):
            assert r.as_numpy("output").tolist() == [2.0 * i]


async def test_model_config(served: tuple[Clipper, str]) -> None:
    import grpc
    from tritonclient.utils import InferenceServerException

    c, url = served

    def config(client: Any) -> Any:
        return client.get_model_config("doubles", as_json=True)["config"]

    doc = await asyncio.to_thread(_call, url, config)
    assert doc["name"] == "doubles"
    assert doc["max_batch_size"] == min(c.config.queue_capacity, c.config.max_items_per_request)
    assert doc["input"] == [{"name": "input", "data_type": "TYPE_FP64", "dims": ["-1"]}]
    assert doc["output"][0]["data_type"] == "TYPE_FP64"
    assert doc["dynamic_batching"] == {"max_queue_delay_microseconds": "2000"}

    def unknown(client: Any) -> Any:
        try:
            client.get_model_config("nope")
        except InferenceServerException as e:
            return e
        return None

    err = await asyncio.to_thread(_call, url, unknown)
    assert err is not None
    assert err.status() == str(grpc.StatusCode.NOT_FOUND)


async def test_infer_encodes_no_json_on_the_way(
    served: tuple[Clipper, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ModelInfer answered by a model goes from protobuf to the application's inputs and
    from predictions to protobuf: the frontend's code calls orjson not once (it used to
    encode and decode a REST request and response, three pairs)."""
    import sys

    import orjson

    _, url = served
    calls: list[str] = []
    real = {"dumps": orjson.dumps, "loads": orjson.loads}

    def counted(name: str) -> Any:
        fn = real[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            module = sys._getframe(1).f_globals.get("__name__", "")
            if module.startswith("clipper.frontend"):
                calls.append(f"{module}.{name}")
            return fn(*args, **kwargs)

        return call

    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    await asyncio.to_thread(_call, url, lambda c: c.infer("doubles", [_in(x)]))  # warm
    monkeypatch.setattr(orjson, "dumps", counted("dumps"))
    monkeypatch.setattr(orjson, "loads", counted("loads"))
    result = await asyncio.to_thread(_call, url, lambda c: c.infer("doubles", [_in(x)]))
    monkeypatch.undo()
    assert result.as_numpy("output").tolist() == [3.0, 7.0]
    assert calls == []

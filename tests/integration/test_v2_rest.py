"""The Open Inference Protocol (KServe V2) REST API end to end, with real containers.

The real client (``tritonclient[http]``, synchronous, run in a thread) where it is installed,
raw HTTP for the error cases. A V2 model is a clipper-serve application. Spec: docs/v2-protocol.md.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio

import clipper as clipper_pkg
from clipper import BatchingConfig, Clipper
from clipper.query.prediction import NO_MODELS
from tests.integration import models
from tests.integration.helpers import post_json, request

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SLO_US = 2_000_000
HAS_TRITONCLIENT = importlib.util.find_spec("tritonclient") is not None
needs_tritonclient = pytest.mark.skipif(
    not HAS_TRITONCLIENT, reason="pip install 'tritonclient[http]' to run the real V2 client"
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clipper() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
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
        await c.register_application("lonely-int", "integers", "0", SLO_US)
        yield c


def v2_url(c: Clipper, path: str) -> str:
    return f"{c.query_url}/v2{path}"


def tensor(data: Any, shape: list[int], datatype: str = "FP64") -> dict[str, Any]:
    return {"name": "input", "shape": shape, "datatype": datatype, "data": data}


# -- the real client ---------------------------------------------------------------------------
def _triton(c: Clipper) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url=c.query_url.removeprefix("http://"))


def _client_calls(c: Clipper, x: np.ndarray) -> dict[str, Any]:
    import tritonclient.http as httpclient

    client = _triton(c)
    try:
        inp = httpclient.InferInput("input", list(x.shape), "FP64")
        inp.set_data_from_numpy(x, binary_data=False)
        out = httpclient.InferRequestedOutput("output", binary_data=False)
        result = client.infer("doubles", [inp], outputs=[out], request_id="req-7")
        # Without requested outputs the client asks for binary outputs; JSON comes back and
        # the client reads it all the same.
        result_default = client.infer("doubles", [inp])
        # The client's defaults: binary tensor data in; binary outputs asked for, JSON back.
        binary_in = httpclient.InferInput("input", list(x.shape), "FP32")
        binary_in.set_data_from_numpy(x.astype(np.float32))
        result_binary = client.infer("doubles", [binary_in])
        words = httpclient.InferInput("input", [2, 1], "BYTES")
        words.set_data_from_numpy(np.array([["héllo"], ["x"]], dtype=np.object_))
        result_words = client.infer("words", [words])
        return {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "server": client.get_server_metadata(),
            "model_ready": client.is_model_ready("doubles"),
            "lonely_ready": client.is_model_ready("lonely"),
            "metadata": client.get_model_metadata("doubles"),
            "output": result.as_numpy("output"),
            "response": result.get_response(),
            "output_default": result_default.as_numpy("output"),
            "output_binary": result_binary.as_numpy("output"),
            "output_words": result_words.as_numpy("output"),
        }
    finally:
        client.close()


@needs_tritonclient
async def test_tritonclient_end_to_end(clipper: Clipper) -> None:
    x = np.arange(12, dtype=np.float64).reshape(4, 3) / 4
    got = await asyncio.to_thread(_client_calls, clipper, x)
    assert got["live"] is True
    assert got["ready"] is True
    assert got["server"]["name"] == "clipper-serve"
    assert got["server"]["version"] == clipper_pkg.__version__
    assert got["model_ready"] is True
    assert got["lonely_ready"] is False  # registered, but no model linked
    meta = got["metadata"]
    assert meta["name"] == "doubles"
    assert meta["platform"] == "clipper-serve"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input", "datatype": "FP64", "shape": [-1, -1]}]
    assert meta["outputs"][0]["name"] == "output"
    expected = np.array(models.row_sums(x))
    np.testing.assert_allclose(got["output"], expected)
    np.testing.assert_allclose(got["output_default"], expected)
    np.testing.assert_allclose(got["output_binary"], expected)
    words = [orjson.loads(s) for s in got["output_words"]]
    assert words == models.shout(["héllo", "x"])
    response = got["response"]
    assert response["model_name"] == "doubles"
    assert response["model_version"] == "1"
    assert response["id"] == "req-7"
    assert "parameters" not in response


@needs_tritonclient
async def test_tritonclient_errors(clipper: Clipper) -> None:
    from tritonclient.utils import InferenceServerException

    def unknown_model() -> str:
        client = _triton(clipper)
        try:
            client.get_model_metadata("no-such-app")
        except InferenceServerException as e:
            return str(e.message())
        finally:
            client.close()
        raise AssertionError("no error for an unknown model")

    message = await asyncio.to_thread(unknown_model)
    assert "no-such-app" in message


# -- raw HTTP ------------------------------------------------------------------------------------
async def test_server_routes(clipper: Clipper) -> None:
    resp = await request(v2_url(clipper, ""))
    assert resp.status == 200
    assert resp.json() == {
        "name": "clipper-serve",
        "version": clipper_pkg.__version__,
        "extensions": [],
    }
    for path in ("/health/live", "/health/ready"):
        resp = await request(v2_url(clipper, path))
        assert (resp.status, resp.body) == (200, b""), path
    for path in ("/models/doubles/ready", "/models/doubles/versions/1/ready"):
        resp = await request(v2_url(clipper, path))
        assert resp.status == 200, path
        assert resp.json() == {"name": "doubles", "ready": True, "reasons": []}
    resp = await request(v2_url(clipper, "/models/doubles/versions/9/ready"))
    assert resp.status == 400
    resp = await request(v2_url(clipper, "/models/lonely/ready"))
    assert resp.status == 400


async def test_model_ready_of_an_app_without_replicas_while_another_is_ready(
    clipper: Clipper,
) -> None:
    # A model whose containers are started elsewhere, none of which has dialled in.
    added = await post_json(
        f"{clipper.admin_url}/admin/add_model",
        {"model_name": "elsewhere", "model_version": "1", "input_type": "doubles"},
    )
    assert added.status == 200, added.body
    await clipper.set_num_replicas("elsewhere", 1, wait=False)
    await clipper.register_application("waiting", "doubles", "-1.0", SLO_US)
    await clipper.link_model_to_app("waiting", "elsewhere")
    why = ["application 'waiting': model 'elsewhere:1' has no replica connected"]
    try:
        resp = await request(v2_url(clipper, "/models/waiting/ready"))
        assert resp.status == 400
        assert resp.json() == {"name": "waiting", "ready": False, "reasons": why}
        resp = await request(v2_url(clipper, "/models/doubles/ready"))
        assert resp.status == 200
        # The Clipper REST route answers the same, by its own statuses.
        resp = await request(f"{clipper.query_url}/waiting/ready")
        assert (resp.status, resp.json()) == (503, {"app": "waiting", "ready": False,
                                                    "reasons": why})  # fmt: skip
        resp = await request(f"{clipper.query_url}/doubles/ready")
        assert (resp.status, resp.json()["ready"]) == (200, True)
        # The whole frontend's readiness counts the model without replicas.
        assert (await request(v2_url(clipper, "/health/ready"))).status == 503
        if HAS_TRITONCLIENT:

            def ask(client: Any) -> tuple[bool, bool]:
                return client.is_model_ready("waiting"), client.is_model_ready("doubles")

            client = _triton(clipper)
            try:
                assert await asyncio.to_thread(ask, client) == (False, True)
            finally:
                client.close()
    finally:
        await clipper.delete_application("waiting")
    assert (await request(v2_url(clipper, "/health/ready"))).status == 200


async def test_infer_flat_and_nested(clipper: Clipper) -> None:
    rows = [[1.0, 2.0], [3.0, 4.5], [0.5, 0.25]]
    for data in (rows, [v for r in rows for v in r]):
        resp = await post_json(
            v2_url(clipper, "/models/doubles/infer"), {"inputs": [tensor(data, [3, 2])]}
        )
        assert resp.status == 200, resp.body
        doc = resp.json()
        assert doc == {
            "model_name": "doubles",
            "model_version": "1",
            "outputs": [
                {"name": "output", "datatype": "FP64", "shape": [3], "data": [3.0, 7.5, 0.75]}
            ],
        }


async def test_infer_integer_data_and_version_path(clipper: Clipper) -> None:
    resp = await post_json(
        v2_url(clipper, "/models/doubles/versions/1/infer"),
        {"id": "abc", "inputs": [tensor([[1, 2, 3]], [1, 3], "INT32")]},
    )
    assert resp.status == 200, resp.body
    doc = resp.json()
    assert doc["id"] == "abc"
    assert doc["model_version"] == "1"
    assert doc["outputs"][0]["data"] == [6.0]


async def test_infer_bytes_outputs_are_json_text(clipper: Clipper) -> None:
    resp = await post_json(
        v2_url(clipper, "/models/words/infer"),
        {"inputs": [tensor(["hi", "abc"], [2, 1], "BYTES")]},
    )
    assert resp.status == 200, resp.body
    (out,) = resp.json()["outputs"]
    assert out["datatype"] == "BYTES"
    assert out["shape"] == [2]
    assert [orjson.loads(s) for s in out["data"]] == models.shout(["hi", "abc"])


async def test_default_output_is_flagged(clipper: Clipper) -> None:
    resp = await post_json(
        v2_url(clipper, "/models/lonely/infer"), {"inputs": [tensor([[1.0], [2.0]], [2, 1])]}
    )
    assert resp.status == 200, resp.body
    doc = resp.json()
    assert doc["outputs"] == [
        {"name": "output", "datatype": "FP64", "shape": [2], "data": [-1.0, -1.0]}
    ]
    assert doc["parameters"] == {"default": True, "default_explanations": [NO_MODELS, NO_MODELS]}


async def test_model_metadata(clipper: Clipper) -> None:
    resp = await request(v2_url(clipper, "/models/words"))
    assert resp.status == 200
    doc = resp.json()
    assert doc["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1, -1]}]
    resp = await request(v2_url(clipper, "/models/lonely-int/versions/1"))
    assert resp.status == 404
    assert "error" in resp.json()
    resp = await request(v2_url(clipper, "/models/lonely-int"))
    assert resp.json()["inputs"][0]["datatype"] == "INT32"
    assert resp.json()["versions"] == []


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/models/nope/infer", orjson.dumps({"inputs": [tensor([1.0], [1, 1])]}), 404, "nope"),
        ("/models/doubles/infer", b"{not json", 400, "malformed JSON"),
        ("/models/doubles/infer", b"[1, 2]", 400, "JSON object"),
        ("/models/doubles/infer", orjson.dumps({"inputs": []}), 400, "inputs"),
        (
            "/models/doubles/infer",
            orjson.dumps({"inputs": [tensor(["a"], [1, 1], "BYTES")]}),
            400,
            "datatype BYTES",
        ),
        (
            "/models/lonely-int/infer",
            orjson.dumps({"inputs": [tensor([1.5], [1, 1], "FP64")]}),
            400,
            "datatype FP64",
        ),
        (
            "/models/doubles/infer",
            orjson.dumps({"inputs": [tensor([1.0, 2.0, 3.0], [2, 2])]}),
            400,
            "needs 4 elements",
        ),
        (
            "/models/doubles/infer",
            orjson.dumps({"inputs": [tensor([1.0, "x"], [1, 2])]}),
            400,
            "not of datatype FP64",
        ),
        (
            "/models/doubles/infer",
            orjson.dumps({"inputs": [tensor([1.0], [1, 1], "FP128")]}),
            400,
            "unknown datatype",
        ),
        (
            "/models/doubles/infer",
            orjson.dumps({"inputs": [tensor([1.0], [1, 1])], "outputs": [{"name": "probs"}]}),
            400,
            "probs",
        ),
        (
            "/models/doubles/versions/7/infer",
            orjson.dumps({"inputs": [tensor([1.0], [1, 1])]}),
            404,
            "version",
        ),
        ("/models/doubles/explain", b"{}", 404, "no route"),
    ],
)
async def test_errors(clipper: Clipper, path: str, body: bytes, status: int, needle: str) -> None:
    resp = await request(v2_url(clipper, path), "POST", body)
    assert resp.status == status, resp.body
    doc = resp.json()
    assert set(doc) == {"error"}, doc
    assert needle in doc["error"]


async def test_unknown_model_metadata_is_404(clipper: Clipper) -> None:
    for path in ("/models/nope", "/models/nope/ready", "/nothing"):
        resp = await request(v2_url(clipper, path))
        assert resp.status == 404, path
        assert set(resp.json()) == {"error"}


async def test_app_named_v2_keeps_its_predict_route(clipper: Clipper) -> None:
    await clipper.register_application("v2", "doubles", "-1.0", SLO_US)
    resp = await post_json(f"{clipper.query_url}/v2/predict", {"input": [1.0]})
    assert resp.status == 200
    assert resp.json()["default"] is True


async def test_binary_tensor_data_in(clipper: Clipper) -> None:
    raw = np.array([[1.0, 2.0], [3.0, 4.0]], dtype="<f4").tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [2, 2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    url = v2_url(clipper, "/models/doubles/infer")
    hdrs = {"Inference-Header-Content-Length": str(len(header))}
    resp = await request(url, "POST", header + raw, headers=hdrs)
    assert resp.status == 200, resp.body
    assert resp.json()["outputs"][0]["data"] == [3.0, 7.0]
    resp = await request(url, "POST", header + raw[:-4], headers=hdrs)
    assert resp.status == 400
    assert "binary_data_size" in resp.json()["error"]
    hdrs = {"Inference-Header-Content-Length": str(len(header) + 1000)}
    resp = await request(url, "POST", header + raw, headers=hdrs)
    assert resp.status == 400
    assert "Inference-Header-Content-Length" in resp.json()["error"]


async def test_the_timeout_parameter_narrows_the_slo(clipper: Clipper) -> None:
    await clipper.deploy_model("slow", "1", models.slow_sums, input_type="doubles")
    await clipper.register_application("slowapp", "doubles", "-1.0", SLO_US)  # 2 s
    await clipper.link_model_to_app("slowapp", "slow")
    url = v2_url(clipper, "/models/slowapp/infer")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    resp = await post_json(
        url, {"inputs": [tensor([[1.0]], [1, 1])], "parameters": {"timeout": 50_000}}
    )
    elapsed = loop.time() - t0
    assert resp.status == 200, resp.body
    assert 0.04 <= elapsed < 0.25  # 50 ms, not the app's 2 s nor the model's 300 ms
    assert resp.json()["parameters"]["default"] is True
    bad = await post_json(
        url, {"inputs": [tensor([[1.0]], [1, 1])], "parameters": {"timeout": "x"}}
    )
    assert bad.status == 400 and b"timeout" in bad.body


async def test_binary_outputs_follow_the_json_header(clipper: Clipper) -> None:
    body = orjson.dumps(
        {
            "inputs": [tensor([[1.0, 2.0], [3.0, 4.5]], [2, 2])],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    )
    resp = await request(v2_url(clipper, "/models/doubles/infer"), "POST", body)
    assert resp.status == 200, resp.body
    assert resp.headers["content-type"] == "application/octet-stream"
    n = int(resp.headers["inference-header-content-length"])
    header, raw = orjson.loads(resp.body[:n]), resp.body[n:]
    (out,) = header["outputs"]
    assert "data" not in out
    assert out["parameters"] == {"binary_data_size": len(raw)} and out["datatype"] == "FP64"
    assert np.frombuffer(raw, dtype="<f8").tolist() == [3.0, 7.5]


async def test_model_config(clipper: Clipper) -> None:
    """Triton's model configuration extension, which perf_analyzer reads before a run."""
    resp = await request(v2_url(clipper, "/models/doubles/config"))
    assert resp.status == 200, resp.body
    doc = resp.json()
    assert doc["name"] == "doubles"
    assert doc["max_batch_size"] == min(
        clipper.config.queue_capacity, clipper.config.max_items_per_request
    )
    assert doc["input"] == [{"name": "input", "data_type": "TYPE_FP64", "dims": [-1]}]
    assert doc["output"] == [{"name": "output", "data_type": "TYPE_FP64", "dims": [-1]}]
    assert doc["dynamic_batching"] == {"max_queue_delay_microseconds": 2000}
    words = (await request(v2_url(clipper, "/models/words/versions/1/config"))).json()
    assert words["input"][0]["data_type"] == "TYPE_STRING"
    lonely = (await request(v2_url(clipper, "/models/lonely-int/config"))).json()
    assert lonely["input"][0]["data_type"] == "TYPE_INT32"
    assert "dynamic_batching" not in lonely  # no model linked
    resp = await request(v2_url(clipper, "/models/nope/config"))
    assert resp.status == 404
    assert "nope" in resp.json()["error"]


def _binary(arr: np.ndarray, datatype: str) -> tuple[bytes, dict[str, str]]:
    raw = arr.tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(arr.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw)},
                }
            ]
        }
    )
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


async def test_binary_elements_convert_to_the_application_type(clipper: Clipper) -> None:
    body, hdrs = _binary(np.array([[1, 2], [3, -4]], dtype="<i8"), "INT64")
    resp = await request(v2_url(clipper, "/models/doubles/infer"), "POST", body, headers=hdrs)
    assert resp.status == 200, resp.body
    assert resp.json()["outputs"][0]["data"] == [3.0, -1.0]
    # Into a 32-bit integer application, a 64-bit element out of its range is refused.
    body, hdrs = _binary(np.array([[1, 2**40]], dtype="<i8"), "INT64")
    resp = await request(v2_url(clipper, "/models/lonely-int/infer"), "POST", body, headers=hdrs)
    assert resp.status == 400
    assert "out of range for 32-bit integers" in resp.json()["error"]
    # Non-finite floats are tensor data like any other (perf_analyzer's random data has them):
    # accepted, here answered with the default output of an application without a model.
    body, hdrs = _binary(np.array([[np.nan, np.inf]], dtype="<f4"), "FP32")
    resp = await request(v2_url(clipper, "/models/lonely/infer"), "POST", body, headers=hdrs)
    assert resp.status == 200, resp.body
    assert resp.json()["parameters"]["default"] is True


async def test_bool_and_bf16_tensors(clipper: Clipper) -> None:
    url = v2_url(clipper, "/models/doubles/infer")
    resp = await post_json(url, {"inputs": [tensor([True, False, True], [1, 3], "BOOL")]})
    assert resp.status == 200, resp.body
    assert resp.json()["outputs"][0]["data"] == [2.0]
    resp = await post_json(url, {"inputs": [tensor([1, 0], [1, 2], "BOOL")]})
    assert resp.status == 400
    assert "not of datatype BOOL" in resp.json()["error"]
    # BF16 is the upper half of an FP32: 1.5 and -2.0 are exact in it.
    bf16 = (np.array([[1.5, -2.0]], dtype="<f4").view("<u4") >> 16).astype("<u2")
    body, hdrs = _binary(bf16, "BF16")
    resp = await request(url, "POST", body, headers=hdrs)
    assert resp.status == 200, resp.body
    assert resp.json()["outputs"][0]["data"] == [-0.5]
    body, hdrs = _binary(np.array([[True, True]]), "BOOL")
    resp = await request(url, "POST", body, headers=hdrs)
    assert resp.status == 200, resp.body
    assert resp.json()["outputs"][0]["data"] == [2.0]

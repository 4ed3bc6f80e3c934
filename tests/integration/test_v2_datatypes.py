"""Every V2 datatype, in JSON and binary form, over REST and gRPC, with real containers: each
query is answered, with the right datatype and values.

Two sweeps. Inputs: every datatype the protocol has (BOOL, UINT8..UINT64, INT8..INT64, FP16,
FP32, FP64, BF16, BYTES) sent to an application that takes it, echoed back by the model.
Outputs: a model that returns values of each datatype a model's output can have (BOOL, INT64,
UINT64 at 2**64 - 1, FP64, BYTES). And the regression that started it: a uint64 output
>= 2**63 asked for as binary data, with a request pipelined behind it on one connection.
"""

from __future__ import annotations

import asyncio
import importlib.util
import struct
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio

from clipper import BatchingConfig, Clipper
from clipper.choices import GRPC_TRANSPORTS
from clipper.frontend.v2_request import NP_DTYPES
from tests.integration import models
from tests.integration.helpers import request

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        importlib.util.find_spec("grpc") is None, reason="the gRPC service needs grpcio"
    ),
]

SLO_US = 5_000_000
_LEN = struct.Struct("<I")

# (datatype, application, rows sent, what the echo model answers, its output datatype)
INPUTS: list[tuple[str, str, list[Any], list[Any], str]] = [
    ("BOOL", "ints", [[True, False], [False, True]], [[1, 0], [0, 1]], "INT64"),
    ("UINT8", "ints", [[0, 255], [1, 2]], [[0, 255], [1, 2]], "INT64"),
    ("UINT16", "ints", [[0, 65535], [1, 2]], [[0, 65535], [1, 2]], "INT64"),
    ("UINT32", "ints", [[0, 2**31 - 1], [1, 2]], [[0, 2**31 - 1], [1, 2]], "INT64"),
    ("UINT64", "ints", [[0, 2**31 - 1], [1, 2]], [[0, 2**31 - 1], [1, 2]], "INT64"),
    ("INT8", "ints", [[-128, 127], [1, 2]], [[-128, 127], [1, 2]], "INT64"),
    ("INT16", "ints", [[-32768, 32767], [1, 2]], [[-32768, 32767], [1, 2]], "INT64"),
    ("INT32", "ints", [[-(2**31), 2**31 - 1], [1, 2]], [[-(2**31), 2**31 - 1], [1, 2]], "INT64"),
    ("INT64", "ints", [[-(2**31), 5], [1, 2]], [[-(2**31), 5], [1, 2]], "INT64"),
    ("FP16", "doubles", [[0.5, -2.0], [1.0, 3.0]], [[0.5, -2.0], [1.0, 3.0]], "FP64"),
    ("FP32", "doubles", [[0.25, -3.5], [1.0, 3.0]], [[0.25, -3.5], [1.0, 3.0]], "FP64"),
    ("FP64", "doubles", [[0.1, 1e300], [1.0, 3.0]], [[0.1, 1e300], [1.0, 3.0]], "FP64"),
    ("BF16", "doubles", [[1.5, -2.0], [1.0, 3.0]], [[1.5, -2.0], [1.0, 3.0]], "FP64"),
    ("BYTES", "words", ["hi", "there"], ['"hi"', '"there"'], "BYTES"),
]
OUTPUTS = sorted(models.TYPED_OUTPUTS)
# gRPC has no contents field for these: raw_input_contents only (as in Triton).
NO_CONTENTS = {"FP16", "BF16"}
_CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# Every test runs against both gRPC transports: the real clients are the interoperability proof.
@pytest_asyncio.fixture(scope="module", loop_scope="module", params=GRPC_TRANSPORTS.names)
async def served(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Clipper, str]]:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport=request.param
    ) as c:
        batching = BatchingConfig(max_wait_micros=500)
        await asyncio.gather(
            c.deploy_model("echo-i", "1", models.echo_rows, input_type="ints", batching=batching),
            c.deploy_model(
                "echo-d", "1", models.echo_rows, input_type="doubles", batching=batching
            ),
            c.deploy_model(
                "echo-s", "1", models.echo_rows, input_type="strings", batching=batching
            ),
            c.deploy_model(
                "typed", "1", models.typed_outputs, input_type="strings", batching=batching
            ),
        )
        for app, itype, model in (
            ("ints", "integers", "echo-i"),
            ("doubles", "doubles", "echo-d"),
            ("words", "strings", "echo-s"),
            ("typed", "strings", "typed"),
        ):
            await c.register_application(app, itype, '"none"', SLO_US)
            await c.link_model_to_app(app, model)
        assert c.grpc is not None and c.grpc.port > 0
        yield c, f"127.0.0.1:{c.grpc.port}"


# -- encoding and decoding tensors by hand (the test must not trust the server's helpers) ------
def _raw(datatype: str, rows: list[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(_LEN.pack(len(s.encode())) + s.encode() for s in rows)
    if datatype == "BF16":  # the upper half of each FP32
        return (np.asarray(rows, "<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return np.asarray(rows, NP_DTYPES[datatype]).tobytes()


def _unraw(datatype: str, raw: bytes) -> list[Any]:
    if datatype != "BYTES":
        return list(np.frombuffer(raw, NP_DTYPES[datatype]).tolist())
    out, pos = [], 0
    while pos < len(raw):
        (n,) = _LEN.unpack_from(raw, pos)
        out.append(raw[pos + 4 : pos + 4 + n].decode())
        pos += 4 + n
    return out


def _flat(rows: list[Any]) -> list[Any]:
    return [v for r in rows for v in r] if rows and isinstance(rows[0], list) else rows


def _shape(rows: list[Any]) -> list[int]:
    return [len(rows), len(rows[0])] if isinstance(rows[0], list) else [len(rows)]


async def rest_infer(
    c: Clipper, app: str, datatype: str, rows: list[Any], *, binary_in: bool, binary_out: bool
) -> tuple[int, dict[str, Any], list[Any] | None]:
    """(status, the response's JSON, the output's flat values)."""
    tensor: dict[str, Any] = {"name": "input", "shape": _shape(rows), "datatype": datatype}
    doc: dict[str, Any] = {"inputs": [tensor]}
    if binary_out:
        doc["parameters"] = {"binary_data_output": True}
    headers = {"Content-Type": "application/json"}
    if binary_in:
        raw = _raw(datatype, rows)
        tensor["parameters"] = {"binary_data_size": len(raw)}
        head = orjson.dumps(doc)
        body = head + raw
        headers["Inference-Header-Content-Length"] = str(len(head))
    else:
        tensor["data"] = rows
        body = orjson.dumps(doc)
    resp = await request(
        f"{c.query_url}/v2/models/{app}/infer", "POST", body, headers=headers, limit_s=10
    )
    split = resp.headers.get("inference-header-content-length")
    head_doc = orjson.loads(resp.body if split is None else resp.body[: int(split)])
    if resp.status != 200:
        return resp.status, head_doc, None
    (out,) = head_doc["outputs"]
    if binary_out:
        assert split is not None, head_doc
        assert out["parameters"]["binary_data_size"] == len(resp.body) - int(split)
        return 200, head_doc, _unraw(out["datatype"], resp.body[int(split) :])
    return 200, head_doc, out["data"]


async def grpc_infer(
    url: str, app: str, datatype: str, rows: list[Any], *, raw: bool
) -> tuple[Any, Any, list[Any] | None]:
    """(status code, the response or the error's details, the output's flat values)."""
    import grpc

    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc

    req = pb.ModelInferRequest(model_name=app)
    tensor = req.inputs.add(name="input", datatype=datatype, shape=_shape(rows))
    if raw:
        req.raw_input_contents.append(_raw(datatype, rows))
    else:
        flat = _flat(rows)
        values = [v.encode() for v in flat] if datatype == "BYTES" else flat
        # FP16/BF16 have no field: sent as FP32 contents, which the server must refuse.
        getattr(tensor.contents, _CONTENTS.get(datatype, "fp32_contents")).extend(values)
    async with grpc.aio.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            response = await stub.ModelInfer(req, timeout=10)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details(), None
    (out,) = response.outputs
    if raw:
        return grpc.StatusCode.OK, response, _unraw(out.datatype, response.raw_output_contents[0])
    values = list(getattr(out.contents, _CONTENTS[out.datatype]))
    if out.datatype == "BYTES":
        values = [v.decode() for v in values]
    return grpc.StatusCode.OK, response, values


# -- the input sweep ---------------------------------------------------------------------------
@pytest.mark.parametrize(("binary_in", "binary_out"), [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize(("datatype", "app", "rows", "expected", "out_type"), INPUTS)
async def test_rest_input_datatypes(  # noqa: PLR0917 (parametrized)
    served: tuple[Clipper, str],
    datatype: str,
    app: str,
    rows: list[Any],
    expected: list[Any],
    out_type: str,
    binary_in: bool,
    binary_out: bool,
) -> None:
    c, _ = served
    status, doc, values = await rest_infer(
        c, app, datatype, rows, binary_in=binary_in, binary_out=binary_out
    )
    assert status == 200, doc
    assert "parameters" not in doc, doc  # a model answered: no default output
    (out,) = doc["outputs"]
    assert (out["datatype"], out["shape"]) == (out_type, _shape(expected))
    assert values == _flat(expected)


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize(("datatype", "app", "rows", "expected", "out_type"), INPUTS)
async def test_grpc_input_datatypes(  # noqa: PLR0917 (parametrized)
    served: tuple[Clipper, str],
    datatype: str,
    app: str,
    rows: list[Any],
    expected: list[Any],
    out_type: str,
    raw: bool,
) -> None:
    import grpc

    _, url = served
    if not raw and datatype in NO_CONTENTS:
        code, details, _ = await grpc_infer(url, app, datatype, rows, raw=False)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "raw_input_contents" in details
        return
    code, response, values = await grpc_infer(url, app, datatype, rows, raw=raw)
    assert code == grpc.StatusCode.OK, response
    assert "default" not in response.parameters
    (out,) = response.outputs
    assert (out.datatype, list(out.shape)) == (out_type, _shape(expected))
    assert values == _flat(expected)


# -- the output sweep --------------------------------------------------------------------------
def _expected_output(datatype: str) -> tuple[list[int], list[Any]]:
    value = models.TYPED_OUTPUTS[datatype]
    if datatype == "BYTES":
        return [1], [orjson.dumps(value).decode()]
    return [1, len(value)], value


@pytest.mark.parametrize("binary_out", [False, True])
@pytest.mark.parametrize("datatype", OUTPUTS)
async def test_rest_output_datatypes(
    served: tuple[Clipper, str], datatype: str, binary_out: bool
) -> None:
    c, _ = served
    status, doc, values = await rest_infer(
        c, "typed", "BYTES", [datatype], binary_in=False, binary_out=binary_out
    )
    assert status == 200, doc
    (out,) = doc["outputs"]
    shape, expected = _expected_output(datatype)
    assert (out["datatype"], out["shape"]) == (datatype, shape)
    assert values == expected  # exact: 2**64 - 1 and -2**63 are not rounded


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("datatype", OUTPUTS)
async def test_grpc_output_datatypes(served: tuple[Clipper, str], datatype: str, raw: bool) -> None:
    import grpc

    _, url = served
    code, response, values = await grpc_infer(url, "typed", "BYTES", [datatype], raw=raw)
    assert code == grpc.StatusCode.OK, response
    (out,) = response.outputs
    shape, expected = _expected_output(datatype)
    assert (out.datatype, list(out.shape)) == (datatype, shape)
    assert values == expected


# -- the regression: uint64 >= 2**63 as binary data, with a request pipelined behind it --------
async def test_uint64_binary_answer_does_not_stall_the_pipeline(
    served: tuple[Clipper, str],
) -> None:
    c, _ = served
    host, port = c.query_url.removeprefix("http://").rsplit(":", 1)

    def infer(value: str, binary: bool) -> bytes:
        doc: dict[str, Any] = {
            "inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [value]}]
        }
        if binary:
            doc["parameters"] = {"binary_data_output": True}
        body = orjson.dumps(doc)
        return (
            b"POST /v2/models/typed/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )

    async with asyncio.timeout(10):
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(infer("UINT64", True) + infer("BOOL", False))
            answers = []
            for _ in range(2):
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = int(_header(head, "content-length"))
                answers.append((head, await reader.readexactly(length)))
        finally:
            writer.close()
    (head1, body1), (head2, body2) = answers
    assert head1.startswith("HTTP/1.1 200"), (head1, body1)
    split = int(_header(head1, "inference-header-content-length"))
    assert orjson.loads(body1[:split])["outputs"][0]["datatype"] == "UINT64"
    assert _unraw("UINT64", body1[split:]) == [2**63, 2**64 - 1]
    assert head2.startswith("HTTP/1.1 200"), head2
    assert orjson.loads(body2)["outputs"][0]["data"] == [True, False]


def _header(head: str, name: str) -> str:
    for line in head.split("\r\n")[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == name:
            return value.strip()
    raise AssertionError(f"no {name} in {head!r}")


@pytest.mark.skipif(
    importlib.util.find_spec("tritonclient") is None, reason="needs tritonclient[http,grpc]"
)
async def test_the_triton_clients_read_uint64_outputs(served: tuple[Clipper, str]) -> None:
    c, url = served

    def call() -> tuple[Any, Any, Any]:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        name = np.array(["UINT64"], dtype=object)
        http = httpclient.InferenceServerClient(url=c.query_url.removeprefix("http://"))
        g = grpcclient.InferenceServerClient(url=url)
        try:
            hin = httpclient.InferInput("input", [1], "BYTES")
            hin.set_data_from_numpy(name, binary_data=False)
            outs = [httpclient.InferRequestedOutput("output", binary_data=b) for b in (True, False)]
            h_bin = http.infer("typed", [hin], outputs=[outs[0]]).as_numpy("output")
            h_json = http.infer("typed", [hin], outputs=[outs[1]]).as_numpy("output")
            gin = grpcclient.InferInput("input", [1], "BYTES")
            gin.set_data_from_numpy(name)
            g_raw = g.infer("typed", [gin]).as_numpy("output")
            return h_bin, h_json, g_raw
        finally:
            http.close()
            g.close()

    for got in await asyncio.to_thread(call):
        assert got.dtype == np.uint64
        assert got.tolist() == [[2**63, 2**64 - 1]]

"""Each protocol's encoding of the processor's typed answer, in process (no ports): the
Clipper REST document, the V2 REST response, the V2 gRPC ModelInferResponse, and the one
parsed V2 request that REST and gRPC share."""

from __future__ import annotations

import importlib.util
import struct
from typing import Any

import numpy as np
import orjson
import pytest

from clipper.errors import BadInputError, NotFoundError
from clipper.frontend import v2
from clipper.frontend.routes import RestReply, encode_predictions
from clipper.frontend.v2_request import InferRequest, InputTensor, input_payloads
from clipper.inputs import InputType
from clipper.query.prediction import NO_MODELS, SLO_MISSED, DefaultReason, Prediction, QueryRejected
from clipper.registry import Application

HAS_GRPC = importlib.util.find_spec("grpc") is not None

ANSWERED = Prediction(7, 42.0)
DEFAULTED = Prediction(8, -1.0, DefaultReason.SLO, SLO_MISSED)


def _app(input_type: str = "doubles") -> Application:
    return Application("a", InputType.parse(input_type), "-1.0", 100_000)


# -- Clipper REST ------------------------------------------------------------------------------
def test_rest_single_prediction_is_the_original_document() -> None:
    assert encode_predictions([ANSWERED]) == b'{"query_id":7,"output":42.0,"default":false}'


def test_rest_default_carries_its_explanation() -> None:
    assert encode_predictions([DEFAULTED]) == orjson.dumps(
        {"query_id": 8, "output": -1.0, "default": True, "default_explanation": SLO_MISSED}
    )


def test_rest_batch_and_numpy_outputs() -> None:
    preds = [Prediction(1, np.array([1.5, 2.5])), Prediction(2, np.float64(3.0))]
    assert orjson.loads(encode_predictions(preds)) == {
        "batch_predictions": [
            {"query_id": 1, "output": [1.5, 2.5], "default": False},
            {"query_id": 2, "output": 3.0, "default": False},
        ]
    }


def test_rest_selection_policy_answers_name_models_and_confidence() -> None:
    used = Prediction(3, 1, None, "", ("m1", "m2"), 0.5)
    low = Prediction(4, -1, DefaultReason.LOW_CONFIDENCE, "too low", ("m1",), 0.25)
    assert encode_predictions([used]) == (
        b'{"query_id":3,"output":1,"default":false,"models":["m1","m2"],"confidence":0.5}'
    )
    assert encode_predictions([low]) == (
        b'{"query_id":4,"output":-1,"default":true,"default_explanation":"too low",'
        b'"models":["m1"],"confidence":0.25}'
    )


def test_rest_reply_renders_answers_and_refusals() -> None:
    got: list[tuple[int, bytes, bytes]] = []
    reply = RestReply(
        lambda status, data, ctype=b"", headers=b"": got.append((status, data, ctype))
    )
    reply.answer([ANSWERED])
    reply.fail(QueryRejected("queue is full"))
    assert got[0][:2] == (200, encode_predictions([ANSWERED]))
    assert got[1][:2] == (503, b'{"error":"Service unavailable","cause":"queue is full"}')


def test_rest_reply_renders_feedback_outcomes() -> None:
    from clipper.query.selection import FeedbackError, NoPrediction

    got: list[tuple[int, bytes, bytes]] = []
    reply = RestReply(
        lambda status, data, ctype=b"", headers=b"": got.append((status, data, ctype))
    )
    reply.received()
    reply.fail(FeedbackError("bad label"))
    reply.fail(NoPrediction("no model"))
    json = b"application/json"
    assert got == [
        (200, b"Feedback received? 1", b"text/plain; charset=utf-8"),  # says text: it is text
        (400, b'{"error":"Feedback error","cause":"bad label"}', json),
        (503, b'{"error":"Service unavailable","cause":"no model"}', json),
    ]


# -- V2 REST -----------------------------------------------------------------------------------
def test_v2_rest_response_of_a_batch_with_a_default() -> None:
    header, raw = v2.encode_response("a", "1", "r-1", [ANSWERED, DEFAULTED])
    assert raw is None
    assert orjson.loads(header) == {
        "model_name": "a",
        "model_version": "1",
        "id": "r-1",
        "parameters": {"default": True, "default_explanations": [None, SLO_MISSED]},
        "outputs": [{"name": "output", "datatype": "FP64", "shape": [2], "data": [42.0, -1.0]}],
    }


def test_v2_rest_binary_output_follows_the_header() -> None:
    preds = [Prediction(1, [1, 2]), Prediction(2, [3, 4])]
    header, raw = v2.encode_response("a", "", None, preds, binary=True)
    doc = orjson.loads(header)
    assert "id" not in doc and "parameters" not in doc
    assert doc["outputs"] == [
        {
            "name": "output",
            "datatype": "INT64",
            "shape": [2, 2],
            "parameters": {"binary_data_size": 32},
        }
    ]
    assert raw == np.array([1, 2, 3, 4], dtype="<i8").tobytes()


def test_v2_rest_error_is_the_cause_alone() -> None:
    got: list[tuple[int, bytes]] = []
    v2.error_response(
        lambda status, data, ctype=b"", headers=b"": got.append((status, data)), NotFoundError("x")
    )
    assert got == [(404, b'{"error":"x"}')]


# -- the shared request ------------------------------------------------------------------------
def test_rest_json_and_binary_parse_into_the_same_payloads() -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    json_body = orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP64", "shape": [2, 2], "data": x.tolist()}]}
    )
    parsed = v2.parse_infer({}, json_body)
    header = orjson.dumps(
        {
            "id": "b",
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP64",
                    "shape": [2, 2],
                    "parameters": {"binary_data_size": 32},
                }
            ],
            "parameters": {"timeout": 5000, "binary_data_output": True},
        }
    )
    headers = {b"inference-header-content-length": str(len(header)).encode()}
    binary = v2.parse_infer(headers, header + x.tobytes())
    assert (binary.id, binary.binary_output, binary.slo_s) == ("b", True, 0.005)
    expected = [x[0].tobytes(), x[1].tobytes()]
    assert input_payloads(_app(), parsed.inputs) == expected
    assert input_payloads(_app(), binary.inputs) == expected


def test_shared_validation_messages() -> None:
    app = _app()
    with pytest.raises(BadInputError, match="needs 4 elements"):
        input_payloads(app, [InputTensor("input", "FP64", [2, 2], [1.0, 2.0, 3.0])])
    with pytest.raises(BadInputError, match="48 bytes"):
        input_payloads(app, [InputTensor("input", "FP64", [2, 3], raw=b"\0" * 8)])
    with pytest.raises(BadInputError, match="datatype BYTES"):
        input_payloads(app, [InputTensor("input", "BYTES", [1], ["a"])])
    with pytest.raises(BadInputError, match="probs"):
        v2.parse_infer({}, b'{"inputs": [], "outputs": [{"name": "probs"}]}')


# -- V2 gRPC -----------------------------------------------------------------------------------
needs_grpc = pytest.mark.skipif(not HAS_GRPC, reason="pip install grpcio for the gRPC service")


@needs_grpc
def test_grpc_contents_and_raw_parse_into_the_same_payloads() -> None:
    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc.server import parse_infer

    x = np.array([[1.5, 2.0], [3.0, -1.0]])
    contents = pb.ModelInferRequest(model_name="a", id="c")
    t = contents.inputs.add(name="input", datatype="FP64", shape=[2, 2])
    t.contents.fp64_contents.extend(x.ravel().tolist())
    contents.outputs.add(name="output")
    contents.parameters["timeout"].int64_param = 2000
    raw = pb.ModelInferRequest(model_name="a")
    raw.inputs.add(name="input", datatype="FP64", shape=[2, 2])
    raw.raw_input_contents.append(x.tobytes())
    parsed, parsed_raw = parse_infer(contents), parse_infer(raw)
    assert (parsed.id, parsed.binary_output, parsed.slo_s) == ("c", False, 0.002)
    assert (parsed_raw.id, parsed_raw.binary_output, parsed_raw.slo_s) == (None, True, None)
    expected = [x[0].tobytes(), x[1].tobytes()]
    assert input_payloads(_app(), parsed.inputs) == expected
    assert input_payloads(_app(), parsed_raw.inputs) == expected


@needs_grpc
def test_grpc_bytes_contents_are_elements() -> None:
    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc.server import parse_infer

    request = pb.ModelInferRequest(model_name="w")
    t = request.inputs.add(name="input", datatype="BYTES", shape=[2, 1])
    t.contents.bytes_contents.extend(["héllo".encode(), b"x"])
    got = input_payloads(_app("strings"), parse_infer(request).inputs)
    assert got == [b"h\xc3\xa9llo", b"x"]


@needs_grpc
def test_grpc_request_errors() -> None:
    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc.server import parse_infer

    request = pb.ModelInferRequest(model_name="a")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 1])
    request.inputs.add(name="other", datatype="FP64", shape=[1, 1])
    request.raw_input_contents.append(b"\0" * 8)
    with pytest.raises(BadInputError, match="2 inputs"):
        parse_infer(request)
    unknown = pb.ModelInferRequest(model_name="a")
    unknown.inputs.add(name="input", datatype="FP64", shape=[1, 1]).contents.fp64_contents.append(1)
    unknown.outputs.add(name="probs")
    with pytest.raises(BadInputError, match="probs"):
        parse_infer(unknown)


def _grpc_response(preds: list[Prediction], *, raw: bool) -> Any:
    from clipper.frontend.grpc.server import encode_response

    request = InferRequest([], "r-2" if raw else None, binary_output=raw)
    return encode_response("a", "1", request, preds)


@needs_grpc
def test_grpc_response_in_contents_with_a_default() -> None:
    response = _grpc_response([ANSWERED, DEFAULTED], raw=False)
    assert (response.model_name, response.model_version, response.id) == ("a", "1", "")
    assert response.parameters["default"].bool_param is True
    why = orjson.loads(response.parameters["default_explanations"].string_param)
    assert why == [None, SLO_MISSED]
    (out,) = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("output", "FP64", [2])
    assert list(out.contents.fp64_contents) == [42.0, -1.0]
    assert not response.raw_output_contents


@needs_grpc
def test_grpc_response_raw_bytes_and_numbers() -> None:
    words = _grpc_response([Prediction(1, {"u": "A"}), Prediction(2, "b")], raw=True)
    assert words.id == "r-2"
    assert "default" not in words.parameters
    (out,) = words.outputs
    assert (out.datatype, list(out.shape)) == ("BYTES", [2])
    elems = [b'{"u":"A"}', b'"b"']
    assert words.raw_output_contents[0] == b"".join(struct.pack("<I", len(e)) + e for e in elems)
    numbers = _grpc_response([Prediction(1, 3), Prediction(2, 4)], raw=True)
    assert numbers.outputs[0].datatype == "INT64"
    assert numbers.raw_output_contents[0] == np.array([3, 4], dtype="<i8").tobytes()
    single = _grpc_response([Prediction(1, -1.0, DefaultReason.NO_MODEL, NO_MODELS)], raw=False)
    assert orjson.loads(single.parameters["default_explanations"].string_param) == [NO_MODELS]


# -- every output datatype, and answers that cannot be encoded ---------------------------------
OUTPUT_CASES = [
    # (outputs, datatype, shape, little-endian layout of the binary form)
    ([True, False], "BOOL", [2], "?"),
    ([[True, False], [False, True]], "BOOL", [2, 2], "?"),
    ([-(2**63), 2**63 - 1], "INT64", [2], "<i8"),
    ([2**63, 2**64 - 1, 0], "UINT64", [3], "<u8"),
    ([[2**63], [1]], "UINT64", [2, 1], "<u8"),
    ([1, 2.5], "FP64", [2], "<f8"),
]


@pytest.mark.parametrize(("outputs", "datatype", "shape", "layout"), OUTPUT_CASES)
def test_v2_output_datatypes_in_json_and_binary(
    outputs: list[Any], datatype: str, shape: list[int], layout: str
) -> None:
    preds = [Prediction(i, o) for i, o in enumerate(outputs)]
    flat = np.asarray(outputs, dtype=layout).reshape(-1)
    header, raw = v2.encode_response("a", "1", None, preds)
    (tensor,) = orjson.loads(header)["outputs"]
    assert (tensor["datatype"], tensor["shape"]) == (datatype, shape)
    assert tensor["data"] == flat.tolist()  # exact: 2**64 - 1 is not rounded through a float
    header, raw = v2.encode_response("a", "1", None, preds, binary=True)
    (tensor,) = orjson.loads(header)["outputs"]
    assert (tensor["datatype"], tensor["shape"]) == (datatype, shape)
    assert raw == flat.tobytes()


def test_v2_integers_beyond_64_bits_go_as_json_text() -> None:
    header, raw = v2.encode_response(
        "a", "1", None, [Prediction(1, -1), Prediction(2, 2**63)], binary=True
    )
    (tensor,) = orjson.loads(header)["outputs"]
    assert tensor["datatype"] == "BYTES"  # neither INT64 nor UINT64 holds both exactly
    assert raw == b"".join(struct.pack("<I", len(e)) + e for e in (b"-1", b"9223372036854775808"))


class _Unencodable:
    """An output no encoder can write (orjson refuses it)."""


def test_every_reply_answers_500_when_encoding_raises() -> None:
    bad = [Prediction(1, _Unencodable())]
    got: list[tuple[int, bytes]] = []
    RestReply(lambda status, data, ctype=b"", headers=b"": got.append((status, data))).answer(bad)
    assert got[0][0] == 500
    doc = orjson.loads(got[0][1])
    assert doc["error"] == "Internal error"
    assert "encoding a Clipper REST answer failed" in doc["cause"]
    got.clear()
    req = InferRequest([], None, binary_output=True)
    app = Application("a", InputType.DOUBLES, "null", 1000)
    v2._V2Reply(
        lambda status, data, ctype=b"", headers=b"": got.append((status, data)), app, "1", req
    ).answer(bad)
    assert got[0][0] == 500
    assert "encoding a V2 infer response failed" in orjson.loads(got[0][1])["error"]


def test_a_query_whose_answer_raises_in_a_callback_is_failed_with_500() -> None:
    """The query's own finish (run from a replica's or the deadline timer's callback) turns
    an exception while answering into a 500 for that request, and does not raise."""
    from types import SimpleNamespace

    from clipper.query.prediction import AnswerFailed
    from clipper.query.single import _Query

    class Raising:
        def __init__(self) -> None:
            self.failed: list[Any] = []

        def answer(self, predictions: list[Prediction]) -> None:
            raise RuntimeError("boom")

        def fail(self, err: Any) -> None:
            self.failed.append(err)

    reply = Raising()
    proc: Any = SimpleNamespace(predictions=lambda q: [Prediction(1, 1.0)])
    q = _Query(proc, _app(), 1, reply=reply, t0=0.0, model="m")
    q.fill(0, 1.0, None)  # the last input arrives: finish() answers, answer() raises
    (err,) = reply.failed
    assert isinstance(err, AnswerFailed)
    assert err.status == 500
    assert err.cause == "answering a query of application 'a' failed: RuntimeError: boom"
    q.fill(0, 2.0, None)  # a late result after the answer is ignored
    assert len(reply.failed) == 1

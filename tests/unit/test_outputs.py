"""Outputs that cannot be served (clipper.rpc.outputs): NaN and infinities found wherever they
hide, objects that are not JSON named by type, sizes over the limit refused, and the partial
response that carries such per-input errors from a container to the frontend."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from clipper.errors import ModelOutputError
from clipper.query.prediction import DefaultReason
from clipper.query.seam import explain
from clipper.rpc import wire
from clipper.rpc.outputs import OutputRefused, non_finite, oversized, unservable
from clipper.rpc.wire import PredictResponse, decode_container_message

MSG = b"\x07\x00\x00\x00"


def _encode(o: object) -> bytes:
    return orjson.dumps(o, option=orjson.OPT_SERIALIZE_NUMPY, default=wire.json_default)


@pytest.mark.parametrize(
    ("value", "found"),
    [
        (1.5, None),
        ([1, "NaN", None, {"k": [True, 2.0]}], None),
        (float("nan"), "NaN"),
        (float("-inf"), "-Infinity"),
        ([[0.0, [1.0, float("inf")]]], "Infinity"),
        ({"a": {"b": (1.0, float("nan"))}}, "NaN"),
        (np.float32("nan"), "NaN"),
        (np.array([[1.0, 2.0], [3.0, -np.inf]]), "-Infinity"),
        (np.array([1, 2, 3]), None),
        (np.array([1.0, None, float("nan")], dtype=object), "NaN"),
    ],
)
def test_non_finite_numbers_are_found_wherever_they_are(value: Any, found: str | None) -> None:
    assert non_finite(value) == found


def test_a_cycle_does_not_recurse_forever() -> None:
    cycle: list[Any] = [1.0]
    cycle.append(cycle)
    assert non_finite(cycle) is None  # the encoder refuses it as not JSON
    assert unservable([cycle], _encode)[0].startswith("output is not JSON")


def test_unservable_names_each_bad_output_and_only_those() -> None:
    class Opaque:
        pass

    outputs = [1.0, float("nan"), Opaque(), {"v": np.array([np.inf])}, None, "null"]
    assert unservable(outputs, _encode) == {
        1: "output contains NaN (JSON has no such number)",
        2: "output is not JSON: Type is not JSON serializable: Opaque",
        3: "output contains Infinity (JSON has no such number)",
    }


def test_oversized_outputs_are_replaced_by_a_refusal_with_their_size() -> None:
    outputs: list[Any] = ["x" * 98, "x" * 99, [1, 2]]  # 100, 101 and 5 bytes encoded
    assert oversized(outputs, None, 100) == 1
    assert outputs[0] == "x" * 98 and outputs[2] == [1, 2]
    assert outputs[1] == OutputRefused(
        "output is 101 bytes, over the limit of 100 bytes per output (max_output_bytes)"
    )
    raw: list[Any] = ["a", "b"]
    assert oversized(raw, [10, 500], 100) == 1  # v3: the frames' own sizes
    assert raw[0] == "a" and isinstance(raw[1], OutputRefused)


def test_the_partial_response_round_trips_its_errors_per_output() -> None:
    frames = wire.encode_predict_response_partial(
        MSG, [1.0, float("nan"), "ok"], {1: "output contains NaN (JSON has no such number)"}
    )
    assert frames[3] == b"\x02\x00\x00\x00"
    assert decode_container_message(frames) == PredictResponse(
        7, [1.0, OutputRefused("output contains NaN (JSON has no such number)"), "ok"], None, False
    )


def test_a_fast_body_that_is_not_json_is_the_batchs_model_error() -> None:
    # orjson reads no NaN and no number too large for a double: such a body fails the batch
    # at once instead of leaving its queries to wait out their deadline.
    for body in (b"[1e999]", b"[NaN]", b"[1,"):
        frames = [b"", b"\x10\x00\x00\x00", MSG, b"\x00\x00\x00\x00", body]
        resp = decode_container_message(frames)
        assert isinstance(resp, PredictResponse) and resp.outputs is None
        assert resp.error is not None and resp.error.startswith("the outputs are not JSON")


def test_the_reason_names_the_model_and_what_was_wrong() -> None:
    reason, words = explain("m", ModelOutputError("output contains NaN (JSON has no such number)"))
    assert reason is DefaultReason.MODEL_ERROR
    assert words == (
        "The model m returned an output that cannot be served: output contains NaN "
        "(JSON has no such number)"
    )

"""RPC framing: golden frames written by hand from the spec (§4), round trips, malformed input."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from clipper.errors import WireError
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.wire import (
    FAST_TOKEN,
    Heartbeat,
    HeartbeatReply,
    HeartbeatType,
    NewContainer,
    PredictRequest,
    PredictResponse,
    decode_container_message,
    decode_frontend_message,
)

Z7 = b"\x00" * 7
Z3 = b"\x00" * 3

# ---- golden frames (bytes spelled out, not produced by struct) -------------------------------


def test_golden_heartbeat() -> None:
    assert wire.encode_heartbeat() == [b"", b"\x02\x00\x00\x00"]
    assert decode_container_message([b"", b"\x02\x00\x00\x00"]) == Heartbeat()


def test_golden_heartbeat_reply() -> None:
    frames = wire.encode_heartbeat_reply(HeartbeatType.REQUEST_CONTAINER_METADATA)
    assert frames == [b"", b"\x03" + Z3, b"\x02" + Z3, b"\x01" + Z3]
    assert decode_frontend_message(frames) == HeartbeatReply(1)
    keep = wire.encode_heartbeat_reply(HeartbeatType.KEEP_ALIVE)
    assert keep[3] == b"\x00" * 4
    assert decode_frontend_message(keep) == HeartbeatReply(HeartbeatType.KEEP_ALIVE)


def test_golden_metadata_as_seen_from_original_rpc_py() -> None:
    # §4.6: the original rpc.py sends exactly [b'', u32 0, b'm', b'v1', b'3', u32 3].
    original = [b"", b"\x00" * 4, b"m", b"v1", b"3", b"\x03" + Z3]
    assert wire.encode_new_container("m", "v1", 3, fast=False) == original
    assert decode_container_message(original) == NewContainer("m", "v1", 3, 3, fast=False)
    ours = wire.encode_new_container("m", "v1", 3)
    assert ours == [*original, b"clipper-serve/fast1"]
    assert FAST_TOKEN == b"clipper-serve/fast1"
    assert decode_container_message(ours) == NewContainer("m", "v1", 3, 3, fast=True)


def test_metadata_without_version_frame_is_accepted() -> None:
    msg = decode_container_message([b"", b"\x00" * 4, b"m", b"v1", b"4"])
    assert msg == NewContainer("m", "v1", 4, None, False)


def test_metadata_unknown_extra_frame_is_not_fast() -> None:
    msg = decode_container_message([b"", b"\x00" * 4, b"m", b"1", b"0", b"\x03" + Z3, b"other"])
    assert isinstance(msg, NewContainer)
    assert msg.fast is False
    assert msg.input_code == 0


DOUBLE_1 = b"\x00\x00\x00\x00\x00\x00\xf0\x3f"  # 1.0
DOUBLE_2 = b"\x00\x00\x00\x00\x00\x00\x00\x40"  # 2.0
DOUBLE_3 = b"\x00\x00\x00\x00\x00\x00\x08\x40"  # 3.0
DOUBLE_4 = b"\x00\x00\x00\x00\x00\x00\x10\x40"  # 4.0


def test_golden_v3_predict_request_two_doubles_inputs() -> None:
    items = [DOUBLE_1 + DOUBLE_2, DOUBLE_3 + DOUBLE_4]
    frames = wire.encode_predict_v3(7, InputType.DOUBLES, items)
    assert frames == [
        b"",
        b"\x03\x00\x00\x00",  # RPC version
        b"\x01\x00\x00\x00",  # ContainerContent
        b"\x07\x00\x00\x00",  # msg_id
        b"\x00\x00\x00\x00",  # Predict
        b"\x20" + Z7,  # header length 8 * (2 + 2) = 32
        b"\x03" + Z7 + b"\x02" + Z7 + b"\x10" + Z7 + b"\x10" + Z7,  # [doubles, n=2, 16, 16]
        DOUBLE_1 + DOUBLE_2,
        DOUBLE_3 + DOUBLE_4,
    ]
    req = decode_frontend_message(frames)
    assert isinstance(req, PredictRequest)
    assert req.msg_id_bytes == b"\x07\x00\x00\x00"
    assert req.input_code == 3
    assert req.items == items
    assert req.fast_meta is None
    assert req.payload is None
    assert req.n == 2
    assert req.sizes == (16, 16)
    # an int code is accepted as well as an InputType
    assert wire.encode_predict_v3(7, 3, items) == frames


def test_golden_v3_response_header_2_58_58() -> None:
    out = "x" * 58
    frames = wire.encode_predict_response_v3(b"\x05\x00\x00\x00", [out, out.encode()])
    assert frames[:5] == [
        b"",
        b"\x01\x00\x00\x00",
        b"\x05\x00\x00\x00",
        b"\x18" + Z7,  # 8 * (2 + 1) = 24
        b"\x02" + Z7 + b"\x3a" + Z7 + b"\x3a" + Z7,
    ]
    assert frames[5:] == [out.encode(), out.encode()]
    assert decode_container_message(frames) == PredictResponse(5, [out, out], None, True)


def test_v3_response_msg_id_is_echoed_raw() -> None:
    frames = wire.encode_predict_response_v3(b"\xff\xff\xff\xff", ["1"])
    assert frames[2] == b"\xff\xff\xff\xff"
    resp = decode_container_message(frames)
    assert isinstance(resp, PredictResponse)
    assert resp.msg_id == 0xFFFFFFFF


# ---- FAST framing ----------------------------------------------------------------------------


def test_fast_request_equal_numeric_items_carry_shape() -> None:
    items = [np.arange(3, dtype="<f8").tobytes(), np.arange(3, 6, dtype="<f8").tobytes()]
    frames = wire.encode_predict_fast(9, InputType.DOUBLES, items)
    assert frames[:5] == [b"", b"\x03" + Z3, b"\x01" + Z3, b"\x09" + Z3, b"\x10" + Z3]
    assert orjson.loads(frames[5]) == {"type": "doubles", "n": 2, "shape": [2, 3]}
    assert frames[6] == items[0] + items[1]
    req = decode_frontend_message(frames)
    assert isinstance(req, PredictRequest)
    assert req.items is None
    assert req.shape == (2, 3)
    assert req.sizes is None
    assert req.type_name == "doubles"
    assert req.input_code == 3
    assert req.fast_meta == {"type": "doubles", "n": 2, "shape": [2, 3]}
    assert req.payload is not None
    arr = np.frombuffer(req.payload, "<f8").reshape(req.shape)
    assert arr.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert [bytes(x) for x in req.item_frames()] == items


def test_fast_request_ragged_items_carry_sizes() -> None:
    items = [np.arange(3, dtype="<i4").tobytes(), np.arange(1, dtype="<i4").tobytes()]
    frames = wire.encode_predict_fast(1, InputType.INTS, items)
    assert orjson.loads(frames[5]) == {"type": "integers", "n": 2, "sizes": [12, 4]}
    req = decode_frontend_message(frames)
    assert isinstance(req, PredictRequest)
    assert req.shape is None
    assert req.sizes == (12, 4)
    assert [bytes(x) for x in req.item_frames()] == items


def test_fast_request_equal_strings_use_sizes_not_shape() -> None:
    frames = wire.encode_predict_fast(1, InputType.STRINGS, [b"ab", b"cd"])
    assert orjson.loads(frames[5]) == {"type": "strings", "n": 2, "sizes": [2, 2]}


def test_fast_request_json_type_survives_and_shares_code_4() -> None:
    items = [b'{"a":1}', b"[1,2]"]
    req = decode_frontend_message(wire.encode_predict_fast(2, InputType.JSON, items))
    assert isinstance(req, PredictRequest)
    assert req.type_name == "json"
    assert req.input_code == 4
    assert [bytes(x) for x in req.item_frames()] == items


def test_fast_request_accepts_memoryview_frames() -> None:
    items = [b"\x01\x00\x00\x00", b"\x02\x00\x00\x00"]
    frames = [memoryview(f) for f in wire.encode_predict_fast(3, InputType.INTS, items)]
    req = decode_frontend_message(frames)
    assert isinstance(req, PredictRequest)
    assert req.msg_id_bytes == b"\x03\x00\x00\x00"
    assert isinstance(req.msg_id_bytes, bytes)


def test_fast_ok_response_round_trip_with_numpy() -> None:
    outputs = [1.5, "a", {"k": [1, 2]}, np.float32(2.5), np.arange(2), None]
    frames = wire.encode_predict_response_fast(b"\x04\x00\x00\x00", outputs)
    assert frames[:4] == [b"", b"\x10" + Z3, b"\x04" + Z3, b"\x00" * 4]
    resp = decode_container_message(frames)
    assert resp == PredictResponse(4, [1.5, "a", {"k": [1, 2]}, 2.5, [0, 1], None], None, False)


def test_fast_ok_response_from_ndarray_and_odd_objects() -> None:
    body = wire.encode_predict_response_fast(b"\0\0\0\0", np.array([1.0, 2.0]))[4]
    assert orjson.loads(body) == [1.0, 2.0]
    strided = np.arange(6.0).reshape(2, 3)[:, ::2]  # not C-contiguous: goes via json_default
    body = wire.encode_predict_response_fast(b"\0\0\0\0", strided)[4]
    assert orjson.loads(body) == [[0.0, 2.0], [3.0, 5.0]]
    # Not JSON: refused, never served as its str() (a repr can carry an address).
    with pytest.raises(orjson.JSONEncodeError, match="not JSON serializable: complex"):
        wire.encode_predict_response_fast(b"\0\0\0\0", [complex(1, 2)])
    with pytest.raises(orjson.JSONEncodeError, match="not JSON serializable: object"):
        wire.encode_predict_response_fast(b"\0\0\0\0", [{"k": object()}])


def test_fast_error_response_round_trip() -> None:
    frames = wire.encode_predict_error_fast(b"\x02\x00\x00\x00", "ValueError: boom")
    assert frames == [b"", b"\x10" + Z3, b"\x02" + Z3, b"\x01" + Z3, b"ValueError: boom"]
    assert decode_container_message(frames) == PredictResponse(2, None, "ValueError: boom", False)


@pytest.mark.parametrize("t", list(InputType))
@pytest.mark.parametrize("fast", [False, True])
def test_request_round_trip_every_type(t: InputType, fast: bool) -> None:
    items = [b"\x01\x00\x00\x00\x02\x00\x00\x00", b"\x03\x00\x00\x00", b""]
    enc = wire.encode_predict_fast if fast else wire.encode_predict_v3
    req = decode_frontend_message(enc(123456, t, items))
    assert isinstance(req, PredictRequest)
    assert struct.unpack("<I", req.msg_id_bytes) == (123456,)
    assert req.input_code == t.code
    assert req.n == 3
    assert [bytes(x) for x in req.item_frames()] == items


def test_empty_batch_round_trips() -> None:
    for frames in (
        wire.encode_predict_v3(0, InputType.DOUBLES, []),
        wire.encode_predict_fast(0, InputType.DOUBLES, []),
    ):
        req = decode_frontend_message(frames)
        assert isinstance(req, PredictRequest)
        assert req.n == 0
        assert req.item_frames() == []
    resp = decode_container_message(wire.encode_predict_response_v3(b"\0\0\0\0", []))
    assert resp == PredictResponse(0, [], None, True)


def test_msg_id_out_of_u32_range() -> None:
    with pytest.raises(WireError, match="u32"):
        wire.encode_predict_v3(2**32, InputType.DOUBLES, [b""])
    with pytest.raises(WireError, match="4 raw bytes"):
        wire.encode_predict_response_v3(b"\x00", ["x"])


# ---- malformed frames ------------------------------------------------------------------------


def _v3_request() -> list[bytes]:
    return wire.encode_predict_v3(1, InputType.DOUBLES, [DOUBLE_1, DOUBLE_2 + DOUBLE_3])


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([], r"0 frames; expected at least 3"),
        ([b"x", b"\x03" + Z3, b"\x02" + Z3, b"\x00" * 4], r"frame 0 \(delimiter\)"),
        ([b"", b"\x02" + Z3, b"\x02" + Z3, b"\x00" * 4], r"frame 1 \(RPC version\): expected 3"),
        ([b"", b"\x03\x00", b"\x02" + Z3], r"frame 1 \(RPC version\): expected a 4-byte u32"),
        ([b"", b"\x03" + Z3, b"\x02" + Z3], r"at least 4 \(heartbeat type\)"),
        ([b"", b"\x03" + Z3, b"\x07" + Z3], r"frame 2 \(message type\)"),
        (_v3_request()[:6], r"at least 7"),
        (_v3_request()[:-1], r"expected 9 frames for 2 input items, got 8"),
        ([*_v3_request()[:7], DOUBLE_1, DOUBLE_2], r"frame 8 \(input item 1\): header says 16"),
        ([*_v3_request()[:6], b"\x01" * 12, *_v3_request()[7:]], r"frame 6 \(input header\)"),
        ([*_v3_request()[:5], b"\x08" + Z7, *_v3_request()[6:]], r"frame 5 .*says 8"),
        ([*_v3_request()[:3], b"\x01", *_v3_request()[4:]], r"frame 3 \(msg_id\)"),
        ([*_v3_request()[:4], b"\x01" + Z3, *_v3_request()[5:]], r"frame 4 \(request type\)"),
    ],
)
def test_frontend_message_errors(frames: list[bytes], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_frontend_message(frames)


def _fast(meta: object, payload: bytes) -> list[bytes]:
    head = wire.encode_predict_fast(1, InputType.DOUBLES, [DOUBLE_1])[:5]
    return [*head, orjson.dumps(meta), payload]


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([*_fast({}, b"")[:5], b"{not json", b""], r"frame 5 \(fast meta\): not JSON"),
        (_fast([1], b""), r"expected a JSON object"),
        (_fast({"type": "quaternions", "n": 1, "sizes": [8]}, DOUBLE_1), r"unknown input type"),
        (_fast({"type": "doubles", "n": -1, "sizes": []}, b""), r'"n" must be'),
        (_fast({"type": "doubles", "n": 1}, DOUBLE_1), r'needs "shape" or "sizes"'),
        (_fast({"type": "doubles", "n": 1, "sizes": [8, 8]}, DOUBLE_1), r'"sizes" must be 1'),
        (_fast({"type": "doubles", "n": 2, "shape": [1, 1]}, DOUBLE_1), r'"shape" must be'),
        (_fast({"type": "strings", "n": 1, "shape": [1, 8]}, DOUBLE_1), r"only for numeric"),
        (
            _fast({"type": "doubles", "n": 1, "shape": [1, 2]}, DOUBLE_1),
            r"meta says 16 bytes, got 8",
        ),
        (_fast({"type": "doubles", "n": 1, "sizes": [8]}, DOUBLE_1)[:6], r"expected 7 frames"),
    ],
)
def test_fast_request_errors(frames: list[bytes], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_frontend_message(frames)


def _v3_response() -> list[bytes]:
    return wire.encode_predict_response_v3(b"\x01" + Z3, ["ab", "c"])


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([b""], r"1 frames; expected at least 2"),
        ([b"", b"\x02\x00"], r"frame 1 \(message type\): expected a 4-byte u32, got 2"),
        (
            [b"", b"\x09" + Z3],
            r"frame 1 \(message type\): expected 0, 1, 2, 16, 17, 18 or 21, got 9",
        ),
        ([b"", b"\x00" * 4, b"m", b"v"], r"at least 5 \(model name"),
        ([b"", b"\x00" * 4, b"m", b"v", b"three"], r"frame 4 \(input type\): expected a decimal"),
        ([b"", b"\x00" * 4, b"\xff", b"v", b"3"], r"frame 2 \(model name\): not UTF-8"),
        ([b"", b"\x00" * 4, b"m", b"v", b"3", b"\x03"], r"frame 5 \(RPC version\)"),
        (_v3_response()[:-1], r"expected 7 frames for 2 outputs, got 6"),
        ([*_v3_response()[:5], b"ab", b"cd"], r"frame 6 \(output 1\): header says 1 bytes"),
        ([*_v3_response()[:4], b"\x02" + Z7, *_v3_response()[5:]], r"n=2 needs 24 bytes"),
        ([*_v3_response()[:4], b"\x02" + Z3, *_v3_response()[5:]], r"frame 4 \(output header\)"),
        ([*_v3_response()[:3], b"\x18", *_v3_response()[4:]], r"frame 3 \(output header length\)"),
        ([*_v3_response()[:5], b"\xffb", b"c"], r"frame 5 \(output 0\): not UTF-8"),
        ([b"", b"\x10" + Z3, b"\x01" + Z3, b"\x00" * 4], r"expected 5 frames"),
        ([b"", b"\x10" + Z3, b"\x01" + Z3, b"\x03" + Z3, b"x"], r"frame 3 \(status\)"),
        ([b"", b"\x10" + Z3, b"\x01" + Z3, b"\x02" + Z3, b"[]"], r"partial body"),
        (
            [
                b"",
                b"\x10" + Z3,
                b"\x01" + Z3,
                b"\x02" + Z3,
                b'{"outputs": [1], "errors": {"1": "x"}}',
            ],
            r"error index '1' is not one of the 1 outputs",
        ),
        ([b"", b"\x10" + Z3, b"\x01" + Z3, b"\x00" * 4, b"{}"], r"expected a JSON list"),
        ([b"", b"\x10" + Z3, b"\x01", b"\x00" * 4, b"[]"], r"frame 2 \(msg_id\)"),
    ],
)
def test_container_message_errors(frames: list[bytes], match: str) -> None:
    with pytest.raises(WireError, match=match):
        decode_container_message(frames)

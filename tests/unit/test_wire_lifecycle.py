"""Our leave and artifact messages on the RPC wire: they round-trip, and malformed ones are
refused naming the frame."""

from __future__ import annotations

import pytest

from clipper.errors import WireError
from clipper.rpc import wire


def test_goodbye_and_its_ack_round_trip() -> None:
    assert wire.decode_container_message(wire.encode_goodbye()) == wire.Goodbye()
    ack = wire.decode_frontend_message(wire.encode_heartbeat_reply(wire.HeartbeatType.GOODBYE_ACK))
    assert ack == wire.HeartbeatReply(wire.HeartbeatType.GOODBYE_ACK)


def test_artifact_request_and_chunk_round_trip() -> None:
    req = wire.decode_container_message(wire.encode_artifact_request("m", "v1", 2**33, 1024))
    assert req == wire.ArtifactRequest("m", "v1", 2**33, 1024)
    meta = {"sha256": "ab" * 32, "size": 10, "kind": "tar", "offset": 4}
    chunk = wire.decode_frontend_message(wire.encode_artifact_chunk(meta, b"xyz"))
    assert isinstance(chunk, wire.ArtifactChunk)
    assert chunk.meta == meta and bytes(chunk.data) == b"xyz" and chunk.error is None
    err = wire.decode_frontend_message(wire.encode_artifact_chunk({"error": "no such"}, b""))
    assert isinstance(err, wire.ArtifactChunk) and err.error == "no such"


def test_malformed_artifact_messages_are_refused() -> None:
    frames = wire.encode_artifact_request("m", "1", 0, 1)
    with pytest.raises(WireError, match=r"at least 6 \(model name"):
        wire.decode_container_message(frames[:5])
    too_much = wire.encode_artifact_request("m", "1", 0, wire.ARTIFACT_CHUNK_MAX + 1)
    with pytest.raises(WireError, match=r"frame 5 \(max bytes\): at most"):
        wire.decode_container_message(too_much)
    chunk = wire.encode_artifact_chunk({}, b"")
    with pytest.raises(WireError, match=r"frame 3 \(artifact meta\): not JSON"):
        wire.decode_frontend_message([*chunk[:3], b"{", b""])
    with pytest.raises(WireError, match=r"frame 3 \(artifact meta\): expected a JSON object"):
        wire.decode_frontend_message([*chunk[:3], b"[1]", b""])

"""Our shared-replica messages on the RPC wire (FRONTENDS, RETIRE, the queue report): they
round-trip, malformed or oversized ones are refused naming the frame, and none of them changes
a byte of what a v3 container or frontend is sent."""

from __future__ import annotations

import pytest

from clipper.errors import WireError
from clipper.inputs import InputType
from clipper.rpc import wire


def test_frontends_round_trip() -> None:
    addrs = ["tcp://10.0.0.1:7000", "tcp://frontend-b.local:7001"]
    frames = wire.encode_frontends(addrs)
    assert frames[:3] == [b"", b"\x03\x00\x00\x00", b"\x13\x00\x00\x00"]
    assert wire.decode_frontend_message(frames) == wire.Frontends(tuple(addrs))
    assert wire.decode_frontend_message(wire.encode_frontends([])) == wire.Frontends(())
    views = [memoryview(f) for f in frames]  # received with copy=False
    assert wire.decode_frontend_message(views) == wire.Frontends(tuple(addrs))


def test_local_sockets_round_trip_and_are_checked() -> None:
    pairs = [("tcp://10.0.0.1:7000", "ipc:///tmp/tmpab12/rpc"), ("tcp://h:1", "ipc:///run/x")]
    frames = wire.encode_local_sockets(pairs)
    assert frames[:3] == [b"", b"\x03\x00\x00\x00", b"\x16\x00\x00\x00"]
    assert wire.decode_frontend_message(frames) == wire.LocalSockets(tuple(pairs))
    views = [memoryview(f) for f in frames]
    assert wire.decode_frontend_message(views) == wire.LocalSockets(tuple(pairs))
    assert wire.decode_frontend_message(wire.encode_local_sockets([])) == wire.LocalSockets(())
    head = frames[:3]
    with pytest.raises(WireError, match=r"expected \(tcp, ipc\) pairs, got 1 frames"):
        wire.decode_frontend_message([*head, b"tcp://h:1"])
    with pytest.raises(WireError, match=r"frame 4 \(local socket\): expected ipc:///path"):
        wire.decode_frontend_message([*head, b"tcp://h:1", b"ipc://relative"])
    with pytest.raises(WireError, match=r"frame 3 \(local socket\): expected tcp://host:port"):
        wire.encode_local_sockets([("ipc:///a", "ipc:///b")])
    long = "ipc:///" + "p" * wire.MAX_ADDRESS_BYTES
    with pytest.raises(WireError, match="of at most 256 bytes"):
        wire.encode_local_sockets([("tcp://h:1", long)])
    many = [(f"tcp://h:{i}", f"ipc:///s{i}") for i in range(wire.MAX_FRONTENDS + 1)]
    with pytest.raises(WireError, match="at most 64 pairs, got 65"):
        wire.encode_local_sockets(many)


def test_new_container_features_round_trip_with_or_without_a_token() -> None:
    feature = wire.LOCAL_SOCKETS_FEATURE
    for token in ("m:1:0:ab.1", ""):
        frames = wire.encode_new_container("m", "1", 3, token=token, features=[feature])
        msg = wire.decode_container_message(frames)
        assert isinstance(msg, wire.NewContainer)
        assert (msg.token, msg.features) == (token, frozenset({feature}))
    # Without features the frames are as before (an older frontend reads the same bytes).
    plain = wire.encode_new_container("m", "1", 3, token="t")
    assert len(plain) == 8
    assert wire.decode_container_message(plain) == wire.NewContainer("m", "1", 3, 3, True, "t")


def test_retire_and_queue_report_round_trip() -> None:
    assert wire.decode_frontend_message(wire.encode_retire()) == wire.Retire()
    report = wire.decode_container_message(wire.encode_queue_report(7, 2))
    assert report == wire.QueueReport(7, 2)
    assert isinstance(report, wire.QueueReport) and report.elsewhere == 5


def test_frontends_are_bounded() -> None:
    many = [f"tcp://h:{7000 + i}" for i in range(wire.MAX_FRONTENDS + 1)]
    with pytest.raises(WireError, match="at most 64 addresses"):
        wire.encode_frontends(many)
    ok = wire.encode_frontends(many[:-1])
    with pytest.raises(WireError, match="at most 64 addresses, got 65"):
        wire.decode_frontend_message([*ok, b"tcp://h:1"])
    long = "tcp://" + "h" * wire.MAX_ADDRESS_BYTES + ":1"
    with pytest.raises(WireError, match=r"frame 3 \(frontend address\): expected 1 to 256"):
        wire.encode_frontends([long])
    head = wire.encode_frontends([])
    with pytest.raises(WireError, match=r"frame 4 \(frontend address\): expected 1 to 256"):
        wire.decode_frontend_message([*head, b"tcp://a:1", b""])


def test_malformed_frontends_retire_and_reports_are_refused() -> None:
    head = wire.encode_frontends([])
    with pytest.raises(WireError, match=r"frame 3 \(frontend address\): not UTF-8"):
        wire.decode_frontend_message([*head, b"tcp://\xff:1"])
    with pytest.raises(WireError, match=r"expected tcp://host:port, got 'ipc:///x'"):
        wire.decode_frontend_message([*head, b"ipc:///x"])
    with pytest.raises(WireError, match=r"expected tcp://host:port"):
        wire.decode_frontend_message([*head, b"tcp://nohost"])
    with pytest.raises(WireError, match="retire: expected 3 frames, got 4"):
        wire.decode_frontend_message([*wire.encode_retire(), b"x"])
    report = wire.encode_queue_report(1, 1)
    with pytest.raises(WireError, match="queue report: expected 4 frames, got 3"):
        wire.decode_container_message(report[:3])
    with pytest.raises(WireError, match=r"frame 2 \(queued\): expected a 4-byte u32"):
        wire.decode_container_message([report[0], report[1], b"\x01", report[3]])
    with pytest.raises(WireError, match=r"frame 3 \(mine\): 3 is more than the 1 queued"):
        wire.decode_container_message(wire.encode_queue_report(1, 3))


def test_v3_bytes_are_unchanged() -> None:
    # What an original Clipper container is sent, pinned byte for byte.
    assert wire.encode_heartbeat_reply(wire.HeartbeatType.KEEP_ALIVE) == [
        b"", b"\x03\x00\x00\x00", b"\x02\x00\x00\x00", b"\x00\x00\x00\x00",
    ]  # fmt: skip
    frames = wire.encode_predict_v3(5, InputType.DOUBLES, [b"\x00" * 8])
    assert frames == [
        b"", b"\x03\x00\x00\x00", b"\x01\x00\x00\x00", b"\x05\x00\x00\x00", b"\x00" * 4,
        (24).to_bytes(8, "little"),
        (3).to_bytes(8, "little") + (1).to_bytes(8, "little") + (8).to_bytes(8, "little"),
        b"\x00" * 8,
    ]  # fmt: skip
    assert wire.encode_heartbeat() == [b"", b"\x02\x00\x00\x00"]

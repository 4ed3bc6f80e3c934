"""The frontend's side of shared replicas: ``RpcServer.set_frontends`` sends FRONTENDS to every
registered fast replica and to each one that registers later (never to a v3 one),
``RpcServer.retire`` sends RETIRE to the replica with that token, and a replica's queue report
is kept on its connection. (Messages are handed to the inbound handler directly, as the socket
reader does; what goes out is recorded at the socket's send.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from clipper.clock import FakeClock
from clipper.errors import WireError
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.link import Connection
from clipper.rpc.server import RpcServer

Link = Connection[str]


@dataclass
class Sink:
    def deliver(self, link: Link, msg_id: int, outputs: object, error: object, n: int) -> None:
        pass

    def leaving(self, link: Link) -> int:
        return 0

    def in_flight(self, link: Link) -> int:
        return 0


@dataclass
class Endpoint:
    rpc: RpcServer[str]
    sent: list[list[bytes]] = field(default_factory=list)

    def sent_to(self, identity: bytes) -> list[object]:
        # What the container decodes (its DEALER sees no identity frame).
        return [wire.decode_frontend_message(f[1:]) for f in self.sent if f[0] == identity]

    def register(
        self, identity: bytes, *, fast: bool = True, token: str = "", sockets: bool = False
    ) -> None:
        features = (wire.LOCAL_SOCKETS_FEATURE,) if sockets else ()
        meta = wire.encode_new_container(
            "m", "1", InputType.BYTES.code, fast=fast, token=token, features=features
        )
        if not fast:
            meta = meta[:6]
        self.rpc._handle([identity, *meta])


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    clock = FakeClock(start=0.0)

    def register(msg: wire.NewContainer, identity: bytes) -> Link:
        return Connection(identity, 1, msg.fast, 3.0, clock.now(), token=msg.token)

    rpc: RpcServer[str] = RpcServer(
        host="127.0.0.1", port=0, clock=clock, registrar=register,
        on_removed=lambda link: None, sink=Sink(),
    )  # fmt: skip
    await rpc.start()
    ep = Endpoint(rpc)
    send = rpc._send

    def record(frames: list[bytes]) -> None:
        ep.sent.append(frames)
        send(frames)

    rpc._send = record  # type: ignore[method-assign]
    try:
        yield ep
    finally:
        await rpc.stop()


async def test_frontends_go_to_every_fast_replica_now_and_on_registering(
    endpoint: Endpoint,
) -> None:
    ep = endpoint
    ep.register(b"fast1")
    ep.register(b"v3", fast=False)
    assert ep.rpc.frontends is None
    ep.rpc.set_frontends(["tcp://a:1", "tcp://b:2"])
    listed = wire.Frontends(("tcp://a:1", "tcp://b:2"))
    assert ep.sent_to(b"fast1") == [listed]
    assert ep.sent_to(b"v3") == []  # the original protocol stays byte for byte
    assert ep.rpc.frontends == ("tcp://a:1", "tcp://b:2")
    ep.register(b"fast2")
    assert ep.sent_to(b"fast2") == [listed]
    ep.rpc.set_frontends(["tcp://b:2"])
    assert ep.sent_to(b"fast1") == [listed, wire.Frontends(("tcp://b:2",))]
    with pytest.raises(WireError, match="at most 64 addresses"):
        ep.rpc.set_frontends([f"tcp://h:{i}" for i in range(65)])
    assert ep.rpc.frontends == ("tcp://b:2",)  # a refused list is not remembered


async def test_local_sockets_go_first_and_only_to_replicas_that_asked(endpoint: Endpoint) -> None:
    # A replica that listed the local-sockets feature is told the frontends' Unix sockets
    # before each FRONTENDS list (so it dials them for the frontends on its machine); one
    # that did not never sees the message (an older replica would log it as malformed).
    ep = endpoint
    ep.register(b"new", token="t1", sockets=True)
    ep.register(b"old", token="t2")
    listed = ["tcp://a:1", "tcp://b:2"]
    ep.rpc.set_frontends(listed, {"tcp://a:1": "ipc:///run/a/rpc", "tcp://gone:3": "ipc:///x"})
    sockets = wire.LocalSockets((("tcp://a:1", "ipc:///run/a/rpc"),))
    assert ep.sent_to(b"new") == [sockets, wire.Frontends(tuple(listed))]
    assert ep.sent_to(b"old") == [wire.Frontends(tuple(listed))]
    ep.register(b"later", sockets=True)  # one that registers later gets both at once
    assert ep.sent_to(b"later") == [sockets, wire.Frontends(tuple(listed))]
    ep.rpc.set_frontends(["tcp://b:2"])  # no sockets now: an empty message says so
    assert ep.sent_to(b"new")[-2:] == [wire.LocalSockets(()), wire.Frontends(("tcp://b:2",))]


async def test_retire_goes_to_the_replica_with_that_token(endpoint: Endpoint) -> None:
    ep = endpoint
    ep.register(b"r1", token="slot-1")
    ep.register(b"r2", token="slot-2")
    assert ep.rpc.retire("slot-2") is True
    assert ep.sent_to(b"r2") == [wire.Retire()]
    assert ep.sent_to(b"r1") == []
    assert ep.rpc.retire("slot-3") is False
    assert ep.rpc.retire("") is False


async def test_a_queue_report_is_kept_on_its_connection(endpoint: Endpoint) -> None:
    ep = endpoint
    ep.register(b"r1")
    [link] = ep.rpc.replicas()
    assert link.queued_elsewhere == 0
    ep.rpc._handle([b"r1", *wire.encode_queue_report(5, 2)])
    assert link.queued_elsewhere == 3
    ep.rpc._handle([b"r1", *wire.encode_queue_report(1, 1)])
    assert link.queued_elsewhere == 0
    ep.rpc._handle([b"stranger", *wire.encode_queue_report(9, 0)])  # not registered: ignored
    assert [c.identity for c in ep.rpc.replicas()] == [b"r1"]

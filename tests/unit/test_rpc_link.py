"""The RPC endpoint keeps its own record of each connection (:class:`Connection`) and asks the
serving side, through its sink, what only that side knows: how many batches a connection has in
flight. A container that says goodbye is removed once the sink reports none left; artifact
requests go to the handler given at construction, with the reply path. The serving side's
:class:`Replica` reads the connection's identity, framing, liveness and token through its link.
(The server listens on a free port; messages are handed to its inbound handler directly, as the
socket reader does.)"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import zmq

from clipper.batching.scheduler import Replica
from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.link import Connection
from clipper.rpc.server import RpcServer, SendTo

Link = Connection[str]


@dataclass
class Sink:
    """Counts each connection's batches in flight, as the scheduler would."""

    pending: dict[bytes, int] = field(default_factory=dict)
    answers: list[tuple[str | None, int, list[object] | None]] = field(default_factory=list)
    leaving_asked: list[bytes] = field(default_factory=list)

    def deliver(
        self,
        link: Link,
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        self.answers.append((link.peer, msg_id, outputs))
        self.pending[link.identity] -= 1

    def leaving(self, link: Link) -> int:
        self.leaving_asked.append(link.identity)
        return self.pending.get(link.identity, 0)

    def in_flight(self, link: Link) -> int:
        return self.pending.get(link.identity, 0)


@dataclass
class Endpoint:
    rpc: RpcServer[str]
    sink: Sink
    removed: list[Link]
    artifact_requests: list[tuple[bytes, wire.ArtifactRequest, SendTo]]


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    clock = FakeClock(start=0.0)
    sink = Sink()
    removed: list[Link] = []
    requests: list[tuple[bytes, wire.ArtifactRequest, SendTo]] = []

    def register(msg: wire.NewContainer, identity: bytes) -> Link:
        link: Link = Connection(identity, 7, msg.fast, 3.0, clock.now(), token=msg.token)
        link.peer = f"{msg.name}:{msg.version}"
        return link

    rpc = RpcServer(
        host="127.0.0.1",
        port=0,
        clock=clock,
        registrar=register,
        on_removed=removed.append,
        sink=sink,
        artifacts=lambda identity, req, send: requests.append((identity, req, send)),
    )
    await rpc.start()
    try:
        yield Endpoint(rpc, sink, removed, requests)
    finally:
        await rpc.stop()


def _answer(msg_id: int, outputs: list[object]) -> list[bytes]:
    return wire.encode_predict_response_fast(struct.pack("<I", msg_id), outputs)


async def test_a_leaving_connection_is_removed_once_its_batches_are_answered(
    endpoint: Endpoint,
) -> None:
    rpc, sink = endpoint.rpc, endpoint.sink
    rpc._handle([b"c1", *wire.encode_new_container("m", "1", InputType.BYTES.code)])
    [link] = rpc.replicas()
    assert (link.identity, link.replica_id, link.fast, link.peer) == (b"c1", 7, True, "m:1")
    first = rpc.send_batch(link, InputType.BYTES, [b"a"])
    second = rpc.send_batch(link, InputType.BYTES, [b"b", b"c"])
    sink.pending[b"c1"] = 2

    rpc._handle([b"c1", *wire.encode_goodbye()])
    assert sink.leaving_asked == [b"c1"]
    assert rpc.replicas() == [link] and endpoint.removed == []  # two batches still out

    rpc._handle([b"c1", *_answer(first, ["A"])])
    assert endpoint.removed == []
    rpc._handle([b"c1", *_answer(second, ["B", "C"])])
    assert sink.answers == [("m:1", first, ["A"]), ("m:1", second, ["B", "C"])]
    assert endpoint.removed == [link] and rpc.replicas() == []


async def test_collect_reads_the_answers_waiting_in_the_socket_at_once(
    endpoint: Endpoint,
) -> None:
    """A deadline timer asks before it answers a default: the answer already in the socket is
    handled inside the call, not at the loop's next poll."""
    rpc, sink = endpoint.rpc, endpoint.sink
    rpc._handle([b"c1", *wire.encode_new_container("m", "1", InputType.BYTES.code)])
    [link] = rpc.replicas()
    msg_id = rpc.send_batch(link, InputType.BYTES, [b"a"])
    sink.pending[b"c1"] = 1
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.IDENTITY, b"c1")
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(rpc.address)
        dealer.send_multipart(_answer(msg_id, ["A"]))
        assert rpc._sock is not None and rpc._sock.poll(5000, zmq.POLLIN)  # it has arrived
        assert sink.answers == []  # nothing read it yet: no await since
        rpc.collect()
        assert sink.answers == [("m:1", msg_id, ["A"])]
        rpc.collect()  # nothing more waiting: a no-op
        assert len(sink.answers) == 1
    finally:
        dealer.close()
        ctx.term()


async def test_an_idle_connection_that_says_goodbye_is_removed_at_once(
    endpoint: Endpoint,
) -> None:
    rpc = endpoint.rpc
    rpc._handle([b"c1", *wire.encode_new_container("m", "1", InputType.BYTES.code)])
    [link] = rpc.replicas()
    rpc._handle([b"c1", *wire.encode_goodbye()])
    assert endpoint.removed == [link] and rpc.replicas() == []


async def test_artifact_requests_go_to_the_handler_with_the_reply_path(
    endpoint: Endpoint,
) -> None:
    rpc = endpoint.rpc
    rpc._handle([b"c9", *wire.encode_artifact_request("m", "1", 0, 1024)])  # no registration
    [(identity, req, send)] = endpoint.artifact_requests
    assert (identity, req.name, req.version, req.offset, req.max_bytes) == (
        b"c9",
        "m",
        "1",
        0,
        1024,
    )
    assert send == rpc.send_to


def test_a_replica_reads_its_connection_through_its_link() -> None:
    link: Connection[Replica] = Connection(b"id", 3, False, 9.0, 1.5, token="tok")
    replica = Replica(link)
    assert link.peer is replica
    assert (replica.identity, replica.replica_id, replica.fast) == (b"id", 3, False)
    assert (replica.timeout, replica.address, replica.last_seen) == (9.0, "tok", 1.5)
    link.last_seen = 4.0  # the endpoint hears from it
    assert replica.last_seen == 4.0

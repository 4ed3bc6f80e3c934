"""The RPC server's silence check runs on its clock: a fake clock's advance() removes a replica
silent longer than its timeout, and a heartbeat keeps it. (The server listens on a free port;
messages are handed to its inbound handler directly, as the socket reader does.)"""

from __future__ import annotations

from clipper.batching.scheduler import Replica
from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.server import RpcServer

TIMEOUT_S = 3.0


class NoAnswers:
    def deliver(
        self,
        replica: Replica,
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        raise AssertionError("no batch was sent")


async def test_a_silent_replica_is_removed_after_its_timeout_on_the_clock() -> None:
    clock = FakeClock(start=0.0)
    removed: list[tuple[Replica, float]] = []

    def register(msg: wire.NewContainer, identity: bytes) -> Replica:
        return Replica(identity, 0, msg.fast, TIMEOUT_S, clock.now())

    rpc = RpcServer(
        host="127.0.0.1",
        port=0,
        clock=clock,
        registrar=register,
        on_removed=lambda r: removed.append((r, clock.now())),
        sink=NoAnswers(),
        input_type_of=lambda _: InputType.BYTES,
    )
    await rpc.start()
    try:
        assert clock.pending() == 1  # the silence check, armed on the clock
        rpc._handle([b"c1", *wire.encode_new_container("m", "1", InputType.BYTES.code)])
        [replica] = rpc.replicas()
        clock.advance(2.5)
        rpc._handle([b"c1", *wire.encode_heartbeat()])  # heard from at 2.5
        clock.advance(3.0)  # 5.5: silent for 3.0, not more
        assert rpc.replicas() == [replica] and removed == []
        clock.advance(0.25)  # the check at 5.75 finds it silent for 3.25
        assert removed == [(replica, 5.75)]
        assert rpc.replicas() == []
    finally:
        await rpc.stop()
    assert clock.pending() == 0  # stop() cancelled the check

"""The RPC server's silence check runs on its clock: a fake clock's advance() removes a replica
silent longer than its timeout, and a heartbeat keeps it. (The server listens on a free port;
messages are handed to its inbound handler directly, as the socket reader does.)

A held event loop is not the replicas' silence: :class:`StallingClock` moves time without running
timers, as a loop busy in one callback does; the overdue check then runs late, and the time it was
late by is not counted against any replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
import zmq

from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.link import Connection
from clipper.rpc.server import RpcServer

TIMEOUT_S = 3.0


# What the serving side keeps per connection: nothing, here.
Link = Connection[None]


class NoAnswers:
    def deliver(
        self,
        link: Link,
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        raise AssertionError("no batch was sent")

    def leaving(self, link: Link) -> int:
        return 0

    def in_flight(self, link: Link) -> int:
        return 0


async def test_a_silent_replica_is_removed_after_its_timeout_on_the_clock() -> None:
    clock = FakeClock(start=0.0)
    removed: list[tuple[Link, float]] = []

    def register(msg: wire.NewContainer, identity: bytes) -> Link:
        return Connection(identity, 0, msg.fast, TIMEOUT_S, clock.now())

    rpc = RpcServer(
        host="127.0.0.1",
        port=0,
        clock=clock,
        registrar=register,
        on_removed=lambda r: removed.append((r, clock.now())),
        sink=NoAnswers(),
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


class StallingClock(FakeClock):
    def stall(self, seconds: float) -> None:
        """Time passes but no timer runs: the event loop is held (a huge request, a long GC).
        The next :meth:`advance` runs what fell due meanwhile, late."""
        self._t += seconds


@pytest.fixture
async def stalled() -> AsyncIterator[tuple[StallingClock, RpcServer[None], list[Link]]]:
    clock = StallingClock(start=0.0)
    removed: list[Link] = []

    def register(msg: wire.NewContainer, identity: bytes) -> Link:
        return Connection(identity, 0, msg.fast, TIMEOUT_S, clock.now())

    rpc = RpcServer(
        host="127.0.0.1",
        port=0,
        clock=clock,
        registrar=register,
        on_removed=removed.append,
        sink=NoAnswers(),
    )
    await rpc.start()
    try:
        yield clock, rpc, removed
    finally:
        await rpc.stop()


async def test_time_the_loop_was_held_is_not_counted_as_silence(
    stalled: tuple[StallingClock, RpcServer[None], list[Link]],
) -> None:
    clock, rpc, removed = stalled
    rpc._handle([b"c1", *wire.encode_new_container("m", "1", InputType.BYTES.code)])
    [replica] = rpc.replicas()
    clock.advance(2.5)
    rpc._handle([b"c1", *wire.encode_heartbeat()])  # heard from at 2.5
    clock.stall(5.0)  # the loop is held from 2.5 to 7.5; the check due at 2.75 has not run
    clock.advance(0)  # it runs now, 4.75 s late: silent 5.0 s by the clock, 0.25 s by ours
    assert removed == [] and rpc.replicas() == [replica]
    # Really silent from here on: removed once its 3 s have passed on the loop's own time,
    # i.e. 3 s plus the 4.75 s stall after its last message (2.5 + 7.75 = 10.25).
    clock.advance(2.5)  # 10.0
    assert removed == []
    clock.advance(0.5)  # the check at 10.5 finds it silent 3.25 s of loop time
    assert removed == [replica]


async def test_a_stall_before_the_last_message_excuses_nothing(
    stalled: tuple[StallingClock, RpcServer[None], list[Link]],
) -> None:
    clock, rpc, removed = stalled
    rpc._handle([b"c1", *wire.encode_new_container("m", "1", InputType.BYTES.code)])
    [replica] = rpc.replicas()
    clock.stall(5.0)
    clock.advance(0)  # late check at 5.0: the replica was heard at 0 -> the stall excuses it
    assert removed == []
    rpc._handle([b"c1", *wire.encode_heartbeat()])  # heard from at 5.0, after the stall
    clock.advance(3.0)  # silent 3.0 at 8.0: not more
    assert removed == []
    clock.advance(0.25)  # 8.25: the old stall does not extend its allowance
    assert removed == [replica]


async def test_messages_waiting_in_the_socket_are_read_before_judging(
    stalled: tuple[StallingClock, RpcServer[None], list[Link]],
) -> None:
    clock, rpc, removed = stalled
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.IDENTITY, b"c1")
    try:
        dealer.connect(rpc.address)
        dealer.send_multipart(wire.encode_new_container("m", "1", InputType.BYTES.code))
        await _until(lambda: len(rpc.replicas()) == 1)
        [replica] = rpc.replicas()
        # Silent 2.9 s, then a heartbeat lands in the socket, unread: the loop does not get
        # to read it before the checks run (no await in between).
        clock.advance(2.9)
        dealer.send_multipart(wire.encode_heartbeat())
        sock = rpc._sock
        assert sock is not None
        # Blocks the loop while it waits, as a busy loop would: the reader cannot run.
        assert sock.poll(5000, zmq.POLLIN), "the heartbeat never arrived"
        clock.advance(0.6)  # the check at 3.25 finds it silent, reads the heartbeat first
        assert removed == [] and rpc.replicas() == [replica]
        assert replica.last_seen == 3.25
    finally:
        dealer.close(linger=0)
        ctx.term()


async def _until(condition: Callable[[], bool], limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)

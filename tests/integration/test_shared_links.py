"""A shared replica's links, driven by in-test ZeroMQ ROUTERs that speak the wire: batches from
every link run in arrival order on one worker and each answer goes back on its own link; the
queue report counts every link's batches; FRONTENDS opens links to new addresses and drops
those no longer listed, never the last live one; a replica that is not ``--shared`` ignores it.
(The container runs :func:`clipper.container.runtime.serve` on a thread.)"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipper.container.runtime import serve
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.rpc.wire import (
    Goodbye,
    Heartbeat,
    HeartbeatType,
    PredictResponse,
    QueueReport,
    decode_container_message,
)
from tests.integration.test_container_runtime import TIMEOUT_S, MockFrontend

pytestmark = pytest.mark.integration

# Absent messages are checked for this long (heartbeats come every 50 ms).
QUIET_S = 0.5


class Gated:
    """Sums each row; a batch whose first value is 99 waits for :attr:`gate`. Records the
    order batches ran in."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.ran: list[float] = []

    def predict(self, xs: Any) -> list[float]:
        first = float(xs[0][0])
        if first == 99.0:
            assert self.gate.wait(TIMEOUT_S)
        self.ran.append(first)
        return [float(x.sum()) for x in xs]


class Replica:
    def __init__(
        self,
        model: object,
        address: str,
        frontends: list[str],
        shared: bool,
        activity_timeout: float = 10.0,
    ) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                serve(
                    model, name="m", version="1", input_type=InputType.DOUBLES,
                    address=address, frontends=frontends, shared=shared,
                    heartbeat_interval=0.05, stop_event=self.stop,
                    activity_timeout=activity_timeout,
                )  # fmt: skip
            except BaseException as e:
                self.errors.append(e)

        self.thread = threading.Thread(target=run, name="shared-replica")
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT_S)
        assert not self.thread.is_alive()
        assert self.errors == []


@pytest.fixture
def fronts() -> Iterator[list[MockFrontend]]:
    made = [MockFrontend() for _ in range(2)]
    try:
        yield made
    finally:
        for f in made:
            f.close()


def batch(msg_id: int, *rows: list[float]) -> list[bytes]:
    items = [np.array(r, dtype=np.float64).tobytes() for r in rows]
    return wire.encode_predict_fast(msg_id, InputType.DOUBLES, items)


def next_of(fe: MockFrontend, kind: type, identity: bytes | None = None) -> Any:
    """The next message of ``kind`` (from ``identity`` when given), skipping the rest."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        ident, frames = fe.recv(max(0.0, deadline - time.monotonic()))
        msg = decode_container_message(frames)
        if isinstance(msg, kind) and identity in (None, ident):
            return msg


def report(fe: MockFrontend, queued: int, mine: int) -> None:
    """Wait for a queue report saying exactly that."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        msg = next_of(fe, QueueReport)
        if msg == QueueReport(queued, mine):
            return
        assert time.monotonic() < deadline, f"last report {msg}, expected {queued}/{mine}"


def ask(fe: MockFrontend, identity: bytes, frames: list[bytes]) -> Any:
    """Send a batch; its answer (queue reports and heartbeats skipped)."""
    fe.send(identity, frames)
    return next_of(fe, PredictResponse, identity)


def quiet(fe: MockFrontend) -> bool:
    """Nothing arrives for QUIET_S (the replica has no link to it)."""
    return not fe.sock.poll(int(QUIET_S * 1000))


def test_batches_run_in_arrival_order_across_links_and_answer_on_their_own(
    fronts: list[MockFrontend],
) -> None:
    a, b = fronts
    model = Gated()
    replica = Replica(model, a.address, [b.address], shared=True)
    try:
        ida, _, _ = a.register()
        idb, _, _ = b.register()
        model.ran.clear()  # the smoke prediction before registering
        # Our frontends say who they are (FRONTENDS, or a fast batch): then reports flow.
        a.send(ida, wire.encode_frontends([a.address, b.address]))
        a.send(ida, batch(1, [99.0, 1.0]))  # runs first and holds the worker
        report(a, 1, 1)
        b.send(idb, batch(2, [2.0, 2.0]))
        report(a, 2, 1)
        report(b, 2, 1)
        a.send(ida, batch(3, [3.0, 3.0]))
        report(a, 3, 2)
        model.gate.set()
        assert next_of(a, PredictResponse) == PredictResponse(1, [100.0], None, False)
        assert next_of(a, PredictResponse) == PredictResponse(3, [6.0], None, False)
        assert next_of(b, PredictResponse) == PredictResponse(2, [4.0], None, False)
        assert model.ran == [99.0, 2.0, 3.0]  # arrival order, across links
        report(a, 0, 0)
    finally:
        replica.close()


def test_frontends_opens_and_drops_links_but_never_the_last_live_one(
    fronts: list[MockFrontend], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = fronts
    caplog.set_level(logging.INFO, logger="clipper.container")
    model = Gated()
    replica = Replica(model, a.address, [], shared=True)
    try:
        ida, _, _ = a.register()
        assert quiet(b)  # not told about b yet
        a.send(ida, wire.encode_frontends([a.address, b.address]))
        idb, _, _ = b.register()  # it dialled b and registers there
        assert isinstance(next_of(b, Heartbeat, idb), Heartbeat)

        b.send(idb, batch(1, [99.0, 1.0]))  # held until the gate opens
        a.send(ida, wire.encode_frontends([a.address]))  # b is gone from the list
        # b is told first (goodbye), its batch still answered, then the link closes once b
        # acknowledges.
        assert isinstance(next_of(b, Goodbye, idb), Goodbye)
        model.gate.set()
        assert next_of(b, PredictResponse, idb) == PredictResponse(1, [100.0], None, False)
        b.send(idb, wire.encode_heartbeat_reply(HeartbeatType.GOODBYE_ACK))
        deadline = time.monotonic() + TIMEOUT_S
        while f"link to {b.address} closed (0 batches unanswered)" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            a.recv()  # keep a's side read meanwhile
        while b.sock.poll(0):
            b.recv()  # what it sent before the link closed
        assert quiet(b)

        # A list without the only live link: that link stays (b is dialled meanwhile).
        a.send(ida, wire.encode_frontends([b.address]))
        idb2, _, _ = b.register()
        assert idb2 != idb  # a new link: a new identity
        assert f"frontend {a.address} no longer listed" not in caplog.text
        assert ask(a, ida, batch(4, [1.0, 1.0])) == PredictResponse(4, [2.0], None, False)
        # Now b is live: its own list leaves a (which is told).
        b.send(idb2, wire.encode_frontends([b.address]))
        assert isinstance(next_of(a, Goodbye, ida), Goodbye)
        assert ask(b, idb2, batch(5, [2.0, 3.0])) == PredictResponse(5, [5.0], None, False)
    finally:
        replica.close()


def test_a_replica_that_is_not_shared_ignores_frontends_and_sends_no_reports(
    fronts: list[MockFrontend],
) -> None:
    a, b = fronts
    replica = Replica(Gated(), a.address, [], shared=False)
    try:
        ida, _, _ = a.register()
        a.send(ida, wire.encode_frontends([a.address, b.address]))
        assert a.predict(ida, batch(1, [1.0, 2.0])) == PredictResponse(1, [3.0], None, False)
        assert quiet(b)
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline:  # heartbeats come, reports never
            if a.sock.poll(10):
                _, frames = a.recv()
                assert not isinstance(decode_container_message(frames), QueueReport)
    finally:
        replica.close()


def no_goodbye(*fes: MockFrontend) -> bool:
    """For QUIET_S no frontend of ``fes`` is told goodbye; each answers the heartbeats it gets
    (a live frontend: the replica's activity timeout never fires on its link)."""
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        for fe in fes:
            while fe.sock.poll(5):
                ident, frames = fe.recv()
                msg = decode_container_message(frames)
                if isinstance(msg, Goodbye):
                    return False
                if isinstance(msg, Heartbeat):
                    fe.send(ident, wire.encode_heartbeat_reply(HeartbeatType.KEEP_ALIVE))
    return True


def ipc_frontend(path: Path) -> MockFrontend:
    """A mock frontend that also listens on a Unix socket at ``path`` (the replica is told it
    is the socket of another mock's TCP address: what arrives here came over the socket)."""
    fe = MockFrontend()
    fe.sock.bind(f"ipc://{path}")
    return fe


def test_a_frontend_on_this_machine_is_dialled_on_its_unix_socket(
    fronts: list[MockFrontend], tmp_path: Path
) -> None:
    a, b_tcp = fronts
    b_ipc = ipc_frontend(tmp_path / "b.sock")
    replica = Replica(Gated(), a.address, [b_tcp.address], shared=True)
    try:
        ida, meta, _ = a.register()
        assert wire.LOCAL_SOCKETS_FEATURE in meta.features  # it asks to be told of sockets
        idb, _, _ = b_tcp.register()  # --frontend: over TCP until told otherwise
        a.send(ida, wire.encode_local_sockets([(b_tcp.address, f"ipc://{tmp_path}/b.sock")]))
        a.send(ida, wire.encode_frontends([a.address, b_tcp.address]))
        idx, _, _ = b_ipc.register()  # b's socket is dialled ...
        # ... and b's TCP link is kept until the socket's link is registered (b would
        # otherwise have this replica on neither for a moment), then left at the next list.
        a.send(ida, wire.encode_frontends([a.address, b_tcp.address]))
        assert no_goodbye(b_tcp)
        b_ipc.send(idx, wire.encode_heartbeat_reply(HeartbeatType.KEEP_ALIVE))
        assert ask(b_ipc, idx, batch(3, [1.0, 2.0])) == PredictResponse(3, [3.0], None, False)
        a.send(ida, wire.encode_frontends([a.address, b_tcp.address]))
        assert isinstance(next_of(b_tcp, Goodbye, idb), Goodbye)
        b_tcp.send(idb, wire.encode_heartbeat_reply(HeartbeatType.GOODBYE_ACK))
        assert ask(b_ipc, idx, batch(1, [2.0, 3.0])) == PredictResponse(1, [5.0], None, False)
        while b_tcp.sock.poll(0):
            b_tcp.recv()  # what it sent before the link closed
        assert quiet(b_tcp)
        # The next lists keep the socket's link: no new link, no goodbye.
        a.send(ida, wire.encode_local_sockets([(b_tcp.address, f"ipc://{tmp_path}/b.sock")]))
        a.send(ida, wire.encode_frontends([a.address, b_tcp.address]))
        assert ask(b_ipc, idx, batch(2, [1.0, 1.0])) == PredictResponse(2, [2.0], None, False)
        assert quiet(b_tcp)
    finally:
        replica.close()
        b_ipc.close()


def test_a_socket_path_that_is_no_socket_here_is_never_dialled(
    fronts: list[MockFrontend], tmp_path: Path
) -> None:
    # Another machine's frontend: its socket's path is absent here, or names something else.
    a, b = fronts
    (tmp_path / "plain-file").write_bytes(b"")
    replica = Replica(Gated(), a.address, [], shared=True)
    try:
        ida, _, _ = a.register()
        a.send(ida, wire.encode_local_sockets([
            (b.address, f"ipc://{tmp_path}/plain-file"),
            ("tcp://127.0.0.1:1", f"ipc://{tmp_path}/absent"),
        ]))  # fmt: skip
        a.send(ida, wire.encode_frontends([a.address, b.address]))
        idb, _, _ = b.register()  # its TCP address
        assert ask(b, idb, batch(1, [1.0, 2.0])) == PredictResponse(1, [3.0], None, False)
    finally:
        replica.close()


@pytest.mark.parametrize("linked_over_tcp", [False, True])
def test_a_unix_socket_that_never_answers_is_given_up_for_tcp(
    fronts: list[MockFrontend],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    linked_over_tcp: bool,
) -> None:
    # A socket file that takes no connection (bound, never listening): after the activity
    # timeout the replica dials that frontend's TCP address instead (or keeps the TCP link it
    # had, never left meanwhile), and keeps to it.
    a, b = fronts
    caplog.set_level(logging.INFO, logger="clipper.container")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(tmp_path / "dead.sock"))
    start = [b.address] if linked_over_tcp else []
    replica = Replica(Gated(), a.address, start, shared=True, activity_timeout=0.5)
    try:
        ida, _, _ = a.register()
        if linked_over_tcp:
            idb, _, _ = b.register()
        sockets = wire.encode_local_sockets([(b.address, f"ipc://{tmp_path}/dead.sock")])
        a.send(ida, sockets)
        a.send(ida, wire.encode_frontends([a.address, b.address]))
        if linked_over_tcp:
            deadline = time.monotonic() + TIMEOUT_S
            while "never answered" not in caplog.text:
                assert no_goodbye(b, a), "the TCP link was left for a socket that never answered"
                assert time.monotonic() < deadline
        else:
            idb, _, _ = b.register()
        assert f"the Unix socket ipc://{tmp_path}/dead.sock never answered" in caplog.text
        a.send(ida, sockets)
        a.send(ida, wire.encode_frontends([a.address, b.address]))
        assert ask(b, idb, batch(1, [4.0, 4.0])) == PredictResponse(1, [8.0], None, False)
        assert "linking on its Unix socket" not in caplog.text.split("never answered")[1]
    finally:
        replica.close()
        dead.close()

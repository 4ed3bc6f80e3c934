"""An answered Clipper REST query leaves no reference cycle: its reply, the connection's slot
that is its ``respond``, and the query that watched for the client leaving are freed by
reference counting the moment the answer is written. (A slot kept its watcher, the reply,
after the answer: every query was a cycle of reply, slot, query and its lists, and the cyclic
collector ran every hundred queries or so, with its older generations' millisecond passes.)"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from clipper.clock import FakeClock
from clipper.frontend.http import HttpServer, Respond, _Connection, _Slot, watch_client
from clipper.frontend.routes import RestReply
from clipper.query.prediction import Prediction
from tests.unit.test_http_turns import _Transport

REQUEST = b"POST /app/predict HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{}"


class _Query:
    """What a runner's waiting query holds: its reply, until it answers."""

    def __init__(self, reply: RestReply) -> None:
        self.reply: RestReply | None = reply

    def abandon(self) -> None:
        self.reply = None

    def answer(self) -> None:
        reply, self.reply = self.reply, None
        assert reply is not None
        reply.answer([Prediction(0, 1.0)])


@pytest.fixture
def saved_garbage() -> Iterator[list[Any]]:
    """The collector off, and what it finds unreachable kept for the test to look at."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def test_an_answered_query_is_freed_without_the_cyclic_collector(
    saved_garbage: list[Any],
) -> None:
    queries: list[_Query] = []

    def router(
        method: bytes, path: str, headers: dict[bytes, bytes], body: bytes, respond: Respond,
        *, t0: float | None = None,
    ) -> None:  # fmt: skip
        reply = RestReply(respond)
        watch_client(respond, reply)  # as the predict route does
        q = _Query(reply)
        reply.watch(q)  # as a runner does while its query waits
        queries.append(q)

    srv = HttpServer(router, host="127.0.0.1", port=0, max_body_bytes=1024, clock=FakeClock())
    conn = _Connection(srv)
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    for _ in range(3):
        conn.data_received(REQUEST)
        queries.pop().answer()
    assert len(transport.written) == 3 and all(b" 200 OK" in w for w in transport.written)
    gc.collect()
    kinds = {type(o) for o in saved_garbage}
    assert not kinds & {RestReply, _Slot, _Query}, kinds
    conn.connection_lost(None)

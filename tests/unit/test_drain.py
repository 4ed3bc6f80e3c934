"""A stop is a drain: readiness withdrawn, no new connection, every request already read answered
(``Connection: close`` on a connection's last answer), what is left at ``drain_timeout_s``
answered 503; driven without sockets, on a fake clock.

The same with real processes and a slow model: tests/integration/test_drain.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, cast

import orjson
import pytest

from clipper.clock import FakeClock
from clipper.frontend.http import HttpServer, Respond, _Connection, json_response
from clipper.server import Clipper

GET = b"GET /now HTTP/1.1\r\nHost: a\r\n\r\n"
HOLD = b"GET /hold HTTP/1.1\r\nHost: a\r\n\r\n"


class _Transport:
    """Enough of a transport for a connection that reads requests and writes answers."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after close"
        self.written += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def take(self) -> bytes:
        out = bytes(self.written)
        self.written.clear()
        return out


class _Listener:
    """Stands in for the asyncio server that start() binds."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def wait_closed(self) -> None:
        pass


class _Server:
    """An HttpServer as start() leaves it (no socket): ``/now`` answers at once, ``/hold``
    keeps its ``respond`` for the test to call."""

    def __init__(self) -> None:
        self.held: list[Respond] = []

        def router(
            method: bytes,
            path: str,
            headers: dict[bytes, bytes],
            body: bytes,
            respond: Respond,
            *,
            t0: float | None = None,
        ) -> None:
            if path == "/hold":
                self.held.append(respond)
            else:
                json_response(respond, 200, {"path": path})

        self.clock = FakeClock()
        self.http = HttpServer(
            router, host="127.0.0.1", port=0, max_body_bytes=1024, clock=self.clock
        )
        self.listener = _Listener()
        self.http._server = cast(Any, self.listener)

    def connect(self) -> tuple[_Connection, _Transport]:
        conn = _Connection(self.http)
        transport = _Transport()
        conn.connection_made(cast(Any, transport))
        return conn, transport


def _answers(raw: bytes) -> list[tuple[int, bool, bytes]]:
    """(status, closes the connection, body) of each answer in ``raw``."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = dict(line.lower().split(b": ", 1) for line in lines[1:])
        n = int(fields[b"content-length"])
        out.append((int(lines[0].split()[1]), fields.get(b"connection") == b"close", rest[:n]))
        raw = rest[n:]
    return out


def test_a_drain_closes_the_listener_and_each_connection_after_its_last_answer() -> None:
    s = _Server()
    busy, busy_t = s.connect()
    idle, idle_t = s.connect()
    idle.data_received(GET)  # an answered keep-alive connection
    assert _answers(idle_t.take()) == [(200, False, b'{"path":"/now"}')]
    busy.data_received(HOLD)
    assert s.http.owed() == 1

    s.http.begin_drain()
    assert s.listener.closed  # new connections are refused from now on
    assert not idle_t.closed and not busy_t.closed  # nothing owed is cut, nothing idle either
    # The idle connection's next request (a health check, a client's next query) is answered
    # and told to close.
    idle.data_received(GET)
    assert _answers(idle_t.take()) == [(200, True, b'{"path":"/now"}')]
    assert idle_t.closed
    # The request read before the drain is answered when its answer comes, and closes.
    assert s.http.owed() == 1 and busy_t.take() == b""
    json_response(s.held[0], 200, {"late": True})
    assert _answers(busy_t.take()) == [(200, True, b'{"late":true}')]
    assert busy_t.closed and s.http.owed() == 0


def test_pipelined_requests_are_all_answered_and_only_the_last_closes() -> None:
    s = _Server()
    conn, transport = s.connect()
    conn.data_received(HOLD + HOLD)
    s.http.begin_drain()
    first, second = s.held
    json_response(second, 200, {"n": 2})  # out of order: waits behind the first
    assert transport.take() == b"" and s.http.owed() == 1
    json_response(first, 200, {"n": 1})
    assert _answers(transport.take()) == [(200, False, b'{"n":1}'), (200, True, b'{"n":2}')]
    assert transport.closed


def test_a_request_being_read_when_the_drain_begins_is_waited_for_and_answered() -> None:
    s = _Server()
    conn, transport = s.connect()
    conn.data_received(GET[:10])
    s.http.begin_drain()
    assert s.http.owed() == 1  # its first bytes are in: it is owed an answer
    conn.data_received(GET[10:])
    assert _answers(transport.take()) == [(200, True, b'{"path":"/now"}')]
    assert s.http.owed() == 0


def test_abandon_answers_what_is_still_owed_503_with_the_cause_and_closes() -> None:
    s = _Server()
    a, a_t = s.connect()
    b, b_t = s.connect()
    a.data_received(HOLD + HOLD)
    b.data_received(GET)
    b_t.take()
    s.http.begin_drain()
    assert s.http.abandon("the drain ended: retry it") == 2
    answers = _answers(a_t.take())
    assert [(status, closes) for status, closes, _ in answers] == [(503, False), (503, True)]
    assert orjson.loads(answers[0][2]) == {
        "error": "Service Unavailable",
        "cause": "the drain ended: retry it",
    }
    assert a_t.closed and b_t.closed and s.http.owed() == 0
    json_response(s.held[0], 200, {})  # the real answer, too late: dropped
    assert a_t.take() == b""


# -- Clipper's drain: its order, its bound, on the fake clock -------------------------------------


class _Port:
    """A query port that records what the drain asks of it; ``owed`` is set by the test."""

    def __init__(self, events: list[str], c: Clipper) -> None:
        self.events = events
        self.c = c
        self.owed_now = 0
        self.causes: list[str] = []

    def begin_drain(self) -> None:
        # Readiness is withdrawn before the ports stop taking connections.
        assert self.c.catalog.withdrawn is not None
        self.events.append("begin_drain")

    def owed(self) -> int:
        return self.owed_now

    def abandon(self, cause: str) -> int:
        self.events.append("abandon")
        self.causes.append(cause)
        n, self.owed_now = self.owed_now, 0
        return n


async def _run(clock: FakeClock, seconds: float, task: asyncio.Task[None]) -> None:
    """Advance the fake clock in poll-sized steps, letting the drain run between them."""
    for _ in range(round(seconds / 0.01)):
        clock.advance(0.01)
        for _ in range(3):
            await asyncio.sleep(0)
        if task.done():
            return


@pytest.fixture
async def drained() -> Any:
    clock = FakeClock()
    c = Clipper(clock=clock, drain_timeout_s=5.0)
    c._drain_cut = asyncio.Event()
    events: list[str] = []
    port = _Port(events, c)
    c.http = cast(Any, port)
    try:
        yield c, clock, port, events
    finally:
        c._cleanup_tmp()


async def test_the_drain_withdraws_readiness_then_waits_for_what_is_owed(drained: Any) -> None:
    c, clock, port, events = drained
    port.owed_now = 3
    task = asyncio.create_task(c._drain())
    await _run(clock, 1.0, task)
    assert events == ["begin_drain"] and not task.done()
    assert c.catalog.reasons()[0].startswith("draining:") and not c.catalog.ready()
    port.owed_now = 0  # answered
    await _run(clock, 0.05, task)
    assert task.done() and events == ["begin_drain"]  # nothing abandoned
    await task


async def test_the_drain_timeout_answers_what_is_left_and_ends(drained: Any) -> None:
    c, clock, port, events = drained
    port.owed_now = 2
    task = asyncio.create_task(c._drain())
    await _run(clock, 4.9, task)
    assert not task.done()
    await _run(clock, 0.2, task)
    assert task.done() and events == ["begin_drain", "abandon"]
    assert "drain_timeout_s" in port.causes[0] and "5 s passed" in port.causes[0]
    await task


async def test_a_second_signal_ends_the_drain_at_once(drained: Any) -> None:
    c, clock, port, events = drained
    port.owed_now = 1
    task = asyncio.create_task(c._drain())
    await _run(clock, 0.5, task)
    c._drain_cut.set()
    await _run(clock, 0.05, task)
    assert task.done() and events == ["begin_drain", "abandon"]
    assert "a second signal" in port.causes[0]
    await task


async def test_nothing_owed_is_no_wait(drained: Any) -> None:
    c, _clock, _port, events = drained
    await c._drain()  # returns without the fake clock moving
    assert events == ["begin_drain"]


async def test_the_drain_delay_keeps_accepting_while_not_ready(drained: Any) -> None:
    """drain_delay_s: readiness goes at once, the listener only after the delay (balancers
    notice the readiness first), then the drain as usual."""
    c, clock, _port, events = drained
    c.config = replace(c.config, drain_delay_s=2.0)
    task = asyncio.create_task(c._drain())
    await _run(clock, 1.9, task)
    assert not c.catalog.ready() and c.catalog.reasons()[0].startswith("draining:")
    assert events == []  # still accepting
    await _run(clock, 0.2, task)
    assert task.done() and events == ["begin_drain"]
    await task


async def test_a_second_signal_cuts_the_drain_delay(drained: Any) -> None:
    c, clock, _port, events = drained
    c.config = replace(c.config, drain_delay_s=30.0)
    task = asyncio.create_task(c._drain())
    await _run(clock, 0.5, task)
    assert events == []
    c._drain_cut.set()
    await _run(clock, 0.05, task)
    assert task.done() and events == ["begin_drain"]
    await task

"""The HTTP server reports each loop turn that read requests (its first read, and when its
work was done): under saturation one turn reads hundreds of requests one after another, and
the turn's length is how long a request waited before its own first read."""

from __future__ import annotations

from typing import Any

import pytest

from clipper.clock import FakeClock
from clipper.frontend.http import HttpServer, Respond, _Connection, json_response

REQUEST = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"


class _Transport:
    """Enough of a transport for a connection that reads requests and writes answers."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, chunks: list[bytes]) -> None:
        self.written.extend(chunks)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def test_each_turn_that_read_requests_is_reported_once_with_its_length() -> None:
    clock = FakeClock()
    seen: list[float | None] = []

    def router(
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        seen.append(t0)
        json_response(respond, 200, {})

    srv = HttpServer(router, host="127.0.0.1", port=0, max_body_bytes=1024, clock=clock)
    turns: list[tuple[float, float]] = []
    srv.on_turn = lambda a, b: turns.append((a, b))
    conns = [_Connection(srv) for _ in range(3)]
    for c in conns:
        c.connection_made(_Transport())  # type: ignore[arg-type]
    start = clock.now()
    for c in conns[:2]:  # one turn reads two connections, 3 ms of work apart
        c.data_received(REQUEST)
        clock._t += 0.003  # the time the reads take, inside the turn (no timers run)
    assert seen == [start, pytest.approx(start + 0.003)]  # each request from its own read
    assert turns == []
    clock.advance(0.0)  # the next turn: the end of the first is reported
    [(began, ended)] = turns
    assert began == start and ended == pytest.approx(start + 0.006)
    clock.advance(0.01)
    conns[2].data_received(REQUEST)
    clock.advance(0.0)
    assert len(turns) == 2 and turns[1][0] == pytest.approx(start + 0.016)
    for c in conns:
        c.connection_lost(None)

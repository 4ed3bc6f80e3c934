"""The dashboard's live clients: server-sent event streams, bounded in number and in what each
may hold unsent.

Every sample is encoded once and written to every stream. Writing never waits: a client that
still holds more than ``max_buffer_bytes`` unsent when the next event is due is too slow to
follow, and is closed (its page reconnects and starts again from a fresh snapshot). Beyond
``max_clients`` streams a new one is refused with a 503 that says so.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from clipper.frontend.http import Stream

__all__ = ["EventHub", "encode_event"]

log = logging.getLogger("clipper.dashboard")

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def encode_event(name: str, doc: Any) -> bytes:
    """One server-sent event: ``event: <name>`` and its JSON document on one ``data:`` line
    (orjson writes no newline)."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(doc, option=_NUMPY))


class EventHub:
    __slots__ = ("_clients", "_closed", "dropped", "max_buffer_bytes", "max_clients", "refused")

    def __init__(self, *, max_clients: int, max_buffer_bytes: int) -> None:
        self.max_clients = max_clients
        self.max_buffer_bytes = max_buffer_bytes
        self._clients: set[Stream] = set()
        self.dropped = 0  # clients closed for falling behind
        self.refused = 0  # streams refused beyond max_clients
        self._closed = False

    def __len__(self) -> int:
        return len(self._clients)

    @property
    def closed(self) -> bool:
        """Closed by :meth:`close_all`: the frontend is stopping."""
        return self._closed

    @property
    def full(self) -> bool:
        return len(self._clients) >= self.max_clients

    def attach(self, stream: Stream, first: bytes) -> None:
        """Follow ``stream`` from now on, after writing ``first`` (its snapshot) to it."""
        if stream.closed:
            return  # the client left before its stream opened
        if self._closed:
            stream.abort()  # the frontend is stopping
            return
        self._clients.add(stream)
        stream.on_close = lambda: self._clients.discard(stream)
        stream.write(first)

    def publish(self, data: bytes) -> None:
        """Write one event to every client that keeps up; close those that do not."""
        for stream in list(self._clients):
            if stream.buffered > self.max_buffer_bytes:
                self._clients.discard(stream)
                self.dropped += 1
                log.warning(
                    "dashboard client dropped: %d bytes unsent (max %d); %d dropped so far",
                    stream.buffered, self.max_buffer_bytes, self.dropped,
                )  # fmt: skip
                stream.abort()
                continue
            stream.write(data)

    def close_all(self) -> None:
        """Cut every stream now (the frontend is stopping), and any opened later."""
        self._closed = True
        for stream in list(self._clients):
            stream.abort()
        self._clients.clear()

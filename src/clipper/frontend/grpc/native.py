"""A lean gRPC transport for the V2 service: HTTP/2 (h2c, prior knowledge) on the event loop.

grpc.aio hands every call from its completion-queue thread to the loop; that hand-off, not our
code, capped V2 gRPC at a fraction of V2 REST. This transport is an :class:`asyncio.Protocol`
on the frontend's own loop, like the REST server (:mod:`clipper.frontend.http`), and serves
unary calls only, which is all ``inference.GRPCInferenceService`` needs. This module is the
server: its port, connection hygiene (limit, preface and idle timeouts, the sweep that also
enforces each stream's body and send timeouts), drain and stop. One connection's HTTP/2 is
:mod:`clipper.frontend.grpc.h2_connection`; its limits :mod:`clipper.frontend.grpc.h2_limits`;
HPACK :mod:`clipper.frontend.grpc.hpack_blocks`. See docs/v2-protocol.md and docs/security.md.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from clipper.clock import Clock, MonotonicClock, TimerHandle, sleep
from clipper.frontend.grpc import inference_pb2 as pb
from clipper.frontend.grpc.h2_connection import Connection
from clipper.frontend.grpc.h2_frames import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
)
from clipper.frontend.grpc.h2_limits import H2Limits
from clipper.frontend.grpc.hpack_blocks import HeaderCache, error_block, header_block
from clipper.frontend.grpc.server import Servicer

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from clipper.query.runtime import QueryServices

# The frame and error codes are re-exported: what a test or tool speaking raw HTTP/2 to this
# server needs, from the module that names the server.
__all__ = [
    "ACK", "CANCEL", "COMPRESSION_ERROR", "CONTINUATION", "DATA", "END_HEADERS", "END_STREAM",
    "ENHANCE_YOUR_CALM", "FLOW_CONTROL_ERROR", "FRAME_SIZE_ERROR", "GOAWAY", "HEADERS",
    "NO_ERROR", "PADDED", "PING", "PREFACE", "PRIORITY", "PROTOCOL_ERROR", "PUSH_PROMISE",
    "REFUSED_STREAM", "RST_STREAM", "SETTINGS", "WINDOW_UPDATE", "HeaderCache",
    "NativeGrpcServer", "ProtocolError", "error_block", "frame", "header_block",
]  # fmt: skip


def _call_soon(callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_soon(callback)


class NativeGrpcServer:
    """The V2 gRPC service on the event loop, over a frontend's query services, on
    ``host:port`` (port 0 picks a free port; :attr:`port` is the bound one after :meth:`start`).
    ``max_message_bytes`` bounds a request message (the frontend's max_body_bytes);
    ``limits`` are the per-peer limits (:class:`~clipper.frontend.grpc.h2_limits.H2Limits`),
    of which ``body_timeout_s`` and ``max_buffered_bytes`` are the frontend's settings."""

    def __init__(
        self,
        svc: QueryServices,
        *,
        host: str,
        port: int,
        max_message_bytes: int = 10 * 2**20,
        clock: Clock | None = None,
        max_connections: int = 10_000,
        preface_timeout_s: float = 10.0,
        idle_timeout_s: float = 300.0,
        body_timeout_s: float | None = None,
        max_buffered_bytes: int | None = None,
        limits: H2Limits | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.svc = svc
        self.host = host
        self.port = port
        # SO_REUSEPORT: the worker processes of one machine share the port (clipper.workers).
        self.reuse_port = reuse_port
        self.max_message_bytes = max_message_bytes
        self.clock: Clock = clock or MonotonicClock()
        limits = limits or H2Limits()
        if body_timeout_s is not None:
            limits = replace(limits, body_timeout_s=body_timeout_s)
        if max_buffered_bytes is not None:
            limits = replace(limits, buffered_bytes=max_buffered_bytes)
        if limits.connection_window < max_message_bytes + 5:
            # Refilled only as calls are dispatched: the window must hold the largest message.
            limits = replace(limits, connection_window=min(max_message_bytes + 5, MAX_WINDOW))
        self.limits = limits
        self.buffered = 0  # request body bytes held by all connections (limits.buffered_bytes)
        # How a connection that used its share of a loop turn asks for the next one.
        self.soon: Callable[[Callable[[], None]], object] = _call_soon
        # Connection hygiene, as on the HTTP ports: a connection limit (refused with GOAWAY
        # ENHANCE_YOUR_CALM), a deadline for the connection preface (a silent or slow client
        # is closed) and an idle limit (no stream open for that long: GOAWAY, then close;
        # gRPC clients reconnect by themselves).
        self.max_connections = max_connections
        self.preface_timeout_s = preface_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.refused = 0
        self._sweeper: TimerHandle | None = None
        self.connections: set[Connection] = set()
        self.tasks: set[asyncio.Future[Any]] = set()
        self._server: asyncio.Server | None = None
        self.draining = False  # begin_drain(): no new connections or calls, those open answered
        servicer = Servicer(svc)
        self.methods: dict[bytes, tuple[Any, Callable[[Any, Any], Coroutine[Any, Any, Any]]]] = {
            b"ServerLive": (pb.ServerLiveRequest, servicer.ServerLive),
            b"ServerReady": (pb.ServerReadyRequest, servicer.ServerReady),
            b"ModelReady": (pb.ModelReadyRequest, servicer.ModelReady),
            b"ServerMetadata": (pb.ServerMetadataRequest, servicer.ServerMetadata),
            b"ModelMetadata": (pb.ModelMetadataRequest, servicer.ModelMetadata),
            b"ModelConfig": (pb.ModelConfigRequest, servicer.ModelConfig),
        }

    async def start(self) -> None:
        """Bind and serve on the running event loop."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), self.host, self.port, reuse_address=True,
            reuse_port=self.reuse_port,
        )  # fmt: skip
        self.port = self._server.sockets[0].getsockname()[1]
        self._arm_sweep()

    def _arm_sweep(self) -> None:
        # One timer for all connections, not one per connection: the hot path stays free of
        # timer handling, and a sweep costs O(connections) a few times per timeout.
        limits = self.limits
        period = min(
            self.preface_timeout_s, self.idle_timeout_s, limits.body_timeout_s,
            limits.send_timeout_s,
        )  # fmt: skip
        period = max(period / 4, 0.01)
        self._sweeper = self.clock.call_later(period, self._sweep)

    def _sweep(self) -> None:
        now = self.clock.now()
        for conn in list(self.connections):
            if conn.closed:
                continue
            if not conn.preface and now - conn.opened >= self.preface_timeout_s:
                conn.closed = True
                conn.transport.close()  # never spoke HTTP/2: nothing to say to it
            elif not conn.streams and now - conn.last_active >= self.idle_timeout_s:
                conn._goaway(NO_ERROR, "idle")
            elif conn.streams:
                conn.expire(now)
        self._arm_sweep()

    def begin_drain(self) -> None:
        """Stop accepting connections (the listening socket closes) and send every connection
        a GOAWAY naming the last call it opened: calls already opened are answered, new ones
        are refused (REFUSED_STREAM: a client retries those elsewhere)."""
        server = self._server
        if server is None or self.draining:
            return
        self.draining = True
        server.close()
        for conn in list(self.connections):
            conn.goaway = True
            if not conn.closed:
                conn.transport.write(
                    frame(GOAWAY, 0, 0, struct.pack(">II", conn.last_id, NO_ERROR))
                )

    def owed(self) -> int:
        """Calls opened and not answered yet, over all connections."""
        return sum(len(c.streams) for c in self.connections if not c.closed)

    def abandon(self, cause: str) -> int:
        """Answer every call still open UNAVAILABLE with ``cause`` (a drain's time is up);
        how many were answered so."""
        n = 0
        for conn in list(self.connections):
            for stream in list(conn.streams.values()):
                n += 1
                conn.send_error(stream, 14, cause)  # UNAVAILABLE: the client may retry
        return n

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: GOAWAY to every connection (:meth:`begin_drain`), ``grace`` seconds
        for calls in flight, then UNAVAILABLE for those still open, and close."""
        if self._server is None:
            return
        self.begin_drain()
        server, self._server = self._server, None
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        deadline = self.clock.now() + (grace or 0.0)
        # Polled: shutdown only, and a drain event per connection would cost the hot path.
        while self.owed() and self.clock.now() < deadline:
            await sleep(self.clock, 0.01)
        self.abandon("the server stopped before this call was answered: retry it")
        for conn in list(self.connections):
            conn.closed = True
            conn.transport.close()
        for task in list(self.tasks):
            task.cancel()
        await server.wait_closed()

"""One container's link to one frontend: its DEALER socket and what the container knows of it.

A container serves one frontend (the classic case) or, started with ``--shared``, every frontend
of a deployment; it then holds one :class:`FrontendLink` per frontend address. Each link has its
own socket (so its own ZeroMQ identity at the frontend), its own connection monitor, its own
session counter (bumped on every reconnect: results of an older session are dropped, since the
frontend would not know the new identity's batches), its own count of batches received and not
answered, and its own heartbeat and silence timers. The container's main thread owns every link;
the predict worker only reads :attr:`session` and :attr:`closed` to skip dead work.
"""

from __future__ import annotations

import logging

import zmq

from clipper.container.presence import ConnectionWatch, configure_reconnect
from clipper.rpc.auth import ClientKeys, apply_client_keys
from clipper.rpc.wire import encode_heartbeat

__all__ = ["FrontendLink"]


class FrontendLink:
    """The container's connection to the frontend at :attr:`address` (main thread only)."""

    def __init__(
        self,
        address: str,
        *,
        keys: ClientKeys | None,
        heartbeat_interval: float,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.address = address
        # A frontend's Unix socket takes no CURVE: its directory admits only the deployment's
        # user (clipper.rpc.server.RpcServer.local_address).
        self.keys = None if address.startswith("ipc://") else keys
        self.heartbeat_interval = heartbeat_interval
        self.log = log
        self.sock: zmq.Socket[bytes] | None = None
        self.watch: ConnectionWatch | None = None
        self.session = 0
        # Batches of this session received and not yet answered.
        self.pending = 0
        # The frontend answered on this session (periodic heartbeats only then, like rpc.py).
        self.connected = False
        # It acknowledged our metadata: registered, so this link makes the container ready.
        self.registered = False
        # It sent a message only our frontends send: it may be sent queue reports.
        self.ours = False
        # While leaving: its goodbye was acknowledged, or there is nobody to wait for.
        self.acked = False
        # Set when this frontend is left alone (no longer listed): by when the link closes
        # even if batches are still unanswered (0.0: not being left).
        self.retiring_by = 0.0
        self.closed = False
        self.last_rx = 0.0
        self.next_hb = 0.0

    def open(self, ctx: zmq.Context[zmq.Socket[bytes]], now: float) -> None:
        """A fresh socket (a new identity) dialling the frontend; the first heartbeat is queued
        by ZeroMQ until the frontend is up."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        configure_reconnect(sock)
        if self.keys is not None:
            apply_client_keys(sock, self.keys)
        self.watch = ConnectionWatch(
            sock, self.address, authenticated=self.keys is not None, log=self.log
        )
        sock.connect(self.address)
        self.sock = sock
        self.connected = False
        self.registered = False
        self.last_rx = now
        self.next_hb = now + self.heartbeat_interval
        self.send(encode_heartbeat())
        self.log.info("connecting to %s", self.address)

    def reconnect(self, ctx: zmq.Context[zmq.Socket[bytes]], now: float) -> None:
        """Drop the socket and dial again as a new session: that session's batches are lost
        (the frontend gave up on them with the old identity)."""
        self._close_socket()
        self.session += 1
        self.pending = 0
        self.ours = False
        self.open(ctx, now)

    def close(self) -> None:
        """For good: the worker drops this link's results, the poller forgets it."""
        self.closed = True
        self.session += 1
        self.pending = 0
        self.registered = False
        self._close_socket()

    @property
    def live(self) -> bool:
        """Connected and not being left: a link the container keeps serving on."""
        return self.connected and not self.retiring_by and not self.closed

    def heard(self, now: float) -> None:
        """A message came on this link."""
        self.last_rx = now
        if not self.connected:
            self.connected = True
            self.next_hb = now + self.heartbeat_interval

    def send(self, frames: list[bytes]) -> None:
        """Frames to the frontend. Never blocks: a frontend that stopped reading must not hold
        the container's one main thread (and so every other link); the message is dropped
        and the frontend, which lost it, would time this link out anyway."""
        sock = self.sock
        if sock is None:
            return
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.log.debug("send queue to %s full: a message dropped", self.address)

    def _close_socket(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
        self.connected = False
        self.registered = False

"""The frontend's end of the container RPC: one ZeroMQ ROUTER on the event loop.

Containers dial in (as in the original). The socket is read from a loop reader callback, never
from a thread or a task per message; batches go out as one multipart message each. A replica is
registered when its metadata arrives and removed when it has been silent longer than its timeout.

With a key directory the socket is a CURVE server and only containers holding this deployment's
keys get through the handshake (:mod:`clipper.rpc.auth`); without one (``--no-rpc-auth``, loopback
only) anyone local may connect, as in the original.

Silence is judged on the frontend's own time: when the event loop was held (a huge request, a
long garbage collection), the silence check itself fires late, and the replicas' heartbeats wait
unread in the socket. Time the check was late by is not held against any replica, and messages
waiting in the socket are read before a replica is judged silent.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar, cast

import zmq

from clipper.clock import Clock, TimerHandle
from clipper.errors import WireError
from clipper.inputs import InputType
from clipper.logs import PROTOCOL_LOG
from clipper.rpc import wire
from clipper.rpc.auth import RpcGuard, ensure_keys
from clipper.rpc.link import Connection
from clipper.rpc.outputs import DEFAULT_MAX_OUTPUT_BYTES, OutputRefused, oversized
from clipper.rpc.wire import embed_output

__all__ = ["ArtifactHandler", "Registrar", "Remover", "ResponseSink", "RpcServer", "SendTo"]

log = logging.getLogger("clipper.rpc")

P = TypeVar("P")

# Called with the decoded metadata and the identity; returns the registered connection, or None
# when no such model version is known (the container is asked for metadata again later).
Registrar = Callable[[wire.NewContainer, bytes], Connection[P] | None]
Remover = Callable[[Connection[P]], None]
# Frames to one connection (RpcServer.send_to).
SendTo = Callable[[bytes, list[bytes]], None]
# Serves an artifact request (identity, request); its answer goes out through the SendTo given.
ArtifactHandler = Callable[[bytes, wire.ArtifactRequest, SendTo], None]


class ResponseSink(Protocol[P]):
    """What the serving side does with a connection's traffic (the runtime routes it to the
    replica's scheduler)."""

    def deliver(
        self,
        link: Connection[P],
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        """An answered batch."""
        ...

    def leaving(self, link: Connection[P]) -> int:
        """The container said goodbye: send it no new batch. Returns its batches in flight."""
        ...

    def in_flight(self, link: Connection[P]) -> int:
        """Its batches not answered yet (a leaving connection is removed at 0)."""
        ...


_DRAIN_BATCH = 256
# How often replicas are checked for silence (their timeouts are seconds).
_LIVENESS_PERIOD_S = 0.25
# A silence check later than this saw the loop held (a normal turn is well under a millisecond);
# smaller lateness is not recorded, so the list of stalls stays short.
_STALL_MIN_S = 0.05
# Drain passes (of _DRAIN_BATCH messages) before a replica is judged silent.
_JUDGE_DRAINS = 8
# A handshake not finished in this long is dropped (libzmq's default is 30 s).
_HANDSHAKE_S = 10.0
_V3_ERROR_KEY = "__clipper_error__"


class RpcServer(Generic[P]):
    """The ROUTER socket and the connections registered on it (``P``: what the serving side
    keeps per connection, in :attr:`Connection.peer`)."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        clock: Clock,
        registrar: Registrar[P],
        on_removed: Remover[P],
        sink: ResponseSink[P],
        artifacts: ArtifactHandler | None = None,
        keys_dir: Path | None = None,
        on_refused: Callable[[str], None] | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        local_socket: bool = False,
    ) -> None:
        """``artifacts``: who answers artifact requests (None: each is refused).
        ``keys_dir``: authenticate containers with the CURVE keys there (made on the first
        start); None accepts any container. ``on_refused(reason)`` counts a refused
        connection; it is called on the authentication thread, not the loop.
        ``max_output_bytes``: a larger output (encoded) is its input's model error
        (:mod:`clipper.rpc.outputs`). ``local_socket``: with ``keys_dir``, also listen on a
        Unix socket for containers on this machine (:attr:`local_address`)."""
        self.max_output_bytes = max_output_bytes
        self.host = host
        self.port = port
        self.clock = clock
        self._registrar = registrar
        self._on_removed = on_removed
        self._sink = sink
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._replicas: dict[bytes, Connection[P]] = {}
        self._msg_id = 0
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._liveness: TimerHandle | None = None
        self._check_due = 0.0
        # (when a late check ran, how late it was): loop stalls not held against replicas.
        self._stalls: list[tuple[float, float]] = []
        self._keys_dir = keys_dir
        self._on_refused = on_refused
        self.guard: RpcGuard | None = None
        # Replicas that said goodbye: removed once their last batch is answered.
        self._leaving: set[bytes] = set()
        self._artifacts = artifacts
        # Every live frontend's RPC address (set_frontends): sent to each fast replica.
        self._frontends: tuple[str, ...] | None = None
        # The listed frontends' private Unix sockets, (address, ipc address) pairs.
        self._local_sockets: tuple[tuple[str, str], ...] = ()
        self._local_socket = local_socket
        self._local_dir: str | None = None  # the Unix socket's directory, while it is bound

    @property
    def address(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def local_address(self) -> str | None:
        """``ipc://PATH`` while listening on a Unix socket too (:meth:`start`); else None."""
        return f"ipc://{self._local_dir}/rpc" if self._local_dir is not None else None

    def replicas(self) -> list[Connection[P]]:
        return list(self._replicas.values())

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # Keys first: a bad key file fails the start before anything is bound.
        keys = ensure_keys(self._keys_dir) if self._keys_dir is not None else None
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            # Queue bounds: a replica that stops reading must not grow our memory without limit.
            sock.setsockopt(zmq.SNDHWM, 10_000)
            sock.setsockopt(zmq.RCVHWM, 10_000)
            sock.setsockopt(zmq.HANDSHAKE_IVL, int(_HANDSHAKE_S * 1000))
            if keys is not None and self._local_socket and zmq.has("ipc"):
                self._bind_local(sock)
            if keys is not None:
                # Before bind: no connection may arrive before its handshake is guarded.
                self.guard = RpcGuard(
                    self._ctx, keys, on_refused=self._on_refused, now=self.clock.now
                )
                self.guard.arm(sock)
            if self.port == 0:
                self.port = sock.bind_to_random_port(f"tcp://{self.host}")
            else:
                sock.bind(f"tcp://{self.host}:{self.port}")
        except BaseException:
            sock.close(linger=0)
            if self.guard is not None:
                self.guard.stop()
                self.guard = None
            self._ctx.term()
            self._ctx = None
            self._remove_local()
            raise
        self._sock = sock
        self._loop.add_reader(_fd(sock), self._drain)
        self._arm_liveness()
        # Messages may have queued before the reader was attached; the FD is edge-triggered.
        self._loop.call_soon(self._drain)

    async def stop(self) -> None:
        if self._liveness is not None:
            self._liveness.cancel()
            self._liveness = None
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(_fd(self._sock))
            self._sock.close(linger=0)
            self._sock = None
        if self.guard is not None:  # after the socket: it must not outlive its ZAP handler
            self.guard.stop()
            self.guard = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._remove_local()

    def _bind_local(self, sock: zmq.Socket[bytes]) -> None:
        """Listen on a Unix socket too, in a fresh directory only this user can open, without
        CURVE. ZeroMQ takes an endpoint's security options when it is bound, so this endpoint
        is bound before the socket is made a CURVE server: containers on this machine dial it
        and skip the encryption of every batch and answer (half the link's CPU per batch of
        784-double inputs, benchmarks/rpc_link_cost.py), while the TCP port still refuses any
        container without the keys. The directory's mode is the check: whoever can open it
        runs as this user (or root), and could read the key files as well."""
        self._local_dir = tempfile.mkdtemp(prefix="clipper-rpc-")  # mode 0700
        address = self.local_address
        assert address is not None
        try:
            sock.bind(address)
        except zmq.ZMQError as e:  # a $TMPDIR too long for a socket path, say: TCP it is
            log.warning("no private Unix socket for local containers (%s: %s): they use the "
                        "RPC port with CURVE", address, e)  # fmt: skip
            self._remove_local()

    def _remove_local(self) -> None:
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)
            self._local_dir = None

    # shared replicas
    def set_frontends(
        self, addresses: Sequence[str], local: Mapping[str, str] | None = None
    ) -> None:
        """Remember every live frontend's RPC address and send the list (FRONTENDS) to each
        registered fast replica now, and to each one that registers later: a shared replica
        dials every frontend listed. v3 replicas are never sent it. ``local`` maps a listed
        address to that frontend's private Unix socket: sent first (LOCAL_SOCKETS) to the
        replicas that can use it, so one on the same machine dials the socket instead. Raises
        :class:`~clipper.errors.WireError` (and keeps the previous list) for more than
        :data:`~clipper.rpc.wire.MAX_FRONTENDS` addresses or one longer than
        :data:`~clipper.rpc.wire.MAX_ADDRESS_BYTES`: no replica would take it."""
        frames = wire.encode_frontends(addresses)  # refuses a list no replica would take
        pairs = tuple((a, local[a]) for a in addresses if local and a in local)
        sockets = wire.encode_local_sockets(pairs)
        self._frontends = tuple(addresses)
        self._local_sockets = pairs
        if self._sock is None:
            return
        for replica in list(self._replicas.values()):
            if replica.fast:
                if replica.local_sockets:
                    self.send_to(replica.identity, sockets)
                self.send_to(replica.identity, frames)

    @property
    def frontends(self) -> tuple[str, ...] | None:
        """The list last given to :meth:`set_frontends` (None: never given)."""
        return self._frontends

    def retire(self, token: str) -> bool:
        """Send RETIRE to the registered fast replica that presented ``token`` (its
        ``--replica-token``): it drains every frontend's batches and exits 0. False when no
        such replica is connected here."""
        if not token or self._sock is None:
            return False
        for replica in self._replicas.values():
            if replica.token == token and replica.fast:
                self.send_to(replica.identity, wire.encode_retire())
                log.info("replica %s (token %s) told to retire", replica.replica_id, token)
                return True
        return False

    def collect(self) -> None:
        """Read the messages that have arrived, now rather than when the loop next polls its
        sockets. A query's deadline timer asks before it answers a default: a loop that was
        descheduled past a deadline runs its due timers first and reads its sockets after, so
        a prediction that arrived meanwhile would lose to the default it could have replaced."""
        self._read()

    # outbound
    def send_batch(
        self,
        link: Connection[P],
        itype: InputType,
        payloads: list[bytes],
        traceparent: str | None = None,
    ) -> int:
        """One batch of inputs of type ``itype``; returns its message id. ``traceparent``: the
        batch's trace context, sent to fast replicas only (v3 has nowhere to put it)."""
        sock = self._sock
        if sock is None:
            raise WireError("the RPC server is stopped")
        msg_id = self._msg_id
        self._msg_id = (msg_id + 1) & 0xFFFFFFFF
        if link.fast:
            frames = wire.encode_predict_fast(msg_id, itype, payloads, traceparent)
        else:
            frames = wire.encode_predict_v3(msg_id, itype.code, payloads)
        self._send([link.identity, *frames])
        return msg_id

    def send_update(
        self, link: Connection[P], itype: InputType, payload: bytes, label: object
    ) -> None:
        """Feedback for a model that learns online (fast-framing replicas only); its answer,
        an empty acknowledgement or the model's error, is not waited for."""
        msg_id = self._msg_id
        self._msg_id = (msg_id + 1) & 0xFFFFFFFF
        frames = wire.encode_update_fast(msg_id, itype, [payload], [label])
        self._send([link.identity, *frames])

    def send_to(self, identity: bytes, frames: list[bytes]) -> None:
        """Frames to one connection (an artifact chunk); dropped when the socket is stopped or
        that connection's queue is full (the container asks again)."""
        if self._sock is None:
            return
        try:
            self._send([identity, *frames])
        except WireError:
            log.debug("send queue full: a message to %r dropped", identity)

    def _send(self, frames: list[bytes]) -> None:
        sock = self._sock
        assert sock is not None
        try:
            # Always copy: zero-copy frames are freed by pyzmq's garbage-collector thread,
            # which cost a quarter of the frontend's CPU in profiles; a memcpy is cheaper.
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=True)
        except zmq.Again:
            raise WireError("the replica's send queue is full") from None
        # Sending can consume the FD's edge while messages wait: look again.
        if not self._drain_scheduled and _events(sock) & zmq.POLLIN:
            self._drain_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._drain)

    # inbound
    def _drain(self) -> None:
        """The socket's reader, and the continuation scheduled when a drain left more."""
        self._drain_scheduled = False
        self._read()

    def _read(self) -> None:
        """Handle up to a batch of waiting messages; more left: a drain comes back soon.
        (:meth:`collect` calls this directly, leaving a scheduled drain's flag alone.)"""
        sock = self._sock
        if sock is None:
            return
        for _ in range(_DRAIN_BATCH):
            if not _events(sock) & zmq.POLLIN:
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._handle(frames)
            except WireError as e:
                PROTOCOL_LOG.warning(
                    log, self.clock, "dropping a malformed message from %r: %s", frames[0], e
                )
            except Exception:
                PROTOCOL_LOG.exception(log, self.clock, "error handling a container message")
        # More may be waiting; yield to the HTTP side first.
        if not self._drain_scheduled:
            self._drain_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._drain)

    def _handle(self, frames: list[bytes]) -> None:
        identity = frames[0]
        msg = wire.decode_container_message(frames[1:])
        replica = self._replicas.get(identity)
        if replica is not None:
            replica.last_seen = self.clock.now()
        if isinstance(msg, wire.PredictResponse):
            if replica is None:
                return  # from a replica we already removed
            outputs = msg.outputs
            error = msg.error
            nbytes = sum(map(len, frames)) - len(identity)
            if msg.raw_strings and outputs is not None:
                outputs = _embed_v3(outputs)
                first = outputs[0] if outputs else None
                # Every output the marker: the batch failed (v3's only way to say so).
                if isinstance(first, OutputRefused) and all(
                    type(o) is OutputRefused for o in outputs
                ):
                    error, outputs = first.reason, None
            if outputs is not None and nbytes > self.max_output_bytes:
                # Only a message over the limit can hold an output over it: no cost below.
                # (Said on the console by the model's scheduler, rate-limited, as any error.)
                sizes = [len(f) for f in frames[6:]] if msg.raw_strings else None
                oversized(outputs, sizes, self.max_output_bytes)
            self._sink.deliver(replica, msg.msg_id, outputs, error, nbytes)
            if identity in self._leaving and not self._sink.in_flight(replica):
                self.remove(replica)
        elif isinstance(msg, wire.Heartbeat):
            hb = (
                wire.HeartbeatType.KEEP_ALIVE
                if replica is not None
                else wire.HeartbeatType.REQUEST_CONTAINER_METADATA
            )
            self._send([identity, *wire.encode_heartbeat_reply(hb)])
        elif isinstance(msg, wire.QueueReport):
            if replica is not None:
                # Kept per connection; admission prices it (a batch another frontend queued on
                # this replica runs before ours).
                replica.queued_elsewhere = msg.elsewhere
        elif isinstance(msg, wire.Goodbye):
            self._goodbye(identity, replica)
        elif isinstance(msg, wire.ArtifactRequest):
            if self._artifacts is None:
                self._send([identity, *wire.encode_artifact_chunk(
                    {"error": "this frontend serves no artifacts"}, b"")])  # fmt: skip
            else:
                self._artifacts(identity, msg, self.send_to)
        elif isinstance(msg, wire.NewContainer):
            if replica is not None or identity in self._leaving:
                return
            if msg.rpc_version != wire.RPC_VERSION:
                PROTOCOL_LOG.error(
                    log,
                    self.clock,
                    "container %s:%s speaks RPC version %s, expected %s; not registered",
                    msg.name,
                    msg.version,
                    msg.rpc_version,
                    wire.RPC_VERSION,
                )
                return
            new = self._registrar(msg, identity)
            if new is not None:
                self._replicas[identity] = new
                new.local_sockets = wire.LOCAL_SOCKETS_FEATURE in msg.features
                if new.fast and self._frontends is not None:
                    if new.local_sockets:
                        self.send_to(identity, wire.encode_local_sockets(self._local_sockets))
                    self.send_to(identity, wire.encode_frontends(self._frontends))
                log.info(
                    "replica %s of %s:%s connected (%s framing)",
                    new.replica_id,
                    msg.name,
                    msg.version,
                    "fast" if new.fast else "v3",
                )

    def _goodbye(self, identity: bytes, replica: Connection[P] | None) -> None:
        """A container is leaving (it was sent SIGTERM): no more batches for it, and it is
        removed as soon as those in flight are answered (a drain, so its answers stand)."""
        self._send([identity, *wire.encode_heartbeat_reply(wire.HeartbeatType.GOODBYE_ACK)])
        if replica is None:
            return  # already drained and removed by its manager
        in_flight = self._sink.leaving(replica)
        log.info("replica %s is leaving: draining %d batches", replica.replica_id, in_flight)
        self._leaving.add(identity)
        if not in_flight:
            self.remove(replica)

    def remove(self, replica: Connection[P]) -> None:
        self._leaving.discard(replica.identity)
        if self._replicas.pop(replica.identity, None) is not None:
            self._on_removed(replica)

    def _arm_liveness(self) -> None:
        self._check_due = self.clock.now() + _LIVENESS_PERIOD_S
        self._liveness = self.clock.call_later(_LIVENESS_PERIOD_S, self._check_liveness)

    def _silence(self, replica: Connection[P], now: float) -> float:
        """Seconds the replica has been silent, less the time our loop was held meanwhile
        (its messages could not have been read then)."""
        silent = now - replica.last_seen
        for at, lag in self._stalls:
            if at > replica.last_seen:
                silent -= min(lag, at - replica.last_seen)
        return silent

    def _check_liveness(self) -> None:
        # A timer on the clock, not a sleeping task, so a fake clock's advance() runs it;
        # re-armed first, so that an error below does not end the checks.
        now = self.clock.now()
        late = now - self._check_due
        if late > _STALL_MIN_S:
            self._stalls.append((now, late))
        self._arm_liveness()
        suspects = [r for r in self._replicas.values() if self._silence(r, now) > r.timeout]
        if suspects:
            # Messages wait unread (the loop was busy): let them speak before judging
            # (bounded: a flood must not hold the loop here either).
            for _ in range(_JUDGE_DRAINS):
                sock = self._sock
                if sock is None or not _events(sock) & zmq.POLLIN:
                    break
                self._drain()
            now = self.clock.now()
        for replica in suspects:
            silent = self._silence(replica, now)
            if replica.identity in self._replicas and silent > replica.timeout:
                log.warning("replica %s silent for %.1f s: removed", replica.replica_id, silent)
                self.remove(replica)
        if self._stalls:
            # A stall before every replica's last message can no longer excuse anyone.
            oldest = min((r.last_seen for r in self._replicas.values()), default=now)
            self._stalls = [s for s in self._stalls if s[0] > oldest]


def _fd(sock: zmq.Socket[bytes]) -> int:
    return cast(int, sock.getsockopt(zmq.FD))


def _events(sock: zmq.Socket[bytes]) -> int:
    return cast(int, sock.getsockopt(zmq.EVENTS))


def _embed_v3(outputs: list[object]) -> list[object]:
    """v3 outputs as JSON values; an output that is the error marker (a v3 container's only
    way to say an input failed) becomes an :class:`OutputRefused` with its text."""
    out: list[object] = []
    for o in outputs:
        value = embed_output(o) if isinstance(o, str) else o
        if isinstance(value, dict) and _V3_ERROR_KEY in value:
            value = OutputRefused(str(value[_V3_ERROR_KEY]))
        out.append(value)
    return out

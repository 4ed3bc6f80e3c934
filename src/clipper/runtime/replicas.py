"""Which connected container is which replica: the RPC endpoint's registrar and response sink.

A container that dials in names its model version; its RPC :class:`Connection` becomes a
:class:`Replica` of that version's scheduler. Containers started by a manager also present their
replica token, so the manager's view of a process (pid, exit) and the scheduler's view of a
connection meet here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from clipper.batching.scheduler import Replica
from clipper.clock import Clock, wait_event
from clipper.rpc import wire
from clipper.rpc.link import Connection
from clipper.runtime.catalog import Catalog

__all__ = ["ReplicaDirectory"]

log = logging.getLogger("clipper")

_DRAIN_TIMEOUT_S = 2.0


class ReplicaDirectory:
    def __init__(
        self,
        catalog: Catalog,
        *,
        clock: Clock,
        replica_timeout_s: float,
        v3_replica_timeout_s: float,
        disconnect: Callable[[Connection[Replica]], None],
    ) -> None:
        """``disconnect(link)``: drops a connection from the RPC endpoint, which then calls
        :meth:`removed` (the endpoint is built with this directory, so this is a callback into
        it, not the endpoint itself)."""
        self.catalog = catalog
        self.clock = clock
        self.replica_timeout_s = replica_timeout_s
        self.v3_replica_timeout_s = v3_replica_timeout_s
        self._disconnect = disconnect
        self._ids: dict[tuple[str, str], itertools.count[int]] = {}
        # One process may be connected more than once for a while (a reconnect with a new
        # identity, a shared replica moving to this frontend's Unix socket), in either order.
        self._by_token: dict[str, list[Replica]] = {}

    def register(self, meta: wire.NewContainer, identity: bytes) -> Connection[Replica] | None:
        sched = self.catalog.scheduler(meta.name, meta.version)
        if sched is None:
            log.debug(
                "container for unknown model %s:%s; asking again later", meta.name, meta.version
            )
            return None
        if meta.input_code != sched.mv.input_type.code:
            log.error(
                "container for %s:%s takes input type %s but the model takes %s (%s); refused",
                meta.name,
                meta.version,
                meta.input_code,
                sched.mv.input_type.code,
                sched.mv.input_type.readable,
            )
            return None
        ids = self._ids.setdefault(sched.mv.key, itertools.count())
        fast = meta.fast
        link: Connection[Replica] = Connection(
            identity,
            next(ids),
            fast,
            self.replica_timeout_s if fast else self.v3_replica_timeout_s,
            self.clock.now(),
            token=meta.token,
        )
        replica = Replica(link)
        if meta.token:
            self._by_token.setdefault(meta.token, []).append(replica)
        sched.add_replica(replica)
        return link

    def deliver(
        self,
        link: Connection[Replica],
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        """An answered batch (the RPC endpoint's response sink)."""
        replica = link.peer
        if replica is not None and replica.scheduler is not None:  # else: removed meanwhile
            replica.scheduler.on_response(replica, msg_id, outputs, error, nbytes)

    def leaving(self, link: Connection[Replica]) -> int:
        """The container said goodbye: it gets no new batch; returns its batches in flight."""
        replica = link.peer
        if replica is None:
            return 0
        replica.draining = True
        return len(replica.in_flight)

    def in_flight(self, link: Connection[Replica]) -> int:
        replica = link.peer
        return len(replica.in_flight) if replica is not None else 0

    def removed(self, link: Connection[Replica]) -> None:
        # Only this connection: the process stays known by its token while another of its
        # connections is registered here.
        known = self._by_token.get(link.token) if link.token else None
        if known is not None:
            known[:] = [r for r in known if r.link is not link]
            if not known:
                del self._by_token[link.token]
        replica = link.peer
        if replica is not None and replica.scheduler is not None:
            replica.scheduler.remove_replica(replica)

    def connected(self, token: str) -> bool:
        """Whether the replica that presented ``token`` is connected here (an adopted one
        counts as running while it is)."""
        return token in self._by_token

    def process_exited(self, token: str) -> None:
        # The manager saw the process die: no need to wait for the heartbeat timeout.
        for replica in list(self._by_token.get(token, ())):
            self._disconnect(replica.link)

    async def drain(self, token: str) -> None:
        """Before a replica is stopped on purpose: send it no more batches and let those in
        flight come back (bounded), so a scale-down or version switch loses no query."""
        replicas = [r for r in self._by_token.get(token, ()) if r.scheduler is not None]
        for replica in replicas:
            replica.draining = True
        for replica in replicas:
            if replica.in_flight:
                replica.drained = asyncio.Event()
                await wait_event(self.clock, replica.drained, _DRAIN_TIMEOUT_S)
            self._disconnect(replica.link)

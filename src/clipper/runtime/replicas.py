"""Which connected container is which replica: the RPC endpoint's registrar.

A container that dials in names its model version; it becomes a :class:`Replica` of that
version's scheduler. Containers started by a manager also present their replica token, so the
manager's view of a process (pid, exit) and the scheduler's view of a connection meet here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from clipper.batching.scheduler import Replica
from clipper.clock import Clock, wait_event
from clipper.rpc import wire
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
    ) -> None:
        self.catalog = catalog
        self.clock = clock
        self.replica_timeout_s = replica_timeout_s
        self.v3_replica_timeout_s = v3_replica_timeout_s
        # Set by the composition root once the RPC server exists (it needs us first).
        self.remove: Callable[[Replica], None] = lambda replica: None
        self._ids: dict[tuple[str, str], itertools.count[int]] = {}
        self._by_token: dict[str, Replica] = {}

    def register(self, meta: wire.NewContainer, identity: bytes) -> Replica | None:
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
        replica = Replica(
            identity,
            next(ids),
            fast,
            self.replica_timeout_s if fast else self.v3_replica_timeout_s,
            self.clock.now(),
        )
        if meta.token:
            replica.address = meta.token
            self._by_token[meta.token] = replica
        sched.add_replica(replica)
        return replica

    def deliver(
        self,
        replica: Replica,
        msg_id: int,
        outputs: list[object] | None,
        error: str | None,
        nbytes: int,
    ) -> None:
        """An answered batch (the RPC endpoint's response sink)."""
        if replica.scheduler is not None:  # else: removed while its batch was out
            replica.scheduler.on_response(replica, msg_id, outputs, error, nbytes)

    def removed(self, replica: Replica) -> None:
        if replica.address:
            self._by_token.pop(replica.address, None)
        if replica.scheduler is not None:
            replica.scheduler.remove_replica(replica)

    def process_exited(self, token: str) -> None:
        # The manager saw the process die: no need to wait for the heartbeat timeout.
        replica = self._by_token.get(token)
        if replica is not None:
            self.remove(replica)

    async def drain(self, token: str) -> None:
        """Before a replica is stopped on purpose: send it no more batches and let those in
        flight come back (bounded), so a scale-down or version switch loses no query."""
        replica = self._by_token.get(token)
        if replica is None or replica.scheduler is None:
            return
        replica.draining = True
        if replica.in_flight:
            replica.drained = asyncio.Event()
            await wait_event(self.clock, replica.drained, _DRAIN_TIMEOUT_S)
        self.remove(replica)

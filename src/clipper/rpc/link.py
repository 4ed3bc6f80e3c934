"""The RPC endpoint's record of one connected container: what the wire knows of a replica.

A :class:`Connection` is the container's ZeroMQ identity, how it frames batches, when it was last
heard from and how long it may stay silent, and the replica token it presented. What is served
through it (a model version's queue, the batches in flight) lives above the wire, in the object
``peer`` refers to; the RPC server never looks inside that object.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["Connection"]

P = TypeVar("P")


class Connection(Generic[P]):
    """One container connected to the RPC endpoint.

    ``replica_id`` numbers the connections of one model version (for logs and metrics);
    ``token`` is the replica token a managed container presents ("" for one started by hand);
    ``peer`` is the serving side's record of this connection, set by whoever registers it;
    ``queued_elsewhere`` is, from the container's latest queue report, the batches other
    frontends have queued on it (0 until a shared replica reports); ``local_sockets``, whether
    its metadata listed the ``local-sockets`` feature (it may be sent LOCAL_SOCKETS).
    """

    __slots__ = (
        "fast",
        "identity",
        "last_seen",
        "local_sockets",
        "peer",
        "queued_elsewhere",
        "replica_id",
        "timeout",
        "token",
    )

    def __init__(
        self,
        identity: bytes,
        replica_id: int,
        fast: bool,
        timeout: float,
        last_seen: float,
        *,
        token: str = "",
    ) -> None:
        self.identity = identity
        self.replica_id = replica_id
        self.fast = fast
        self.timeout = timeout
        self.last_seen = last_seen
        self.token = token
        self.peer: P | None = None
        self.queued_elsewhere = 0
        # It dials a frontend's private Unix socket when told of one (wire.LOCAL_SOCKETS).
        self.local_sockets = False

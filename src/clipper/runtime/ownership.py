"""Which frontend of a deployment runs its replicas: the replica owner's lease, and the list of
live frontends that shared replicas dial.

With shared replicas (a redis store, or several worker processes on one sqlite file), a model
version's replicas serve every frontend, and exactly one frontend, the **owner**, starts, scales,
restarts and stops them. It holds the lease ``replica-owner`` in the store, renewed every third
of its TTL; when the owner dies its lease expires and another frontend takes it, adopts the
replicas and converges every version (:class:`clipper.runtime.reconciler.Reconciler`). A
frontend that cannot renew (the store unreachable) stops acting once the lease it last renewed
would have expired, so two owners never act at once for longer than the store's own clock drift.

Every frontend also announces the RPC address replicas should dial, about every second with a
TTL of a few seconds, and hands the live list to the RPC endpoint (``set_frontends``), which
tells the replicas: a frontend that starts is dialled by the running replicas, one that is gone
is dropped by them. A frontend with a private Unix socket announces it too; the replicas on
its machine dial that instead of the TCP address (docs/containers.md, "Local containers").

Without sharing, this frontend owns its own replicas and nothing is written to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from clipper.clock import Clock, sleep
from clipper.errors import ClipperError
from clipper.store.base import Store, StoreError

__all__ = ["FRONTENDS", "LEASE", "FrontendFeed", "Ownership"]

log = logging.getLogger("clipper.runtime")

LEASE: Final = "replica-owner"
# The presence group of the frontends' RPC addresses.
FRONTENDS: Final = "frontends"
# A frontend missing this many announcements in a row is gone from the list.
_MISSED_ANNOUNCEMENTS: Final = 3


class FrontendFeed(Protocol):
    """Who gets the live frontends' addresses (the RPC endpoint, which tells its replicas)."""

    def set_frontends(
        self, addresses: Sequence[str], local: Mapping[str, str] | None = None
    ) -> None: ...


OwnerListener = Callable[[bool], None]


class Ownership:
    def __init__(
        self,
        store: Store,
        *,
        node_id: Callable[[], str],
        address: Callable[[], str],
        clock: Clock,
        shared: bool,
        ttl_s: float = 5.0,
        announce_s: float = 1.0,
        feed: object | None = None,
        local: Callable[[], str | None] | None = None,
    ) -> None:
        """``address()``: the RPC address replicas dial here (``tcp://host:port``), read once
        the RPC port is bound; ``local()``: this frontend's private Unix socket
        (``ipc:///path``) or None. ``feed``: gets ``set_frontends(addresses, local)`` when it
        has that method (the RPC endpoint, once it speaks the FRONTENDS message)."""
        if ttl_s <= 0 or announce_s <= 0:
            raise ValueError("the owner lease's TTL and the announcement interval must be > 0")
        self.store = store
        self.clock = clock
        self.shared = shared
        self.ttl_s = ttl_s
        self.announce_s = min(announce_s, ttl_s / 3)
        self._node_id = node_id
        self._address = address
        self._local = local
        self._feed = feed
        # Unique per process: a frontend restarted on the same state directory (same node id)
        # is a new claimant, not the holder of the lease its previous process left.
        self._suffix = secrets.token_hex(4)
        self._owner = not shared
        self._holder_seen: str | None = None
        self._valid_until = 0.0
        self._next_claim = 0.0
        self._frontends: list[str] = []
        # address -> private Unix socket, for the live frontends that announced one.
        self._sockets: dict[str, str] = {}
        self._listeners: list[OwnerListener] = []
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._closed = False

    # -- what others read ------------------------------------------------------------------------
    @property
    def holder(self) -> str:
        """This frontend's name in the lease and the presence list."""
        return f"{self._node_id()}/{self._suffix}"

    @property
    def is_owner(self) -> bool:
        return self._owner

    @property
    def owner(self) -> str | None:
        """The owner as last seen (this frontend's holder when it owns)."""
        if not self.shared:
            return self.holder
        return self.holder if self._owner else self._holder_seen

    @property
    def frontends(self) -> list[str]:
        """The live frontends' RPC addresses, this one's included, as last read."""
        return list(self._frontends) if self.shared else [self._address()]

    def subscribe(self, listener: OwnerListener) -> None:
        """``listener(is_owner)`` on every change of ownership (not for the initial state)."""
        self._listeners.append(listener)

    def describe(self) -> dict[str, Any]:
        """For the admin status: who owns the replicas, and who shares them."""
        return {
            "shared_replicas": self.shared,
            "node_id": self._node_id(),
            "holder": self.holder,
            "owner": self.owner,
            "is_owner": self._owner,
            "frontends": self.frontends,
            "lease_ttl_s": self.ttl_s if self.shared else None,
        }

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        """Announce this frontend and try the lease once (so start-up knows whether it owns),
        then keep both up in an owned task."""
        if not self.shared or self._task is not None:
            return
        await self._tick()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="clipper-replica-owner"
        )

    async def stop(self) -> None:
        """Stop renewing and announcing (what is held stays until it expires or is
        released: :meth:`release`, :meth:`withdraw`)."""
        task, self._task = self._task, None
        self._closed = True
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def others(self) -> list[str]:
        """The other live frontends' addresses, read now (a stopping frontend asks whether it
        is the last)."""
        if not self.shared:
            return []
        try:
            live = await self.store.live(FRONTENDS)
        except StoreError as exc:
            log.warning("cannot read the live frontends: %s", exc)
            return list(a for a in self._frontends if a != self._address())
        return sorted(
            _address_of(v) for k, v in live.items() if k != self.holder and _address_of(v)
        )

    async def release(self) -> None:
        """Hand the lease on now (a graceful stop that leaves its replicas to the next owner)."""
        was = self._owner
        self._set_owner(False)
        if not self.shared or not was:
            return
        with contextlib.suppress(StoreError):
            await self.store.release(LEASE, self.holder)

    async def withdraw(self) -> None:
        """Leave the list of frontends at once (replicas stop dialling here)."""
        if self.shared:
            with contextlib.suppress(StoreError):
                await self.store.withdraw(FRONTENDS, self.holder)

    # -- the loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            await sleep(self.clock, self.announce_s)
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Logged, not fatal: the next tick tries again (a store error is handled in
                # _tick; this is anything else).
                log.exception("replica ownership: a renewal failed")

    async def _tick(self) -> None:
        now = self.clock.now()
        try:
            await self.store.announce(
                FRONTENDS,
                self.holder,
                self._announcement(),
                self.announce_s * _MISSED_ANNOUNCEMENTS,
            )
            live = await self.store.live(FRONTENDS)
            if now >= self._next_claim or not self._owner:
                lease = await self.store.claim(LEASE, self.holder, self.ttl_s)
                self._holder_seen = lease.holder
                if lease.holder == self.holder:
                    # Counted from before the call: the store's expiry is no earlier.
                    self._valid_until = now + lease.expires_in_s
                    self._next_claim = now + self.ttl_s / 3
                self._set_owner(lease.holder == self.holder)
        except StoreError as exc:
            if not self._failing:
                log.warning("replica ownership: the store failed: %s", exc)
            self._failing = True
            if self._owner and self.clock.now() >= self._valid_until:
                log.warning("replica ownership: the lease could not be renewed: not the owner")
                self._set_owner(False)
            return
        if self._failing:
            log.info("replica ownership: the store answers again")
        self._failing = False
        self._frontends = sorted({a for v in live.values() if (a := _address_of(v))})
        self._sockets = {_address_of(v): _socket_of(v) for v in live.values() if _socket_of(v)}
        self._feed_frontends()

    def _announcement(self) -> dict[str, str]:
        value = {"rpc": self._address(), "node": self._node_id()}
        ipc = self._local() if self._local is not None else None
        if ipc:
            value["ipc"] = ipc
        return value

    def _feed_frontends(self) -> None:
        # Sent every tick, changed or not: a replica that was leaving a frontend when that
        # frontend came back (a restart on the same address) links to it again at the next
        # list; one small message per replica per second.
        setter = getattr(self._feed, "set_frontends", None)
        if setter is None:
            return  # the RPC endpoint does not speak FRONTENDS: replicas dial what they were given
        try:
            setter(list(self._frontends), dict(self._sockets))
        except ClipperError as exc:  # a list no replica would take: the previous one stays
            log.warning("the live frontends were not sent to the replicas: %s", exc)

    def _set_owner(self, owner: bool) -> None:
        if owner == self._owner or (self._closed and owner):
            return
        self._owner = owner
        log.info(
            "replica owner: %s", "this frontend" if owner else (self._holder_seen or "none known")
        )
        for listener in list(self._listeners):
            try:
                listener(owner)
            except Exception:
                log.exception("replica ownership listener %r failed", listener)


def _address_of(value: Any) -> str:
    return str(value.get("rpc") or "") if isinstance(value, dict) else ""


def _socket_of(value: Any) -> str:
    """The announced private Unix socket, or "" (none, or not an ``ipc:///`` address)."""
    ipc = str(value.get("ipc") or "") if isinstance(value, dict) else ""
    return ipc if ipc.startswith("ipc:///") else ""

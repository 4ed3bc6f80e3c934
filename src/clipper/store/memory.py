"""A store in process memory, for tests and throwaway runs: nothing survives the process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from clipper.clock import Clock, MonotonicClock
from clipper.store.base import (
    CONFIG_KINDS,
    KINDS,
    STATE_PAGE,
    DeletePrefix,
    Kind,
    Lease,
    Op,
    Put,
    Resync,
    Snapshot,
    StoreError,
    Watcher,
    check_kind,
    check_lease,
    check_ops,
    check_runtime_kind,
    decode_value,
    encode_value,
)

__all__ = ["MemoryStore"]


class MemoryStore:
    """Records held as JSON text, so every put and every load is a deep copy: callers can neither
    change stored state through a value they passed in nor through one they got back.

    Each instance is its own world: two MemoryStores never see each other's writes, so callbacks
    given to :meth:`watch` are kept but never called.

    A state written again moves to the end of its dict, so a dict walk lists states least
    recently written first (:meth:`state_users`).

    Leases and presence entries expire by ``clock`` (tests pass a fake one).
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self._data: dict[Kind, dict[str, bytes]] = {kind: {} for kind in KINDS}
        self._leases: dict[str, tuple[str, float]] = {}  # name -> (holder, expires at)
        self._presence: dict[str, dict[str, tuple[bytes, float]]] = {}
        self._watchers: list[Watcher] = []
        self._open = False

    def __repr__(self) -> str:
        return "MemoryStore()"

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError("memory store is not open: call 'await store.open()' first")

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False

    async def load(self) -> Snapshot:
        self._check_open()
        return {
            kind: {key: decode_value(kind, key, text) for key, text in records.items()}
            for kind, records in self._data.items()
            if kind in CONFIG_KINDS
        }

    async def commit(self, ops: Sequence[Op]) -> None:
        self._check_open()
        for op, text in check_ops(ops):  # checked whole first: all or nothing
            records = self._data[op.kind]
            if isinstance(op, Put):
                assert text is not None
                if op.kind == "state":
                    records.pop(op.key, None)  # to the end: the most recently written
                records[op.key] = text
            elif isinstance(op, DeletePrefix):
                for key in [k for k in records if k.startswith(op.prefix)]:
                    del records[key]
            else:
                records.pop(op.key, None)

    async def put(self, kind: Kind, key: str, value: Any) -> None:
        await self.commit([Put(kind, key, value)])

    async def delete(self, kind: Kind, key: str) -> None:
        self._check_open()
        self._data[check_kind(kind)].pop(key, None)

    async def get(self, kind: Kind, key: str) -> Any | None:
        self._check_open()
        text = self._data[check_kind(kind)].get(key)
        return None if text is None else decode_value(kind, key, text)

    async def state_users(self, app: str, batch: int = STATE_PAGE) -> AsyncIterator[list[str]]:
        self._check_open()
        prefix = f"{app}:"
        # A copy: the caller may write and delete states between pages.
        uids = [k[len(prefix) :] for k in self._data["state"] if k.startswith(prefix)]
        uids = [uid for uid in uids if uid]  # the shared state is not a user's
        for start in range(0, len(uids), max(1, batch)):
            yield uids[start : start + max(1, batch)]

    def watch(self, callback: Watcher) -> None:
        self._watchers.append(callback)

    def on_resync(self, callback: Resync) -> None:
        """Nothing is ever missed in one process."""

    async def claim(self, name: str, holder: str, ttl_s: float) -> Lease:
        self._check_open()
        check_lease(name, holder, ttl_s)
        now = self.clock.now()
        held = self._leases.get(name)
        if held is None or held[1] <= now or held[0] == holder:
            held = self._leases[name] = (holder, now + ttl_s)
        return Lease(held[0], held[1] - now)

    async def release(self, name: str, holder: str) -> bool:
        self._check_open()
        check_lease(name, holder)
        held = self._leases.get(name)
        if held is None or held[0] != holder or held[1] <= self.clock.now():
            return False
        del self._leases[name]
        return True

    async def announce(self, group: str, key: str, value: Any, ttl_s: float) -> None:
        self._check_open()
        check_lease(group, key, ttl_s)
        text = encode_value("replica", key, value)  # the JSON check every value gets
        self._presence.setdefault(group, {})[key] = (text, self.clock.now() + ttl_s)

    async def withdraw(self, group: str, key: str) -> None:
        self._check_open()
        self._presence.get(group, {}).pop(key, None)

    async def live(self, group: str) -> dict[str, Any]:
        self._check_open()
        now = self.clock.now()
        entries = self._presence.get(group, {})
        for key in [k for k, (_, until) in entries.items() if until <= now]:
            del entries[key]
        return {key: decode_value(group, key, text) for key, (text, _) in entries.items()}

    async def records(self, kind: Kind) -> dict[str, Any]:
        self._check_open()
        check_runtime_kind(kind)
        return {key: decode_value(kind, key, text) for key, text in self._data[kind].items()}

"""The prediction cache: completed predictions by (model, version, input), bounded in bytes.

Besides remembering answers it joins concurrent identical misses: the first query for a key
computes it, later identical queries register a waiter and are answered when it completes, so a
burst of the same input costs one prediction. Errors are delivered to the waiters but never
cached. Eviction is second-chance CLOCK (as in Clipper) or LRU.

Keys are compared by equality (dict semantics), so hash collisions never return a wrong answer.
Not thread-safe: it lives on the event loop.

An entry may name its *producer* (the replica that computed it): when that replica is removed
as failed, :meth:`PredictionCache.forget_producer` drops everything it answered, so answers of a
replica that turned out broken (or not ours) are never served again.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from clipper.choices import CACHE_POLICIES, CachePolicy
from clipper.errors import ConfigError

__all__ = [
    "Abandonable",
    "CacheKey",
    "CacheStats",
    "Lookup",
    "PredictionCache",
    "Waiter",
    "abandoned",
]

CacheKey = tuple[str, str, bytes]
Waiter = Callable[[object, BaseException | None], None]

_log = logging.getLogger("clipper.cache")

# Bookkeeping charged per entry on top of the input and value bytes (key tuple, entry object).
_ENTRY_OVERHEAD = 64


class Abandonable:
    """A waiter that can say its query was abandoned (its client went away before the answer).

    A runner's waiters derive from it; a waiter that does not (a plain function) is always
    taken as live. The check is made only at dispatch, and only for inputs queued before the
    latest abandon (:attr:`PredictionCache.abandoned_at`), so an ordinary query pays nothing."""

    __slots__ = ()

    def __call__(self, value: object, err: BaseException | None, /) -> None:
        raise NotImplementedError

    def abandoned(self) -> bool:
        return False


def abandoned(waiter: Waiter | None) -> bool:
    """Whether ``waiter`` belongs to a query that was abandoned (None: nobody waits)."""
    return waiter is None or (isinstance(waiter, Abandonable) and waiter.abandoned())


class Lookup(enum.Enum):
    HIT = "hit"
    JOINED = "joined"
    MISS = "miss"


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    joins: int
    evictions: int
    entries: int
    bytes: int


class _Entry:
    __slots__ = ("nbytes", "producer", "referenced", "value")

    def __init__(self, value: object, nbytes: int, producer: Hashable | None) -> None:
        self.value = value
        self.nbytes = nbytes
        self.producer = producer
        self.referenced = False  # CLOCK's bit: set on a hit, cleared when the hand passes


class PredictionCache:
    """Byte-bounded prediction cache that also joins identical in-flight computations.

    ``max_bytes == 0`` disables storage; identical in-flight misses are still joined.
    Pending (in-flight) entries are never evicted and not counted in ``bytes``.
    """

    __slots__ = (
        "_by_producer",
        "_bytes",
        "_done",
        "_evictions",
        "_hits",
        "_joins",
        "_lru",
        "_max_bytes",
        "_misses",
        "_pending",
        "abandoned_at",
    )

    def __init__(self, max_bytes: int = 32 * 2**20, policy: CachePolicy = "clock") -> None:
        if max_bytes < 0:
            raise ConfigError(f"cache max_bytes must be >= 0, got {max_bytes}")
        CACHE_POLICIES.check(policy)
        self._max_bytes = max_bytes
        self._lru = policy == "lru"
        # Completed entries in ring order: for CLOCK the front is where the hand points, for
        # LRU the front is the least recently used.
        self._done: OrderedDict[CacheKey, _Entry] = OrderedDict()
        self._pending: dict[CacheKey, list[Waiter]] = {}
        self._by_producer: dict[Hashable, set[CacheKey]] = {}
        self._bytes = 0
        self._hits = self._misses = self._joins = self._evictions = 0
        # When a waiter was last abandoned, on the clock of the runners and schedulers that
        # share this cache: an input queued after it cannot have an abandoned waiter.
        self.abandoned_at = float("-inf")

    def get_or_join(self, key: CacheKey, waiter: Waiter) -> tuple[Lookup, object]:
        """HIT returns the value (waiter not called); JOINED registers the waiter on the
        in-flight computation; MISS registers it on a new one that the caller must finish with
        :meth:`complete` or :meth:`fail`."""
        entry = self._done.get(key)
        if entry is not None:
            self._hits += 1
            if self._lru:
                self._done.move_to_end(key)
            else:
                entry.referenced = True
            return Lookup.HIT, entry.value
        waiters = self._pending.get(key)
        if waiters is not None:
            waiters.append(waiter)
            self._joins += 1
            return Lookup.JOINED, None
        self._pending[key] = [waiter]
        self._misses += 1
        return Lookup.MISS, None

    def complete(
        self, key: CacheKey, value: object, nbytes: int, producer: Hashable | None = None
    ) -> None:
        """Store ``value`` (if it fits) and deliver it to every waiter, in registration order.
        ``producer``: who computed it, for :meth:`forget_producer`.

        Also accepted with nothing pending: a late result still warms the cache.
        """
        waiters = self._pending.pop(key, None)
        self._store(key, value, len(key[2]) + nbytes + _ENTRY_OVERHEAD, producer)
        if waiters:
            _deliver(waiters, value, None)

    def fail(self, key: CacheKey, error: BaseException) -> None:
        """Drop the in-flight computation and deliver ``error`` to its waiters (not cached)."""
        waiters = self._pending.pop(key, None)
        if waiters:
            _deliver(waiters, None, error)

    def remove_waiter(self, key: CacheKey, waiter: Waiter) -> None:
        """Stop calling ``waiter`` (it gave up); the computation itself carries on."""
        waiters = self._pending.get(key)
        if waiters is None:
            return
        # Absent means already delivered or never registered: nothing to undo.
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)

    def note_abandoned(self, at: float) -> None:
        """A query gave up its waiters at ``at``: inputs queued until then are checked at
        dispatch (:meth:`all_abandoned`)."""
        self.abandoned_at = at

    def all_abandoned(self, key: CacheKey) -> bool:
        """Whether nobody live waits for ``key`` any more: every waiter registered on its
        computation belongs to an abandoned query (or none is left)."""
        waiters = self._pending.get(key)
        if waiters:
            for waiter in waiters:
                if not (isinstance(waiter, Abandonable) and waiter.abandoned()):
                    return False
        return True

    def pending_waiters(self, key: CacheKey) -> int:
        waiters = self._pending.get(key)
        return 0 if waiters is None else len(waiters)

    def peek(self, key: CacheKey) -> object | None:
        """The completed value for ``key`` without counting a hit or refreshing it."""
        entry = self._done.get(key)
        return None if entry is None else entry.value

    def forget_producer(self, producer: Hashable) -> int:
        """Drop every completed entry ``producer`` computed; returns how many."""
        keys = self._by_producer.pop(producer, None)
        if not keys:
            return 0
        for key in keys:
            entry = self._done.pop(key)
            self._bytes -= entry.nbytes
        return len(keys)

    def clear(self) -> None:
        """Drop completed entries; in-flight computations and their waiters are kept."""
        self._done.clear()
        self._by_producer.clear()
        self._bytes = 0

    @property
    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self._hits,
            misses=self._misses,
            joins=self._joins,
            evictions=self._evictions,
            entries=len(self._done),
            bytes=self._bytes,
        )

    def _store(self, key: CacheKey, value: object, size: int, producer: Hashable | None) -> None:
        old = self._done.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes  # a newer result for the same key supersedes the old one
            self._unindex(key, old)
        if size > self._max_bytes:
            return  # also covers max_bytes == 0 (disabled)
        # Make room first, then insert behind the hand, as CLOCK puts a new page in the
        # victim's slot: the newcomer is then the last one the hand reaches.
        while self._bytes + size > self._max_bytes:
            self._evict_one()
        self._done[key] = _Entry(value, size, producer)
        self._bytes += size
        if producer is not None:
            keys = self._by_producer.get(producer)
            if keys is None:
                keys = self._by_producer[producer] = set()
            keys.add(key)

    def _unindex(self, key: CacheKey, entry: _Entry) -> None:
        if entry.producer is None:
            return
        keys = self._by_producer.get(entry.producer)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_producer[entry.producer]  # no dead replicas kept alive here

    def _evict_one(self) -> None:
        done = self._done
        while True:
            key, entry = done.popitem(last=False)
            if entry.referenced:
                # Second chance: clear the bit and move the hand past it.
                entry.referenced = False
                done[key] = entry
                continue
            self._bytes -= entry.nbytes
            self._evictions += 1
            self._unindex(key, entry)
            return


def _deliver(waiters: list[Waiter], value: object, error: BaseException | None) -> None:
    for waiter in waiters:
        try:
            waiter(value, error)
        except Exception:
            # One broken waiter must not starve the others of their answer.
            _log.exception("cache waiter raised")

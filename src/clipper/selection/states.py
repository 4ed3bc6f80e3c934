"""Per-user policy states (personalisation), held in a bounded least-recently-used map.

The map does no I/O: the caller persists what it is handed through ``on_evict`` (and, at
shutdown, what :meth:`UserStates.items` lists) and supplies its persisted copies through
``load``. The uid ``""`` (a query without a uid) is the application's shared state; it is kept
apart from the per-user ones, never evicted and not counted against ``capacity``, because
every query without a uid uses it.

The store holds as many: the frontend deletes the stored state of the user it wrote least
recently once an application has more than ``CAPACITY`` users' states stored
(:class:`clipper.persistence.StoreSync`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from clipper.errors import ConfigError
from clipper.selection.base import SelectionPolicy, State

__all__ = ["CAPACITY", "SHARED", "UserStates"]

CAPACITY = 10_000
"""Per-user states kept per application: in memory here, and in the store (persistence)."""

SHARED = ""
"""The uid of the shared state."""


class UserStates:
    """At most ``capacity`` per-user states in memory (plus the shared one), LRU evicted."""

    __slots__ = ("_load", "_on_evict", "_shared", "_users", "capacity", "policy")

    def __init__(
        self,
        policy: SelectionPolicy,
        capacity: int = CAPACITY,
        *,
        on_evict: Callable[[str, State], None] | None = None,
        load: Callable[[str], State | None] | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"user state capacity must be an integer >= 1, got {capacity!r}")
        self.policy = policy
        self.capacity = capacity
        self._on_evict = on_evict
        self._load = load
        self._shared: State | None = None
        self._users: OrderedDict[str, State] = OrderedDict()  # oldest first

    def get(self, uid: str) -> State:
        """The state for ``uid``: in memory, else the caller's persisted copy (``load``), else a
        fresh one. It becomes the most recently used; the returned dict is the live state, so
        ``observe`` on it needs no ``put``."""
        if uid == SHARED:
            if self._shared is None:
                self._shared = self._fetch(uid)
            return self._shared
        state = self._users.get(uid)
        if state is not None:
            self._users.move_to_end(uid)
            return state
        state = self._fetch(uid)
        self._insert(uid, state)
        return state

    def put(self, uid: str, state: State) -> None:
        """Store (or replace) the state for ``uid`` as the most recently used."""
        if uid == SHARED:
            self._shared = state
            return
        self._users.pop(uid, None)
        self._insert(uid, state)

    def items(self) -> Iterator[tuple[str, State]]:
        """Every state in memory: the shared one first, then users from least recently used."""
        if self._shared is not None:
            yield SHARED, self._shared
        yield from list(self._users.items())

    def __contains__(self, uid: object) -> bool:
        # Membership does not count as a use.
        return (uid == SHARED and self._shared is not None) or uid in self._users

    def __len__(self) -> int:
        return len(self._users) + (self._shared is not None)

    def _fetch(self, uid: str) -> State:
        loaded = self._load(uid) if self._load is not None else None
        return loaded if loaded is not None else self.policy.init_state()

    def _insert(self, uid: str, state: State) -> None:
        self._users[uid] = state
        while len(self._users) > self.capacity:
            old_uid, old_state = self._users.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(old_uid, old_state)

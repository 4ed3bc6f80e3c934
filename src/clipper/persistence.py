"""Keeps the registry and the config store in step.

The registry is a view of the store. A change made on this frontend is validated on a draft of
the registry, committed to the store as one atomic write, and only then applied to the registry
(:meth:`StoreSync.commit`): an acknowledged change is a stored change, and a change the store
refused leaves the registry as it was. Changes that other frontends wrote to a shared store
arrive as store events, a commit at a time; when the store says events may have been missed (a
reconnect, a revision gap), the snapshot is loaded again and the difference applied. All three —
local commits, remote events, reloads — end in :meth:`Registry.apply_snapshot`, whose change
events are what the runtime follows.

Selection-policy states are learned, not configured: they are written behind, by one owned
writer task, and a lost one costs a little learning, never a promise. The per-user ones are as
bounded in the store as in memory: this frontend keeps at most ``state_capacity`` users' states
per application stored (the same bound as :class:`~clipper.selection.UserStates` in memory),
and writing one more deletes the stored state of the user written least recently. Without it a
client sending feedback with a new ``uid`` each time grew the store without end.

What was stored before this frontend started (an earlier run, another frontend on a shared
Redis store) counts too: at an application's first state write here, the writer task lists the
application's stored users (:meth:`Store.state_users`, a page at a time) as older than any
written since, and deletes the oldest beyond the bound, a page per commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from clipper.clock import Clock, MonotonicClock, wait_for
from clipper.registry import GONE, Records, Registry
from clipper.selection.states import CAPACITY, SHARED
from clipper.store.base import (
    CONFIG_KINDS,
    STATE_PAGE,
    Delete,
    DeletePrefix,
    Op,
    Put,
    Store,
    StoreError,
    StoreEvent,
)

__all__ = ["StoreSync", "delta_of", "diff_registries"]

log = logging.getLogger("clipper.store")

_STATE_QUEUE_LIMIT = 100_000

# Queued with an application's name instead of a state: list what the application has stored.
_SCAN: Final = object()

T = TypeVar("T")


@dataclass(slots=True)
class _Scan:
    """An application's stored users being listed: those found so far that this frontend has
    not written (older than every user it wrote), and those it deleted meanwhile, which the
    listing may still show."""

    found: OrderedDict[str, None] = field(default_factory=OrderedDict)
    gone: set[str] = field(default_factory=set)


def diff_registries(before: Registry, after: Registry) -> list[Op]:
    """The store operations that turn ``before`` into its draft ``after`` (a
    :meth:`Registry.copy` then changed). Unchanged entries are the same objects in both, so
    only what changed is turned into records: a change costs the same however much is
    registered."""
    ops: list[Op] = []
    for name, app in after.apps.items():
        if before.apps.get(name) is not app:
            ops.append(Put("app", name, app.to_record()))
    ops.extend(Delete("app", name) for name in before.apps if name not in after.apps)
    for name, versions in after.models.items():
        old_versions = before.models.get(name, {})
        for version, mv in versions.items():
            if old_versions.get(version) is not mv:
                ops.append(Put("model", f"{name}:{version}", mv.to_record()))
    for name, versions in before.models.items():
        kept = after.models.get(name, {})
        ops.extend(Delete("model", f"{name}:{v}") for v in versions if v not in kept)
    for name, version in after.current.items():
        if before.current.get(name) != version:
            ops.append(Put("current", name, version))
    ops.extend(Delete("current", name) for name in before.current if name not in after.current)
    for app_name, models in after.links.items():
        if before.links.get(app_name) != models:
            ops.append(Put("links", app_name, list(models)))
    ops.extend(Delete("links", name) for name in before.links if name not in after.links)
    for name, intent in after.intents.items():
        if before.intents.get(name) != intent:
            ops.append(Put("intent", name, intent.to_record()))
    ops.extend(Delete("intent", name) for name in before.intents if name not in after.intents)
    for name, rollout in after.rollouts.items():
        if before.rollouts.get(name) is not rollout:
            ops.append(Put("rollout", name, rollout.to_record()))
    ops.extend(Delete("rollout", name) for name in before.rollouts if name not in after.rollouts)
    for name, tenant in after.tenants.items():
        if before.tenants.get(name) is not tenant:
            ops.append(Put("tenant", name, tenant.to_record()))
    ops.extend(Delete("tenant", name) for name in before.tenants if name not in after.tenants)
    return ops


def delta_of(ops: Sequence[Op | StoreEvent]) -> Records:
    """Store operations as a registry delta (:meth:`Registry.apply_delta`), configuration
    kinds only; a later operation on a key wins."""
    delta: Records = {kind: {} for kind in CONFIG_KINDS}
    for op in ops:
        if op.kind not in delta or isinstance(op, DeletePrefix):
            continue  # prefix deletions are of selection states, never configuration
        if isinstance(op, Delete) or (isinstance(op, StoreEvent) and op.value is None):
            delta[op.kind][op.key] = GONE
        else:
            delta[op.kind][op.key] = op.value
    return delta


class StoreSync:
    def __init__(
        self,
        registry: Registry,
        store: Store,
        *,
        clock: Clock | None = None,
        state_capacity: int = CAPACITY,
    ) -> None:
        self.clock: Clock = clock or MonotonicClock()
        self.state_capacity = state_capacity
        # Per application, the users whose states this frontend stored, least recently first.
        self._stored: dict[str, OrderedDict[str, None]] = {}
        # Applications whose stored users were listed (or are queued to be), and the listings
        # under way.
        self._scanned: set[str] = set()
        self._scanning: dict[str, _Scan] = {}
        self.registry = registry
        self.store = store
        # Serializes this frontend's commits and reloads: a draft is validated against the
        # registry that its commit will be applied to.
        self.lock = asyncio.Lock()
        self._pending: list[StoreEvent] = []
        # (key, state), or (key, None): delete the key's stored state.
        self._states: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(_STATE_QUEUE_LIMIT)
        self._writer: asyncio.Task[None] | None = None
        self._reloads: set[asyncio.Task[None]] = set()
        self._reload_wanted = False

    async def start(self) -> None:
        """Make the registry equal to the store, then follow the store's events."""
        self.registry.apply_snapshot(await self.store.load())
        self.store.watch(self._on_event)
        self.store.on_resync(self.request_reload)
        self._writer = asyncio.create_task(self._write_states(), name="clipper-state-writer")

    async def stop(self) -> None:
        """Write the queued selection states (bounded), then stop."""
        for task in list(self._reloads):
            task.cancel()
        await asyncio.gather(*self._reloads, return_exceptions=True)
        if self._writer is None:
            return
        with contextlib.suppress(TimeoutError):
            await wait_for(self.clock, self._states.join(), 10.0)
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        self._writer = None

    # -- local changes -------------------------------------------------------------------------
    async def commit(self, mutate: Callable[[Registry], T], extra: Sequence[Op] = ()) -> T:
        """Validate ``mutate`` on a draft of the registry, commit the difference (and
        ``extra``) to the store, then apply it. Raises what ``mutate`` raises, or
        :class:`StoreError` — in both cases nothing changed."""
        async with self.lock:
            draft = self.registry.copy()
            result = mutate(draft)
            ops = diff_registries(self.registry, draft) + list(extra)
            if ops:
                await self.store.commit(ops)
                for op in extra:  # an application's states deleted with it
                    if isinstance(op, DeletePrefix) and op.kind == "state":
                        app = op.prefix.rstrip(":")
                        self._stored.pop(app, None)
                        self._scanning.pop(app, None)
                        self._scanned.discard(app)
                # Applied as a delta to the registry as it is now: an event from another
                # frontend may have landed while the commit was in flight, and stays.
                self.registry.apply_delta(delta_of(ops))
            return result

    def write_state(self, key: str, value: Any) -> None:
        """Queue a selection-policy state write (``app:uid``). A user's state beyond
        ``state_capacity`` per application queues the deletion of the least recent one's; the
        application's first write queues the listing of what it already has stored."""
        app, _, uid = key.partition(":")
        if uid == SHARED:  # the shared state is every uid-less query's: never evicted
            self._queue(key, value)
            return
        if app not in self._scanned and self._queue(app, _SCAN):
            self._scanned.add(app)
            self._scanning[app] = _Scan()
        users = self._stored.setdefault(app, OrderedDict())
        scan = self._scanning.get(app)
        if scan is not None:  # written now: the most recent, whatever the listing finds
            scan.found.pop(uid, None)
            scan.gone.discard(uid)
        users[uid] = None
        users.move_to_end(uid)
        self._queue(key, value)
        for evicted in self._over_bound(app):
            self._queue(f"{app}:{evicted}", None)

    def stored_users(self, app: str) -> int:
        """How many users' states of ``app`` this frontend counts as stored."""
        scan = self._scanning.get(app)
        return len(self._stored.get(app, ())) + (len(scan.found) if scan is not None else 0)

    def _over_bound(self, app: str) -> list[str]:
        """Forget the least recent users of ``app`` beyond ``state_capacity``: those the listing
        found first (older than any written here), then the least recently written; the
        caller deletes their states."""
        users = self._stored.get(app)
        if users is None:
            return []
        scan = self._scanning.get(app)
        found = scan.found if scan is not None else OrderedDict()
        evicted: list[str] = []
        while len(users) + len(found) > self.state_capacity:
            source = found if found else users
            evicted.append(source.popitem(last=False)[0])
        if scan is not None:
            scan.gone.update(evicted)
        return evicted

    def _queue(self, key: str, value: Any) -> bool:
        try:
            self._states.put_nowait((key, value))
        except asyncio.QueueFull:
            log.warning(
                "the state writer is %d writes behind; dropping %s", _STATE_QUEUE_LIMIT, key
            )
            return False
        return True

    async def _write_states(self) -> None:
        while True:
            key, value = await self._states.get()
            try:
                if value is _SCAN:
                    await self._scan(key)
                elif value is None:
                    await self.store.delete("state", key)
                else:
                    await self.store.put("state", key, value)
            except StoreError as e:
                log.warning("a selection state was not stored: %s", e)
            except Exception:
                log.exception("writing selection state %s failed", key)
            finally:
                self._states.task_done()

    async def _scan(self, app: str) -> None:
        """Count the users of ``app`` stored before this frontend wrote any, as the oldest, and
        delete the oldest beyond the bound: one commit per page listed, so the writes queued
        meanwhile wait at most a page."""
        scan = self._scanning.get(app)
        if scan is None:
            return
        listed = 0
        try:
            async for page in self.store.state_users(app, STATE_PAGE):
                if self._scanning.get(app) is not scan:
                    return  # the application's states were deleted meanwhile
                users = self._stored.get(app, OrderedDict())
                for uid in page:
                    if uid not in users and uid not in scan.gone:
                        scan.found[uid] = None  # a uid listed twice keeps its first place
                listed += len(page)
                evicted = self._over_bound(app)
                if evicted:
                    await self.store.commit([Delete("state", f"{app}:{u}") for u in evicted])
        except StoreError as e:
            log.warning("listing the stored selection states of %s failed: %s", app, e)
        finally:
            if self._scanning.get(app) is scan:
                del self._scanning[app]
                # The users found go before those written here: they are the older ones.
                merged = scan.found
                merged.update(self._stored.get(app, OrderedDict()))
                self._stored[app] = merged
        log.info(
            "application %s: %d stored users' states listed, %d kept",
            app,
            listed,
            len(self._stored.get(app, ())),
        )

    # -- other frontends -----------------------------------------------------------------------
    def _on_event(self, event: StoreEvent) -> None:
        self._pending.append(event)
        if not event.last:
            return  # the rest of the commit follows
        ops, self._pending = self._pending, []
        self.registry.apply_delta(delta_of(ops))

    def request_reload(self) -> None:
        """Load the snapshot again and apply the difference (events may have been missed)."""
        if self._reload_wanted:
            return
        self._reload_wanted = True
        task = asyncio.get_running_loop().create_task(self._reload(), name="clipper-store-reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload(self) -> None:
        async with self.lock:
            self._reload_wanted = False
            try:
                snapshot = await self.store.load()
            except StoreError as e:
                log.warning("reloading the configuration failed (retried on the next sign): %s", e)
                return
            self._pending = []
            changes = self.registry.apply_snapshot(snapshot)
            if changes:
                log.info("reloaded the configuration from the store: %d changes", len(changes))

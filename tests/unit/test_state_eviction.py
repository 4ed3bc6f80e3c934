"""Per-user selection states are as bounded in the store as in memory: many distinct uids
leave at most ``state_capacity`` stored states per application, the least recently written
evicted first; the shared state is never evicted; deleting an application forgets its users."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clipper.clock import FakeClock
from clipper.persistence import StoreSync
from clipper.registry import Registry
from clipper.selection.states import CAPACITY
from clipper.store.base import DeletePrefix, Store
from clipper.store.memory import MemoryStore
from clipper.store.sqlite import SqliteStore

pytestmark = pytest.mark.asyncio

STATE = {"weights": [0.25] * 8, "n": 12}


async def _sync(store: Store, capacity: int) -> StoreSync:
    await store.open()
    sync = StoreSync(Registry(), store, clock=FakeClock(start=0.0), state_capacity=capacity)
    await sync.start()
    return sync


def _sqlite_states(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        count, size = conn.execute(
            "SELECT count(*), coalesce(sum(length(key) + length(value)), 0) "
            "FROM clipper_store WHERE kind = 'state'"
        ).fetchone()
    finally:
        conn.close()
    return int(count), int(size)


async def test_many_distinct_uids_leave_a_bounded_store(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    store = SqliteStore(path)
    sync = await _sync(store, capacity=100)
    sync.write_state("app:", STATE)  # the shared state
    for i in range(2_000):  # a client sending feedback with a new uid each time
        sync.write_state(f"app:user-{i}", STATE)
        sync.write_state(f"other:user-{i}", STATE)
    await sync.stop()  # drains the queued writes and deletions
    count, size = _sqlite_states(path)
    assert count == 2 * 100 + 1
    one = len("other:user-1999") + len(
        b'{"weights":[0.25,0.25,0.25,0.25,0.25,0.25,0.25,0.25],"n":12}'
    )
    assert size <= count * one
    assert sync.stored_users("app") == 100
    # The most recent users stayed, the oldest went; the shared state stayed.
    assert await store.get("state", "app:user-1999") == STATE
    assert await store.get("state", "app:user-1900") == STATE
    assert await store.get("state", "app:user-1899") is None
    assert await store.get("state", "app:user-0") is None
    assert await store.get("state", "app:") == STATE
    await store.close()


async def test_a_user_written_again_is_the_most_recent() -> None:
    store = MemoryStore()
    sync = await _sync(store, capacity=3)
    for uid in ("a", "b", "c", "a", "d"):  # "a" again: "b" is now the least recent
        sync.write_state(f"app:{uid}", STATE)
    await sync.stop()
    assert [await store.get("state", f"app:{u}") is not None for u in "abcd"] == [
        True, False, True, True,
    ]  # fmt: skip


async def test_deleting_an_application_forgets_its_stored_users() -> None:
    store = MemoryStore()
    sync = await _sync(store, capacity=5)
    for i in range(5):
        sync.write_state(f"app:{i}", STATE)
    await sync.commit(lambda draft: None, extra=[DeletePrefix("state", "app:")])
    assert sync.stored_users("app") == 0
    await sync.stop()


async def test_memory_and_store_share_one_bound() -> None:
    assert StoreSync(Registry(), MemoryStore()).state_capacity == CAPACITY

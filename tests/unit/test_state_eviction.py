"""Per-user selection states are as bounded in the store as in memory: many distinct uids
leave at most ``state_capacity`` stored states per application, the least recently written
evicted first; the shared state is never evicted; deleting an application forgets its users."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from clipper.clock import FakeClock
from clipper.persistence import StoreSync
from clipper.registry import Registry
from clipper.selection.states import CAPACITY
from clipper.store.base import STATE_PAGE, Delete, DeletePrefix, Op, Put, Store
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


# --- what was stored before this frontend started counts too ----------------------------------


async def test_the_bound_holds_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    store = SqliteStore(path)
    sync = await _sync(store, capacity=5)
    for i in range(10):  # 2 x the bound
        sync.write_state(f"app:user-{i}", STATE)
    sync.write_state("app:", STATE)
    await sync.stop()
    await store.close()
    assert _sqlite_states(path)[0] == 5 + 1

    store = SqliteStore(path)  # the restart
    sync = await _sync(store, capacity=5)
    sync.write_state("app:user-new", STATE)
    await sync.stop()
    assert _sqlite_states(path)[0] == 5 + 1  # the bound, and the shared state
    assert sync.stored_users("app") == 5
    # The oldest stored before the restart went; the newest four and the new one stayed.
    kept = [i for i in range(10) if await store.get("state", f"app:user-{i}") is not None]
    assert kept == [6, 7, 8, 9]
    assert await store.get("state", "app:user-new") == STATE
    assert await store.get("state", "app:") == STATE
    await store.close()


async def test_restarts_do_not_add_up(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    for run in range(4):  # each run writes the bound in new users
        store = SqliteStore(path)
        sync = await _sync(store, capacity=20)
        for i in range(20):
            sync.write_state(f"app:run{run}-{i}", STATE)
        await sync.stop()
        await store.close()
        assert _sqlite_states(path)[0] == 20
    store = SqliteStore(path)
    await store.open()
    listed = [uid async for page in store.state_users("app") for uid in page]
    assert listed == [f"run3-{i}" for i in range(20)]
    await store.close()


async def test_a_store_far_over_the_bound_is_cut_down_a_page_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    store = SqliteStore(path)
    await store.open()
    # States written before the store was bounded: 2,500 users, more than two pages.
    await store.commit([Put("state", f"app:old-{i}", STATE) for i in range(2_500)])
    await store.commit([Put("state", f"other:old-{i}", STATE) for i in range(30)])
    commits: list[int] = []
    real_commit = store.commit

    async def counting_commit(ops: Sequence[Op]) -> None:
        if all(isinstance(op, Delete) for op in ops):
            commits.append(len(ops))
        await real_commit(ops)

    store.commit = counting_commit  # type: ignore[method-assign]
    sync = StoreSync(Registry(), store, clock=FakeClock(start=0.0), state_capacity=10)
    await sync.start()
    sync.write_state("app:new", STATE)
    await sync.stop()
    assert sync.stored_users("app") == 10
    # The deletions went in commits of at most a page, not one per user nor one for all.
    assert commits and max(commits) <= STATE_PAGE
    assert sum(commits) == 2_500 - 9
    listed = [uid async for page in store.state_users("app") for uid in page]
    assert listed == [f"old-{i}" for i in range(2_491, 2_500)] + ["new"]
    # Another application is not touched until it is written.
    assert len([u async for page in store.state_users("other") for u in page]) == 30
    await store.close()


async def test_users_written_during_the_listing_stay_the_most_recent() -> None:
    store = MemoryStore()
    await store.open()
    for i in range(6):
        await store.put("state", f"app:old-{i}", STATE)
    sync = await _sync(store, capacity=4)
    # Queued in one go: the listing runs after these writes are counted, and "old-5" written
    # again here is a recent user, not an old one.
    for uid in ("a", "old-5", "b"):
        sync.write_state(f"app:{uid}", STATE)
    assert sync.stored_users("app") == 3  # the listing has not run yet
    await sync.stop()
    assert sync.stored_users("app") == 4
    listed = [uid async for page in store.state_users("app") for uid in page]
    assert listed == ["old-4", "a", "old-5", "b"]


async def test_deleting_an_application_during_its_listing_stops_it() -> None:
    store = MemoryStore()
    await store.open()
    for i in range(5):
        await store.put("state", f"app:old-{i}", STATE)
    sync = await _sync(store, capacity=2)
    sync.write_state("app:a", STATE)
    await sync.commit(lambda draft: None, extra=[DeletePrefix("state", "app:")])
    await sync.stop()
    assert sync.stored_users("app") == 0

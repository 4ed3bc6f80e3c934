"""Two SQLite stores on one file (the worker processes of ``clipper start --workers N``): each
hears the other's commits through the change log, whole commits in order, never its own."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.persistence import StoreSync
from clipper.registry import Application, Registry
from clipper.store import SqliteStore, StoreEvent
from clipper.store import sqlite as sqlite_module
from clipper.store.base import Delete, DeletePrefix, Put
from clipper.store.sqlite import CHANGES_KEEP_REVS, CHANGES_KEEP_S, SCHEMA_VERSION

APP = {"name": "a", "input_type": "doubles", "default_output": "-1.0", "latency_slo_micros": 20000}
# Long enough for a loaded machine; the queue answers as soon as the poller dispatched.
WAIT_S = 10.0


class Heard:
    """A store's watcher and resync callback: the events in a queue, the resyncs counted."""

    def __init__(self, store: SqliteStore) -> None:
        self.events: asyncio.Queue[StoreEvent] = asyncio.Queue()
        self.resyncs: asyncio.Queue[None] = asyncio.Queue()
        store.watch(self.events.put_nowait)
        store.on_resync(lambda: self.resyncs.put_nowait(None))

    async def next(self) -> StoreEvent:
        return await asyncio.wait_for(self.events.get(), WAIT_S)

    async def commit(self) -> list[StoreEvent]:
        """The events of the next whole commit."""
        out = [await self.next()]
        while not out[-1].last:
            out.append(await self.next())
        return out


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[SqliteStore, SqliteStore]]:
    path = tmp_path / "clipper.db"
    a, b = SqliteStore(path, poll_s=0.005), SqliteStore(path, poll_s=0.005)
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_a_commit_reaches_the_other_store_whole_and_in_order(
    pair: tuple[SqliteStore, SqliteStore],
) -> None:
    a, b = pair
    heard_a, heard_b = Heard(a), Heard(b)
    await b.load()
    await a.commit([Put("app", "a", APP), Put("links", "a", ["m"])])
    await a.delete("links", "a")
    assert await heard_b.commit() == [
        StoreEvent("app", "a", APP, last=False),
        StoreEvent("links", "a", ["m"], last=True),
    ]
    assert await heard_b.commit() == [StoreEvent("links", "a", None)]
    # And the other way; a's own commits never came back to it.
    await b.put("current", "m", "2")
    assert await heard_a.commit() == [StoreEvent("current", "m", "2")]
    assert heard_a.events.empty() and heard_b.events.empty()


async def test_selection_states_are_neither_logged_nor_heard(
    pair: tuple[SqliteStore, SqliteStore], tmp_path: Path
) -> None:
    a, b = pair
    heard_b = Heard(b)
    await a.put("state", "a:u1", {"n": 1})
    await a.commit([Delete("app", "a"), DeletePrefix("state", "a:")])
    # Only the configuration part of the mixed commit is heard.
    assert await heard_b.commit() == [StoreEvent("app", "a", None)]
    with sqlite3.connect(tmp_path / "clipper.db") as conn:
        rows = conn.execute("SELECT ops FROM clipper_changes").fetchall()
    assert [orjson.loads(r[0]) for r in rows] == [[["app", "a", None]]]


async def test_a_stale_event_never_reverts_a_newer_own_write(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    # b reads the log only when the test moves its clock, which stamps b's commits on the
    # scale of a's (the log's age trim compares them).
    polls = FakeClock(time.monotonic())
    a, b = SqliteStore(path), SqliteStore(path, clock=polls, poll_s=1.0)
    await a.open()
    await b.open()
    try:
        heard_b = Heard(b)
        await b.load()
        # a's write lands first; b's own later write of the same key must win in b's view.
        await a.put("current", "m", "1")
        await b.put("current", "m", "2")
        await a.put("current", "other", "3")
        polls.advance(1.0)
        assert await heard_b.commit() == [StoreEvent("current", "other", "3")]
        assert heard_b.events.empty()
    finally:
        await a.close()
        await b.close()


async def test_events_a_load_already_holds_are_not_dispatched(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    # b's poller is parked on a fake clock: it reads only when the test moves it.
    clock = FakeClock()
    a, b = SqliteStore(path), SqliteStore(path, clock=clock, poll_s=1.0)
    await a.open()
    await b.open()
    try:
        heard_b = Heard(b)
        await a.put("app", "a", APP)
        snapshot = await b.load()
        assert snapshot["app"] == {"a": APP}
        await a.put("current", "m", "1")
        clock.advance(1.0)
        assert await heard_b.commit() == [StoreEvent("current", "m", "1")]
        assert heard_b.events.empty()
    finally:
        await a.close()
        await b.close()


async def test_a_store_behind_the_trimmed_log_resyncs(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    # a's clock stamps the log; b's poller reads only when the test moves b's clock.
    stamps, polls = FakeClock(), FakeClock()
    a = SqliteStore(path, clock=stamps)
    b = SqliteStore(path, clock=polls, poll_s=1.0)
    await a.open()
    await b.open()
    try:
        heard_b = Heard(b)
        await b.load()
        await a.put("current", "m", "1")
        # Older than the log keeps: the next commit trims it before b ever read it.
        stamps.advance(CHANGES_KEEP_S + 1)
        await a.put("current", "m", "2")
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM clipper_changes").fetchone() == (1,)
        polls.advance(1.0)
        await asyncio.wait_for(heard_b.resyncs.get(), WAIT_S)
        assert heard_b.events.empty()
        # Back in step after the resync: the next commit is heard as usual.
        await a.put("current", "m", "3")
        polls.advance(1.0)
        assert await heard_b.commit() == [StoreEvent("current", "m", "3")]
    finally:
        await a.close()
        await b.close()


async def test_the_log_keeps_at_most_its_revisions(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    a = SqliteStore(path)
    await a.open()
    try:
        with sqlite3.connect(path) as conn:  # a long history, without 10,000 commits
            conn.execute(
                "INSERT INTO clipper_changes (rev, origin, at, ops) VALUES (?, 'x', ?, '[]')",
                (CHANGES_KEEP_REVS + 5, a.clock.now()),
            )
        await a.put("app", "a", APP)
        with sqlite3.connect(path) as conn:
            revs = [r[0] for r in conn.execute("SELECT rev FROM clipper_changes ORDER BY rev")]
        assert revs == [CHANGES_KEEP_REVS + 5, CHANGES_KEEP_REVS + 6]
    finally:
        await a.close()


async def test_registries_of_two_stores_converge(tmp_path: Path) -> None:
    """What the workers run: each StoreSync applies the other's admin changes."""
    path = tmp_path / "clipper.db"
    a, b = SqliteStore(path, poll_s=0.005), SqliteStore(path, poll_s=0.005)
    ra, rb = Registry(), Registry()
    sa, sb = StoreSync(ra, a), StoreSync(rb, b)
    await a.open()
    await b.open()
    try:
        await sa.start()
        await sb.start()
        heard_b = Heard(b)  # after StoreSync's watcher: fires once the registry applied it
        await sa.commit(lambda r: r.add_app(Application("a", InputType.DOUBLES, "-1", 20_000)))
        await heard_b.commit()
        assert rb.apps["a"] == ra.apps["a"]
    finally:
        await sa.stop()
        await sb.stop()
        await a.close()
        await b.close()


async def test_a_schema_2_file_gets_the_change_log(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # the layout of schema 2: no change log
        conn.execute(
            "CREATE TABLE clipper_store (kind TEXT NOT NULL, key TEXT NOT NULL,"
            " value TEXT NOT NULL, seq INTEGER, PRIMARY KEY (kind, key))"
        )
        conn.execute("INSERT INTO clipper_store VALUES ('meta', 'schema_version', '2', NULL)")
        conn.execute(
            "INSERT INTO clipper_store VALUES ('app', 'a', ?, NULL)", (orjson.dumps(APP).decode(),)
        )
    finally:
        conn.close()
    a, b = SqliteStore(path, poll_s=0.005), SqliteStore(path, poll_s=0.005)
    await a.open()
    await b.open()
    try:
        heard_b = Heard(b)
        assert (await b.load())["app"] == {"a": APP}
        await a.delete("app", "a")
        assert await heard_b.commit() == [StoreEvent("app", "a", None)]
    finally:
        await a.close()
        await b.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute(
            "SELECT value FROM clipper_store WHERE kind = 'meta' AND key = 'schema_version'"
        ).fetchone() == (str(SCHEMA_VERSION),)


async def test_a_commit_the_wal_stat_hides_is_read_within_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poller wakes its thread only when the write-ahead log's stat changed, and at least
    every _FULL_POLL_S: a commit hidden by coarse time stamps is late, never lost."""
    path = tmp_path / "clipper.db"
    polls = FakeClock(time.monotonic())
    a, b = SqliteStore(path), SqliteStore(path, clock=polls, poll_s=0.25)
    monkeypatch.setattr(sqlite_module, "_file_mark", lambda _path: (1, 1, 1))
    await a.open()
    await b.open()
    try:
        heard_b = Heard(b)
        await b.load()
        polls.advance(0.25)  # the first look notes the mark, and reads nothing
        # Two reads on b's one thread: the poller resumes while the test awaits the first and
        # queues its look, which may land behind that first read; the second is behind it, so
        # the look has read before a commits (else it would read the commit itself).
        await b.get("app", "x")
        await b.get("app", "x")
        await a.put("current", "m", "1")
        for _ in range(2):
            polls.advance(0.25)
            await b.get("app", "x")
        assert heard_b.events.empty()  # the mark did not move: the thread was not asked
        polls.advance(0.5)  # a second since the last read: read anyway
        assert await heard_b.commit() == [StoreEvent("current", "m", "1")]
    finally:
        await a.close()
        await b.close()

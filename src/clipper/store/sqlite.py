"""The default store: one SQLite file in the state directory.

Durability: the database runs in WAL mode with ``synchronous=FULL``. Every commit (a put, a
delete, or the several operations of one admin change) is one transaction, synced to the
write-ahead log before it returns, so a change that was acknowledged survives the frontend being
killed at any point and an operating-system crash or power loss (measured: 0.3 ms p50, 0.7 ms
p99 per commit on this project's machine; NORMAL saves that sync and may lose the last commits
on power loss).

Threading: sqlite3 calls block, and the frontend's event loop must not, so every call runs on ONE
worker thread owned by the store (a single-thread executor). The connection is made and used only
on that thread, and the single FIFO worker applies writes in the order they were issued.

Change notification between processes (schema 3): several frontends on one machine (``clipper
start --workers N``) share one file. Every commit that changes configuration also appends one
row to ``clipper_changes`` in the same transaction: its revision (an AUTOINCREMENT key, so
revisions only grow, even after trimming), the writer's random instance id, the time, and its
operations. Every store looks every ``poll_s`` whether the write-ahead log changed (a stat on
the event loop) and, when it did (or a second passed), asks ``PRAGMA data_version`` (which
moves only when another connection committed) on its worker thread, reads the rows past the
last revision it saw, and calls its watchers on the event loop with the other writers'
operations, one whole commit at a time, in revision order. Selection states are not logged
(they are written per query and never watched). The log keeps the last 10,000 revisions and
at most 10 minutes of them; a store that finds the revision after its last one trimmed (it was
stopped, or far behind) calls its ``on_resync`` callbacks, whose owner loads the snapshot again.

Leases and presence (frontends of one machine sharing the file: ``--workers``) are rows of their
own tables, each claim one IMMEDIATE transaction that reads and writes under the file's write
lock, timed by the wall clock (the processes sharing the file share it; a monotonic clock is
per process). They are not configuration and never in :meth:`SqliteStore.load`.

Write order of selection states (schema 2): each state row carries ``seq``, one more than the
largest stored, set by every write of it, with a partial index on it; listing an application's
users least recently written first (:meth:`SqliteStore.state_users`) walks that index a page at
a time. Rows of schema 1 get their insertion order (rowid) as ``seq`` when the file is upgraded.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import orjson

from clipper.clock import Clock, MonotonicClock, sleep
from clipper.store.base import (
    CONFIG_KINDS,
    KINDS,
    RUNTIME_KINDS,
    STATE_PAGE,
    Delete,
    DeletePrefix,
    Kind,
    Lease,
    Op,
    Put,
    Resync,
    Snapshot,
    StoreError,
    StoreEvent,
    Watcher,
    check_kind,
    check_lease,
    check_ops,
    check_runtime_kind,
    decode_value,
    empty_snapshot,
    encode_value,
)

__all__ = ["CHANGES_KEEP_REVS", "CHANGES_KEEP_S", "POLL_S", "SCHEMA_VERSION", "SqliteStore"]

log = logging.getLogger(__name__)

# Bump when the table layout or the JSON of a kind changes, and add a step to _migrate.
SCHEMA_VERSION: Final = 3
# How often each store looks for other processes' commits: a change made on one worker's admin
# port reaches the others within about this. An idle look is a stat of the write-ahead log on
# the loop (measured: 0.4% of a core at 50 ms; a hop to the store's thread for a PRAGMA each
# time cost 1.1%).
POLL_S: Final = 0.05
# The change log keeps at most this many revisions, none older than this many seconds (on the
# machine-wide monotonic clock); a store further behind reloads.
CHANGES_KEEP_REVS: Final = 10_000
CHANGES_KEEP_S: Final = 600.0
# Commits read per poll step: a store far behind catches up in steps, the thread free between.
_POLL_BATCH: Final = 500
# The longest a commit can go unread when the write-ahead log's stat did not show it.
_FULL_POLL_S: Final = 1.0
_META: Final = "meta"
_SCHEMA_KEY: Final = "schema_version"
# Another process holding the write lock briefly (e.g. an admin tool) is waited for, not an error.
_BUSY_TIMEOUT_MS: Final = 5000

T = TypeVar("T")

# Every write of a state is the most recent: one more than the largest seq stored (the partial
# index makes the max a lookup). Other kinds have no order to keep: their seq stays NULL.
_PUT: Final = (
    "INSERT INTO clipper_store (kind, key, value, seq) VALUES (?1, ?2, ?3,"
    " CASE WHEN ?1 = 'state' THEN"
    " (SELECT coalesce(max(seq), 0) + 1 FROM clipper_store INDEXED BY clipper_state_seq"
    " WHERE kind = 'state') END)"
    " ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value, seq = excluded.seq"
)
# One page of an application's users, least recently written first, after the seq ``?``; the
# prefix test is a substr (not LIKE: keys may hold '%' or '_'), so the walk is on the seq index.
_STATE_PAGE_SQL: Final = (
    "SELECT key, seq FROM clipper_store INDEXED BY clipper_state_seq"
    " WHERE kind = 'state' AND seq > ? AND substr(key, 1, ?) = ? ORDER BY seq LIMIT ?"
)


_CREATE_CHANGES: Final = (
    "CREATE TABLE IF NOT EXISTS clipper_changes ("
    " rev INTEGER PRIMARY KEY AUTOINCREMENT, origin TEXT NOT NULL, at REAL NOT NULL,"
    " ops TEXT NOT NULL)"
)
# The oldest rows go first, always a prefix of the revisions (the times of two writers' commits
# may interleave), so a reader's gap test (is the row after my last one still there?) sees
# every trimmed revision.
_TRIM_CHANGES: Final = (
    "DELETE FROM clipper_changes WHERE rev <= max(?1,"
    " coalesce((SELECT max(rev) FROM clipper_changes WHERE at < ?2), 0))"
)
_LATEST_REV: Final = (
    "SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'clipper_changes'"
)


def _file_mark(path: str) -> tuple[int, int, int] | None:
    """What changes when a file is written: inode, size, modification time."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SqliteStore:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        poll_s: float = POLL_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = os.fspath(path)
        self.clock: Clock = clock or MonotonicClock()
        self.poll_s = poll_s
        # Random per instance: the poller skips the log rows of this instance's own commits.
        self.origin = secrets.token_hex(8)
        # Leases and presence expire by this (seconds since the epoch): every process that
        # shares the file reads the same one. Injected by tests.
        self._wall = wall
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # touched only on the worker thread
        self._watchers: list[Watcher] = []
        self._resyncs: list[Resync] = []
        self._poller: asyncio.Task[None] | None = None
        # Worker thread only: the last log revision read, and PRAGMA data_version at that read.
        self._seen_rev = 0
        self._data_version: int | None = None
        # Event loop only: the revision the last load() reflects, and per configuration key the
        # revision of its last write applied here (a late event never reverts a newer value).
        self._loaded_rev = 0
        self._key_rev: dict[tuple[str, str], int] = {}

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError(f"sqlite store {self.path} is not open: call 'await store.open()'")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(fn, *args))
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite store {self.path}: {exc}") from exc

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clipper-sqlite")
        try:
            await self._call(self._open_sync)
        except BaseException:
            await self._shutdown()
            raise
        self._poller = asyncio.create_task(self._poll(), name=f"{self!r} change poller")

    async def close(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            # wait() rather than awaiting it: a cancel of close() itself still propagates.
            await asyncio.wait([poller])
        if self._executor is None:
            return
        await self._shutdown()

    async def _shutdown(self) -> None:
        executor = self._executor
        if executor is None:
            return
        # Refuse new calls at once; the close job queues behind the writes already in flight,
        # so those land before the connection closes.
        self._executor = None
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(executor, self._close_sync)
        finally:
            # The worker is idle now; joining it on another thread keeps the loop unblocked.
            await asyncio.to_thread(executor.shutdown, wait=True)

    async def load(self) -> Snapshot:
        rows, rev = await self._call(self._load_sync)
        # The snapshot holds every commit up to rev: events of those are stale from now on.
        self._loaded_rev = rev
        self._key_rev = {k: r for k, r in self._key_rev.items() if r > rev}
        snapshot = empty_snapshot()
        for kind, key, text in rows:
            if kind in snapshot:
                snapshot[kind][key] = decode_value(kind, key, text)
        return snapshot

    async def commit(self, ops: Sequence[Op]) -> None:
        # Encoded here, not on the worker, so a caller mutating a value after this call is not
        # seen, and a value that is not JSON fails the commit before anything is written.
        checked = check_ops(ops)
        if not checked:
            return
        rev = await self._call(self._commit_sync, checked, self.clock.now())
        if rev is not None:
            for op, _ in checked:
                if isinstance(op, Put | Delete) and op.kind != "state":
                    self._key_rev[(op.kind, op.key)] = rev

    async def put(self, kind: Kind, key: str, value: Any) -> None:
        await self.commit([Put(kind, key, value)])

    async def delete(self, kind: Kind, key: str) -> None:
        check_kind(kind)
        await self.commit([Delete(kind, key)])

    async def get(self, kind: Kind, key: str) -> Any | None:
        check_kind(kind)
        text = await self._call(self._get_sync, kind, key)
        return None if text is None else decode_value(kind, key, text)

    async def state_users(self, app: str, batch: int = STATE_PAGE) -> AsyncIterator[list[str]]:
        prefix = f"{app}:"
        after = -(2**63)
        while True:
            rows = await self._call(self._state_page_sync, prefix, after, max(1, batch))
            if not rows:
                return
            after = rows[-1][1]
            uids = [key[len(prefix) :] for key, _ in rows]
            if page := [uid for uid in uids if uid]:  # the shared state is not a user's
                yield page

    def watch(self, callback: Watcher) -> None:
        self._watchers.append(callback)

    def on_resync(self, callback: Resync) -> None:
        self._resyncs.append(callback)

    async def _poll(self) -> None:
        failing = False
        more = False
        wal = f"{self.path}-wal"
        seen: tuple[int, int, int] | None = None
        full_at = self.clock.now()
        while True:
            if not more:
                await sleep(self.clock, self.poll_s)
                # Every commit, of any process, writes the write-ahead log: while it looks
                # unchanged (a stat, microseconds) the worker thread is not woken. Its time
                # stamps may be coarse, so the thread looks anyway every _FULL_POLL_S.
                now, mark = self.clock.now(), _file_mark(wal)

                if not failing and mark == seen and now - full_at < _FULL_POLL_S:
                    continue
                seen, full_at = mark, now
            try:
                commits, gap, more = await self._call(self._poll_sync)
            except StoreError as exc:
                if not failing:
                    log.warning("sqlite store %s: cannot read the change log: %s", self.path, exc)
                failing, more = True, False
                continue
            if failing:
                # What we could not read may be gone from the log: start from a fresh snapshot.
                failing, gap = False, True
            if gap:
                self._resync("its last change seen is no longer in the change log")
            for rev, events in commits:
                self._dispatch(rev, events)

    def _resync(self, why: str) -> None:
        log.info("sqlite store %s: reloading (%s)", self.path, why)
        for callback in list(self._resyncs):
            try:
                callback()
            except Exception:
                log.exception("sqlite store resync callback %r failed", callback)

    def _dispatch(self, rev: int, events: list[StoreEvent]) -> None:
        if rev <= self._loaded_rev:
            return  # a load() since the poll read it already holds it
        fresh = [e for e in events if self._key_rev.get((e.kind, e.key), 0) < rev]
        for e in events:
            self._key_rev[(e.kind, e.key)] = max(rev, self._key_rev.get((e.kind, e.key), 0))
        for i, e in enumerate(fresh):
            event = StoreEvent(e.kind, e.key, e.value, last=i == len(fresh) - 1)
            for callback in list(self._watchers):
                try:
                    callback(event)
                except Exception:
                    # One failing watcher must not stop the others or the poller.
                    log.exception("sqlite store watcher %r failed on %r", callback, event)

    async def claim(self, name: str, holder: str, ttl_s: float) -> Lease:
        check_lease(name, holder, ttl_s)
        return await self._call(self._claim_sync, name, holder, ttl_s)

    async def release(self, name: str, holder: str) -> bool:
        check_lease(name, holder)
        return await self._call(self._release_sync, name, holder)

    async def announce(self, group: str, key: str, value: Any, ttl_s: float) -> None:
        check_lease(group, key, ttl_s)
        text = encode_value("replica", key, value).decode()
        await self._call(self._announce_sync, group, key, text, ttl_s)

    async def withdraw(self, group: str, key: str) -> None:
        await self._call(self._withdraw_sync, group, key)

    async def live(self, group: str) -> dict[str, Any]:
        rows = await self._call(self._live_sync, group)
        return {key: decode_value(group, key, text) for key, text in rows}

    async def records(self, kind: Kind) -> dict[str, Any]:
        check_runtime_kind(kind)
        rows = await self._call(self._records_sync, kind)
        return {key: decode_value(kind, key, text) for key, text in rows}

    # --- on the worker thread only ---------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"sqlite store {self.path} is closed")
        return self._conn

    def _open_sync(self) -> None:
        try:
            parent = os.path.dirname(os.path.abspath(self.path))
            os.makedirs(parent, exist_ok=True)
            # isolation_level=None: autocommit, each statement or explicit BEGIN is a transaction.
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=_BUSY_TIMEOUT_MS / 1000)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open sqlite store {self.path}: {exc}") from exc
        # Processes opening a fresh file at once (--workers) race on switching it to WAL, which
        # SQLite answers "locked" without waiting on the busy timeout: retry for a while (on the
        # store's own thread, never the event loop).
        give_up = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                self._setup(conn)
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) and time.monotonic() < give_up:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    time.sleep(0.05)
                    continue
                conn.close()
                raise StoreError(f"cannot open sqlite store {self.path}: {exc}") from exc
            except sqlite3.Error as exc:
                conn.close()
                raise StoreError(f"cannot open sqlite store {self.path}: {exc}") from exc
            except BaseException:
                conn.close()
                raise
            break
        self._conn = conn

    def _setup(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(
                f"sqlite store {self.path}: cannot enable WAL mode (got {mode!r}); "
                "put the state directory on a local filesystem"
            )
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS clipper_lease ("
            " name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL)"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS clipper_presence ("
            " grp TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,"
            " expires_at REAL NOT NULL, PRIMARY KEY (grp, key))"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS clipper_store ("
            " kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, seq INTEGER,"
            " PRIMARY KEY (kind, key))"
        )
        # IMMEDIATE: two processes opening a fresh file at once must not both write the version.
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._migrate(conn, self._schema_version(conn))
            conn.execute(
                "CREATE INDEX IF NOT EXISTS clipper_state_seq ON clipper_store (seq)"
                " WHERE kind = 'state'"
            )
            conn.execute(_CREATE_CHANGES)
            conn.execute(
                "INSERT INTO clipper_store (kind, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value",
                (_META, _SCHEMA_KEY, str(SCHEMA_VERSION)),
            )
            # Changes are heard from here on (load() moves this to its snapshot's revision).
            self._seen_rev = int(conn.execute(_LATEST_REV).fetchone()[0])
            conn.execute("COMMIT")
            self._data_version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "SELECT value FROM clipper_store WHERE kind = ? AND key = ?", (_META, _SCHEMA_KEY)
        ).fetchone()
        if row is None:
            return SCHEMA_VERSION  # a new file
        found = decode_value(_META, _SCHEMA_KEY, row[0])
        if not isinstance(found, int) or isinstance(found, bool):
            raise StoreError(f"sqlite store {self.path}: bad schema version {row[0]!r}")
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"sqlite store {self.path} has schema version {found}, written by a newer "
                f"clipper-serve; this version reads up to {SCHEMA_VERSION}"
            )
        return found

    def _migrate(self, conn: sqlite3.Connection, found: int) -> None:
        """Upgrade records from schema ``found`` to SCHEMA_VERSION, a step per version."""
        if found < 2:
            # 2: states carry their write order; the existing ones in the order first written.
            conn.execute("ALTER TABLE clipper_store ADD COLUMN seq INTEGER")
            conn.execute("UPDATE clipper_store SET seq = rowid WHERE kind = 'state'")
        if found < 3:
            # 3: the change log that other processes on the file poll; it starts empty.
            conn.execute(_CREATE_CHANGES)

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _get_sync(self, kind: str, key: str) -> str | None:
        row = (
            self._db()
            .execute("SELECT value FROM clipper_store WHERE kind = ? AND key = ?", (kind, key))
            .fetchone()
        )
        return None if row is None else str(row[0])

    def _load_sync(self) -> tuple[list[tuple[str, str, str]], int]:
        """The configuration rows and the log revision they reflect, read in one transaction."""
        db = self._db()
        placeholders = ", ".join("?" * len(CONFIG_KINDS))
        db.execute("BEGIN")
        try:
            cur = db.execute(
                f"SELECT kind, key, value FROM clipper_store WHERE kind IN ({placeholders})",
                CONFIG_KINDS,
            )
            rows = [(str(k), str(key), str(v)) for k, key, v in cur.fetchall()]
            rev = int(db.execute(_LATEST_REV).fetchone()[0])
        finally:
            db.execute("COMMIT")
        self._seen_rev = rev
        return rows, rev

    def _poll_sync(self) -> tuple[list[tuple[int, list[StoreEvent]]], bool, bool]:
        """(other writers' commits since the last poll, whether some were trimmed unread,
        whether more are waiting). A PRAGMA only, when no other connection committed."""
        db = self._db()
        version = int(db.execute("PRAGMA data_version").fetchone()[0])
        if version == self._data_version:
            return [], False, False
        db.execute("BEGIN")
        try:
            rows = db.execute(
                "SELECT rev, origin, ops FROM clipper_changes WHERE rev > ? ORDER BY rev LIMIT ?",
                (self._seen_rev, _POLL_BATCH),
            ).fetchall()
            latest = int(db.execute(_LATEST_REV).fetchone()[0])
        finally:
            db.execute("COMMIT")
        more = len(rows) == _POLL_BATCH
        if not more:
            # Only once everything is read: a batch cut short reads on without a new commit.
            self._data_version = version
        first = int(rows[0][0]) if rows else latest + 1
        if latest > self._seen_rev and first != self._seen_rev + 1:
            self._seen_rev = latest
            return [], True, False
        commits: list[tuple[int, list[StoreEvent]]] = []
        for rev, origin, ops in rows:
            self._seen_rev = int(rev)
            if origin == self.origin:
                continue
            events = self._events_of(int(rev), ops)
            if events:
                commits.append((int(rev), events))
        return commits, False, more

    def _events_of(self, rev: int, text: str) -> list[StoreEvent]:
        try:
            events = [
                StoreEvent(kind, key, None if value is None else decode_value(kind, key, value))
                for kind, key, value in orjson.loads(text)
                if kind in KINDS and isinstance(key, str)
            ]
        except (orjson.JSONDecodeError, TypeError, ValueError, StoreError):
            log.warning("sqlite store %s: ignoring malformed change %d: %r", self.path, rev, text)
            return []
        return events

    def _state_page_sync(self, prefix: str, after: int, limit: int) -> list[tuple[str, int]]:
        cur = self._db().execute(_STATE_PAGE_SQL, (after, len(prefix), prefix, limit))
        return [(str(key), int(seq)) for key, seq in cur.fetchall()]

    def _claim_sync(self, name: str, holder: str, ttl_s: float) -> Lease:
        db = self._db()
        # IMMEDIATE: the read and the write under one write lock, so two processes claiming at
        # once cannot both see the lease free.
        db.execute("BEGIN IMMEDIATE")
        try:
            now = self._wall()
            row = db.execute(
                "SELECT holder, expires_at FROM clipper_lease WHERE name = ?", (name,)
            ).fetchone()
            if row is None or float(row[1]) <= now or row[0] == holder:
                db.execute(
                    "INSERT INTO clipper_lease (name, holder, expires_at) VALUES (?, ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
                    " expires_at = excluded.expires_at",
                    (name, holder, now + ttl_s),
                )
                lease = Lease(holder, ttl_s)
            else:
                lease = Lease(str(row[0]), float(row[1]) - now)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return lease

    def _release_sync(self, name: str, holder: str) -> bool:
        cur = self._db().execute(
            "DELETE FROM clipper_lease WHERE name = ? AND holder = ? AND expires_at > ?",
            (name, holder, self._wall()),
        )
        return cur.rowcount > 0

    def _announce_sync(self, group: str, key: str, text: str, ttl_s: float) -> None:
        self._db().execute(
            "INSERT INTO clipper_presence (grp, key, value, expires_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (grp, key) DO UPDATE SET value = excluded.value,"
            " expires_at = excluded.expires_at",
            (group, key, text, self._wall() + ttl_s),
        )

    def _withdraw_sync(self, group: str, key: str) -> None:
        self._db().execute("DELETE FROM clipper_presence WHERE grp = ? AND key = ?", (group, key))

    def _live_sync(self, group: str) -> list[tuple[str, str]]:
        db = self._db()
        now = self._wall()
        # Expired entries go as they are read: the table holds live frontends and a few more.
        db.execute("DELETE FROM clipper_presence WHERE grp = ? AND expires_at <= ?", (group, now))
        cur = db.execute(
            "SELECT key, value FROM clipper_presence WHERE grp = ? AND expires_at > ?",
            (group, now),
        )
        return [(str(k), str(v)) for k, v in cur.fetchall()]

    def _records_sync(self, kind: str) -> list[tuple[str, str]]:
        cur = self._db().execute("SELECT key, value FROM clipper_store WHERE kind = ?", (kind,))
        return [(str(k), str(v)) for k, v in cur.fetchall()]

    def _commit_sync(self, checked: list[tuple[Op, bytes | None]], now: float) -> int | None:
        """Write ``checked`` in one transaction; the revision of its change log row (None when
        it changed selection states only, which are not logged)."""
        db = self._db()
        logged = [
            [op.kind, op.key, text.decode() if text is not None else None]
            for op, text in checked
            # Runtime records (RUNTIME_KINDS) are the replica owner's: never watched.
            if isinstance(op, Put | Delete) and op.kind != "state" and op.kind not in RUNTIME_KINDS
        ]
        rev: int | None = None
        db.execute("BEGIN IMMEDIATE")
        try:
            for op, text in checked:
                if isinstance(op, Put):
                    assert text is not None
                    db.execute(_PUT, (op.kind, op.key, text.decode()))
                elif isinstance(op, DeletePrefix):
                    # substr, not LIKE: keys may hold '%' or '_'.
                    db.execute(
                        "DELETE FROM clipper_store WHERE kind = ? AND substr(key, 1, ?) = ?",
                        (op.kind, len(op.prefix), op.prefix),
                    )
                else:
                    db.execute(
                        "DELETE FROM clipper_store WHERE kind = ? AND key = ?", (op.kind, op.key)
                    )
            if logged:
                cur = db.execute(
                    "INSERT INTO clipper_changes (origin, at, ops) VALUES (?, ?, ?)",
                    (self.origin, now, orjson.dumps(logged).decode()),
                )
                rev = cur.lastrowid
                assert rev is not None
                db.execute(_TRIM_CHANGES, (rev - CHANGES_KEEP_REVS, now - CHANGES_KEEP_S))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return rev

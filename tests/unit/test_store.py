from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from clipper.clock import FakeClock
from clipper.errors import ClipperError, ConfigError
from clipper.store import CONFIG_KINDS, MemoryStore, SqliteStore, Store, StoreError, open_store
from clipper.store.base import Delete, DeletePrefix, Lease, Put, redact_url
from clipper.store.sqlite import SCHEMA_VERSION

SRC = Path(__file__).resolve().parents[2] / "src"

APP = {"name": "a", "input_type": "doubles", "default_output": "-1.0", "latency_slo_micros": 20000}
MODEL = {"name": "m", "version": "1", "labels": ["x", "y"], "batching": {"controller": "aimd"}}


def make_store(backend: str, tmp_path: Path) -> Store:
    if backend == "memory":
        return MemoryStore()
    return SqliteStore(tmp_path / "state" / "clipper.db")


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s = make_store(request.param, tmp_path)
    await s.open()
    yield s
    await s.close()


# --- the contract, for every backend ------------------------------------------------------


async def test_load_of_an_empty_store_has_every_config_kind(store: Store) -> None:
    assert await store.load() == {
        "app": {},
        "model": {},
        "current": {},
        "links": {},
        "intent": {},
        "rollout": {},
        "tenant": {},
    }


async def test_put_then_load(store: Store) -> None:
    await store.put("app", "a", APP)
    await store.put("model", "m:1", MODEL)
    await store.put("current", "m", "1")
    await store.put("links", "a", ["m"])
    rollout = {"name": "m", "split": {"1": 95.0}, "sticky": True, "shadow": None}
    await store.put("rollout", "m", rollout)
    snap = await store.load()
    assert snap == {
        "app": {"a": APP},
        "model": {"m:1": MODEL},
        "current": {"m": "1"},
        "links": {"a": ["m"]},
        "intent": {},
        "rollout": {"m": rollout},
        "tenant": {},
    }


async def test_overwrite_keeps_the_last_value(store: Store) -> None:
    await store.put("current", "m", "1")
    await store.put("current", "m", "2")
    await store.put("links", "a", ["m"])
    await store.put("links", "a", [])
    snap = await store.load()
    assert snap["current"] == {"m": "2"}
    assert snap["links"] == {"a": []}


async def test_delete_removes_only_that_key(store: Store) -> None:
    await store.put("model", "m:1", MODEL)
    await store.put("model", "m:2", {**MODEL, "version": "2"})
    await store.put("app", "m:1", APP)  # same key, other kind: must survive
    await store.delete("model", "m:1")
    snap = await store.load()
    assert snap["model"] == {"m:2": {**MODEL, "version": "2"}}
    assert snap["app"] == {"m:1": APP}


async def test_delete_of_a_missing_key_is_not_an_error(store: Store) -> None:
    await store.delete("app", "nope")
    assert (await store.load())["app"] == {}


async def test_values_are_copies(store: Store) -> None:
    value: dict[str, Any] = {"labels": ["x"], "nested": {"n": 1}}
    await store.put("model", "m:1", value)
    value["labels"].append("mutated after put")
    value["nested"]["n"] = 2
    loaded = (await store.load())["model"]["m:1"]
    assert loaded == {"labels": ["x"], "nested": {"n": 1}}
    loaded["labels"].append("mutated after load")
    assert (await store.load())["model"]["m:1"] == {"labels": ["x"], "nested": {"n": 1}}


async def test_json_scalars_round_trip(store: Store) -> None:
    doc = {"f": 1.5, "i": -3, "big": 2**53, "t": True, "n": None, "s": "ünï €"}
    await store.put("app", "a", doc)
    assert (await store.load())["app"]["a"] == doc


async def test_bad_kind_key_or_value_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown store kind 'meta'"):
        await store.put("meta", "x", 1)  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="non-empty"):
        await store.put("app", "", APP)
    with pytest.raises(StoreError, match="not JSON"):
        await store.put("app", "a", {"f": object()})
    assert await store.load() == {kind: {} for kind in CONFIG_KINDS}


async def test_own_writes_are_not_watched(store: Store) -> None:
    seen: list[object] = []
    store.watch(seen.append)
    await store.put("app", "a", APP)
    await store.delete("app", "a")
    assert seen == []


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_use_before_open_or_after_close_is_a_store_error(
    backend: str, tmp_path: Path
) -> None:
    s = make_store(backend, tmp_path)
    with pytest.raises(StoreError, match="not open"):
        await s.load()
    await s.open()
    await s.put("app", "a", APP)
    await s.close()
    with pytest.raises(StoreError, match="not open"):
        await s.put("app", "b", APP)
    await s.close()  # closing twice is harmless


async def test_store_error_is_a_clipper_error() -> None:
    assert issubclass(StoreError, ClipperError)


# --- sqlite --------------------------------------------------------------------------------


async def test_sqlite_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "clipper.db"
    first = SqliteStore(path)
    await first.open()
    await first.put("app", "a", APP)
    await first.put("current", "m", "3")
    await first.put("links", "gone", ["m"])
    await first.delete("links", "gone")
    await first.close()

    second = SqliteStore(path)
    await second.open()
    try:
        snap = await second.load()
    finally:
        await second.close()
    assert snap["app"] == {"a": APP}
    assert snap["current"] == {"m": "3"}
    assert snap["links"] == {}


async def test_sqlite_survives_a_crash_without_close(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    # The child writes and then dies at once: no close(), no checkpoint, no atexit handlers.
    code = textwrap.dedent(
        f"""
        import asyncio, os
        from clipper.store.sqlite import SqliteStore

        async def main():
            s = SqliteStore({str(path)!r})
            await s.open()
            await s.put("app", "a", {APP!r})
            await s.put("current", "m", "7")
            os._exit(0)

        asyncio.run(main())
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, env=env)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    # Not checkpointed: the commits live only in the WAL, which is what the crash must keep.
    assert (tmp_path / "clipper.db-wal").stat().st_size > 0

    s = SqliteStore(path)
    await s.open()
    try:
        snap = await s.load()
    finally:
        await s.close()
    assert snap["app"] == {"a": APP}
    assert snap["current"] == {"m": "7"}


async def test_sqlite_runs_in_wal_mode_with_synchronous_full(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    s = SqliteStore(path)
    await s.open()
    try:
        # synchronous is per connection, so ask the store's own connection, on its own thread.
        sync = await s._call(lambda: s._db().execute("PRAGMA synchronous").fetchone()[0])
    finally:
        await s.close()
    assert sync == 2  # FULL: a commit is synced before the admin call is acknowledged
    # journal_mode=WAL is persistent in the file: any new connection sees it.
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_sqlite_concurrent_puts_all_land_in_issue_order(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "clipper.db")
    await s.open()
    try:
        await asyncio.gather(*(s.put("model", f"m:{i}", {"i": i}) for i in range(200)))
        # Writes to one key from many coroutines: the single worker applies them in call order.
        await asyncio.gather(*(s.put("current", "m", str(i)) for i in range(100)))
        snap = await s.load()
    finally:
        await s.close()
    assert snap["model"] == {f"m:{i}": {"i": i} for i in range(200)}
    assert snap["current"] == {"m": "99"}


def sqlite_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("clipper-sqlite")]


async def test_sqlite_uses_one_worker_thread_and_joins_it_on_close(tmp_path: Path) -> None:
    before = set(sqlite_threads())
    s = SqliteStore(tmp_path / "clipper.db")
    await s.open()
    await asyncio.gather(*(s.put("app", f"a{i}", APP) for i in range(20)), s.load())
    mine = set(sqlite_threads()) - before
    assert len(mine) == 1
    await s.close()
    assert not any(t.is_alive() for t in mine)


async def test_sqlite_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    s = SqliteStore(path)
    await s.open()
    await s.close()
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT value FROM clipper_store WHERE kind = 'meta' AND key = 'schema_version'"
        ).fetchone()
        assert row == (str(SCHEMA_VERSION),)
        conn.execute(
            "UPDATE clipper_store SET value = ? WHERE kind = 'meta'", (str(SCHEMA_VERSION + 1),)
        )
    newer = SqliteStore(path)
    with pytest.raises(StoreError, match="newer clipper-serve"):
        await newer.open()
    with pytest.raises(StoreError, match="not open"):
        await newer.load()


async def test_sqlite_meta_row_is_not_in_the_snapshot(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "clipper.db")
    await s.open()
    try:
        assert set(await s.load()) == set(CONFIG_KINDS)
    finally:
        await s.close()


async def test_sqlite_cannot_open_names_the_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = blocker / "clipper.db"
    s = SqliteStore(path)
    with pytest.raises(StoreError, match="cannot open sqlite store") as info:
        await s.open()
    assert str(path) in str(info.value)


async def test_sqlite_open_failure_leaves_no_worker_thread(tmp_path: Path) -> None:
    before = set(sqlite_threads())
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreError):
        await SqliteStore(blocker / "clipper.db").open()
    assert not any(t.is_alive() for t in set(sqlite_threads()) - before)


# --- open_store ------------------------------------------------------------------------------


def test_open_store_memory() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)


def test_open_store_sqlite_file(tmp_path: Path) -> None:
    s = open_store(f"sqlite://{tmp_path}/x.db")
    assert isinstance(s, SqliteStore)
    assert s.path == f"{tmp_path}/x.db"


@pytest.mark.parametrize("form", ["{d}", "{d}/", "{d}/new-state-dir"])
def test_open_store_sqlite_directory(tmp_path: Path, form: str) -> None:
    url = "sqlite://" + form.format(d=tmp_path)
    s = open_store(url)
    assert isinstance(s, SqliteStore)
    assert Path(s.path) == Path(form.format(d=tmp_path)) / "clipper.db"


async def test_open_store_sqlite_directory_is_created(tmp_path: Path) -> None:
    s = open_store(f"sqlite://{tmp_path}/state")
    await s.open()
    await s.put("current", "m", "1")
    await s.close()
    assert (tmp_path / "state" / "clipper.db").is_file()


def test_open_store_redis_takes_prefix_out_of_the_url() -> None:
    pytest.importorskip("redis")
    from clipper.store.redis import RedisStore

    s = open_store("redis://127.0.0.1:6390/2?prefix=blue")
    assert isinstance(s, RedisStore)
    assert s.url == "redis://127.0.0.1:6390/2"
    assert s.prefix == "blue"
    assert s.channel == "blue:events"
    plain = open_store("redis://localhost:6379/0")
    assert isinstance(plain, RedisStore)
    assert plain.prefix == "clipper"


@pytest.mark.parametrize(
    "url",
    ["", "postgres://x/y", "/var/lib/clipper", "memory://extra", "sqlite://", "file:///x.db"],
)
def test_open_store_rejects_other_urls_naming_the_accepted_forms(url: str) -> None:
    with pytest.raises(ConfigError, match=r"memory://.*sqlite:///.*redis://"):
        open_store(url)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://", "no host"),
        ("redis://h:notaport/0", "bad port"),
        ("redis://h:6379/zero", "database number"),
        ("redis://h:6379/0?prefix=", "prefix"),
    ],
)
def test_open_store_rejects_bad_redis_urls(url: str, why: str) -> None:
    pytest.importorskip("redis")
    with pytest.raises(ConfigError, match=why) as info:
        open_store(url)
    assert "accepted forms" in str(info.value)


def test_redis_store_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import redis` raise ImportError, as if it were not installed.
    monkeypatch.setitem(sys.modules, "redis", None)
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(ConfigError, match=r"pip install 'clipper-serve\[redis\]'"):
        open_store("redis://localhost:6379/0")


def test_redact_url_hides_the_password() -> None:
    assert redact_url("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    assert redact_url("redis://:pw@[::1]:6379/0") == "redis://:***@[::1]:6379/0"


async def test_state_is_read_one_key_at_a_time_and_not_loaded(store: Store) -> None:
    await store.put("state", "app:user-1", {"log_w": {"m": -1.5}})
    assert await store.get("state", "app:user-1") == {"log_w": {"m": -1.5}}
    assert await store.get("state", "app:nobody") is None
    assert "state" not in await store.load()  # possibly millions of users: never in a snapshot
    await store.delete("state", "app:user-1")
    assert await store.get("state", "app:user-1") is None


async def test_a_commit_stores_all_its_operations_together(store: Store) -> None:
    await store.put("state", "keep:u1", {"w": 1})
    await store.put("state", "app:u1", {"w": 1})
    await store.put("state", "app:u2", {"w": 2})
    await store.put("app", "old", APP)
    await store.commit(
        [
            Put("app", "a", APP),
            Put("links", "a", []),
            Delete("app", "old"),
            DeletePrefix("state", "app:"),
        ]
    )
    snap = await store.load()
    assert snap["app"] == {"a": APP}
    assert snap["links"] == {"a": []}
    assert await store.get("state", "app:u1") is None
    assert await store.get("state", "app:u2") is None
    assert await store.get("state", "keep:u1") == {"w": 1}


async def test_a_commit_with_a_bad_operation_stores_nothing(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.commit([Put("app", "a", APP), Put("app", "b", {"f": object()})])
    with pytest.raises(StoreError):
        await store.commit([Put("app", "a", APP), DeletePrefix("state", "")])
    assert (await store.load())["app"] == {}


async def test_a_failed_sqlite_commit_is_rolled_back_whole(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "clipper.db")
    await s.open()
    try:
        # Break the second statement of the transaction from the inside: a trigger that
        # refuses one key. The first write of the same commit must not survive.
        await s._call(
            lambda: s._db().execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON clipper_store WHEN NEW.key = 'bad' "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        )
        with pytest.raises(StoreError, match="refused"):
            await s.commit([Put("app", "good", APP), Put("app", "bad", APP)])
        assert (await s.load())["app"] == {}
    finally:
        await s.close()


# --- listing an application's stored users ---------------------------------------------------


async def _listed(store: Store, app: str, batch: int) -> list[list[str]]:
    return [page async for page in store.state_users(app, batch)]


async def test_state_users_lists_one_app_least_recently_written_first(store: Store) -> None:
    for uid in ("u0", "u1", "u2", "u3", "u4"):
        await store.put("state", f"a:{uid}", {"n": 1})
    await store.put("state", "a:", {"shared": True})  # not a user's: not listed
    await store.put("state", "ab:u9", {"n": 1})  # another application whose name starts alike
    await store.put("state", "b:u1", {"n": 1})
    await store.put("app", "a", APP)
    await store.put("state", "a:u1", {"n": 2})  # written again: now the most recent
    await store.delete("state", "a:u3")
    pages = await _listed(store, "a", batch=2)
    assert all(1 <= len(page) <= 2 for page in pages)
    assert [uid for page in pages for uid in page] == ["u0", "u2", "u4", "u1"]
    assert await _listed(store, "b", batch=10) == [["u1"]]
    assert await _listed(store, "none", batch=10) == []


async def test_state_users_of_uids_holding_colons_and_wildcards(store: Store) -> None:
    for uid in ("x:y", "*", "a%_[b]"):
        await store.put("state", f"a:{uid}", {"n": 1})
    assert await _listed(store, "a", batch=100) == [["x:y", "*", "a%_[b]"]]


async def test_sqlite_state_users_keeps_the_write_order_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    store = SqliteStore(path)
    await store.open()
    for i in range(5):
        await store.put("state", f"a:u{i}", {"n": i})
    await store.close()
    store = SqliteStore(path)
    await store.open()
    await store.put("state", "a:u0", {"n": 9})  # after the reopen: still the most recent
    assert [u for page in await _listed(store, "a", 2) for u in page] == [
        "u1", "u2", "u3", "u4", "u0",
    ]  # fmt: skip
    await store.close()


async def test_sqlite_upgrades_a_schema_1_file_keeping_its_states(tmp_path: Path) -> None:
    path = tmp_path / "clipper.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # the layout clipper-serve wrote before states carried their write order
        conn.execute(
            "CREATE TABLE clipper_store (kind TEXT NOT NULL, key TEXT NOT NULL,"
            " value TEXT NOT NULL, PRIMARY KEY (kind, key))"
        )
        conn.execute("INSERT INTO clipper_store VALUES ('meta', 'schema_version', '1')")
        conn.execute(
            "INSERT INTO clipper_store VALUES ('app', 'a', ?)", (orjson.dumps(APP).decode(),)
        )
        for uid in ("old0", "old1", "old2"):
            conn.execute(
                "INSERT INTO clipper_store VALUES ('state', ?, '{\"n\":1}')", (f"a:{uid}",)
            )
    finally:
        conn.close()
    store = SqliteStore(path)
    await store.open()
    try:
        assert (await store.load())["app"] == {"a": APP}
        assert await store.get("state", "a:old1") == {"n": 1}
        await store.put("state", "a:new", {"n": 2})
        await store.put("state", "a:old0", {"n": 3})
        # The old states in the order first written, then the writes since, in their order.
        assert await _listed(store, "a", 10) == [["old1", "old2", "new", "old0"]]
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        version = conn.execute(
            "SELECT value FROM clipper_store WHERE kind = 'meta' AND key = 'schema_version'"
        ).fetchone()
    finally:
        conn.close()
    assert version == (str(SCHEMA_VERSION),)
    assert SCHEMA_VERSION == 3


# --- leases, presence and runtime records ----------------------------------------------------


class Timed:
    """A store whose leases and presence expire by a time the test moves."""

    def __init__(self, backend: str, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.backend = backend
        self.path = tmp_path / "state" / "clipper.db"

    def make(self) -> Store:
        if self.backend == "memory":
            return MemoryStore(clock=self.clock)
        return SqliteStore(self.path, wall=self.clock.now)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)


@pytest.fixture(params=["memory", "sqlite"])
async def timed(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Store, Timed]]:
    t = Timed(request.param, tmp_path)
    s = t.make()
    await s.open()
    yield s, t
    await s.close()


async def test_a_free_lease_is_taken_and_renewed_by_its_holder(
    timed: tuple[Store, Timed],
) -> None:
    store, t = timed
    assert await store.claim("owner", "a", 5.0) == Lease("a", 5.0)
    t.advance(3.0)
    assert await store.claim("owner", "a", 5.0) == Lease("a", 5.0)  # renewed from now
    t.advance(4.0)  # 7 s after the first claim, 4 after the renewal: still a's
    lease = await store.claim("owner", "b", 5.0)
    assert lease.holder == "a"
    assert lease.expires_in_s == pytest.approx(1.0)


async def test_an_expired_lease_goes_to_the_next_claimant(timed: tuple[Store, Timed]) -> None:
    store, t = timed
    await store.claim("owner", "a", 5.0)
    t.advance(5.0)
    assert await store.claim("owner", "b", 5.0) == Lease("b", 5.0)
    assert (await store.claim("owner", "a", 5.0)).holder == "b"
    # Leases of other names are other leases.
    assert (await store.claim("other", "a", 5.0)).holder == "a"


async def test_release_frees_the_lease_only_for_its_holder(timed: tuple[Store, Timed]) -> None:
    store, _ = timed
    await store.claim("owner", "a", 5.0)
    assert await store.release("owner", "b") is False
    assert (await store.claim("owner", "b", 5.0)).holder == "a"
    assert await store.release("owner", "a") is True
    assert await store.release("owner", "a") is False
    assert (await store.claim("owner", "b", 5.0)).holder == "b"


async def test_bad_lease_arguments_are_store_errors(timed: tuple[Store, Timed]) -> None:
    store, _ = timed
    with pytest.raises(StoreError, match="non-empty"):
        await store.claim("", "a", 5.0)
    with pytest.raises(StoreError, match="non-empty"):
        await store.claim("owner", "", 5.0)
    with pytest.raises(StoreError, match="> 0"):
        await store.claim("owner", "a", 0)
    with pytest.raises(StoreError, match="> 0"):
        await store.announce("frontends", "a", "x", -1.0)


async def test_presence_expires_unless_announced_again(timed: tuple[Store, Timed]) -> None:
    store, t = timed
    await store.announce("frontends", "a", "tcp://127.0.0.1:7000", 3.0)
    await store.announce("frontends", "b", "tcp://127.0.0.1:7001", 3.0)
    await store.announce("others", "c", {"x": 1}, 3.0)
    assert await store.live("frontends") == {
        "a": "tcp://127.0.0.1:7000",
        "b": "tcp://127.0.0.1:7001",
    }
    t.advance(2.0)
    await store.announce("frontends", "a", "tcp://127.0.0.1:7002", 3.0)  # renewed, new value
    t.advance(1.5)
    assert await store.live("frontends") == {"a": "tcp://127.0.0.1:7002"}
    assert await store.live("others") == {}
    await store.withdraw("frontends", "a")
    assert await store.live("frontends") == {}
    assert await store.live("never") == {}


async def test_runtime_records_are_read_whole_and_never_loaded(store: Store) -> None:
    record = {"name": "m", "version": "1", "slot": 0, "token": "t", "pid": 42}
    await store.put("replica", "m/1/0", record)
    await store.put("replica", "m/1/1", {**record, "slot": 1})
    await store.put("app", "a", APP)
    assert await store.records("replica") == {"m/1/0": record, "m/1/1": {**record, "slot": 1}}
    snapshot = await store.load()
    assert set(snapshot) == set(CONFIG_KINDS)
    assert "replica" not in snapshot
    await store.delete("replica", "m/1/0")
    assert set(await store.records("replica")) == {"m/1/1"}
    with pytest.raises(StoreError, match="runtime kinds"):
        await store.records("state")
    with pytest.raises(StoreError, match="runtime kinds"):
        await store.records("app")


async def test_sqlite_processes_sharing_a_file_share_one_lease(tmp_path: Path) -> None:
    t = Timed("sqlite", tmp_path)
    first, second = t.make(), t.make()
    await first.open()
    await second.open()
    try:
        leases = await asyncio.gather(
            *(s.claim("owner", name, 5.0) for s, name in ((first, "a"), (second, "b")))
        )
        assert leases[0].holder == leases[1].holder  # one winner, seen by both
        await first.announce("frontends", "a", "tcp://a", 3.0)
        assert await second.live("frontends") == {"a": "tcp://a"}
    finally:
        await first.close()
        await second.close()

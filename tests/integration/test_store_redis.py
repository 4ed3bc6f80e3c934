"""The Redis store against a real redis-server that this module starts on a free port.

Skipped only when redis-server is not installed and ``CLIPPER_REQUIRE_REDIS`` is not set."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest

from clipper.clock import FakeClock
from clipper.persistence import StoreSync
from clipper.registry import Registry
from clipper.store import Put, StoreError, StoreEvent, open_store
from tests.integration.helpers import wait_for
from tests.integration.redis_server import REDIS_SERVER, free_port, start_redis, stop_redis

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        REDIS_SERVER is None and not os.environ.get("CLIPPER_REQUIRE_REDIS"),
        reason="redis-server is not installed (apt-get install -y redis-server); "
        "set CLIPPER_REQUIRE_REDIS=1 to fail instead",
    ),
]

pytest.importorskip("redis", reason="the redis client is not installed: pip install 'redis>=5'")

from clipper.store.redis import RedisStore  # noqa: E402  (needs the redis package)

APP = {"name": "a", "input_type": "doubles", "default_output": "-1.0", "latency_slo_micros": 20000}


@pytest.fixture(scope="module")
def redis_port() -> Iterator[int]:
    proc, port = start_redis()
    yield port
    stop_redis(proc)


@pytest.fixture
def own_redis() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A server for one test, which may kill it."""
    proc, port = start_redis()
    yield proc, port
    stop_redis(proc)


@pytest.fixture
def make_store(redis_port: int) -> Iterator[Callable[..., RedisStore]]:
    """Unopened stores on the test server; each test gets its own prefix."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"

    def make(*, db: int = 0, prefix: str = prefix) -> RedisStore:
        store = open_store(f"redis://127.0.0.1:{redis_port}/{db}?prefix={prefix}")
        assert isinstance(store, RedisStore)
        return store

    yield make


@pytest.fixture
async def stores(make_store: Callable[..., RedisStore]) -> AsyncIterator[Callable[..., Any]]:
    opened: list[RedisStore] = []

    async def new(**kwargs: Any) -> RedisStore:
        store = make_store(**kwargs)
        await store.open()
        opened.append(store)
        return store

    yield new
    for store in opened:
        await store.close()


def collector() -> tuple[asyncio.Queue[StoreEvent], Callable[[StoreEvent], None]]:
    queue: asyncio.Queue[StoreEvent] = asyncio.Queue()
    return queue, queue.put_nowait


async def test_put_load_delete_contract(stores: Callable[..., Any]) -> None:
    s: RedisStore = await stores()
    assert await s.load() == {
        "app": {},
        "model": {},
        "current": {},
        "links": {},
        "intent": {},
        "rollout": {},
        "tenant": {},
    }
    value: dict[str, Any] = {"labels": ["x"]}
    await s.put("app", "a", APP)
    await s.put("model", "m:1", value)
    value["labels"].append("mutated after put")
    await s.put("current", "m", "1")
    await s.put("current", "m", "2")
    await s.put("links", "a", ["m"])
    await s.put("links", "b", ["m"])
    await s.delete("links", "b")
    await s.delete("links", "never-there")
    rollout = {"name": "m", "split": {"1": 9.0, "2": 1.0}, "sticky": False, "shadow": None}
    await s.put("rollout", "m", rollout)
    snap = await s.load()
    assert snap == {
        "app": {"a": APP},
        "model": {"m:1": {"labels": ["x"]}},
        "current": {"m": "2"},
        "links": {"a": ["m"]},
        "intent": {},
        "rollout": {"m": rollout},
        "tenant": {},
    }
    snap["app"]["a"]["name"] = "mutated after load"
    assert (await s.load())["app"]["a"] == APP


async def test_data_outlives_the_store_instance(stores: Callable[..., Any]) -> None:
    first: RedisStore = await stores()
    await first.put("current", "m", "4")
    await first.close()
    second: RedisStore = await stores()
    assert (await second.load())["current"] == {"m": "4"}


async def test_prefixes_keep_deployments_apart(stores: Callable[..., Any]) -> None:
    blue: RedisStore = await stores(prefix="blue-" + uuid.uuid4().hex[:6])
    green: RedisStore = await stores(prefix="green-" + uuid.uuid4().hex[:6])
    await blue.put("app", "a", APP)
    assert (await green.load())["app"] == {}
    assert (await blue.load())["app"] == {"a": APP}


async def test_a_put_through_a_reaches_b_and_not_a(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    a_seen: list[StoreEvent] = []
    a_got_b = asyncio.Event()

    def on_a(event: StoreEvent) -> None:
        a_seen.append(event)
        a_got_b.set()

    b_seen: list[StoreEvent] = []
    b_got = asyncio.Event()

    def on_b(event: StoreEvent) -> None:
        b_seen.append(event)
        b_got.set()

    a.watch(on_a)
    b.watch(on_b)

    await a.put("model", "m:1", {"version": "1"})
    await asyncio.wait_for(b_got.wait(), 1.0)
    assert b_seen == [StoreEvent("model", "m:1", {"version": "1"})]

    # A's listener reads the channel in publish order: once it has B's later write, it would
    # already have had its own earlier one had that not been skipped.
    await b.put("current", "m", "1")
    await asyncio.wait_for(a_got_b.wait(), 1.0)
    assert a_seen == [StoreEvent("current", "m", "1")]


async def test_a_delete_is_an_event_with_no_value(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    queue, callback = collector()
    b.watch(callback)
    await a.put("links", "app", ["m"])
    await a.delete("links", "app")
    first = await asyncio.wait_for(queue.get(), 1.0)
    second = await asyncio.wait_for(queue.get(), 1.0)
    assert first == StoreEvent("links", "app", ["m"])
    assert second == StoreEvent("links", "app", None)


async def test_events_of_another_db_or_prefix_are_not_delivered(
    stores: Callable[..., Any],
) -> None:
    a: RedisStore = await stores(db=0)
    other_db: RedisStore = await stores(db=1)
    other_db_writer: RedisStore = await stores(db=1)
    other_prefix: RedisStore = await stores(prefix="other-" + uuid.uuid4().hex[:6])
    other_prefix_writer: RedisStore = await stores(prefix=other_prefix.prefix)
    db_queue, db_cb = collector()
    prefix_queue, prefix_cb = collector()
    other_db.watch(db_cb)
    other_prefix.watch(prefix_cb)

    await a.put("app", "a", APP)
    # Fences: later writes in each watcher's own deployment. Delivery follows publish order, so
    # A's event, had it been passed on, would come first.
    await other_db_writer.put("current", "fence", "db")
    await other_prefix_writer.put("current", "fence", "prefix")
    assert await asyncio.wait_for(db_queue.get(), 1.0) == StoreEvent("current", "fence", "db")
    assert await asyncio.wait_for(prefix_queue.get(), 1.0) == StoreEvent(
        "current", "fence", "prefix"
    )
    assert (await other_db.load())["app"] == {}


async def test_a_failing_watcher_does_not_stop_the_others(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()

    def broken(event: StoreEvent) -> None:
        raise RuntimeError("watcher bug")

    queue, callback = collector()
    b.watch(broken)
    b.watch(callback)
    await a.put("current", "m", "1")
    await a.put("current", "m", "2")
    assert (await asyncio.wait_for(queue.get(), 1.0)).value == "1"
    assert (await asyncio.wait_for(queue.get(), 1.0)).value == "2"


async def test_close_leaves_no_task_running(make_store: Callable[..., RedisStore]) -> None:
    before = asyncio.all_tasks()
    s = make_store()
    await s.open()
    s.watch(lambda event: None)
    await s.put("app", "a", APP)
    listener = s._listener
    assert listener is not None
    assert not listener.done()
    await s.close()
    assert listener.done()
    assert asyncio.all_tasks() == before
    with pytest.raises(StoreError, match="not open"):
        await s.load()
    await s.close()  # twice is harmless


async def test_unreachable_redis_is_a_store_error_naming_the_url() -> None:
    port = free_port()  # nothing listens here
    url = f"redis://127.0.0.1:{port}/0"
    before = asyncio.all_tasks()
    s = open_store(url)
    with pytest.raises(StoreError) as info:
        await asyncio.wait_for(s.open(), 10.0)
    assert url in str(info.value)
    assert asyncio.all_tasks() == before
    with pytest.raises(StoreError, match="not open"):
        await s.put("app", "a", APP)


async def test_password_is_not_in_the_error(redis_port: int) -> None:
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreError) as info:
        await asyncio.wait_for(open_store(url).open(), 10.0)
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1" in str(info.value)


async def test_server_gone_mid_run_is_a_store_error(
    own_redis: tuple[subprocess.Popen[bytes], int],
) -> None:
    proc, port = own_redis
    s = open_store(f"redis://127.0.0.1:{port}/0")
    await s.open()
    try:
        await s.put("current", "m", "1")
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.wait)
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
            await asyncio.wait_for(s.put("current", "m", "2"), 10.0)
    finally:
        await s.close()


async def test_a_commit_arrives_whole_at_other_stores(stores: Callable[..., Any]) -> None:
    from clipper.store.base import Delete, DeletePrefix, Put

    a: RedisStore = await stores()
    b: RedisStore = await stores()
    queue, callback = collector()
    b.watch(callback)
    await a.put("state", "x:u", {"w": 1})
    await a.commit(
        [
            Put("app", "x", APP),
            Put("links", "x", []),
            Delete("app", "y"),
            DeletePrefix("state", "x:"),
        ]
    )
    got = [await asyncio.wait_for(queue.get(), 5) for _ in range(3)]
    assert got == [
        StoreEvent("app", "x", APP, last=False),
        StoreEvent("links", "x", [], last=False),
        StoreEvent("app", "y", None, last=True),
    ]
    assert await b.get("state", "x:u") is None


async def test_a_store_that_missed_events_asks_for_a_reload(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    await b.load()
    reloads: asyncio.Queue[None] = asyncio.Queue()
    b.on_resync(lambda: reloads.put_nowait(None))
    # b's event connection goes away unnoticed by it, then a commits: no event reaches b.
    assert b._pubsub is not None
    await b._pubsub.unsubscribe(b.channel)
    await a.put("app", "a", APP)
    # The revision poller sees the gap outlive one poll interval.
    await asyncio.wait_for(reloads.get(), 5)
    assert (await b.load())["app"] == {"a": APP}


async def test_a_late_event_never_reverts_a_newer_value(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    await b.load()
    queue, callback = collector()
    b.watch(callback)
    await a.put("current", "m", "1")
    first = await asyncio.wait_for(queue.get(), 5)
    assert first.value == "1"
    await b.put("current", "m", "3")  # b's own, newer write
    # An event of a's older commit, delivered late (revision 1 < b's write's revision 2):
    op = {"kind": "current", "key": "m", "value": "2"}
    b._dispatch(orjson.dumps({"origin": "someone", "db": 0, "rev": 1, "ops": [op]}))
    assert queue.empty()


# --- listing an application's stored users (HSCAN) --------------------------------------------


async def test_state_users_scans_one_application(stores: Callable[..., Any]) -> None:
    s: RedisStore = await stores()
    # Enough fields that the hash is a real hash table and HSCAN answers in several steps.
    await s.commit([Put("state", f"a:u{i}", {"n": i}) for i in range(600)])
    await s.commit([Put("state", f"ab:u{i}", {"n": i}) for i in range(50)])
    await s.put("state", "a:", {"shared": True})
    # Glob characters in a name match themselves only.
    await s.put("state", "x[1]:u", {"n": 1})
    await s.put("state", "x1:u", {"n": 1})
    await s.put("state", "x*:v", {"n": 1})
    pages = [page async for page in s.state_users("a", 100)]
    assert all(1 <= len(page) <= 100 for page in pages)
    listed = [uid for page in pages for uid in page]
    assert set(listed) == {f"u{i}" for i in range(600)}  # a scan may list a user twice
    assert [page async for page in s.state_users("x[1]", 10)] == [["u"]]
    assert [page async for page in s.state_users("x*", 10)] == [["v"]]
    assert [page async for page in s.state_users("none", 10)] == []


async def test_a_frontend_counts_states_another_one_stored(stores: Callable[..., Any]) -> None:
    other: RedisStore = await stores()  # a frontend that ran before, unbounded
    await other.commit([Put("state", f"a:old{i}", {"n": i}) for i in range(300)])
    await other.put("state", "a:", {"shared": True})
    mine: RedisStore = await stores()
    sync = StoreSync(Registry(), mine, clock=FakeClock(start=0.0), state_capacity=25)
    await sync.start()
    sync.write_state("a:new", {"n": 1})
    await sync.stop()
    assert sync.stored_users("a") == 25
    client = mine._live()
    fields = await client.hkeys(mine._hash("state"))
    assert len(fields) == 25 + 1  # the bound, and the shared state
    assert "a:new" in fields and "a:" in fields


async def test_one_lease_holder_among_stores_by_the_servers_clock(
    stores: Callable[..., Any],
) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    leases = await asyncio.gather(a.claim("owner", "a", 30.0), b.claim("owner", "b", 30.0))
    winner = leases[0].holder
    assert winner in ("a", "b") and leases[1].holder == winner
    assert 29.0 < leases[0].expires_in_s <= 30.0
    loser, loser_name = (b, "b") if winner == "a" else (a, "a")
    winner_store = a if winner == "a" else b
    assert (await winner_store.claim("owner", winner, 30.0)).holder == winner  # renewed
    assert await loser.release("owner", loser_name) is False
    assert await winner_store.release("owner", winner) is True
    assert (await loser.claim("owner", loser_name, 0.2)).holder == loser_name
    # Not renewed, the short lease expires on the server and the other store takes it.
    await wait_for(
        lambda: _holder_is(winner_store, winner), limit_s=5.0, what="the lease to expire"
    )


async def _holder_is(store: RedisStore, holder: str) -> bool:
    return (await store.claim("owner", holder, 30.0)).holder == holder


async def test_presence_expires_on_the_server(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    await a.announce("frontends", "a", "tcp://127.0.0.1:47000", 30.0)
    await b.announce("frontends", "b", "tcp://127.0.0.1:7001", 0.2)
    assert await a.live("frontends") == {
        "a": "tcp://127.0.0.1:47000",
        "b": "tcp://127.0.0.1:7001",
    }

    async def only_a() -> bool:
        return await b.live("frontends") == {"a": "tcp://127.0.0.1:47000"}

    await wait_for(only_a, limit_s=5.0, what="b's entry to expire")
    await a.withdraw("frontends", "a")
    assert await b.live("frontends") == {}


async def test_replica_records_are_shared_but_never_events(stores: Callable[..., Any]) -> None:
    a: RedisStore = await stores()
    b: RedisStore = await stores()
    seen, on_event = collector()
    b.watch(on_event)
    await a.put("replica", "m/1/0", {"token": "t", "pid": 1})
    await a.put("current", "m", "1")  # a config change after it: its event comes
    event = await asyncio.wait_for(seen.get(), 2.0)
    assert event == StoreEvent("current", "m", "1")
    assert await b.records("replica") == {"m/1/0": {"token": "t", "pid": 1}}
    assert "replica" not in await b.load()

"""The redis store's waits on its clock, with its client and pub/sub faked and a FakeClock:
the subscription's confirmation timeout, the event listener's reconnect back-off and the
revision poller's interval. No redis server, no real waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

pytest.importorskip("redis")

import redis.exceptions

from clipper.clock import FakeClock
from clipper.store.open import open_store
from clipper.store.redis import RedisStore

EPS = 1e-6


async def turns(n: int = 20) -> None:
    """Let the loop run ``n`` turns (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=0.0)


@pytest.fixture
def store(clock: FakeClock) -> RedisStore:
    # Never opened: nothing connects. Port 1 would refuse if it did.
    s = open_store("redis://127.0.0.1:1/0", clock=clock)
    assert isinstance(s, RedisStore) and s.clock is clock
    return s


@contextlib.asynccontextmanager
async def running(coro: Any) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)  # what it raised, the test checked


class SilentPubSub:
    """A subscription whose confirmation never comes (or comes when ``confirm()`` is called)."""

    def __init__(self) -> None:
        self._confirmed = asyncio.Event()

    def confirm(self) -> None:
        self._confirmed.set()

    async def get_message(self, **kwargs: Any) -> dict[str, Any] | None:
        await self._confirmed.wait()
        return {"type": "subscribe"}


async def test_an_unconfirmed_subscription_times_out_when_the_clock_passes_5_s(
    store: RedisStore, clock: FakeClock
) -> None:
    pubsub = SilentPubSub()
    async with running(store._await_subscribed(cast(Any, pubsub))) as waiting:
        await turns()
        clock.advance(4.75)
        await turns()
        assert not waiting.done()
        clock.advance(0.25)
        await turns()
        assert waiting.done()
        with pytest.raises(TimeoutError):
            await waiting

    pubsub = SilentPubSub()
    async with running(store._await_subscribed(cast(Any, pubsub))) as waiting:
        await turns()
        clock.advance(4.0)
        pubsub.confirm()
        await waiting  # confirmed in time: no error
        assert clock.pending() == 0


class BrokenPubSub:
    """A subscription whose every read fails, as while the server is down."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.reads: list[float] = []

    async def get_message(self, **kwargs: Any) -> dict[str, Any] | None:
        self.reads.append(self.clock.now())
        raise redis.exceptions.ConnectionError("connection refused (test)")


async def test_the_event_listener_backs_off_on_the_clock_doubling(
    store: RedisStore, clock: FakeClock
) -> None:
    pubsub = BrokenPubSub(clock)
    async with running(store._listen(cast(Any, pubsub))):
        await turns()
        assert pubsub.reads == [0.0] and store._events_broken
        for n, delay in enumerate((0.05, 0.1, 0.2, 0.4), start=2):
            clock.advance(delay - EPS)
            await turns()
            assert len(pubsub.reads) == n - 1  # not before the back-off
            clock.advance(2 * EPS)
            await turns()
            assert len(pubsub.reads) == n
    assert pubsub.reads == pytest.approx([0.0, 0.05, 0.15, 0.35, 0.75], abs=1e-5)


class RevClient:
    """The client as the poller uses it: ``get`` of the revision key."""

    def __init__(self, rev: int) -> None:
        self.rev = rev

    async def get(self, key: str) -> str:
        return str(self.rev)


async def test_a_revision_gap_that_outlives_a_poll_interval_resyncs_at_the_second_poll(
    store: RedisStore, clock: FakeClock
) -> None:
    resyncs: list[float] = []
    store.on_resync(lambda: resyncs.append(clock.now()))
    store._client = cast(Any, RevClient(rev=3))  # ahead of the 0 this store has seen
    async with running(store._poll()):
        await turns()
        clock.advance(1.0)  # the first poll: a gap, maybe an event in flight
        await turns()
        assert resyncs == []
        clock.advance(1.0 - EPS)
        await turns()
        assert resyncs == []
        clock.advance(2 * EPS)  # the second poll, one interval later: still behind
        await turns()
        assert resyncs == [pytest.approx(2.0, abs=1e-5)]

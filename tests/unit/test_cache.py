"""The prediction cache: hits, joined misses, failures, eviction (CLOCK and LRU), stats."""

from __future__ import annotations

import logging

import pytest

from clipper.cache import CacheKey, CacheStats, Lookup, PredictionCache
from clipper.errors import ConfigError

OVERHEAD = 64


class Recorder:
    """A waiter that remembers what it was called with."""

    def __init__(self, log: list[tuple[str, object, BaseException | None]], name: str) -> None:
        self.log = log
        self.name = name

    def __call__(self, value: object, error: BaseException | None) -> None:
        self.log.append((self.name, value, error))


def key(i: int, model: str = "m") -> CacheKey:
    return (model, "1", f"input-{i:04d}".encode())  # 10 bytes of input


def size_of(k: CacheKey, nbytes: int) -> int:
    return len(k[2]) + nbytes + OVERHEAD


def noop(value: object, error: BaseException | None) -> None:
    pass


def fill(cache: PredictionCache, k: CacheKey, value: object, nbytes: int = 26) -> None:
    assert cache.get_or_join(k, noop)[0] is Lookup.MISS
    cache.complete(k, value, nbytes)


# Entries of 10 input bytes + 26 value bytes + 64 overhead = 100 bytes each.
ENTRY = 100


def test_miss_then_hit() -> None:
    cache = PredictionCache()
    log: list[tuple[str, object, BaseException | None]] = []
    assert cache.get_or_join(key(1), Recorder(log, "a")) == (Lookup.MISS, None)
    cache.complete(key(1), "yes", 8)
    assert log == [("a", "yes", None)]
    hit_waiter = Recorder(log, "b")
    assert cache.get_or_join(key(1), hit_waiter) == (Lookup.HIT, "yes")
    assert log == [("a", "yes", None)]  # a hit does not call the waiter


def test_identical_misses_are_joined_and_called_in_order() -> None:
    cache = PredictionCache()
    log: list[tuple[str, object, BaseException | None]] = []
    assert cache.get_or_join(key(1), Recorder(log, "first"))[0] is Lookup.MISS
    assert cache.get_or_join(key(1), Recorder(log, "second")) == (Lookup.JOINED, None)
    assert cache.get_or_join(key(1), Recorder(log, "third")) == (Lookup.JOINED, None)
    assert cache.pending_waiters(key(1)) == 3
    assert log == []
    cache.complete(key(1), 42, 8)
    assert [name for name, _, _ in log] == ["first", "second", "third"]
    assert all(value == 42 and err is None for _, value, err in log)
    assert cache.pending_waiters(key(1)) == 0


def test_different_keys_are_distinct() -> None:
    cache = PredictionCache()
    fill(cache, ("m", "1", b"x"), "m1")
    assert cache.get_or_join(("m", "2", b"x"), noop)[0] is Lookup.MISS
    assert cache.get_or_join(("other", "1", b"x"), noop)[0] is Lookup.MISS
    assert cache.get_or_join(("m", "1", b"y"), noop)[0] is Lookup.MISS


class SameHash(bytes):
    """Bytes whose hash always collides, to show keys are compared by value."""

    def __hash__(self) -> int:
        return 7


def test_hash_collisions_never_return_wrong_values() -> None:
    cache = PredictionCache()
    k1: CacheKey = ("m", "1", SameHash(b"aaa"))
    k2: CacheKey = ("m", "1", SameHash(b"bbb"))
    assert hash(k1) == hash(k2)
    fill(cache, k1, "for-aaa")
    assert cache.get_or_join(k2, noop) == (Lookup.MISS, None)
    cache.complete(k2, "for-bbb", 8)
    assert cache.get_or_join(k1, noop) == (Lookup.HIT, "for-aaa")
    assert cache.get_or_join(k2, noop) == (Lookup.HIT, "for-bbb")


def test_fail_delivers_error_and_is_not_cached() -> None:
    cache = PredictionCache()
    log: list[tuple[str, object, BaseException | None]] = []
    cache.get_or_join(key(1), Recorder(log, "a"))
    cache.get_or_join(key(1), Recorder(log, "b"))
    boom = RuntimeError("model crashed")
    cache.fail(key(1), boom)
    assert log == [("a", None, boom), ("b", None, boom)]
    assert cache.pending_waiters(key(1)) == 0
    # The next query recomputes.
    assert cache.get_or_join(key(1), noop) == (Lookup.MISS, None)
    assert cache.peek(key(1)) is None


def test_fail_without_pending_is_harmless() -> None:
    cache = PredictionCache()
    cache.fail(key(1), RuntimeError("late"))
    assert cache.stats.entries == 0
    assert cache.pending_waiters(key(1)) == 0


def test_raising_waiter_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    cache = PredictionCache()
    log: list[tuple[str, object, BaseException | None]] = []

    def broken(value: object, error: BaseException | None) -> None:
        raise ValueError("waiter bug")

    cache.get_or_join(key(1), Recorder(log, "a"))
    cache.get_or_join(key(1), broken)
    cache.get_or_join(key(1), Recorder(log, "c"))
    with caplog.at_level(logging.ERROR, logger="clipper.cache"):
        cache.complete(key(1), "v", 1)
    assert [name for name, _, _ in log] == ["a", "c"]
    assert any("waiter" in r.message for r in caplog.records)
    assert cache.peek(key(1)) == "v"

    cache.get_or_join(key(2), broken)
    cache.get_or_join(key(2), Recorder(log, "d"))
    with caplog.at_level(logging.ERROR, logger="clipper.cache"):
        cache.fail(key(2), RuntimeError("x"))
    assert log[-1][0] == "d"


def test_remove_waiter_stops_calls_but_computation_continues() -> None:
    cache = PredictionCache()
    log: list[tuple[str, object, BaseException | None]] = []
    gave_up = Recorder(log, "gave-up")
    stays = Recorder(log, "stays")
    cache.get_or_join(key(1), gave_up)
    cache.get_or_join(key(1), stays)
    cache.remove_waiter(key(1), gave_up)
    assert cache.pending_waiters(key(1)) == 1
    cache.remove_waiter(key(1), gave_up)  # twice is harmless
    cache.remove_waiter(key(2), gave_up)  # unknown key is harmless
    cache.remove_waiter(key(1), stays)
    assert cache.pending_waiters(key(1)) == 0
    # Still in flight: an identical query joins rather than starting a second computation.
    assert cache.get_or_join(key(1), Recorder(log, "late"))[0] is Lookup.JOINED
    cache.complete(key(1), "done", 4)
    assert log == [("late", "done", None)]
    assert cache.peek(key(1)) == "done"


def test_late_complete_still_warms_the_cache() -> None:
    cache = PredictionCache()
    cache.complete(key(1), "late", 4)
    assert cache.get_or_join(key(1), noop) == (Lookup.HIT, "late")
    assert cache.stats.bytes == size_of(key(1), 4)


def test_complete_replaces_an_existing_value_without_leaking_bytes() -> None:
    cache = PredictionCache()
    cache.complete(key(1), "old", 4)
    cache.complete(key(1), "new", 10)
    assert cache.peek(key(1)) == "new"
    assert cache.stats.entries == 1
    assert cache.stats.bytes == size_of(key(1), 10)


def test_oversize_value_is_delivered_but_not_stored() -> None:
    cache = PredictionCache(max_bytes=1000)
    fill(cache, key(2), "small")
    log: list[tuple[str, object, BaseException | None]] = []
    cache.get_or_join(key(1), Recorder(log, "a"))
    cache.complete(key(1), "huge", 1000)
    assert log == [("a", "huge", None)]
    assert cache.peek(key(1)) is None
    assert cache.peek(key(2)) == "small"  # nothing was evicted to make room for it
    assert cache.stats.evictions == 0


def test_disabled_cache_joins_but_stores_nothing() -> None:
    cache = PredictionCache(max_bytes=0)
    log: list[tuple[str, object, BaseException | None]] = []
    assert cache.get_or_join(key(1), Recorder(log, "a"))[0] is Lookup.MISS
    assert cache.get_or_join(key(1), Recorder(log, "b"))[0] is Lookup.JOINED
    cache.complete(key(1), "v", 1)
    assert [name for name, _, _ in log] == ["a", "b"]
    assert cache.get_or_join(key(1), noop)[0] is Lookup.MISS
    assert cache.stats.entries == 0
    assert cache.stats.bytes == 0


def test_peek_does_not_count_a_hit() -> None:
    cache = PredictionCache()
    fill(cache, key(1), "v")
    assert cache.peek(key(1)) == "v"
    assert cache.peek(key(2)) is None
    assert cache.stats.hits == 0


@pytest.mark.parametrize("policy", ["clock", "lru"])
def test_bytes_stay_under_the_bound(policy: str) -> None:
    cache = PredictionCache(max_bytes=5 * ENTRY + 50, policy=policy)  # type: ignore[arg-type]
    for i in range(40):
        fill(cache, key(i), i)
        if i % 3 == 0 and i > 0:
            cache.get_or_join(key(i - 1), noop)  # some hits to exercise reordering
        assert cache.stats.bytes <= 5 * ENTRY + 50
    stats = cache.stats
    assert stats.entries == 5
    assert stats.bytes == 5 * ENTRY
    assert stats.evictions == 35
    assert cache.peek(key(39)) == 39  # the newest entry is always kept


def test_lru_evicts_least_recently_used() -> None:
    cache = PredictionCache(max_bytes=3 * ENTRY, policy="lru")
    for i in range(3):
        fill(cache, key(i), i)
    assert cache.get_or_join(key(0), noop)[0] is Lookup.HIT  # 0 is now most recent
    fill(cache, key(3), 3)  # evicts 1, the least recently used
    assert cache.peek(key(1)) is None
    assert [cache.peek(key(i)) for i in (0, 2, 3)] == [0, 2, 3]
    fill(cache, key(4), 4)  # then 2
    assert cache.peek(key(2)) is None
    assert cache.peek(key(0)) == 0


def test_clock_gives_referenced_entries_a_second_chance() -> None:
    cache = PredictionCache(max_bytes=3 * ENTRY, policy="clock")
    for i in range(3):
        fill(cache, key(i), i)
    assert cache.get_or_join(key(0), noop)[0] is Lookup.HIT  # sets 0's reference bit
    fill(cache, key(3), 3)
    # The hand passed 0 (clearing its bit) and evicted 1, which was never referenced.
    assert cache.peek(key(0)) == 0
    assert cache.peek(key(1)) is None
    assert cache.stats.evictions == 1
    # 0 used its second chance: with no new reference, the next sweeps reach it after 2.
    fill(cache, key(4), 4)
    assert cache.peek(key(2)) is None
    assert cache.peek(key(0)) == 0
    fill(cache, key(5), 5)
    assert cache.peek(key(0)) is None
    assert [cache.peek(key(i)) for i in (3, 4, 5)] == [3, 4, 5]


def test_clock_evicts_in_insertion_order_without_references() -> None:
    cache = PredictionCache(max_bytes=3 * ENTRY, policy="clock")
    for i in range(6):
        fill(cache, key(i), i)
    assert [cache.peek(key(i)) for i in range(6)] == [None, None, None, 3, 4, 5]


def test_clock_all_referenced_still_makes_room_and_keeps_newcomer() -> None:
    cache = PredictionCache(max_bytes=3 * ENTRY, policy="clock")
    for i in range(3):
        fill(cache, key(i), i)
    for i in range(3):
        cache.get_or_join(key(i), noop)
    fill(cache, key(3), 3)
    # A full turn clears every bit, then the oldest goes; the newcomer is kept.
    assert cache.peek(key(0)) is None
    assert [cache.peek(key(i)) for i in (1, 2, 3)] == [1, 2, 3]


def test_pending_entries_are_not_counted_nor_evicted() -> None:
    cache = PredictionCache(max_bytes=2 * ENTRY)
    cache.get_or_join(key(9), noop)  # stays in flight throughout
    for i in range(5):
        fill(cache, key(i), i)
    assert cache.stats.bytes == 2 * ENTRY
    assert cache.pending_waiters(key(9)) == 1
    assert cache.get_or_join(key(9), noop)[0] is Lookup.JOINED


def test_clear_drops_completed_entries_only() -> None:
    cache = PredictionCache()
    log: list[tuple[str, object, BaseException | None]] = []
    fill(cache, key(1), "v")
    cache.get_or_join(key(2), Recorder(log, "a"))
    cache.clear()
    assert cache.stats.entries == 0
    assert cache.stats.bytes == 0
    assert cache.peek(key(1)) is None
    assert log == []  # nothing was failed
    assert cache.pending_waiters(key(2)) == 1
    cache.complete(key(2), "w", 1)
    assert log == [("a", "w", None)]


def test_stats_count_everything() -> None:
    cache = PredictionCache(max_bytes=2 * ENTRY)
    assert cache.stats == CacheStats(hits=0, misses=0, joins=0, evictions=0, entries=0, bytes=0)
    cache.get_or_join(key(1), noop)  # miss
    cache.get_or_join(key(1), noop)  # join
    cache.complete(key(1), "a", 26)
    cache.get_or_join(key(1), noop)  # hit
    cache.get_or_join(key(1), noop)  # hit
    fill(cache, key(2), "b")  # miss
    fill(cache, key(3), "c")  # miss, evicts one
    assert cache.stats == CacheStats(
        hits=2, misses=3, joins=1, evictions=1, entries=2, bytes=2 * ENTRY
    )


def test_waiter_may_reenter_the_cache() -> None:
    cache = PredictionCache()
    seen: list[tuple[Lookup, object]] = []

    def reenter(value: object, error: BaseException | None) -> None:
        seen.append(cache.get_or_join(key(1), noop))

    cache.get_or_join(key(1), reenter)
    cache.complete(key(1), "v", 1)
    assert seen == [(Lookup.HIT, "v")]  # stored before the waiters run


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_bytes": -1}, "max_bytes"), ({"policy": "fifo"}, "policy")],
)
def test_bad_configuration(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        PredictionCache(**kwargs)  # type: ignore[arg-type]


def test_forget_producer_drops_only_its_entries() -> None:
    cache = PredictionCache(1 << 20)
    bad, good = object(), object()
    cache.complete(key(1), "from bad", 10, bad)
    cache.complete(key(2), "from good", 10, good)
    cache.complete(key(3), "untagged", 10)
    cache.complete(key(4), "bad, then good", 10, bad)
    cache.complete(key(4), "bad, then good", 10, good)  # recomputed by good: good's now
    before = cache.stats.bytes
    assert cache.forget_producer(bad) == 1
    assert cache.get_or_join(key(1), noop)[0] is Lookup.MISS  # not served again
    assert cache.peek(key(2)) == "from good"
    assert cache.peek(key(3)) == "untagged"
    assert cache.peek(key(4)) == "bad, then good"
    assert cache.stats.entries == 3
    assert cache.stats.bytes == before - size_of(key(1), 10)
    assert cache.forget_producer(bad) == 0  # nothing left of it: a no-op


def test_evicted_entries_leave_the_producer_index() -> None:
    producer = object()
    cache = PredictionCache(2 * size_of(key(0), 10), policy="lru")
    for i in range(5):
        cache.complete(key(i), i, 10, producer)
    assert cache.stats.entries == 2
    # Only what is still cached is dropped; evicted keys are not looked up again.
    assert cache.forget_producer(producer) == 2
    assert cache.stats.entries == 0
    assert cache.stats.bytes == 0

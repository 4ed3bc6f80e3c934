"""The pure batching decision, branch by branch, with explicit timestamps."""

from __future__ import annotations

import math
import random

import pytest

from clipper.batching.decision import Dispatch, Wait, decide

NOW = 1000.0


def _decide(**overrides: float) -> Dispatch | Wait:
    args: dict[str, float] = {
        "pending": 3,
        "oldest_enqueued_at": NOW,
        "earliest_deadline": math.inf,
        "max_batch_size": 8,
        "max_wait_s": 0.002,
        "expected_latency_s": 0.0,
        "now": NOW,
    }
    args.update(overrides)
    return decide(**args)  # type: ignore[arg-type]


def test_nothing_pending_waits_for_an_arrival() -> None:
    assert _decide(pending=0) == Wait(math.inf)


def test_full_batch_dispatches_the_cap() -> None:
    assert _decide(pending=8) == Dispatch(8)
    assert _decide(pending=50) == Dispatch(8)


def test_zero_max_wait_dispatches_everything_at_once() -> None:
    assert _decide(max_wait_s=0.0) == Dispatch(3)
    assert _decide(max_wait_s=-1.0) == Dispatch(3)


def test_waits_for_company_until_max_wait() -> None:
    result = _decide(oldest_enqueued_at=NOW - 0.0005)
    assert isinstance(result, Wait)
    assert result.seconds == pytest.approx(0.0015)


def test_dispatches_when_oldest_waited_max_wait() -> None:
    assert _decide(oldest_enqueued_at=NOW - 0.002) == Dispatch(3)
    assert _decide(oldest_enqueued_at=NOW - 0.010) == Dispatch(3)


def test_deadline_shortens_the_wait() -> None:
    # The batch takes 4 ms and the earliest deadline is 5 ms away: only 1 ms left to wait,
    # although max_wait would allow 2 ms.
    result = _decide(earliest_deadline=NOW + 0.005, expected_latency_s=0.004, max_wait_s=0.002)
    assert isinstance(result, Wait)
    assert result.seconds == pytest.approx(0.001)


def test_dispatches_at_latest_send_time() -> None:
    assert _decide(earliest_deadline=NOW + 0.004, expected_latency_s=0.004) == Dispatch(3)


def test_dispatches_when_deadline_already_unreachable() -> None:
    assert _decide(earliest_deadline=NOW - 1.0, expected_latency_s=0.0) == Dispatch(3)
    assert _decide(earliest_deadline=NOW + 0.001, expected_latency_s=0.050) == Dispatch(3)


def test_max_wait_wins_when_deadline_is_far() -> None:
    result = _decide(earliest_deadline=NOW + 10.0, expected_latency_s=0.004)
    assert result == Wait(pytest.approx(0.002))  # type: ignore[arg-type]


def test_wait_is_positive_just_before_each_limit() -> None:
    eps = math.ulp(NOW)
    result = _decide(oldest_enqueued_at=NOW - 0.002 + eps)
    assert isinstance(result, Wait)
    assert result.seconds > 0.0
    result = _decide(earliest_deadline=NOW + eps, expected_latency_s=0.0)
    assert isinstance(result, Wait)
    assert result.seconds > 0.0


def test_randomised_invariants() -> None:
    rng = random.Random(20170327)
    dispatches = waits = 0
    for _ in range(20_000):
        pending = rng.choice([0, 1, 2, rng.randint(0, 300)])
        max_batch_size = rng.choice([1, 2, rng.randint(1, 256)])
        now = rng.uniform(0.0, 1e6)
        oldest = now - rng.choice([0.0, rng.uniform(0.0, 0.02), rng.uniform(-1e-9, 1e-9)])
        deadline = rng.choice([math.inf, now + rng.uniform(-0.01, 0.1), now])
        max_wait = rng.choice([0.0, rng.uniform(0.0, 0.01), rng.uniform(-0.01, 0.0)])
        latency = rng.choice([0.0, rng.uniform(0.0, 0.05)])
        result = decide(
            pending=pending,
            oldest_enqueued_at=oldest,
            earliest_deadline=deadline,
            max_batch_size=max_batch_size,
            max_wait_s=max_wait,
            expected_latency_s=latency,
            now=now,
        )
        if isinstance(result, Dispatch):
            dispatches += 1
            assert 1 <= result.count <= min(pending, max_batch_size)
        else:
            waits += 1
            assert result.seconds > 0.0
            # Never past the oldest query's max wait, nor past the latest send time.
            assert pending == 0 or result.seconds <= (oldest + max_wait) - now
            assert pending == 0 or result.seconds <= (deadline - latency) - now
            assert pending < max_batch_size
    # Both outcomes were actually exercised.
    assert dispatches > 1000
    assert waits > 1000

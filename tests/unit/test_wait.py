"""The batch-wait policies: the pure adaptive policy driven by explicit timestamps, then the
scheduler with a fake clock and transport, as a closed-loop client and as open-loop arrivals
would drive it. Deterministic: no wall clock anywhere."""

from __future__ import annotations

from typing import Any

import pytest

from clipper.batching.wait import AdaptiveWait, FixedWait, make_wait_policy
from clipper.choices import WAITS
from clipper.config import BatchingConfig
from clipper.errors import ConfigError
from tests.unit.test_scheduler import harness_factory  # noqa: F401 (a fixture)

WAIT_S = 0.001


def episode(p: AdaptiveWait, now: float, start: int, end: int) -> None:
    """One wait that began with ``start`` queries queued and sent ``end``."""
    assert p.max_wait_s(now) == WAIT_S
    p.waiting(start, now)
    p.dispatched(end)


def test_fixed_always_waits_and_adaptive_is_the_default() -> None:
    assert BatchingConfig().wait == "adaptive"
    assert BatchingConfig().to_dict()["wait"] == "adaptive"
    assert BatchingConfig(**BatchingConfig(wait="fixed").to_dict()).wait == "fixed"
    assert isinstance(make_wait_policy("adaptive", WAIT_S), AdaptiveWait)
    assert isinstance(make_wait_policy("adaptive", 0.0), FixedWait)  # nothing to learn
    p = make_wait_policy("fixed", WAIT_S)
    for _ in range(100):
        p.waiting(1, 0.0)
        p.dispatched(1)
    assert p.max_wait_s(0.0) == WAIT_S
    assert WAITS.names == ("adaptive", "fixed")
    with pytest.raises(ConfigError, match="unknown batch wait policy 'sometimes'"):
        BatchingConfig(wait="sometimes")  # type: ignore[arg-type]


def test_waits_that_add_nothing_switch_the_wait_off() -> None:
    p = AdaptiveWait(WAIT_S, window=8, min_paid_share=0.25)
    now = 0.0
    for _ in range(8):  # the configured behaviour until the window has evidence
        episode(p, now, 1, 1)
        now += 0.0001
    assert p.paid_share == 0.0
    assert p.max_wait_s(now) == 0.0


def test_waits_that_grow_batches_keep_the_wait() -> None:
    p = AdaptiveWait(WAIT_S, window=8, min_paid_share=0.25)
    now = 0.0
    for i in range(40):
        episode(p, now, 1, 3 if i % 4 == 0 else 1)  # a quarter of the waits pay
        now += 0.0001
    assert p.paid_share == 0.25
    assert p.max_wait_s(now) == WAIT_S


def test_a_wait_in_progress_keeps_its_length_and_its_starting_size() -> None:
    p = AdaptiveWait(WAIT_S, window=4)
    for _ in range(3):
        episode(p, 0.0, 1, 1)
    p.waiting(1, 0.0)
    p.waiting(2, 0.0005)  # re-armed after an arrival: still the same wait, begun with 1
    p.dispatched(2)
    assert p.paid_share == 0.25
    # the window is full and a quarter paid: the wait stays; a wait that is open always does
    assert p.max_wait_s(0.001) == WAIT_S


def test_a_switched_off_wait_is_probed_again_only_when_arrivals_are_close() -> None:
    p = AdaptiveWait(WAIT_S, window=4, probe_interval_s=0.05)
    now = 0.0
    for _ in range(4):
        episode(p, now, 1, 1)
    # arrivals every 0.3 ms: closer than the wait
    for _ in range(10):
        now += 0.0003
        p.arrived(now)
    assert p.arrival_gap_s == pytest.approx(0.0003)
    assert p.max_wait_s(now) == 0.0  # the last wait was under 50 ms ago
    now = 0.0501
    assert p.max_wait_s(now) == WAIT_S  # a probe
    p.waiting(1, now)
    p.dispatched(1)
    assert p.max_wait_s(now + 0.01) == 0.0  # it did not pay: off again, next probe in 50 ms
    assert p.max_wait_s(now + 0.0501) == WAIT_S


def test_a_sparse_stream_never_probes() -> None:
    p = AdaptiveWait(WAIT_S, window=4, probe_interval_s=0.05)
    for _ in range(4):
        episode(p, 0.0, 1, 1)
    now = 0.0
    for _ in range(20):
        now += 0.1  # one query every 100 ms: a wait of 1 ms would find nobody
        p.arrived(now)
        assert p.max_wait_s(now) == 0.0


def test_probes_that_pay_switch_the_wait_back_on() -> None:
    p = AdaptiveWait(WAIT_S, window=4, min_paid_share=0.5, probe_interval_s=0.05)
    for _ in range(4):
        episode(p, 0.0, 1, 1)
    now = 0.0
    for _ in range(5):
        now += 0.0001
        p.arrived(now)
    now = 0.06
    episode(p, now, 1, 4)  # the load came back
    assert p.max_wait_s(now + 0.001) == 0.0  # one of four paid: not yet
    now += 0.05
    episode(p, now, 1, 5)
    assert p.max_wait_s(now + 0.001) == WAIT_S  # two of four: waits are worth it again


# -- in the scheduler --------------------------------------------------------------------------
def adaptive(max_wait_micros: int = 1000) -> BatchingConfig:
    return BatchingConfig(controller="fixed", max_batch_size=8, max_wait_micros=max_wait_micros)


def test_a_closed_loop_client_stops_paying_the_wait(harness_factory: Any) -> None:  # noqa: F811
    h = harness_factory(batching=adaptive())
    h.replica()
    waited = []
    for i in range(40):
        sent_before = len(h.transport.sent)
        h.submit(f"q{i}".encode())
        if len(h.transport.sent) == sent_before:  # it waited: let the wait run out
            waited.append(i)
            h.clock.advance(0.001)
        assert len(h.transport.sent) == sent_before + 1
        h.clock.advance(0.0002)  # the model's latency
        h.respond(i)
        h.clock.advance(0.0001)  # the client's turn-around
    # 16 waits (the window) taught the policy; then none, the 50 ms probe interval not reached
    assert waited == list(range(16))
    assert h.results.value(b"q39") == b"Q39"


def test_open_arrivals_keep_the_wait_and_fill_batches(harness_factory: Any) -> None:  # noqa: F811
    h = harness_factory(batching=adaptive())
    h.replica()
    n = 0
    for _ in range(40):
        # four queries 0.3 ms apart, whatever the replica does: open loop
        for _ in range(4):
            h.submit(f"q{n}".encode())
            n += 1
            h.clock.advance(0.0003)
        for i in range(len(h.transport.sent)):
            if h.transport.sent[i][1] in h.sched.replicas[0].in_flight:
                h.respond(i)
    sizes = [len(tasks) for _, _, tasks in h.transport.sent]
    assert sum(sizes) >= n - 4
    assert min(sizes[20:]) >= 3  # still waiting for company long after the window filled


def test_fixed_wait_in_the_scheduler_always_waits(harness_factory: Any) -> None:  # noqa: F811
    b = BatchingConfig(controller="fixed", max_batch_size=8, max_wait_micros=1000, wait="fixed")
    h = harness_factory(batching=b)
    h.replica()
    for i in range(40):
        h.submit(f"q{i}".encode())
        assert len(h.transport.sent) == i  # waiting
        h.clock.advance(0.001)
        h.respond(i)

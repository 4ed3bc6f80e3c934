"""Whether a partial batch should wait for company: the delayed-batching wait, spent only when
it is expected to pay.

A wait costs every query in the batch its full length and pays only if queries arrive during
it. One client in a closed loop never sends its next query before the answer: every wait is
pure cost. Under open load the same wait fills batches (the paper's Fig 5). The adaptive policy
tells the two apart from what it sees, per model version:

* **did recent waits pay?** Of the last ``window`` waits, how many ended with a larger batch
  than they started with. While at least ``min_paid_share`` of them did, partial batches wait
  the configured ``max_wait``; otherwise they go at once.
* **probes.** With waits switched off there is nothing to learn from, so one wait is tried again
  at most every ``probe_interval_s`` — and only while the arrival process says company is
  likely: the EWMA of inter-arrival gaps is shorter than the wait. A sparse stream never
  probes; a closed-loop client pays one wait per probe interval (well under 1% of its
  queries at sub-millisecond round trips).

Until ``window`` waits have been seen the policy waits (the configured behaviour), so a fresh
model under load batches from its first query. Everything is driven by timestamps the
scheduler passes in: no clock, no timer, deterministic under test.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

from clipper.choices import WAITS

__all__ = ["AdaptiveWait", "FixedWait", "WaitPolicy", "make_wait_policy"]


class WaitPolicy(Protocol):
    def arrived(self, now: float) -> None:
        """A query was queued at ``now``."""
        ...

    def max_wait_s(self, now: float) -> float:
        """How long a partial batch may wait for company, asked before each decision."""
        ...

    def waiting(self, pending: int, now: float) -> None:
        """The scheduler decided to wait with ``pending`` queries queued."""
        ...

    def dispatched(self, count: int) -> None:
        """The scheduler sent a batch of ``count`` queries."""
        ...


class FixedWait:
    """Always the configured wait: Clipper's delayed batching as published."""

    __slots__ = ("_wait_s",)

    def __init__(self, max_wait_s: float) -> None:
        self._wait_s = max_wait_s

    def arrived(self, now: float) -> None:
        pass

    def max_wait_s(self, now: float) -> float:
        return self._wait_s

    def waiting(self, pending: int, now: float) -> None:
        pass

    def dispatched(self, count: int) -> None:
        pass


class AdaptiveWait:
    """The configured wait while recent waits grew batches; none otherwise (see the module)."""

    __slots__ = (
        "_alpha",
        "_gap",
        "_last_arrival",
        "_last_wait_at",
        "_min_paid",
        "_outcomes",
        "_paid",
        "_probe_interval_s",
        "_started_with",
        "_wait_s",
        "_window",
    )

    def __init__(
        self,
        max_wait_s: float,
        *,
        window: int = 16,
        min_paid_share: float = 0.25,
        probe_interval_s: float = 0.05,
        gap_alpha: float = 0.1,
    ) -> None:
        self._wait_s = max_wait_s
        self._window = window
        # Compared against a count, so the share is turned into one once (at least one wait).
        self._min_paid = max(1, math.ceil(min_paid_share * window))
        self._probe_interval_s = probe_interval_s
        self._alpha = gap_alpha
        self._outcomes: deque[bool] = deque(maxlen=window)
        self._paid = 0
        self._gap = math.inf  # EWMA of inter-arrival gaps; inf: not known yet
        self._last_arrival = math.nan
        self._last_wait_at = -math.inf
        self._started_with = 0  # queries queued when the open wait began; 0: none open

    # what the scheduler reports
    def arrived(self, now: float) -> None:
        last = self._last_arrival
        self._last_arrival = now
        if math.isnan(last):
            return
        gap = max(now - last, 0.0)
        g = self._gap
        self._gap = gap if g == math.inf else g + self._alpha * (gap - g)

    def waiting(self, pending: int, now: float) -> None:
        if self._started_with == 0:  # a new wait; a re-armed one keeps its starting size
            self._started_with = pending
            self._last_wait_at = now

    def dispatched(self, count: int) -> None:
        start = self._started_with
        if start == 0:
            return  # sent without waiting: nothing learnt
        self._started_with = 0
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen and outcomes[0]:
            self._paid -= 1
        grew = count > start
        outcomes.append(grew)
        self._paid += grew

    # the decision
    def max_wait_s(self, now: float) -> float:
        if self._started_with or self._worth_waiting(now):
            return self._wait_s
        return 0.0

    def _worth_waiting(self, now: float) -> bool:
        if len(self._outcomes) < self._window or self._paid >= self._min_paid:
            return True
        # Waits stopped paying: try one again now and then, if arrivals are close enough that
        # one could pay (a sparse stream would only pay for the probe).
        return self._gap < self._wait_s and now - self._last_wait_at >= self._probe_interval_s

    # for metrics, tests and benchmarks
    @property
    def paid_share(self) -> float:
        n = len(self._outcomes)
        return self._paid / n if n else 1.0

    @property
    def arrival_gap_s(self) -> float:
        return self._gap


def make_wait_policy(kind: str, max_wait_s: float) -> WaitPolicy:
    """The policy named ``kind`` (see :data:`clipper.choices.WAITS`); no wait configured needs
    no learning."""
    if max_wait_s <= 0.0:
        return FixedWait(0.0)
    policy: WaitPolicy = WAITS.load(kind)(max_wait_s)
    return policy

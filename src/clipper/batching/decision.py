"""The batching decision: send a batch now, or wait a little for more queries.

Delayed batching in the spirit of Nagle's algorithm: a partial batch waits at most
``max_wait_s`` for company, and never so long that the earliest deadline in the queue would be
missed given how long the batch is expected to take. A pure function of explicit timestamps, so
every branch is testable without a clock; it runs once per batch, so it validates nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Dispatch", "Wait", "decide"]


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send the ``count`` oldest pending queries now."""

    count: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Check again after ``seconds`` (``math.inf``: only when a query arrives)."""

    seconds: float


_WAIT_FOR_ARRIVAL = Wait(math.inf)


def decide(
    *,
    pending: int,
    oldest_enqueued_at: float,
    earliest_deadline: float,
    max_batch_size: int,
    max_wait_s: float,
    expected_latency_s: float,
    now: float,
) -> Dispatch | Wait:
    """Decide what to do with ``pending`` queued queries at time ``now``.

    ``earliest_deadline`` may be ``math.inf`` (no deadline). A returned :class:`Wait` always has
    ``seconds > 0``; a :class:`Dispatch` always has ``1 <= count <= min(pending, max_batch_size)``
    for ``max_batch_size >= 1``.
    """
    if pending <= 0:
        return _WAIT_FOR_ARRIVAL
    if pending >= max_batch_size:
        return Dispatch(max_batch_size)
    if max_wait_s <= 0.0:
        return Dispatch(pending)
    # Sending after latest_send would make the earliest query miss its deadline.
    latest_send = earliest_deadline - expected_latency_s
    wait_until = oldest_enqueued_at + max_wait_s
    # Comparing now against absolute instants (not now - oldest against max_wait_s) keeps the
    # Wait strictly positive: for floats x > now implies x - now > 0.
    if now >= latest_send or now >= wait_until:
        return Dispatch(pending)
    return Wait(min(wait_until, latest_send) - now)

"""Holding queries for a model version that scales to zero while its replica starts.

A version autoscaled with ``min_replicas`` 0 has no replica once it has been idle; the first
query must not get an instant "no replica" default, but must not wait blindly either. The
rules (docs/autoscaling.md, "Scale to zero"), for a query that finds no replica connected:

* it asks for a wake (the autoscaler that drives the version scales it to one replica; asking
  again while a wake is under way changes nothing);
* it is held, queued in the version's scheduler like any input, while at most
  ``max_held_queries`` inputs are queued; beyond that it gets the default at once;
* it is held only when the wake can still end before its deadline: once a wake has been
  measured (from the first held query to the replica connecting), a query whose remaining
  budget is shorter than what is left of that duration gets the default at once rather than
  at its deadline;
* a held query is answered by the replica if it connects in time, else by the default at its
  deadline; both defaults say ``cold_start``.

Pure apart from the clock it reads: no task, no timer (the scheduler's own expiry timer drops
what is held past its deadline).
"""

from __future__ import annotations

from collections.abc import Callable

from clipper.clock import Clock

__all__ = ["ColdStart"]


class ColdStart:
    """A scale-to-zero version's wake state: when the current wake began, how long the last
    one took, and the bound on held inputs."""

    __slots__ = ("_wake", "clock", "last_s", "limit", "loading", "wakes", "woke_at")

    def __init__(
        self, clock: Clock, *, limit: int, wake: Callable[[], None], loading: bool = False
    ) -> None:
        self.clock = clock
        # A pooled version (docs/density.md): waking is loading the model into a pool
        # process, and its defaults say ``loading`` instead of ``cold_start``.
        self.loading = loading
        self.limit = limit
        self._wake = wake
        self.woke_at: float | None = None  # when the wake under way began (None: none)
        self.last_s: float | None = None  # the last wake, request to replica connected
        self.wakes = 0  # wakes begun (running total)

    def hold(self, queued: int, n: int, remaining_s: float) -> str | None:
        """A query of ``n`` inputs with ``remaining_s`` left of its budget found no replica;
        ``queued`` inputs are already held. Wakes the version; returns None to hold the query,
        else why it gets the default at once."""
        now = self.clock.now()
        if self.woke_at is None:
            self.woke_at = now
            self.wakes += 1
        self._wake()
        what = "loading into a pool process" if self.loading else "starting from zero replicas"
        if queued + n > self.limit:
            return (
                f"the model is {what} and {queued} inputs already wait "
                f"for it (at most {self.limit} are held)"
            )
        expected = self.expected_s()
        if expected is not None and expected > remaining_s:
            return (
                f"the model is {what}: about {expected * 1e3:.0f} ms "
                f"more, past the query's deadline ({remaining_s * 1e3:.0f} ms left)"
            )
        return None

    def expected_s(self) -> float | None:
        """What is left of the wake under way, at the last wake's duration (None: no wake
        measured yet, or none under way)."""
        if self.woke_at is None or self.last_s is None:
            return None
        return max(self.last_s - (self.clock.now() - self.woke_at), 0.0)

    def connected(self) -> None:
        """A replica connected: the wake under way (if any) is over, and measured."""
        if self.woke_at is not None:
            self.last_s = self.clock.now() - self.woke_at
            self.woke_at = None

    def explain(self, model: str) -> str:
        """Why a held query got the default at its deadline."""
        if self.loading:
            return (
                f"model {model} is not loaded in a pool process: its load did not end within "
                "the query's latency SLO"
            )
        waited = "" if self.woke_at is None else (
            f" (waking for {(self.clock.now() - self.woke_at) * 1e3:.0f} ms)"
        )  # fmt: skip
        return (
            f"model {model} is starting from zero replicas{waited}: its replica did not "
            "connect within the query's latency SLO"
        )

"""The autoscaling rule for one model version: samples in, a replica count (and why) out.

Pure: no clock, no I/O, no tasks. :class:`~clipper.runtime.autoscaler.Autoscaler` feeds it one
:class:`Sample` per interval — running totals of the inputs offered to the version's queue, of
those shed or late because of the model's queue (demand) and of those shed or late because the
frontend was behind (not demand), the capacity of one replica that fits the SLO (the mean and
the worst replica's), the replica count — and acts on the :class:`Decision` it returns. The
rule (docs/autoscaling.md):

* utilisation = arrival rate / (replicas x one replica's capacity), both averaged at each
  interval over the last half up window;
* **up**, to the count that brings utilisation back under the target, once it stayed above the
  target at every interval of a whole up window (demand is in replicas' worth of load, so the
  samples from before the last change count: a load that keeps growing keeps scaling); at once
  when more than ``shed_threshold`` of the up window's queries were shed or late (not counting
  the first half up window after a change: what was queued before it may still come late);
* **down**, one replica, once at every interval of a whole down window since the last change
  one replica fewer would still have run under the target less a tenth (:data:`DOWN_HEADROOM`)
  at a conservative per-replica capacity (the worst replica's, less a fifth, never below
  what it does one input at a time: :data:`DOWN_BATCHING_TRUST`), no more than
  ``shed_threshold`` was shed or late, and, if that smaller count was once left by scaling
  up, the load is a tenth below the rate it was left at;
* **to zero**, with ``min_replicas`` 0, once no query came for ``scale_to_zero_after_s`` (and
  as long since the last change); **from zero**, to one replica, when queries came while it
  had none (the scheduler's held queries wake it at once through
  :meth:`~clipper.runtime.autoscaler.Autoscaler.wake`; this is the rule's own backstop);
* always within ``[min_replicas, max_replicas]``.

Why the count does not oscillate: the capacity estimate is the controllers' latency lines read
at the batch sizes they see, so it moves with the count (the batches change) and with which
replica is kept — at a constant 30 queries/s two replicas measured 48-50/s each, and the one
left after a scale-down about 40/s, enough to scale back up. So a scale-down is priced at the
worst replica's capacity less a fifth, never below what it does one input at a time, and a
count left by scaling up is only returned to once the load is a tenth below what it was left
at: at a constant load, the count a scale-up reached is never taken back, whatever the
capacity reads at either count.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

from clipper.scaling import AutoscaleConfig

__all__ = ["Decision", "Sample", "ScalePolicy"]

# Shed or late queries needed before their share counts: one unlucky query out of fifty is
# noise, not overload.
MIN_BAD_QUERIES = 3
# Down only when one replica fewer would run at most this far under the target, and to a
# count once left by scaling up only when the load is this far below the rate it was left at.
DOWN_HEADROOM = 0.1
# A scale-down is priced at the worst replica's capacity, but not above the larger of what it
# does one input at a time (that needs no batching gain) and this share of the estimate: the
# gain from batching is read off the batches the larger count saw, and the one left after a
# scale-down measured 40/s where the pair had read 48 and 50 (at 30/s: 0.75, back up).
DOWN_BATCHING_TRUST = 0.8


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # clock time
    offered: int  # inputs offered to the version's queue so far (a running total)
    bad: int  # of those, shed or late because of the model's queue: demand (total)
    capacity_rps: float  # inputs/s one replica takes within the SLO (0.0: not measured yet)
    replicas: int  # the version's num_replicas now
    # Of the offered, shed or late for reasons more replicas would not fix: the frontend was
    # behind, or a round trip alone overran (total; never demand).
    behind: int = 0
    floor_rps: float = 0.0  # the worst replica's capacity (0.0: take capacity_rps)
    # the worst replica's capacity one input at a time, without batching (0.0: floor_rps)
    single_rps: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    # "utilization", "shedding", "quiet", "idle" (to zero), "cold_start" (from zero),
    # "min_replicas", "max_replicas" or "unloaded" (a pooled version left its pool process)
    reason: str
    detail: str  # for people: the figures behind it


@dataclass(frozen=True, slots=True)
class _Interval:
    end: float
    seconds: float
    offered: int
    bad: int
    behind: int
    capacity: float  # one replica's, as sampled at its end (0.0: not known)
    floor: float  # what a scale-down prices one replica at, sampled at its end (0.0: unknown)
    # Over the half up window ending here: arrivals/s, and that over the mean capacity (how
    # many replicas running flat out the load needs; 0.0 while the capacity is not known);
    # and over the worst replica's (what a scale-down is priced with).
    rate: float = 0.0
    demand: float = 0.0
    floor_demand: float = 0.0


class ScalePolicy:
    def __init__(self, config: AutoscaleConfig, start: float) -> None:
        self.config = config
        self._intervals: deque[_Interval] = deque()
        self._last: tuple[float, int, int, int] | None = None
        self._burst = 0.0  # the rate since shedding began, at the last shedding decision
        self._since = start
        self._offered_at = start  # when the last interval with any offered input ended
        self.capacity_rps = 0.0  # smoothed as the rate is; kept while no replica has data
        self.floor_rps = 0.0  # what a scale-down prices one replica at, smoothed the same way
        self.rate = 0.0  # arrivals/s over the last half up window
        self.utilization: float | None = None  # at the current count; None: not known
        self.note = "collecting samples"  # why nothing changes, for status
        # Share of the up window's queries shed or late because the frontend was behind (not
        # demand), and the figures, for status; None while under the threshold.
        self.behind_share = 0.0
        self.behind_note: str | None = None
        # count -> the arrival rate at which it was last left by scaling up: it is not taken
        # back to until the load is DOWN_HEADROOM below that.
        self._too_few: dict[int, float] = {}

    def restart(self, at: float) -> None:
        """After a change of the replica count (carried out at ``at``): the down window and
        the shed count start again. The samples stay: demand is in replicas' worth of load,
        whatever the count, so a load still growing after a scale-up scales again at once."""
        self._since = at

    def observe(self, s: Sample) -> Decision | None:
        self._burst = 0.0
        decision = self._observe(s)
        if decision is None and self.behind_note is not None:
            self.note = f"{self.note}; {self.behind_note}"
        if decision is not None and decision.replicas > s.replicas and s.replicas >= 1:
            self._scaled_up(s.replicas, decision)
        return decision

    def _scaled_up(self, n: int, decision: Decision) -> None:
        """Remember that ``n`` (and so any fewer) was too few at the rate now."""
        if decision.reason not in ("utilization", "shedding"):
            return  # a bound, not the load
        rate = max(self.rate, self._burst)
        self._too_few[n] = rate
        for k in [k for k in self._too_few if k < n]:
            self._too_few[k] = min(self._too_few[k], rate)

    def _observe(self, s: Sample) -> Decision | None:
        cfg = self.config
        n = s.replicas
        if n < cfg.min_replicas or n > cfg.max_replicas:
            bound = "min_replicas" if n < cfg.min_replicas else "max_replicas"
            target = cfg.clamp(n)
            return Decision(target, bound, f"{n} replicas is outside [{cfg.min_replicas}, "
                            f"{cfg.max_replicas}]: set to {target}")  # fmt: skip
        if not self._add(s):
            return None
        newest = self._intervals[-1]
        if newest.offered:
            self._offered_at = s.at
        if n == 0:
            if newest.offered:
                return Decision(
                    1, "cold_start", f"{newest.offered} inputs offered with no replica running"
                )
            self.note = "scaled to zero: the next query wakes it"
            return None
        if cfg.min_replicas == 0:
            quiet = s.at - max(self._offered_at, self._since)
            if quiet >= cfg.scale_to_zero_after_s - 1e-9:
                return Decision(
                    0, "idle", f"no query for {quiet:.0f} s (scale_to_zero_after_s "
                    f"{cfg.scale_to_zero_after_s:g})"
                )  # fmt: skip
        self.utilization = newest.demand / n if newest.demand > 0.0 else None
        up = self._window(s.at, cfg.up_window_s)
        # Shed or late counts from half an up window after the last change: until then, what
        # was queued before it (and replicas just started) may still come late.
        settled = self._since + max(cfg.up_window_s / 2, cfg.interval_s) - 1e-9
        fresh = [i for i in up if i.end - i.seconds >= settled]
        offered = sum(i.offered for i in fresh)
        bad = sum(i.bad for i in fresh)
        self._note_behind(fresh, offered)
        if bad >= MIN_BAD_QUERIES and bad > cfg.shed_threshold * offered:
            return self._shedding(n, fresh, offered, bad)
        if self.capacity_rps <= 0.0:
            self.note = "waiting for a replica's batch latencies (capacity not measured yet)"
            return None
        util = newest.demand / n
        if util > cfg.target_utilization:
            # stayed above: at every interval of a whole up window
            low = min(i.demand for i in up) / n
            first = self._intervals[0]
            whole = first.end - first.seconds <= s.at - cfg.up_window_s + 1e-9
            if not whole or low <= cfg.target_utilization:
                self.note = (
                    f"utilization {util:.2f} above target, not yet for a whole up window "
                    f"({cfg.up_window_s:g} s)"
                )
                return None
            target = cfg.clamp(self._needed(newest.demand))
            detail = (
                f"utilization {util:.2f} (at least {low:.2f}) > {cfg.target_utilization:.2f} "
                f"for {cfg.up_window_s:g} s ({self.rate:.1f}/s offered, "
                f"{self.capacity_rps:.1f}/s per replica)"
            )
            if target > n:
                return Decision(target, "utilization", detail)
            self.note = f"{detail}, but already at max_replicas ({cfg.max_replicas})"
            return None
        return self._maybe_down(s.at, n)

    def _note_behind(self, fresh: list[_Interval], offered: int) -> None:
        behind = sum(i.behind for i in fresh)
        self.behind_share = behind / offered if offered else 0.0
        if behind >= MIN_BAD_QUERIES and behind > self.config.shed_threshold * offered:
            seconds = sum(i.seconds for i in fresh)
            self.behind_note = (
                f"{behind} of {offered} queries in the last {seconds:.1f} s shed or late "
                "because the frontend was behind (its event loop, or a round trip that alone "
                "overran), not the model's queue: more replicas would not help"
            )
        else:
            self.behind_note = None

    def _shedding(self, n: int, fresh: list[_Interval], offered: int, bad: int) -> Decision | None:
        cfg = self.config
        # The smoothed rate lags a step of load: the rate since the shedding began counts.
        run: list[_Interval] = []
        for i in reversed(fresh):
            if i.bad == 0:
                break
            run.append(i)
        burst = sum(i.offered for i in run) / sum(i.seconds for i in run) if run else 0.0
        self._burst = burst
        cap = self.capacity_rps
        demand = max(burst / cap, self._intervals[-1].demand) if cap > 0.0 else 0.0
        target = cfg.clamp(max(n + 1, self._needed(demand)))
        seconds = sum(i.seconds for i in fresh)
        share = f"{bad} of {offered} queries in the last {seconds:.1f} s shed or late"
        if target > n:
            return Decision(target, "shedding", f"{share} (> {cfg.shed_threshold:.0%})")
        self.note = f"{share}, but already at max_replicas ({cfg.max_replicas})"
        return None

    def _maybe_down(self, at: float, n: int) -> Decision | None:
        cfg = self.config
        if n <= cfg.min_replicas:
            self.note = f"at min_replicas ({cfg.min_replicas})"
            return None
        if n == 1:  # min_replicas 0: the last replica goes only when idle (the rule above)
            quiet = at - max(self._offered_at, self._since)
            self.note = (
                f"one replica; to zero after {cfg.scale_to_zero_after_s:g} s without a query "
                f"(quiet for {quiet:.0f} s)"
            )
            return None
        window = self._window(at, cfg.down_window_s)
        # Priced at the worst replica's capacity (the one that stays may be the slower one),
        # less a fifth but never below one input at a time (DOWN_BATCHING_TRUST).
        known = [i.floor_demand for i in window if i.floor_demand > 0.0 or i.floor > 0.0]
        peak = max(known, default=math.inf) / (n - 1)
        offered = sum(i.offered for i in window)
        bad = sum(i.bad for i in window)
        ceiling = cfg.target_utilization * (1.0 - DOWN_HEADROOM)
        if peak >= ceiling or bad > cfg.shed_threshold * offered:
            self.note = f"steady: {n - 1} replicas would run at {peak:.2f}"
            return None
        left_at = self._too_few.get(n - 1)
        rate = max(i.rate for i in window)
        if left_at is not None and rate >= (1.0 - DOWN_HEADROOM) * left_at:
            self.note = (
                f"steady: {n - 1} replicas would run at {peak:.2f}, but were too few at "
                f"{left_at:.1f}/s; the load ({rate:.1f}/s) is not a tenth below that"
            )
            return None
        elapsed = at - self._since
        if elapsed < cfg.down_window_s:
            self.note = (
                f"{n - 1} replicas would do ({peak:.2f}); quiet for {elapsed:.0f} of "
                f"{cfg.down_window_s:g} s"
            )
            return None
        return Decision(
            n - 1,
            "quiet",
            f"utilization with {n - 1} replicas at most {peak:.2f} < {ceiling:.2f} (the "
            f"target less {DOWN_HEADROOM:.0%}, at {self.floor_rps:.1f}/s per replica) for "
            f"{cfg.down_window_s:g} s",
        )

    def _needed(self, demand: float) -> int:
        """The fewest replicas that run ``demand`` at or under the target."""
        return max(1, math.ceil(demand / self.config.target_utilization - 1e-9))

    def _add(self, s: Sample) -> bool:
        """Record the interval since the previous sample; False when there is none yet."""
        last, self._last = self._last, (s.at, s.offered, s.bad, s.behind)
        if last is None or s.at <= last[0]:
            return False
        at, offered, bad, behind = last
        cfg = self.config
        # A total that went back: the version's scheduler was made again; count from zero.
        d_offered = s.offered - offered if s.offered >= offered else s.offered
        d_bad = s.bad - bad if s.bad >= bad else s.bad
        d_behind = s.behind - behind if s.behind >= behind else s.behind
        capacity = max(s.capacity_rps, 0.0)
        worst = min(s.floor_rps, capacity) if s.floor_rps > 0.0 else capacity
        single = min(s.single_rps, worst) if s.single_rps > 0.0 else worst
        floor = max(single, DOWN_BATCHING_TRUST * worst)
        keep = max(cfg.up_window_s, cfg.down_window_s)
        while self._intervals and self._intervals[0].end <= s.at - keep:
            self._intervals.popleft()
        self._intervals.append(
            _Interval(s.at, s.at - at, d_offered, d_bad, d_behind, capacity, floor)
        )
        recent = self._window(s.at, max(cfg.up_window_s / 2, cfg.interval_s))
        self.rate = sum(i.offered for i in recent) / sum(i.seconds for i in recent)
        measured = [i for i in recent if i.capacity > 0.0]
        if measured:
            self.capacity_rps = sum(i.capacity for i in measured) / len(measured)
            self.floor_rps = sum(i.floor for i in measured) / len(measured)
        cap, floor = self.capacity_rps, self.floor_rps
        self._intervals[-1] = replace(
            self._intervals[-1],
            rate=self.rate,
            demand=self.rate / cap if cap > 0.0 else 0.0,
            floor_demand=self.rate / floor if floor > 0.0 else 0.0,
        )
        return True

    def _window(self, at: float, seconds: float) -> list[_Interval]:
        """The intervals that ended in the last ``seconds`` (at least the newest one)."""
        start = at - seconds
        out = [i for i in self._intervals if i.end - i.seconds >= start - 1e-9]
        return out or [self._intervals[-1]]

"""The autoscaling rule for one model version: samples in, a replica count (and why) out.

Pure: no clock, no I/O, no tasks. :class:`~clipper.runtime.autoscaler.Autoscaler` feeds it one
:class:`Sample` per interval — running totals of the inputs offered to the version's queue and
of those shed or late, the capacity of one replica that fits the SLO, the replica count — and
acts on the :class:`Decision` it returns. The rule (docs/autoscaling.md):

* utilisation = arrival rate / (replicas x one replica's capacity), the rate at each interval
  averaged over the last half up window;
* **up**, to the count that brings utilisation back under the target, once it stayed above the
  target at every interval of a whole up window since the last change; at once (after two
  intervals) when more than ``shed_threshold`` of the up window's queries were shed or late;
* **down**, one replica, once at every interval of a whole down window since the last change
  one replica fewer would still have run under the target, with no more than
  ``shed_threshold`` shed or late;
* always within ``[min_replicas, max_replicas]``.

Up only above the target at ``n``, down only below it at ``n - 1``: a count reached by scaling
up is never taken back while the load stays, so the count does not oscillate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from clipper.scaling import AutoscaleConfig

__all__ = ["Decision", "Sample", "ScalePolicy"]

# Shed or late queries needed before their share counts: one unlucky query out of fifty is
# noise, not overload.
MIN_BAD_QUERIES = 3


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # clock time
    offered: int  # inputs offered to the version's queue so far (a running total)
    bad: int  # of those, shed at admission or expired/answered past their deadline (total)
    capacity_rps: float  # inputs/s one replica takes within the SLO (0.0: not measured yet)
    replicas: int  # the version's num_replicas now


@dataclass(frozen=True, slots=True)
class Decision:
    replicas: int
    reason: str  # "utilization", "shedding", "quiet", "min_replicas" or "max_replicas"
    detail: str  # for people: the figures behind it


@dataclass(frozen=True, slots=True)
class _Interval:
    end: float
    seconds: float
    offered: int
    bad: int
    rate: float  # arrival rate averaged over the half up window ending here


class ScalePolicy:
    def __init__(self, config: AutoscaleConfig, start: float) -> None:
        self.config = config
        self._intervals: deque[_Interval] = deque()
        self._last: tuple[float, int, int] | None = None
        self._since = start
        self.capacity_rps = 0.0  # the last one measured: kept while no replica has data
        self.rate = 0.0  # arrivals/s over the last half up window
        self.utilization: float | None = None  # at the current count; None: not known
        self.note = "collecting samples"  # why nothing changes, for status

    def restart(self, at: float) -> None:
        """After a change of the replica count: both windows start again from ``at``."""
        self._intervals.clear()
        self._last = None
        self._since = at

    def observe(self, s: Sample) -> Decision | None:
        cfg = self.config
        n = s.replicas
        if s.capacity_rps > 0.0:
            self.capacity_rps = s.capacity_rps
        if n < cfg.min_replicas or n > cfg.max_replicas:
            bound = "min_replicas" if n < cfg.min_replicas else "max_replicas"
            target = cfg.clamp(n)
            return Decision(target, bound, f"{n} replicas is outside [{cfg.min_replicas}, "
                            f"{cfg.max_replicas}]: set to {target}")  # fmt: skip
        if not self._add(s):
            return None
        up = self._window(s.at, cfg.up_window_s)
        offered = sum(i.offered for i in up)
        bad = sum(i.bad for i in up)
        cap = self.capacity_rps
        self.utilization = self.rate / (n * cap) if cap > 0.0 else None
        elapsed = s.at - self._since
        if (
            bad >= MIN_BAD_QUERIES
            and bad > cfg.shed_threshold * offered
            and elapsed >= 2 * cfg.interval_s
        ):
            # The smoothed rate lags a step of load: what the newest interval brought counts.
            newest = self._intervals[-1]
            target = cfg.clamp(max(n + 1, self._needed(cap, newest.offered / newest.seconds)))
            share = f"{bad} of {offered} queries in the last {elapsed:.0f} s shed or late"
            if target > n:
                return Decision(target, "shedding", f"{share} (> {cfg.shed_threshold:.0%})")
            self.note = f"{share}, but already at max_replicas ({cfg.max_replicas})"
            return None
        if cap <= 0.0:
            self.note = "waiting for a replica's batch latencies (capacity not measured yet)"
            return None
        util = self.rate / (n * cap)
        if util > cfg.target_utilization:
            low = min(i.rate for i in up) / (n * cap)
            if elapsed < cfg.up_window_s or low <= cfg.target_utilization:
                self.note = (
                    f"utilization {util:.2f} above target, not yet for a whole up window "
                    f"({cfg.up_window_s:g} s)"
                )
                return None
            target = cfg.clamp(self._needed(cap))
            detail = (
                f"utilization {util:.2f} (at least {low:.2f}) > {cfg.target_utilization:.2f} "
                f"for {cfg.up_window_s:g} s ({self.rate:.1f}/s offered, {cap:.1f}/s per replica)"
            )
            if target > n:
                return Decision(target, "utilization", detail)
            self.note = f"{detail}, but already at max_replicas ({cfg.max_replicas})"
            return None
        return self._maybe_down(s.at, n, cap, elapsed)

    def _maybe_down(self, at: float, n: int, cap: float, elapsed: float) -> Decision | None:
        cfg = self.config
        if n <= cfg.min_replicas:
            self.note = f"at min_replicas ({cfg.min_replicas})"
            return None
        window = self._window(at, cfg.down_window_s)
        peak = max(i.rate for i in window) / ((n - 1) * cap)
        offered = sum(i.offered for i in window)
        bad = sum(i.bad for i in window)
        if peak >= cfg.target_utilization or bad > cfg.shed_threshold * offered:
            self.note = f"steady: {n - 1} replicas would run at {peak:.2f}"
            return None
        if elapsed < cfg.down_window_s:
            self.note = (
                f"{n - 1} replicas would do ({peak:.2f}); quiet for {elapsed:.0f} of "
                f"{cfg.down_window_s:g} s"
            )
            return None
        return Decision(
            n - 1,
            "quiet",
            f"utilization with {n - 1} replicas at most {peak:.2f} < "
            f"{cfg.target_utilization:.2f} for {cfg.down_window_s:g} s",
        )

    def _needed(self, cap: float, rate: float = 0.0) -> int:
        """The fewest replicas that run the current rate (or ``rate``, when higher) at or
        under the target."""
        if cap <= 0.0:
            return 1
        rate = max(rate, self.rate)
        return max(1, math.ceil(rate / (cap * self.config.target_utilization) - 1e-9))

    def _add(self, s: Sample) -> bool:
        """Record the interval since the previous sample; False when there is none yet."""
        last, self._last = self._last, (s.at, s.offered, s.bad)
        if last is None or s.at <= last[0]:
            return False
        at, offered, bad = last
        # A total that went back: the version's scheduler was made again; count from zero.
        d_offered = s.offered - offered if s.offered >= offered else s.offered
        d_bad = s.bad - bad if s.bad >= bad else s.bad
        keep = max(self.config.up_window_s, self.config.down_window_s)
        while self._intervals and self._intervals[0].end <= s.at - keep:
            self._intervals.popleft()
        self._intervals.append(_Interval(s.at, s.at - at, d_offered, d_bad, 0.0))
        recent = self._window(s.at, max(self.config.up_window_s / 2, self.config.interval_s))
        self.rate = sum(i.offered for i in recent) / sum(i.seconds for i in recent)
        self._intervals[-1] = _Interval(s.at, s.at - at, d_offered, d_bad, self.rate)
        return True

    def _window(self, at: float, seconds: float) -> list[_Interval]:
        """The intervals that ended in the last ``seconds`` (at least the newest one)."""
        start = at - seconds
        out = [i for i in self._intervals if i.end - i.seconds >= start - 1e-9]
        return out or [self._intervals[-1]]

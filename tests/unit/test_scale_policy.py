"""The autoscaling rule (clipper.runtime.scale_policy) on simulated time.

A small simulation stands in for a model version: ``C`` inputs/s per replica fit the SLO, the
offered load follows a schedule (optionally with Poisson noise), inputs beyond ``n * C`` are
shed when the simulation says so, and a decision takes effect at once (the policy then starts
its windows again, as the autoscaler does once the count is realised).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from clipper.errors import RegistryError
from clipper.runtime.scale_policy import Decision, Sample, ScalePolicy
from clipper.scaling import AutoscaleConfig

C = 100.0  # one replica's capacity within the SLO, inputs/s


@dataclass
class Run:
    """What happened: the count after each period, and each decision with its time."""

    counts: list[int] = field(default_factory=list)
    decisions: list[tuple[float, Decision]] = field(default_factory=list)

    def changes(self) -> list[int]:
        return [d.replicas for _, d in self.decisions]


@dataclass
class Sim:
    config: AutoscaleConfig
    replicas: int = 1
    shed_excess: bool = False
    noise: random.Random | None = None
    capacity: float = C
    # replicas -> (mean, worst, worst one input at a time) per-replica capacity as measured at
    # that count (None: capacity for all three)
    measured: Callable[[int], tuple[float, float, float]] | None = None
    t: float = 0.0
    offered: int = 0
    bad: int = 0
    policy: ScalePolicy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = ScalePolicy(self.config, self.t)

    def run(self, seconds: float, rate: Callable[[float], float], into: Run) -> Run:
        dt = self.config.interval_s
        for _ in range(round(seconds / dt)):
            self.t += dt
            mean = rate(self.t) * dt
            arrivals = self._poisson(mean) if self.noise is not None else round(mean)
            self.offered += arrivals
            if self.shed_excess:
                self.bad += max(0, arrivals - int(self.replicas * self.capacity * dt))
            mean, worst, single = (
                self.measured(self.replicas)
                if self.measured is not None
                else (self.capacity, self.capacity, self.capacity)
            )
            sample = Sample(self.t, self.offered, self.bad, mean, self.replicas)
            d = self.policy.observe(replace(sample, floor_rps=worst, single_rps=single))
            if d is not None:
                into.decisions.append((self.t, d))
                self.replicas = d.replicas
                self.policy.restart(self.t)
            into.counts.append(self.replicas)
        return into

    def _poisson(self, mean: float) -> int:
        # Normal approximation (the means here are tens to hundreds of arrivals).
        assert self.noise is not None
        return max(0, round(self.noise.gauss(mean, mean**0.5)))


def config(**changes: object) -> AutoscaleConfig:
    base = AutoscaleConfig(
        min_replicas=1,
        max_replicas=8,
        target_utilization=0.7,
        up_window_s=10.0,
        down_window_s=60.0,
        interval_s=1.0,
    )
    return base.updated(**changes)


def constant(rps: float) -> Callable[[float], float]:
    return lambda t: rps


def unimodal(counts: list[int]) -> bool:
    """Up, then down, never up again: no oscillation."""
    peak = counts.index(max(counts))
    rising, falling = counts[: peak + 1], counts[peak:]
    return rising == sorted(rising) and falling == sorted(falling, reverse=True)


def test_the_ramp_reaches_the_needed_count_holds_it_and_comes_back_one_at_a_time() -> None:
    cfg = config()
    sim, run = Sim(cfg), Run()
    sim.run(100, constant(0.5 * C), run)
    assert run.decisions == [] and sim.replicas == 1  # 0.5x: one replica at 0.5 < 0.7
    step = sim.t
    sim.run(200, constant(3 * C), run)
    # 3x at 0.7 per replica needs ceil(3 / 0.7) = 5, reached in one decision once the up
    # window is full: within up_window / interval + 1 periods of the step.
    assert run.changes() == [5]
    (t_up, up), *_ = run.decisions
    assert up.reason == "utilization"
    assert t_up - step <= cfg.up_window_s + cfg.interval_s
    drop = sim.t
    sim.run(400, constant(0.5 * C), run)
    assert run.changes() == [5, 4, 3, 2, 1]  # down one replica at a time, to the bottom
    downs = [t for t, d in run.decisions if d.reason == "quiet"]
    # each only after a whole quiet window since the change before it (the first: since the
    # drop, which the window's smoothed rates still remember), all within 5 windows
    assert downs[0] - drop >= cfg.down_window_s
    gaps = [b - a for a, b in zip([t_up, *downs], downs, strict=False)]
    assert all(g >= cfg.down_window_s for g in gaps), gaps
    assert downs[-1] - drop <= 5 * (cfg.down_window_s + cfg.up_window_s)
    assert unimodal(run.counts)


def test_no_oscillation_under_noisy_steady_load() -> None:
    for seed in range(5):
        sim, run = Sim(config(), noise=random.Random(seed)), Run()
        sim.run(60, constant(0.5 * C), run)
        sim.run(900, constant(2.4 * C), run)  # needs ceil(2.4 / 0.7) = 4
        assert run.changes() == [4], (seed, run.decisions)
        sim.run(900, constant(0.5 * C), run)
        assert run.changes() == [4, 3, 2, 1], (seed, run.decisions)
        assert unimodal(run.counts)


def test_a_gradual_ramp_steps_up_and_never_back_while_the_load_stays() -> None:
    sim, run = Sim(config(), noise=random.Random(7)), Run()
    sim.run(300, lambda t: C * (0.5 + 2.5 * t / 300), run)  # 0.5x -> 3x over five minutes
    sim.run(600, constant(3 * C), run)
    counts = run.changes()
    assert counts == sorted(counts) and counts[-1] == 5  # only up, to ceil(3 / 0.7)
    assert all(d.reason == "utilization" for _, d in run.decisions)
    # it kept up with the ramp: the last step within an up window of the ramp's end (the
    # samples from before each change count: no fresh window to wait for after every step)
    assert run.decisions[-1][0] <= 300 + 10 + 1


def test_max_replicas_bounds_scale_up_and_says_so() -> None:
    sim, run = Sim(config(max_replicas=3), shed_excess=True), Run()
    sim.run(120, constant(5 * C), run)
    assert max(run.counts) == 3 and run.changes()[-1] == 3
    assert "max_replicas" in sim.policy.note


def test_min_replicas_is_a_floor_at_once_and_under_no_load() -> None:
    sim, run = Sim(config(min_replicas=2)), Run()
    sim.run(1, constant(0), run)
    assert run.decisions[0][1].replicas == 2
    assert run.decisions[0][1].reason == "min_replicas"
    sim.run(600, constant(0), run)
    assert min(run.counts) == 2 and sim.replicas == 2
    assert "min_replicas" in sim.policy.note


def test_a_count_above_max_is_brought_down_at_once() -> None:
    sim = Sim(config(max_replicas=3), replicas=6)
    run = sim.run(1, constant(C), Run())
    assert run.decisions[0][1] == Decision(3, "max_replicas", run.decisions[0][1].detail)


def test_shedding_over_one_percent_scales_up_without_waiting_for_the_up_window() -> None:
    cfg = config(up_window_s=30.0, down_window_s=120.0)
    sim, run = Sim(cfg, shed_excess=True), Run()
    sim.run(60, constant(0.5 * C), run)
    step = sim.t
    sim.run(5, constant(3 * C), run)
    (t, d), *_ = run.decisions
    assert d.reason == "shedding" and "shed or late" in d.detail
    assert t - step <= 2 * cfg.interval_s  # not the 30 s up window
    assert d.replicas == 5  # straight to the count the load needs, not one at a time


def test_shedding_under_the_threshold_or_a_stray_query_does_not_scale() -> None:
    cfg = config(up_window_s=30.0, down_window_s=120.0)
    policy = ScalePolicy(cfg, 0.0)
    offered = bad = 0
    for t in range(1, 30):
        offered += 50  # 0.5x: no utilisation reason
        bad += 1 if t in (3, 17) else 0  # two stray ones: under MIN_BAD_QUERIES
        assert policy.observe(Sample(float(t), offered, bad, C, 1)) is None
    policy = ScalePolicy(cfg, 0.0)
    offered = bad = 0
    for t in range(1, 30):
        offered += 1000  # 10x offered, 0.5% of it shed: under 1%
        bad += 5
        d = policy.observe(Sample(float(t), offered, bad, 1000 * C, 1))
        assert d is None


def test_capacity_not_yet_measured_holds_utilisation_but_not_shedding() -> None:
    policy = ScalePolicy(config(), 0.0)
    offered = 0
    for t in range(1, 40):
        offered += 300
        assert policy.observe(Sample(float(t), offered, 0, 0.0, 1)) is None
    assert policy.utilization is None and "capacity" in policy.note
    d = policy.observe(Sample(40.0, offered + 300, 100, 0.0, 1))
    assert d is not None and d.reason == "shedding" and d.replicas == 2


def test_totals_that_go_back_count_from_zero() -> None:
    # The version's scheduler was made again (deleted and deployed again): its counters restart.
    policy = ScalePolicy(config(), 0.0)
    policy.observe(Sample(1.0, 10_000, 0, C, 1))
    policy.observe(Sample(2.0, 50, 0, C, 1))
    assert policy.rate == pytest.approx(50.0)


def test_settings_are_checked() -> None:
    bad: list[dict[str, object]] = [
        {"min_replicas": 0, "max_replicas": 0},
        {"min_replicas": -1},
        {"min_replicas": 5, "max_replicas": 4},
        {"scale_to_zero_after_s": 0.01},
        {"scale_to_zero_after_s": 1e6},
        {"max_held_queries": 0},
        {"max_held_queries": True},
        {"max_replicas": 2.0},
        {"target_utilization": 0.0},
        {"target_utilization": 1.5},
        {"up_window_s": 0.01},
        {"down_window_s": 5.0, "up_window_s": 10.0},
        {"interval_s": float("nan")},
        {"shed_threshold": "1%"},
        {"enabled": "yes"},
        {"surprise": 1},
    ]
    for changes in bad:
        with pytest.raises(RegistryError):
            AutoscaleConfig().updated(**changes)
    with pytest.raises(RegistryError, match="owner is not a setting"):
        AutoscaleConfig.configure(None, {"owner": "x"}, owner="me")
    cfg = AutoscaleConfig.configure(None, {"max_replicas": 6, "up_window_s": 20}, owner="me")
    assert (cfg.max_replicas, cfg.up_window_s, cfg.owner) == (6, 20.0, "me")
    assert isinstance(cfg.up_window_s, float)
    again = AutoscaleConfig.configure(cfg, {"min_replicas": 2}, owner="other")
    assert (again.min_replicas, again.max_replicas, again.owner) == (2, 6, "other")
    assert AutoscaleConfig.from_record(cfg.to_record()) == cfg


def test_late_answers_just_after_a_change_are_the_backlog_not_a_reason() -> None:
    # What was queued before a scale-up may still come back late: shed or late queries of the
    # first half up window after a change do not count.
    cfg = config(up_window_s=10.0)
    policy = ScalePolicy(cfg, 0.0)
    policy.observe(Sample(0.0, 0, 0, C, 3))
    for t in range(1, 6):
        assert policy.observe(Sample(float(t), 100 * t, 20 * t, C, 3)) is None
    for t in range(6, 12):  # then nothing late: still nothing to do
        assert policy.observe(Sample(float(t), 100 * t, 100, C, 3)) is None
    d = policy.observe(Sample(12.0, 1200, 110, C, 3))  # 10 of the last 700 late: > 1%
    assert d is not None and d.reason == "shedding" and d.replicas == 4
    assert d.detail.startswith("10 of 700 queries in the last 7.0 s")


def trace_capacities(n: int) -> tuple[float, float, float]:
    """The measured flap's figures (the trace's model: 5 ms a batch and 20 ms an input, 40/s
    one at a time): at 30 queries/s two replicas read 48 and 50/s each, and the one left after
    a scale-down 40/s (so 30/s ran at 0.61 of the pair, scaled down under the 0.63 bound, and
    at 0.75 of the one, scaled back up)."""
    return (49.0, 48.0, 40.0) if n >= 2 else (40.0, 40.0, 40.0)


def test_a_constant_load_at_the_measured_flap_holds_its_count() -> None:
    cfg = config(up_window_s=5.0, down_window_s=15.0)  # the trace's windows
    sim, run = Sim(cfg, replicas=2, measured=trace_capacities), Run()
    sim.run(40 * cfg.down_window_s, constant(30.0), run)  # forty down windows
    assert run.decisions == [] and set(run.counts) == {2}
    # priced at max(40 one at a time, 0.8 x 48): 30/40
    assert "1 replicas would run at 0.75" in sim.policy.note
    # ... and with noise on the arrivals
    for seed in range(3):
        sim, run = Sim(cfg, replicas=2, measured=trace_capacities, noise=random.Random(seed)), Run()
        sim.run(40 * cfg.down_window_s, constant(30.0), run)
        assert run.decisions == [], (seed, run.decisions)
    # a real drop still scales down, once, and the one replica holds
    sim, run = Sim(cfg, replicas=2, measured=trace_capacities), Run()
    sim.run(60, constant(30.0), run)
    sim.run(20 * cfg.down_window_s, constant(15.0), run)
    assert run.changes() == [1] and run.decisions[0][1].reason == "quiet"
    assert sim.replicas == 1


def test_a_count_left_by_scaling_up_is_not_returned_to_at_the_same_load() -> None:
    # Two replicas read 60/s each, one input at a time too (30/s would run at 0.5 on one:
    # under the 0.63 down bound), but one replica read 35/s when 30/s scaled it up (0.86).
    # Whatever the larger count reads, the rate the smaller one was left at holds it.
    cfg = config(up_window_s=5.0, down_window_s=15.0)

    def measured(n: int) -> tuple[float, float, float]:
        return (60.0, 60.0, 60.0) if n >= 2 else (35.0, 35.0, 35.0)

    sim, run = Sim(cfg, replicas=1, measured=measured), Run()
    sim.run(40 * cfg.down_window_s, constant(30.0), run)
    assert run.changes() == [2] and run.decisions[0][1].reason == "utilization"
    assert "were too few at 30.0/s" in sim.policy.note
    sim.run(10 * cfg.down_window_s, constant(28.0), run)  # a fifteenth less: not a tenth
    assert run.changes() == [2]
    sim.run(10 * cfg.down_window_s, constant(20.0), run)  # a third less: a real drop
    assert run.changes() == [2, 1]
    assert sim.replicas == 1  # 20/35 = 0.57 < 0.7: and it stays


def test_a_scale_down_is_priced_at_the_worst_replica() -> None:
    # Two replicas at 80 and 40/s (mean 60): one fewer at 30/s is 0.5 of the mean but 0.75
    # of the slower one, which may be the one kept.
    cfg = config(up_window_s=5.0, down_window_s=15.0)
    sim, run = Sim(cfg, replicas=2, measured=lambda n: (60.0, 40.0, 40.0)), Run()
    sim.run(20 * cfg.down_window_s, constant(30.0), run)
    assert run.decisions == []
    sim.run(20 * cfg.down_window_s, constant(20.0), run)  # 0.5 of the slower: down
    assert run.changes() == [1]


def test_the_batching_gain_is_trusted_in_part_but_one_at_a_time_in_full() -> None:
    # A model that batches well: 1000/s one at a time, 10,000/s in batches. Down is priced at
    # 8,000/s (a fifth of the gain held back), not at 1,000/s: it still comes down.
    cfg = config(up_window_s=5.0, down_window_s=15.0)
    sim, run = Sim(cfg, replicas=3, measured=lambda n: (10_000.0, 10_000.0, 1000.0)), Run()
    sim.run(20 * cfg.down_window_s, constant(2 * 0.62 * 8000), run)  # 0.62 at 2: down to 2
    assert run.changes() == [2]
    sim.run(20 * cfg.down_window_s, constant(2 * 0.62 * 8000), run)  # 1.24 at 1: stays
    assert run.changes() == [2]


def test_an_idle_version_goes_to_zero_after_its_window_and_queries_wake_it() -> None:
    cfg = config(min_replicas=0, scale_to_zero_after_s=30.0)
    sim, run = Sim(cfg, replicas=3), Run()
    sim.run(20, constant(1.5 * C), run)
    assert sim.replicas == 3 and run.decisions == []  # busy: nothing goes
    quiet_from = sim.t
    sim.run(29, constant(0.0), run)
    assert sim.replicas == 3  # 29 s without a query: not yet (and not one at a time either)
    sim.run(2, constant(0.0), run)
    assert sim.replicas == 0
    at, d = run.decisions[-1]
    assert (d.replicas, d.reason) == (0, "idle") and at == pytest.approx(quiet_from + 30)
    assert "no query for 30 s" in d.detail
    sim.run(100, constant(0.0), run)
    assert sim.replicas == 0 and sim.policy.note.startswith("scaled to zero")
    sim.run(1, constant(5.0), run)  # a trickle of queries: back to one at the next sample
    assert sim.replicas == 1 and run.decisions[-1][1].reason == "cold_start"


def test_the_last_replica_stays_while_queries_come_however_few() -> None:
    cfg = config(min_replicas=0, scale_to_zero_after_s=30.0)
    sim, run = Sim(cfg), Run()
    sim.run(300, lambda t: 1.0 if int(t) % 20 == 0 else 0.0, run)  # one query every 20 s
    assert run.decisions == [] and sim.replicas == 1
    assert "to zero after 30 s" in sim.policy.note


def test_the_idle_window_counts_from_the_last_change() -> None:
    """Woken by a query, a version is not sent back to zero before a whole window passes."""
    cfg = config(min_replicas=0, scale_to_zero_after_s=30.0)
    sim, run = Sim(cfg, replicas=0), Run()
    sim.run(200, constant(0.0), run)
    assert run.decisions == []
    sim.run(1, constant(1.0), run)
    woke = sim.t
    sim.run(29, constant(0.0), run)
    assert sim.replicas == 1
    sim.run(1, constant(0.0), run)
    assert sim.replicas == 0 and run.decisions[-1][0] == pytest.approx(woke + 30)


def test_min_replicas_one_never_goes_to_zero() -> None:
    sim, run = Sim(config(scale_to_zero_after_s=5.0)), Run()
    sim.run(600, constant(0.0), run)
    assert sim.replicas == 1 and run.decisions == []

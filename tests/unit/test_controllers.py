"""Batch-size controllers: AIMD, quantile regression, fixed, and the factory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clipper.batching.controllers import (
    AIMDController,
    BatchController,
    FixedController,
    LatencyModel,
    QuantileController,
    fit_quantile_line,
    make_controller,
)
from clipper.errors import ConfigError

TARGET = 0.020  # 20 ms
FAST = 0.001  # well under target * (1 - hold_band)
IN_BAND = 0.019  # between target * 0.9 and target
SLOW = 0.030  # over target


def _pinball(a: float, b: float, n: np.ndarray, y: np.ndarray, tau: float) -> float:
    r = y - a - b * n
    return float(np.sum(np.maximum(tau * r, (tau - 1.0) * r)))


# --- AIMD -----------------------------------------------------------------------------------


def test_aimd_grows_by_increment_per_full_fast_batch() -> None:
    c = AIMDController(TARGET, slow_start=False)
    sizes = []
    for _ in range(4):
        c.observe(c.max_batch_size(), FAST)
        sizes.append(c.max_batch_size())
    assert sizes == [3, 5, 7, 9]


def test_aimd_growth_is_capped_at_max_size() -> None:
    c = AIMDController(TARGET, slow_start=False, increment=5, initial=8, max_size=10)
    c.observe(8, FAST)
    assert c.max_batch_size() == 10
    c.observe(10, FAST)
    assert c.max_batch_size() == 10


def test_aimd_holds_inside_the_band() -> None:
    c = AIMDController(TARGET, slow_start=False, initial=10)
    c.observe(10, IN_BAND)
    c.observe(10, TARGET)  # exactly on target still holds
    assert c.max_batch_size() == 10


def test_aimd_backs_off_multiplicatively_with_floor() -> None:
    c = AIMDController(TARGET, slow_start=False, initial=100, backoff_after=1)  # the paper's
    seen = []
    for _ in range(3):
        c.observe(c.max_batch_size(), SLOW)
        seen.append(c.max_batch_size())
    assert seen == [90, 81, 72]  # 72.9 floors to 72


def test_aimd_never_goes_below_one() -> None:
    c = AIMDController(TARGET, slow_start=False, initial=3)
    for _ in range(10):
        c.observe(1, SLOW)
    assert c.max_batch_size() == 1


def test_aimd_does_not_grow_on_non_full_batches_but_backs_off() -> None:
    c = AIMDController(TARGET, slow_start=False, initial=10)
    for _ in range(20):
        c.observe(4, FAST)
    assert c.max_batch_size() == 10
    c.observe(4, SLOW)
    c.observe(4, SLOW)  # over-target batches shrink the cap even when not full
    assert c.max_batch_size() == 9


def test_aimd_one_slow_batch_among_fast_ones_does_not_shrink_the_cap() -> None:
    """Beside another program on the core, a batch now and then waits out its time slice:
    that says nothing about the batch's size. Shrinking at each such batch drove the cap to 1."""
    c = AIMDController(TARGET, slow_start=False, initial=40)
    for _ in range(30):
        c.observe(40, SLOW)  # one batch over the target...
        c.observe(40, IN_BAND)  # ...then one within it: never two in a row
    assert c.max_batch_size() == 40


def test_aimd_backs_off_from_the_second_slow_batch_in_a_row() -> None:
    c = AIMDController(TARGET, slow_start=False, initial=100)
    seen = []
    for _ in range(4):
        c.observe(c.max_batch_size(), SLOW)
        seen.append(c.max_batch_size())
    assert seen == [100, 90, 81, 72]
    c.observe(72, FAST)  # the run ends: the next slow batch is again the first
    c.observe(74, SLOW)
    assert c.max_batch_size() == 74


def test_aimd_expected_latency_tracks_linear_cost() -> None:
    c = AIMDController(TARGET, slow_start=False)
    assert c.expected_latency(10) == 0.0
    for n in range(1, 60):
        c.observe(n, 0.001 + 0.0001 * n)
    # Noise-free data: the conservative margin is ~0 and the fit is exact.
    assert c.expected_latency(100) == pytest.approx(0.011, rel=1e-6)
    assert c.expected_latency(1) == pytest.approx(0.0011, rel=1e-6)


def test_aimd_rejects_bad_observations() -> None:
    c = AIMDController(TARGET, slow_start=False)
    with pytest.raises(ValueError):
        c.observe(0, FAST)
    with pytest.raises(ValueError):
        c.observe(1, math.nan)
    with pytest.raises(ValueError):
        c.observe(1, -0.001)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"increment": 0},
        {"backoff": 1.0},
        {"backoff": 0.0},
        {"initial": 0},
        {"initial": 11, "max_size": 10},
        {"max_size": 0},
        {"hold_band": 1.0},
        {"hold_band": -0.1},
        {"backoff_after": 0},
    ],
)
def test_aimd_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        AIMDController(TARGET, **kwargs)  # type: ignore[arg-type]


# --- LatencyModel ---------------------------------------------------------------------------


def test_latency_model_empty_predicts_zero() -> None:
    assert LatencyModel().predict(5) == 0.0


def test_latency_model_single_size_is_conservative() -> None:
    m = LatencyModel()
    for lat in (0.010, 0.012, 0.011):
        m.observe(8, lat)
    assert m.predict(8) == 0.012  # worst seen at that size
    assert m.predict(4) == 0.012  # smaller batches are no slower
    assert m.predict(16) == pytest.approx(0.024)  # scaled up proportionally


def test_latency_model_prediction_is_above_noisy_mean() -> None:
    rng = np.random.default_rng(7)
    m = LatencyModel()
    ns = rng.integers(1, 100, 1000)
    lats = 0.002 + 0.0001 * ns + rng.normal(0.0, 0.0005, ns.size)
    for n, lat in zip(ns, lats, strict=True):
        m.observe(int(n), max(0.0, float(lat)))
    mean_at_50 = 0.002 + 0.0001 * 50
    assert mean_at_50 < m.predict(50) < mean_at_50 + 0.003


def test_latency_model_window_forgets_old_data() -> None:
    m = LatencyModel(window=16)
    for n in range(1, 17):
        m.observe(n, 1.0)  # old regime: very slow
    for _ in range(3):  # several full turns of the window, exercising the exact rebuild
        for n in range(1, 17):
            m.observe(n, 0.001 * n)
    assert len(m) == 16
    assert m.predict(10) == pytest.approx(0.010, abs=1e-9)


def test_latency_model_negative_slope_is_flattened() -> None:
    m = LatencyModel()
    for n in range(1, 20):
        m.observe(n, 0.02 - 0.0005 * n)
    # Never predicts bigger batches to be faster than the average batch.
    assert m.predict(100) >= m.predict(1) > 0.0


# --- quantile regression ------------------------------------------------------------------------


def test_fit_quantile_line_recovers_noise_free_line() -> None:
    n = np.arange(1.0, 101.0)
    a, b = fit_quantile_line(n, 0.0005 + 0.0001 * n, 0.99)
    assert a == pytest.approx(0.0005, abs=1e-9)
    assert b == pytest.approx(0.0001, rel=1e-6)


def test_fit_quantile_line_minimises_pinball_loss() -> None:
    rng = np.random.default_rng(3)
    n = rng.integers(1, 200, 300).astype(np.float64)
    y = 0.001 + 0.0001 * n + rng.exponential(0.0005, n.size)
    tau = 0.9
    a, b = fit_quantile_line(n, y, tau)
    best = _pinball(a, b, n, y, tau)
    # The optimum of a 2-parameter quantile regression interpolates two observations; no such
    # line (checked on a sample of pairs) may do better, nor may nudging the fitted one.
    for i in range(0, 300, 7):
        for j in range(i + 1, 300, 11):
            if n[i] != n[j]:
                bb = (y[j] - y[i]) / (n[j] - n[i])
                aa = y[i] - bb * n[i]
                assert _pinball(aa, bb, n, y, tau) >= best - 1e-12
    for da, db in ((1e-5, 0.0), (-1e-5, 0.0), (0.0, 1e-7), (0.0, -1e-7)):
        assert _pinball(a + da, b + db, n, y, tau) >= best - 1e-12
    # About tau of the points lie on or below the fitted quantile line.
    assert 0.85 <= float(np.mean(y <= a + b * n + 1e-12)) <= 0.95


def _run_quantile(
    c: QuantileController, rng: np.random.Generator, steps: int, a: float, b: float
) -> list[int]:
    caps = []
    for _ in range(steps):
        n = c.max_batch_size()
        c.observe(n, max(0.0, a + b * n + float(rng.normal(0.0, 0.0001))))
        caps.append(c.max_batch_size())
    return caps


def test_quantile_converges_near_true_cap() -> None:
    rng = np.random.default_rng(42)
    c = QuantileController(TARGET)
    caps = _run_quantile(c, rng, 2000, 0.0005, 0.0001)
    true_cap = (TARGET - 0.0005) / 0.0001  # 195
    assert 0.9 * true_cap <= c.max_batch_size() <= 1.1 * true_cap
    # It stays there: the last few hundred caps are all within the band.
    assert all(0.85 * true_cap <= cap <= 1.1 * true_cap for cap in caps[-300:])
    # expected_latency is the fitted P99: near the target at the cap, and above the mean
    # latency there (the window only holds sizes near the cap, so only check near it).
    cap = c.max_batch_size()
    assert c.expected_latency(cap) == pytest.approx(TARGET, rel=0.05)
    assert c.expected_latency(cap) > 0.0005 + 0.0001 * cap


def test_quantile_backs_off_when_latencies_rise() -> None:
    rng = np.random.default_rng(5)
    c = QuantileController(TARGET)
    _run_quantile(c, rng, 1500, 0.0005, 0.0001)
    before = c.max_batch_size()
    assert before > 150
    # The model got twice as slow: the very next over-target batch shrinks the cap.
    c.observe(before, 0.001 + 0.0002 * before)
    assert c.max_batch_size() < before
    _run_quantile(c, rng, 2000, 0.001, 0.0002)
    new_true_cap = (TARGET - 0.001) / 0.0002  # 95
    assert 0.9 * new_true_cap <= c.max_batch_size() <= 1.1 * new_true_cap


def test_quantile_explores_before_min_samples() -> None:
    c = QuantileController(TARGET, min_samples=32)
    assert c.expected_latency(10) == 0.0
    for _ in range(5):
        c.observe(c.max_batch_size(), FAST)
    assert c.max_batch_size() == 11  # 1 + 5 * 2
    c.observe(11, SLOW)
    assert c.max_batch_size() == 9  # floor(11 * 0.9)
    c.observe(3, FAST)  # not full: no growth
    assert c.max_batch_size() == 9
    assert c.expected_latency(10) == 0.0  # no fit yet


def test_quantile_degenerate_single_size_does_not_jump() -> None:
    c = QuantileController(TARGET, min_samples=8, max_size=4096)
    for _ in range(100):
        c.observe(4, 0.002)  # underloaded: batches never fill the cap
    # No evidence about bigger batches: the cap stays small, it does not leap to max_size.
    assert c.max_batch_size() <= 10
    # The fit is the latency quantile at the one observed size.
    assert c.expected_latency(4) == pytest.approx(0.002)


def test_quantile_non_positive_slope_falls_back_to_exploration() -> None:
    c = QuantileController(TARGET, min_samples=8, refit_every=4)
    for i in range(40):
        n = c.max_batch_size()
        c.observe(n, 0.005 if i % 2 else 0.004)  # flat latencies: slope ~ 0
    # Exploration grows by 2 per full batch at most; never nonsense like max_size.
    assert c.max_batch_size() <= 1 + 2 * 40
    assert c.max_batch_size() > 1


def test_quantile_respects_max_size() -> None:
    rng = np.random.default_rng(1)
    c = QuantileController(TARGET, max_size=50)
    caps = _run_quantile(c, rng, 800, 0.0005, 0.0001)
    assert max(caps) == 50
    assert c.max_batch_size() == 50


@pytest.mark.parametrize(
    "kwargs",
    [
        {"quantile": 1.0},
        {"quantile": 0.0},
        {"window": 16, "min_samples": 32},
        {"min_samples": 1},
        {"max_size": 0},
        {"explore_increment": 0},
        {"refit_every": 0},
    ],
)
def test_quantile_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        QuantileController(TARGET, **kwargs)  # type: ignore[arg-type]


# --- fixed ------------------------------------------------------------------------------------


def test_fixed_is_constant() -> None:
    c = FixedController(8)
    for lat in (FAST, SLOW, IN_BAND, 10.0):
        c.observe(8, lat)
        assert c.max_batch_size() == 8


def test_fixed_expected_latency_from_observations() -> None:
    c = FixedController(8)
    assert c.expected_latency(8) == 0.0
    c.observe(8, 0.004)
    c.observe(2, 0.001)
    assert c.expected_latency(8) == pytest.approx(0.004, rel=1e-6)


def test_fixed_rejects_size_below_one() -> None:
    with pytest.raises(ConfigError):
        FixedController(0)


# --- factory ----------------------------------------------------------------------------------


def test_make_controller_builds_each_kind() -> None:
    aimd = make_controller("aimd", target_s=TARGET, initial=4, increment=3, slow_start=False)
    quant = make_controller("quantile", target_s=TARGET, quantile=0.95)
    fixed = make_controller("fixed", target_s=TARGET, size=16)
    assert isinstance(aimd, AIMDController)
    assert isinstance(quant, QuantileController)
    assert isinstance(fixed, FixedController)
    assert all(isinstance(c, BatchController) for c in (aimd, quant, fixed))
    aimd.observe(4, FAST)
    assert aimd.max_batch_size() == 7
    assert fixed.max_batch_size() == 16
    assert make_controller(" AIMD ", target_s=TARGET).max_batch_size() == 1


@pytest.mark.parametrize(
    ("name", "target", "params", "match"),
    [
        ("batchy", TARGET, {}, "unknown batching controller 'batchy'"),
        ("aimd", 0.0, {}, "target_s"),
        ("aimd", -1.0, {}, "target_s"),
        ("aimd", math.inf, {}, "target_s"),
        ("quantile", math.nan, {}, "target_s"),
        ("fixed", TARGET, {}, "requires a 'size'"),
        ("fixed", TARGET, {"size": 0}, "fixed batch size must be >= 1"),
        ("fixed", TARGET, {"size": 2.5}, "'size' must be an integer"),
        ("fixed", TARGET, {"size": True}, "'size' must be an integer"),
        ("aimd", TARGET, {"size": 4}, "unknown parameter"),
        ("aimd", TARGET, {"backoff": "0.5"}, "'backoff' must be a finite number"),
        ("aimd", TARGET, {"backoff": 1.5}, "backoff"),
        ("aimd", TARGET, {"backoff_after": 0}, "backoff_after must be >= 1"),
        ("aimd", TARGET, {"backoff_after": 1.5}, "'backoff_after' must be an integer"),
        ("quantile", TARGET, {"quantile": 2}, "quantile"),
    ],
)
def test_make_controller_errors(
    name: str, target: float, params: dict[str, object], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        make_controller(name, target_s=target, **params)


def test_typical_latency_is_not_dominated_by_one_cold_batch() -> None:
    from clipper.batching.controllers import FixedController

    c = FixedController(1)
    c.observe(1, 0.05)  # a cold first batch
    for _ in range(9):
        c.observe(1, 0.0002)
    assert c.expected_latency(1) >= 0.05  # the upper-side estimate keeps the outlier
    for _ in range(90):
        c.observe(1, 0.0002)
    assert c.typical_latency(1) < 0.001  # the central one, used for throughput, does not
    # And a run of batches far under the estimate is a shift (below): the fit forgot it.
    assert c.expected_latency(1) < 0.001


def test_the_latency_fit_forgets_the_old_cost_after_a_run_of_batches_off_it() -> None:
    """A flood beside a busy process left 13-15 ms batches in the window; the process left and
    the batches fell to 3 ms. After SHIFT_RUN batches in a row under half the fit's estimate,
    the window keeps only those: the fit follows at once instead of a window later."""
    from clipper.batching.controllers import SHIFT_RUN, LatencyModel

    m = LatencyModel()
    for i in range(256):
        m.observe(5 + i % 3, 0.013 + 0.0005 * (i % 3))
    assert m.typical(6) == pytest.approx(0.0135, rel=0.01)
    for _ in range(SHIFT_RUN - 1):
        m.observe(6, 0.003)
    assert m.forgets == 0 and m.typical(6) > 0.012  # not yet: seven could be a lucky spell
    m.observe(6, 0.003)
    assert m.forgets == 1 and len(m) == SHIFT_RUN
    assert m.typical(6) == pytest.approx(0.003)
    # Slower works the same way: a run over twice the estimate.
    for _ in range(2 * SHIFT_RUN):
        m.observe(6, 0.003)
    for _ in range(SHIFT_RUN):
        m.observe(6, 0.010)
    assert m.forgets == 2 and m.typical(6) == pytest.approx(0.010)


def test_noise_within_twice_the_estimate_never_makes_the_fit_forget() -> None:
    from clipper.batching.controllers import LatencyModel

    m = LatencyModel()
    for i in range(2000):
        m.observe(1 + i % 16, (0.001 + 0.0001 * (i % 16)) * (0.6 if i % 2 else 1.6))
    assert m.forgets == 0 and len(m) == 256


def test_aimd_slow_start_doubles_until_the_hold_band_then_adds() -> None:
    c = AIMDController(0.010)  # slow start on by default
    for expected in (2, 4, 8, 16):
        c.observe(c.max_batch_size(), 0.001)
        assert c.max_batch_size() == expected
    c.observe(16, 0.0095)  # in the hold band: slow start ends, size holds
    assert c.max_batch_size() == 16
    c.observe(16, 0.001)
    assert c.max_batch_size() == 18  # the paper's +2 from now on


def test_a_cold_first_batch_of_one_does_not_end_slow_start() -> None:
    """A fresh replica's first call is slow (imports, first allocations): over the target for
    a batch of one. That says nothing about batching: the cap still doubles after it."""
    c = AIMDController(0.010)
    c.observe(1, 0.0105)  # cold: over the target
    assert c.max_batch_size() == 1
    for expected in (2, 4, 8, 16, 32):
        c.observe(c.max_batch_size(), 0.002)
        assert c.max_batch_size() == expected
    c.observe(32, 0.0095)  # a real batch in the hold band ends it
    c.observe(32, 0.002)
    assert c.max_batch_size() == 34

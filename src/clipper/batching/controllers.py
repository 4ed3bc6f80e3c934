"""Batch-size controllers: one per replica, deciding how large the next batch may be.

Each controller sees the measured latency of every batch it allowed and answers two questions:
how many queries may go in the next batch (:meth:`BatchController.max_batch_size`), and how long a
batch of a given size is expected to take (:meth:`BatchController.expected_latency`), which the
dispatcher uses to send a batch early enough for the earliest deadline in it.

* :class:`AIMDController` - additive increase, multiplicative decrease around the latency target.
* :class:`QuantileController` - a linear quantile regression (P99 by default) of batch latency on
  batch size; the cap is the largest size whose predicted quantile meets the target.
* :class:`FixedController` - a constant size (baselines, models that cannot batch).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from clipper.choices import CONTROLLERS
from clipper.errors import ConfigError

__all__ = [
    "AIMDController",
    "BatchController",
    "FixedController",
    "LatencyModel",
    "QuantileController",
    "fit_quantile_line",
    "make_controller",
]

_FloatArray = npt.NDArray[np.float64]


@runtime_checkable
class BatchController(Protocol):
    def max_batch_size(self) -> int:
        """Current cap on the size of the next batch (always >= 1)."""
        ...

    def observe(self, batch_size: int, latency_s: float) -> None:
        """Record one batch's measured latency (send to response), in seconds."""
        ...

    def expected_latency(self, batch_size: int) -> float:
        """Estimated seconds for a batch of ``batch_size``; 0.0 while nothing is known."""
        ...

    def typical_latency(self, batch_size: int) -> float:
        """A central (not upper-side) estimate, for throughput: 0.0 while nothing is known.
        Shedding at admission prices the queue with it, so one slow outlier (a cold first
        batch) does not make the model look a hundred times slower than it is."""
        ...


def _check_observation(batch_size: int, latency_s: float) -> None:
    # ``not latency_s >= 0`` also rejects NaN, which would poison every running sum.
    if batch_size < 1 or not latency_s >= 0.0 or latency_s == math.inf:
        raise ValueError(f"invalid observation: batch_size={batch_size}, latency_s={latency_s}")


# Batches in a row at under half, or over twice, the fit's central estimate: the model's cost
# changed (another program left or took the core, a flood ended), and the fit forgets the
# batches before them instead of averaging the old cost in for a whole window.
SHIFT_RUN = 8


class LatencyModel:
    """Running least-squares fit ``latency ~ a + b*n`` over the last ``window`` batches.

    When :data:`SHIFT_RUN` batches in a row land under half or over twice the fit's central
    estimate, the window keeps only them: after a flood beside a busy process, the fit held
    13-15 ms batches for 256 batches (a second and more) after they had fallen to 3 ms, and
    admission shed a normal load's first second on that stale cost.

    Updates are O(1) (running sums, refreshed exactly now and then so float drift cannot
    accumulate); the fit itself is recomputed lazily, only when a prediction is asked for after
    new data. :meth:`predict` is deliberately on the high side (fit plus two residual standard
    deviations) because it is used to decide how late a batch may still be sent.
    """

    __slots__ = (
        "_a",
        "_b",
        "_dirty",
        "_margin",
        "_mean",
        "_shift",
        "_since_rebuild",
        "_single_max",
        "_single_size",
        "_sizes",
        "_sl",
        "_sll",
        "_sn",
        "_snl",
        "_snn",
        "_window",
        "forgets",
    )

    def __init__(self, window: int = 256) -> None:
        if window < 2:
            raise ConfigError(f"latency model window must be >= 2, got {window}")
        self._window: deque[tuple[int, float]] = deque(maxlen=window)
        self._sizes: dict[int, int] = {}  # batch size -> occurrences in the window
        self._sn = self._sl = self._snn = self._snl = self._sll = 0.0
        self._since_rebuild = 0
        self._dirty = False
        self._a = self._b = self._margin = self._mean = 0.0
        self._single_size = 0  # > 0 when the window holds exactly one distinct size
        self._single_max = 0.0
        self._shift = 0  # the run of batches off the fit: > 0 slower, < 0 faster
        self.forgets = 0  # times the window was cut to a shift's batches

    def __len__(self) -> int:
        return len(self._window)

    def observe(self, batch_size: int, latency_s: float) -> None:
        _check_observation(batch_size, latency_s)
        window = self._window
        if len(window) >= 2 * SHIFT_RUN and self._shifted(batch_size, latency_s):
            self._keep_last(SHIFT_RUN - 1)
        if len(window) == window.maxlen:
            old_n, old_l = window[0]
            self._add(old_n, old_l, -1.0)
            count = self._sizes[old_n] - 1
            if count:
                self._sizes[old_n] = count
            else:
                del self._sizes[old_n]
            self._since_rebuild += 1
        window.append((batch_size, latency_s))
        self._add(batch_size, latency_s, 1.0)
        self._sizes[batch_size] = self._sizes.get(batch_size, 0) + 1
        if self._since_rebuild >= len(window):
            self._rebuild()
        self._dirty = True

    def predict(self, batch_size: int) -> float:
        """Upper-side latency estimate for a batch of ``batch_size``; 0.0 with no data."""
        if not self._window:
            return 0.0
        if self._dirty:
            self._refit()
        if self._single_size:
            # One size seen: its worst latency bounds smaller batches, and scaling it
            # proportionally over-estimates larger ones for any affine cost with a >= 0.
            if batch_size <= self._single_size:
                return self._single_max
            return self._single_max * batch_size / self._single_size
        return max(0.0, self._a + self._b * batch_size + self._margin)

    def typical(self, batch_size: int) -> float:
        """Central estimate: the least-squares line (or the mean, scaled, for one size)."""
        if not self._window:
            return 0.0
        if self._dirty:
            self._refit()
        if self._single_size:
            return self._mean * max(1.0, batch_size / self._single_size)
        return max(0.0, self._a + self._b * batch_size)

    def _shifted(self, batch_size: int, latency_s: float) -> bool:
        """Count ``latency_s`` into the run of batches off the fit; True when the run is long
        enough that the fit should forget what came before it."""
        expected = self.typical(batch_size)
        if latency_s > 2.0 * expected:
            self._shift = self._shift + 1 if self._shift > 0 else 1
        elif latency_s < 0.5 * expected:
            self._shift = self._shift - 1 if self._shift < 0 else -1
        else:
            self._shift = 0
        if abs(self._shift) < SHIFT_RUN:
            return False
        self._shift = 0
        return True

    def _keep_last(self, keep: int) -> None:
        """Forget all but the last ``keep`` batches (those of the shift)."""
        recent = list(self._window)[-keep:]
        self._window.clear()
        self._window.extend(recent)
        self._sizes = dict(Counter(n for n, _ in recent))
        self._rebuild()  # observe() marks the fit dirty after its own append
        self.forgets += 1

    def _add(self, n: int, lat: float, sign: float) -> None:
        fn = float(n)
        self._sn += sign * fn
        self._sl += sign * lat
        self._snn += sign * fn * fn
        self._snl += sign * fn * lat
        self._sll += sign * lat * lat

    def _rebuild(self) -> None:
        self._sn = self._sl = self._snn = self._snl = self._sll = 0.0
        for n, lat in self._window:
            self._add(n, lat, 1.0)
        self._since_rebuild = 0

    def _refit(self) -> None:
        self._dirty = False
        k = float(len(self._window))
        mean_n = self._sn / k
        mean_l = self._sl / k
        self._mean = mean_l
        if len(self._sizes) < 2:
            self._single_size = next(iter(self._sizes))
            self._single_max = max(lat for _, lat in self._window)
            return
        self._single_size = 0
        sxx = self._snn - k * mean_n * mean_n
        sxy = self._snl - k * mean_n * mean_l
        syy = max(0.0, self._sll - k * mean_l * mean_l)
        # Bigger batches are never faster; a negative slope is noise, so flatten it to the mean.
        b = max(sxy / sxx if sxx > 0.0 else 0.0, 0.0)
        self._b = b
        self._a = mean_l - b * mean_n
        sse = max(0.0, syy - b * sxy)
        self._margin = 2.0 * math.sqrt(sse / max(1.0, k - 2.0))


class AIMDController:
    """Additive increase / multiplicative decrease of the batch cap (Clipper's rule).

    Under ``target*(1-hold_band)`` the cap grows by ``increment``, but only after a *full* batch:
    a half-empty batch says nothing about whether a bigger one would meet the target. Between
    that and the target the cap holds; over the target it shrinks by ``backoff``, always.

    ``slow_start`` (TCP's idea, not the paper's): until the first batch of two or more that
    reaches the hold band, a full fast batch doubles the cap instead of adding ``increment``.
    A cold replica under load then reaches a cap of ~1000 in ten batches instead of five
    hundred, so it does not shed queries while it ramps up.

    One departure from the paper's backoff, for a core shared with other programs, where a
    batch's latency holds time the replica was not running (another program's time slice) that
    no batch size changes: the cap shrinks from the ``backoff_after``-th batch in a row over the
    target (2; 1 is the paper's rule). One batch that waited out someone else's slice says
    nothing about its size; shrinking at every such batch drove the cap to 1-3 beside a busy
    process, and a queue of 30 then waited out a dozen batches instead of one.
    """

    __slots__ = (
        "_backoff",
        "_backoff_after",
        "_grow_below",
        "_increment",
        "_max_size",
        "_model",
        "_overs",
        "_size",
        "_slow_start",
        "_target",
    )

    def __init__(
        self,
        target_s: float,
        *,
        increment: int = 2,
        backoff: float = 0.9,
        initial: int = 1,
        max_size: int = 4096,
        hold_band: float = 0.1,
        slow_start: bool = True,
        backoff_after: int = 2,
    ) -> None:
        _require_target(target_s)
        if increment < 1:
            raise ConfigError(f"aimd increment must be >= 1, got {increment}")
        if not 0.0 < backoff < 1.0:
            raise ConfigError(f"aimd backoff must be in (0, 1), got {backoff}")
        if max_size < 1:
            raise ConfigError(f"max_size must be >= 1, got {max_size}")
        if not 1 <= initial <= max_size:
            raise ConfigError(f"aimd initial must be in [1, max_size={max_size}], got {initial}")
        if not 0.0 <= hold_band < 1.0:
            raise ConfigError(f"aimd hold_band must be in [0, 1), got {hold_band}")
        if backoff_after < 1:
            raise ConfigError(f"aimd backoff_after must be >= 1, got {backoff_after}")
        self._target = target_s
        self._increment = increment
        self._backoff = backoff
        self._max_size = max_size
        self._grow_below = target_s * (1.0 - hold_band)
        self._size = initial
        self._slow_start = slow_start
        self._model = LatencyModel()
        self._backoff_after = backoff_after
        self._overs = 0  # batches in a row over the target

    def max_batch_size(self) -> int:
        return self._size

    def observe(self, batch_size: int, latency_s: float) -> None:
        self._model.observe(batch_size, latency_s)
        if latency_s >= self._grow_below and batch_size > 1:
            # A batch of one ends nothing: it cannot be made smaller, and a slow one is most
            # often a replica's cold first call (10 ms where the next take 2), after which
            # additive growth from 1 let a fresh deploy's first burst queue past its SLO.
            self._slow_start = False
        if latency_s > self._target:
            self._overs += 1
            if self._overs >= self._backoff_after:
                self._size = max(1, math.floor(self._size * self._backoff))
            return
        self._overs = 0
        if latency_s < self._grow_below and batch_size >= self._size:
            grown = self._size * 2 if self._slow_start else self._size + self._increment
            self._size = min(self._max_size, grown)

    def expected_latency(self, batch_size: int) -> float:
        return self._model.predict(batch_size)

    def typical_latency(self, batch_size: int) -> float:
        return self._model.typical(batch_size)


def _pinball_loss(residuals: _FloatArray, tau: float) -> float:
    return float(np.sum(np.maximum(tau * residuals, (tau - 1.0) * residuals)))


def fit_quantile_line(
    sizes: _FloatArray, latencies: _FloatArray, tau: float
) -> tuple[float, float]:
    """Exact-to-tolerance linear quantile regression: ``(a, b)`` minimising the pinball loss.

    For a fixed slope ``b`` the best intercept is a ``tau``-quantile of ``y - b*n``, and the
    loss minimised over the intercept is convex in ``b`` (partial minimisation of a jointly
    convex function), so a golden-section search over ``b`` finds the optimum. The optimal line
    passes through two observations, so ``|b| <= range(y) / min gap of n``, and integer batch
    sizes have gaps of at least 1. About 60 O(m) evaluations: cheap enough every few batches.
    """
    m = len(latencies)
    k = max(0, math.ceil(tau * m) - 1)  # the ceil(tau*m)-th order statistic minimises over a

    def best_intercept(b: float) -> tuple[float, float]:
        z = latencies - b * sizes
        a = float(np.partition(z, k)[k])
        return a, _pinball_loss(z - a, tau)

    span = float(np.max(latencies) - np.min(latencies))
    lo, hi = -span, span
    inv_phi = (math.sqrt(5.0) - 1.0) / 2.0
    x1 = hi - inv_phi * (hi - lo)
    x2 = lo + inv_phi * (hi - lo)
    f1 = best_intercept(x1)[1]
    f2 = best_intercept(x2)[1]
    tol = 1e-9 * span + 1e-15
    for _ in range(100):
        if hi - lo <= tol:
            break
        if f1 <= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - inv_phi * (hi - lo)
            f1 = best_intercept(x1)[1]
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + inv_phi * (hi - lo)
            f2 = best_intercept(x2)[1]
    b = (lo + hi) / 2.0
    return best_intercept(b)[0], b


class QuantileController:
    """Sets the cap from a linear quantile regression of batch latency on batch size.

    The cap is the largest ``n`` whose fitted ``quantile`` latency is within the target. A fit
    is only trusted where it has data: until ``min_samples`` batches were seen, while the fit is
    degenerate (one size, or non-positive slope) or while it would allow sizes beyond every size
    observed, the cap moves like AIMD (``+explore_increment`` after a full batch under target,
    ``x0.9`` over target), never above a valid fitted cap. Any batch over target shrinks the cap
    at once; the fit, refreshed every ``refit_every`` batches, then resets it.
    """

    __slots__ = (
        "_a",
        "_b",
        "_explore_increment",
        "_fit_cap",
        "_fitted",
        "_max_size",
        "_min_samples",
        "_quantile",
        "_refit_every",
        "_since_fit",
        "_size",
        "_target",
        "_typical",
        "_window",
    )

    _BACKOFF = 0.9

    def __init__(
        self,
        target_s: float,
        *,
        quantile: float = 0.99,
        window: int = 512,
        max_size: int = 4096,
        min_samples: int = 32,
        explore_increment: int = 2,
        refit_every: int = 16,
    ) -> None:
        _require_target(target_s)
        if not 0.0 < quantile < 1.0:
            raise ConfigError(f"quantile must be in (0, 1), got {quantile}")
        if max_size < 1:
            raise ConfigError(f"max_size must be >= 1, got {max_size}")
        if min_samples < 2:
            raise ConfigError(f"quantile min_samples must be >= 2, got {min_samples}")
        if window < min_samples:
            raise ConfigError(f"quantile window ({window}) must be >= min_samples ({min_samples})")
        if explore_increment < 1:
            raise ConfigError(f"explore_increment must be >= 1, got {explore_increment}")
        if refit_every < 1:
            raise ConfigError(f"refit_every must be >= 1, got {refit_every}")
        self._target = target_s
        self._quantile = quantile
        self._max_size = max_size
        self._min_samples = min_samples
        self._explore_increment = explore_increment
        self._refit_every = refit_every
        self._window: deque[tuple[int, float]] = deque(maxlen=window)
        self._size = 1
        self._since_fit = 0
        self._fitted = False
        self._a = self._b = 0.0
        self._typical = LatencyModel()
        self._fit_cap: int | None = None  # None while there is no trustworthy fit

    def max_batch_size(self) -> int:
        return self._size

    def typical_latency(self, batch_size: int) -> float:
        return self._typical.typical(batch_size)

    def observe(self, batch_size: int, latency_s: float) -> None:
        self._typical.observe(batch_size, latency_s)
        _check_observation(batch_size, latency_s)
        self._window.append((batch_size, latency_s))
        if latency_s > self._target:
            self._size = max(1, math.floor(self._size * self._BACKOFF))
        elif batch_size >= self._size:
            grown = self._size + self._explore_increment
            if self._fit_cap is not None:
                grown = min(grown, self._fit_cap)
            self._size = max(self._size, min(self._max_size, grown))
        self._since_fit += 1
        if len(self._window) >= self._min_samples and (
            not self._fitted or self._since_fit >= self._refit_every
        ):
            self._refit()

    def expected_latency(self, batch_size: int) -> float:
        if not self._fitted:
            return 0.0
        # A negative fitted slope is noise; never predict less than the intercept.
        return max(0.0, self._a + max(self._b, 0.0) * batch_size)

    def _refit(self) -> None:
        self._since_fit = 0
        self._fitted = True
        data = np.array(self._window, dtype=np.float64)
        sizes = data[:, 0]
        latencies = data[:, 1]
        max_seen = int(np.max(sizes))
        if max_seen == int(np.min(sizes)):
            # One size only: the slope is unidentifiable; keep the quantile level, explore.
            self._a = float(np.quantile(latencies, self._quantile))
            self._b = 0.0
            self._fit_cap = None
            return
        self._a, self._b = fit_quantile_line(sizes, latencies, self._quantile)
        if self._b <= 0.0:
            self._fit_cap = None
            return
        cap = math.floor((self._target - self._a) / self._b)
        cap = min(self._max_size, max(1, cap))
        self._fit_cap = cap
        if cap <= max_seen:
            self._size = cap  # within observed sizes: trust the fit, up or down
        else:
            self._size = min(self._size, cap)  # beyond the data: keep exploring towards it


class FixedController:
    """A constant batch cap; latency estimates still come from observations."""

    __slots__ = ("_model", "_size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ConfigError(f"fixed batch size must be >= 1, got {size}")
        self._size = size
        self._model = LatencyModel()

    def max_batch_size(self) -> int:
        return self._size

    def observe(self, batch_size: int, latency_s: float) -> None:
        self._model.observe(batch_size, latency_s)

    def expected_latency(self, batch_size: int) -> float:
        return self._model.predict(batch_size)

    def typical_latency(self, batch_size: int) -> float:
        return self._model.typical(batch_size)


def _require_target(target_s: float) -> None:
    if not (isinstance(target_s, int | float) and 0.0 < target_s < math.inf):
        raise ConfigError(f"target_s must be a positive finite number of seconds, got {target_s!r}")


def _bool_param(params: dict[str, object], name: str, default: bool) -> bool:
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"controller parameter {name!r} must be true or false, got {value!r}")
    return value


def _int_param(params: dict[str, object], name: str, default: int) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"controller parameter {name!r} must be an integer, got {value!r}")
    return value


def _float_param(params: dict[str, object], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"controller parameter {name!r} must be a finite number, got {value!r}")
    return float(value)


def _check_params(name: str, params: dict[str, object], accepted: frozenset[str]) -> None:
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ConfigError(
            f"unknown parameter(s) for {name!r} controller: {', '.join(unknown)}; "
            f"accepted: {', '.join(sorted(accepted))}"
        )


# The builders, one per option of clipper.choices.CONTROLLERS (which names them lazily).
_AIMD_PARAMS = frozenset(
    {"increment", "backoff", "backoff_after", "initial", "max_size", "hold_band", "slow_start"}
)
_QUANTILE_PARAMS = frozenset(
    {"quantile", "window", "max_size", "min_samples", "explore_increment", "refit_every"}
)


def _build_aimd(target_s: float, params: dict[str, object]) -> BatchController:
    _check_params("aimd", params, _AIMD_PARAMS)
    return AIMDController(
        target_s,
        increment=_int_param(params, "increment", 2),
        backoff=_float_param(params, "backoff", 0.9),
        initial=_int_param(params, "initial", 1),
        max_size=_int_param(params, "max_size", 4096),
        hold_band=_float_param(params, "hold_band", 0.1),
        slow_start=_bool_param(params, "slow_start", True),
        backoff_after=_int_param(params, "backoff_after", 2),
    )


def _build_quantile(target_s: float, params: dict[str, object]) -> BatchController:
    _check_params("quantile", params, _QUANTILE_PARAMS)
    return QuantileController(
        target_s,
        quantile=_float_param(params, "quantile", 0.99),
        window=_int_param(params, "window", 512),
        max_size=_int_param(params, "max_size", 4096),
        min_samples=_int_param(params, "min_samples", 32),
        explore_increment=_int_param(params, "explore_increment", 2),
        refit_every=_int_param(params, "refit_every", 16),
    )


def _build_fixed(target_s: float, params: dict[str, object]) -> BatchController:
    _check_params("fixed", params, frozenset({"size"}))
    if "size" not in params:
        raise ConfigError("the 'fixed' controller requires a 'size' parameter")
    return FixedController(_int_param(params, "size", 1))


def make_controller(name: str, *, target_s: float, **params: object) -> BatchController:
    """Build the controller called ``name`` (see :data:`clipper.choices.CONTROLLERS`).

    Raises :class:`~clipper.errors.ConfigError` for an unknown name, an unknown or ill-typed
    parameter, or a value out of range.
    """
    key = name.strip().lower()
    if key not in CONTROLLERS:
        raise ConfigError(CONTROLLERS.unknown(name))
    _require_target(target_s)
    build: Callable[[float, dict[str, object]], BatchController] = CONTROLLERS.load(key)
    return build(target_s, params)

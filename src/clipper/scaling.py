"""A model version's autoscaling settings: the bounds, the target and the windows.

Data only, stored with the version (the ``autoscale`` key of its store record), so the settings
survive a restart and reach every frontend sharing the store. The decisions themselves are made
by :mod:`clipper.runtime.autoscaler`; docs/autoscaling.md explains the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from clipper.errors import RegistryError

__all__ = ["AutoscaleConfig"]

# Bounds on the windows: below the sampling interval a window means nothing, and a day is
# longer than any sensible quiet period.
_MIN_INTERVAL_S = 0.05
_MAX_WINDOW_S = 86_400.0
_MAX_REPLICAS = 1024
_FLOAT_FIELDS = (
    "target_utilization",
    "up_window_s",
    "down_window_s",
    "interval_s",
    "shed_threshold",
    "scale_to_zero_after_s",
)
# Queries held at most while a version wakes from zero replicas (each holds a connection and
# a queue slot until a replica connects or its deadline passes).
_MAX_HELD = 10_000


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """How the autoscaler drives ``num_replicas`` of one model version.

    ``target_utilization`` is the share of the capacity that fits the SLO the replicas should
    run at. Utilisation averaged over ``up_window_s`` above it scales up at once to the count
    that brings it back to the target; more than ``shed_threshold`` of the queries of that
    window shed or late scales up without waiting for the window to fill. One replica is
    removed after ``down_window_s`` in which one replica fewer would still have stayed under
    the target. With ``min_replicas`` 0 the version goes to zero replicas once no query came
    for ``scale_to_zero_after_s``; then the first query wakes it, and up to
    ``max_held_queries`` inputs wait for its replica (within their deadlines). ``owner`` is
    the frontend (its node id) that drives the version: the one whose admin API set these
    settings.
    """

    enabled: bool = True
    min_replicas: int = 1
    max_replicas: int = 4
    target_utilization: float = 0.7
    up_window_s: float = 15.0
    down_window_s: float = 180.0
    interval_s: float = 1.0
    shed_threshold: float = 0.01
    scale_to_zero_after_s: float = 300.0
    max_held_queries: int = 64
    owner: str = ""

    def __post_init__(self) -> None:
        for name in ("min_replicas", "max_replicas", "max_held_queries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise RegistryError(f"{name} must be an integer, got {value!r}")
        # min_replicas 0: the version scales to zero when idle; max_replicas is at least 1.
        bounds = 0 <= self.min_replicas <= self.max_replicas <= _MAX_REPLICAS
        if not bounds or not self.max_replicas:
            raise RegistryError(
                "autoscaling needs 0 <= min_replicas <= max_replicas <= "
                f"{_MAX_REPLICAS} and max_replicas >= 1, got min_replicas={self.min_replicas}, "
                f"max_replicas={self.max_replicas}"
            )
        if not 1 <= self.max_held_queries <= _MAX_HELD:
            raise RegistryError(
                f"max_held_queries must be between 1 and {_MAX_HELD}, got {self.max_held_queries!r}"
            )
        _number("target_utilization", self.target_utilization, 0.0, 1.0, "in (0, 1]")
        _number("shed_threshold", self.shed_threshold, 0.0, 1.0, "in (0, 1]")
        _number("interval_s", self.interval_s, _MIN_INTERVAL_S, _MAX_WINDOW_S, "in [0.05, 86400]")
        for name in ("up_window_s", "down_window_s", "scale_to_zero_after_s"):
            if not self.interval_s <= _float(name, getattr(self, name)) <= _MAX_WINDOW_S:
                raise RegistryError(
                    f"{name} must be between interval_s ({self.interval_s}) and "
                    f"{_MAX_WINDOW_S:.0f} seconds, got {getattr(self, name)!r}"
                )
        if self.down_window_s < self.up_window_s:
            raise RegistryError(
                f"down_window_s ({self.down_window_s}) must be at least up_window_s "
                f"({self.up_window_s}): removing capacity waits longer than adding it"
            )
        for name in _FLOAT_FIELDS:  # an integer from JSON is stored as the float it means
            object.__setattr__(self, name, float(getattr(self, name)))
        if not isinstance(self.enabled, bool):
            raise RegistryError(f"enabled must be true or false, got {self.enabled!r}")
        if not isinstance(self.owner, str):
            raise RegistryError(f"owner must be a string, got {self.owner!r}")

    @property
    def scales_to_zero(self) -> bool:
        """Whether an idle version goes to zero replicas (and a query wakes it)."""
        return self.enabled and self.min_replicas == 0

    def clamp(self, n: int) -> int:
        return min(max(n, self.min_replicas), self.max_replicas)

    def updated(self, **changes: Any) -> AutoscaleConfig:
        """These settings with ``changes`` (validated; unknown names refused)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise RegistryError(
                f"unknown autoscale settings {unknown}; expected some of {sorted(known)}"
            )
        return replace(self, **changes)

    @classmethod
    def configure(
        cls, current: AutoscaleConfig | None, changes: dict[str, Any], *, owner: str
    ) -> AutoscaleConfig:
        """``current`` (or the defaults) with the settings in ``changes``, driven by ``owner``:
        what an admin call makes of a partial request."""
        if "owner" in changes:
            raise RegistryError(
                "owner is not a setting: the frontend whose admin API sets a version's "
                "autoscaling drives it"
            )
        return (current or cls()).updated(**changes, owner=owner)

    def to_record(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> AutoscaleConfig:
        if not isinstance(r, dict):
            raise RegistryError(f"an autoscale record must be an object, got {r!r}")
        return cls().updated(**r)


def _float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RegistryError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _number(name: str, value: object, low: float, high: float, expected: str) -> None:
    v = _float(name, value)
    # (low, high] for the fractions, [low, high] for the interval.
    if not (low < v <= high if low == 0.0 else low <= v <= high):
        raise RegistryError(f"{name} must be {expected}, got {value!r}")

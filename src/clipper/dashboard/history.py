"""The dashboard's memory: the last ``capacity`` samples of every series, in fixed rings.

One ring holds the sample times; each series has its own ring of values, aligned with it (the
i-th value of every series belongs to the i-th time). A sample that does not mention a series
records ``None`` for it (a gap in its plot); a series absent from ``capacity`` samples in a row
(its application or model is gone) is dropped. At most ``max_series`` series are kept: a new
series beyond that is not recorded, and :attr:`History.refused_series` counts it. So memory is
bounded by ``capacity * (max_series + 1)`` values whatever the frontend serves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from clipper.errors import ConfigError

__all__ = ["History", "Value"]

Value = float | None
"""One sample of a series; None: nothing to show for that interval (no queries, no batch)."""


class History:
    __slots__ = ("_absent", "_series", "_times", "capacity", "max_series", "refused_series")

    def __init__(self, capacity: int, max_series: int) -> None:
        if capacity < 2:
            raise ConfigError(f"a history must hold at least 2 samples, got {capacity}")
        if max_series < 1:
            raise ConfigError(f"a history must hold at least 1 series, got {max_series}")
        self.capacity = capacity
        self.max_series = max_series
        self._times: deque[float] = deque(maxlen=capacity)
        self._series: dict[str, deque[Value]] = {}
        self._absent: dict[str, int] = {}  # samples in a row that did not mention the series
        self.refused_series = 0

    def __len__(self) -> int:
        """How many samples are held (at most :attr:`capacity`)."""
        return len(self._times)

    @property
    def series(self) -> list[str]:
        return list(self._series)

    def append(self, t: float, values: Mapping[str, Value]) -> dict[str, Value]:
        """Record one sample taken at ``t``; returns what was recorded (the values of the
        series kept: a refused new series is left out)."""
        self._times.append(t)
        n = len(self._times)
        recorded: dict[str, Value] = {}
        for key, value in values.items():
            ring = self._series.get(key)
            if ring is None:
                if len(self._series) >= self.max_series:
                    self.refused_series += 1
                    continue
                # Earlier samples had nothing of it: gaps, so the rings stay aligned.
                ring = self._series[key] = deque([None] * (n - 1), maxlen=self.capacity)
            ring.append(value)
            self._absent[key] = 0
            recorded[key] = value
        for key in [k for k in self._series if k not in values]:
            self._series[key].append(None)
            self._absent[key] += 1
            if self._absent[key] >= self.capacity:
                del self._series[key], self._absent[key]
        return recorded

    def values(self, key: str) -> list[Value]:
        """A series' values, oldest first (as many as :meth:`times`)."""
        return list(self._series[key])

    def times(self) -> list[float]:
        return list(self._times)

    def snapshot(self) -> dict[str, Any]:
        """Everything held: ``{"t": [...], "series": {key: [...]}}``, oldest first."""
        return {"t": self.times(), "series": {k: list(v) for k, v in self._series.items()}}

"""Whether a model version's recent answers are mostly errors: its error and default rates over
the last minute, and the rule that makes such a version not ready.

A model that raises on every query still has its replicas connected, so the connection-based
readiness said ``ready`` while every answer was a default. :class:`ModelHealth` (one per
scheduler) turns the scheduler's running totals into counts over the last :data:`WINDOW_S`
seconds of the injected clock: it keeps a snapshot of the totals at the first event of each
:data:`STEP_S` step (a bounded ring, no timer: a snapshot is taken when a batch is answered or a
reading is asked for) and answers the totals now minus the oldest snapshot inside the window.
A version is *failing* when at least :data:`MIN_ANSWERED` inputs were answered in the window
and at least :data:`ERROR_FRACTION` of them with an error; it stops failing as soon as its
error rate falls below that, or its errors age out of the window.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from clipper.clock import Clock

__all__ = [
    "ERROR_FRACTION",
    "MIN_ANSWERED",
    "STEP_S",
    "WINDOW_S",
    "HealthReading",
    "ModelHealth",
    "Totals",
]

# The last minute, in 5 s steps: the same window as ``clipper status``'s rates.
WINDOW_S = 60.0
STEP_S = 5.0
# Fewer answered inputs than this say nothing (one failed query of three is not a broken model).
MIN_ANSWERED = 20
# Half or more of the answered inputs failed: the version is not ready.
ERROR_FRACTION = 0.5
_MAX_MESSAGE = 300

# (offered, answered, errors, missed): running totals of inputs. ``offered``: queued or shed;
# ``answered``: the model answered (with outputs or an error); ``errors``: answered with an
# error; ``missed``: shed at admission or answered too late (a default to their queries).
Totals = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class HealthReading:
    """One version's inputs over the last :attr:`window_s` seconds."""

    window_s: float
    offered: int
    answered: int
    errors: int
    defaults: int  # inputs its queries got no prediction for: errors, shed, too late
    last_error: str | None  # the latest error's text (None: no error in the window)

    @property
    def error_fraction(self) -> float | None:
        """Errors per answered input (None: none answered)."""
        return round(self.errors / self.answered, 4) if self.answered else None

    @property
    def default_fraction(self) -> float | None:
        """Defaults per offered input (None: none offered)."""
        return round(min(self.defaults / self.offered, 1.0), 4) if self.offered else None

    @property
    def failing(self) -> bool:
        return self.answered >= MIN_ANSWERED and self.errors >= ERROR_FRACTION * self.answered

    def reason(self, model: str) -> str:
        """Why ``model`` ("name:version") is not ready, when :attr:`failing`."""
        return (
            f"model '{model}' answered {self.errors} of its last {self.answered} inputs with "
            f"errors ({self.errors / max(self.answered, 1):.0%} in the last {self.window_s:.0f} s;"
            f" not ready at {ERROR_FRACTION:.0%} of at least {MIN_ANSWERED}); latest error: "
            f"{self.last_error or '(none)'}"
        )

    def as_json(self) -> dict[str, object]:
        return {
            "window_s": self.window_s,
            "inputs": self.offered,
            "answered": self.answered,
            "errors": self.errors,
            "error_fraction": self.error_fraction,
            "default_fraction": self.default_fraction,
            "failing": self.failing,
            "last_error": self.last_error,
        }


class ModelHealth:
    """The window over one scheduler's totals (read through ``totals``)."""

    __slots__ = ("_clock", "_last_error", "_next", "_snaps", "_totals")

    def __init__(self, clock: Clock, totals: Callable[[], Totals]) -> None:
        self._clock = clock
        self._totals = totals
        # One snapshot per step in the window, plus the one the window starts from.
        self._snaps: deque[tuple[float, Totals]] = deque(maxlen=math.ceil(WINDOW_S / STEP_S) + 2)
        self._next = float("-inf")
        self._last_error: str | None = None
        self.step()

    def step(self) -> None:
        """Take a snapshot of the totals if a new step began; called before the totals change
        (each answered batch), so the snapshot holds the totals as the step began."""
        now = self._clock.now()
        if now >= self._next:
            self._snaps.append((now, self._totals()))
            self._next = (math.floor(now / STEP_S) + 1) * STEP_S

    def failed(self, message: str) -> None:
        """The model answered with an error whose text is ``message``."""
        text = " ".join(message.split())
        self._last_error = text[:_MAX_MESSAGE] + "..." if len(text) > _MAX_MESSAGE else text

    def reading(self) -> HealthReading:
        self.step()
        now = self._clock.now()
        start = now - WINDOW_S
        base = next((t for at, t in self._snaps if at >= start), self._snaps[-1][1])
        cur = self._totals()
        offered, answered, errors, missed = (max(c - b, 0) for c, b in zip(cur, base, strict=True))
        return HealthReading(
            window_s=WINDOW_S,
            offered=offered,
            answered=answered,
            errors=errors,
            defaults=errors + missed,
            last_error=self._last_error if errors else None,
        )

"""How a pipeline's deadline is split among its stages.

Each stage has a *weight* in seconds: its static share of the query's latency budget
(``"budget": 0.3``), or for ``"auto"`` an estimate of its latency plus 1 ms, and at least 5%
of the budget (a batch's latency leaves out the frontend's own work and the RPC hop). The
estimate is the larger of the stage's own (about its 90th percentile, from an exponentially
weighted mean and mean deviation of what it took lately) and what its model's queue says an
input queued now would take (the work ahead and a typical batch); when neither is known, an
even share of the budget.

A stage's deadline is fixed when it starts: the query's deadline minus the time *reserved* for
the stages after it (the heaviest chain of weights from a stage that reads it to a last stage;
for a required stage, only the required stages count: it may take the time of a stage that
can degrade), but for a required stage never less than its own weight from now, and never past
the query's deadline. So time an earlier stage did not use passes on to the next one while the
later stages keep their reserves; time no stage reserves (static shares summing to less than
1) belongs to the stages that run first. When the reserves leave a *required* stage less than
its own weight (auto estimates of a slow stage after it can), it still gets its weight and the
later stages make do with what is left (without it the query fails anyway); a stage that may
degrade (a default, or optional) is cut at its reserve line instead, so that it never takes
the time of the stages after it.
"""

from __future__ import annotations

from collections.abc import Callable

from clipper.pipeline.spec import Pipeline

__all__ = [
    "AUTO_FLOOR_SHARE",
    "AUTO_HEADROOM_S",
    "LatencyEstimate",
    "StagePlan",
    "critical_path",
    "stage_deadline",
]

# The normal distribution's 90th percentile is the mean + 1.2816 sigma, and sigma is about
# 1.2533 times the mean absolute deviation.
_P90_DEVIATIONS = 1.2816 * 1.2533
AUTO_HEADROOM_S = 0.001
AUTO_FLOOR_SHARE = 0.05


class LatencyEstimate:
    """A stage's recent latency: EWMA of the mean and of the absolute deviation from it."""

    __slots__ = ("alpha", "dev", "mean", "n")

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.mean = 0.0
        self.dev = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        if self.n == 0:
            self.mean = seconds
        else:
            diff = seconds - self.mean
            self.mean += self.alpha * diff
            self.dev += self.alpha * (abs(diff) - self.dev)
        self.n += 1

    def p90(self) -> float:
        """About the 90th percentile (0.0 before any observation)."""
        return self.mean + _P90_DEVIATIONS * self.dev


def critical_path(pipeline: Pipeline, weights: dict[str, float]) -> tuple[float, list[str]]:
    """The heaviest path from a first stage to a last one: its weight and its stages."""
    after: dict[str, tuple[float, str | None]] = {}
    for name in reversed(pipeline.stages):
        succs = pipeline.succs[name]
        nxt = max(succs, key=lambda s: weights[s] + after[s][0], default=None)
        after[name] = (0.0 if nxt is None else weights[nxt] + after[nxt][0], nxt)
    start = max(pipeline.stages, key=lambda n: weights[n] + after[n][0])
    path: list[str] = []
    node: str | None = start
    while node is not None:
        path.append(node)
        node = after[node][1]
    return weights[start] + after[start][0], path


class StagePlan:
    """One pipeline application's budgets: the stages' latency estimates and reserves."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.estimates = {name: LatencyEstimate() for name in pipeline.stages}

    def weights(self, budget_s: float, hint: Callable[[str], float]) -> dict[str, float]:
        """Each stage's weight in seconds for a query with ``budget_s`` (``hint``: how long a
        stage's model would take now, 0.0 when not known: the weight is never below it, or
        the model's own admission would shed what the stage is given)."""
        out: dict[str, float] = {}
        even = budget_s / len(self.pipeline.stages)
        for name, stage in self.pipeline.stages.items():
            if stage.share is not None:
                out[name] = stage.share * budget_s
                continue
            est = self.estimates[name]
            w = max(est.p90() if est.n else 0.0, hint(name))
            if w > 0.0:
                out[name] = max(w + AUTO_HEADROOM_S, AUTO_FLOOR_SHARE * budget_s)
            else:
                out[name] = even
        return out

    def reserves(self, weights: dict[str, float]) -> dict[str, float]:
        """Seconds reserved after each stage: the heaviest chain of weights after it. For a
        required stage only the required stages after it count: it may take the time of a
        stage that can degrade (better a degraded answer than the default)."""
        p = self.pipeline
        every: dict[str, float] = {}
        required: dict[str, float] = {}
        for name in reversed(p.stages):
            succs = p.succs[name]
            every[name] = max((weights[s] + every[s] for s in succs), default=0.0)
            required[name] = max(
                (
                    (weights[s] if p.stages[s].on_miss == "fail" else 0.0) + required[s]
                    for s in succs
                ),
                default=0.0,
            )
        return {
            name: required[name] if stage.on_miss == "fail" else every[name]
            for name, stage in p.stages.items()
        }


def stage_deadline(now: float, end: float, reserve: float, weight: float, required: bool) -> float:
    """When a stage starting ``now`` is due, in a query due at ``end`` (see the module doc)."""
    if not required:
        return end - reserve
    return min(end, max(end - reserve, now + weight))

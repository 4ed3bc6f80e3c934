"""Stage models of the pipeline integration tests (cloudpickled by value, like models.py).

Each call appends one line per input to ``calls`` (when given): the tests count a stage's
calls from the file. ``sleep_s`` is a simulated compute cost.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class StageModel:
    def __init__(self, kind: str, *, calls: str | None = None, sleep_s: float = 0.0) -> None:
        self.kind = kind
        self.calls = calls
        self.sleep_s = sleep_s

    def predict(self, xs: list[Any]) -> list[Any]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        out = [self.one(x) for x in xs]
        if self.calls is not None:
            with open(self.calls, "a") as f:
                f.write("call\n" * len(xs))
        return out

    def one(self, x: Any) -> Any:
        if self.kind == "feat":  # json {"x": [...]} -> {"vec": doubled, "n": count}
            return {"vec": [2.0 * v for v in x["x"]], "n": len(x["x"])}
        if self.kind == "score":  # doubles -> their sum
            return float(np.asarray(x, dtype=np.float64).sum())
        if self.kind == "post":  # json {"name", "score"?} -> "name:score"
            return f"{x.get('name')}:{x.get('score')}"
        raise ValueError(f"unknown stage kind {self.kind}")

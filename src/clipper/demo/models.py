"""The demo's models: importable in container processes (they ship with the package)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DigitsClassifier", "Stats", "train_digits"]


class Stats:
    """Summary statistics of each input row."""

    def predict(self, inputs: Any) -> list[dict[str, float]]:
        return [
            {"sum": float(np.sum(x)), "mean": float(np.mean(x)), "max": float(np.max(x))}
            for x in inputs
        ]


class DigitsClassifier:
    """Wraps a fitted scikit-learn classifier: a batch of 64-pixel rows -> digit labels."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def predict(self, inputs: Any) -> list[int]:
        return [int(y) for y in self.estimator.predict(np.asarray(inputs))]


def train_digits() -> DigitsClassifier | None:
    try:
        from sklearn.datasets import load_digits
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        return None
    x, y = load_digits(return_X_y=True)
    return DigitsClassifier(LogisticRegression(max_iter=2000).fit(x, y))

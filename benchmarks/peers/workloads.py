"""The three benchmark workloads, identical in every system (imported by every peer's server).

This file is imported inside each peer's own virtual environment, so it depends only on NumPy,
plus scikit-learn for ``logreg`` and PyTorch for ``mlp`` (imported lazily).

* ``noop``: a 784-float input (an MNIST-sized image); answers ``0`` per row without looking.
* ``logreg``: ``LogisticRegression(max_iter=1000)`` fitted on ``load_digits`` (64 floats);
  answers the class label per row.
* ``mlp``: a PyTorch MLP 784 -> 512 -> 256 -> 10 (ReLU), weights from ``torch.manual_seed(0)``,
  float32, eval mode, one intra-op thread per process (two cores are shared by everything);
  answers the argmax class per row.
* ``spin``: a 64-float input and a model of known cost: 1 ms of CPU per batch plus 50 us per
  row (a busy loop), answering ``0`` per row — batching pays, and it competes for the core.

Every model is a callable ``predict(batch: np.ndarray[float32, (n, d)]) -> list[int]``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["INPUT_SIZE", "WORKLOADS", "as_batch", "example_input", "make_model"]

WORKLOADS = ("noop", "logreg", "mlp", "spin")
INPUT_SIZE = {"noop": 784, "logreg": 64, "mlp": 784, "spin": 64}

Predict = Callable[[np.ndarray], list[int]]


def example_input(workload: str) -> list[float]:
    """The request input every load generator sends for ``workload`` (reproducible)."""
    if workload == "logreg":
        from sklearn.datasets import load_digits

        x, _ = load_digits(return_X_y=True)
        return [float(v) for v in x[7]]
    rng = random.Random(0)
    return [round(rng.random(), 6) for _ in range(INPUT_SIZE[workload])]


def _noop() -> Predict:
    def predict(batch: np.ndarray) -> list[int]:
        return [0] * len(batch)

    return predict


def _logreg() -> Predict:
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    clf = LogisticRegression(max_iter=1000).fit(x, y)

    def predict(batch: np.ndarray) -> list[int]:
        return [int(c) for c in clf.predict(np.asarray(batch, dtype=np.float64))]

    return predict


def _mlp() -> Predict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).eval()

    def predict(batch: np.ndarray) -> list[int]:
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
            return [int(c) for c in net(x).argmax(dim=1)]

    return predict


def _spin() -> Predict:
    import time

    def predict(batch: np.ndarray) -> list[int]:
        end = time.perf_counter() + 0.001 + 0.00005 * len(batch)
        while time.perf_counter() < end:
            pass
        return [0] * len(batch)

    return predict


def make_model(workload: str) -> Predict:
    """The model for ``workload``: ``predict(batch (n, d) float array) -> n int labels``."""
    makers: dict[str, Callable[[], Predict]] = {
        "noop": _noop,
        "logreg": _logreg,
        "mlp": _mlp,
        "spin": _spin,
    }
    if workload not in makers:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(WORKLOADS)}")
    return makers[workload]()


def as_batch(rows: Any, workload: str) -> np.ndarray:
    """Rows (lists, arrays or one flat list) as a float32 ``(n, d)`` array for ``workload``."""
    a = np.asarray(rows, dtype=np.float32)
    return a.reshape(-1, INPUT_SIZE[workload])

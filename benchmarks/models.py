"""Benchmark models for clipper-serve.

The model objects are pickled (cloudpickle) by the driver and unpickled in the model-container
process. This module is not installed, so :func:`picklable` registers it with
``cloudpickle.register_pickle_by_value`` so that the classes travel by value and the container
does not need to import ``models``.

* :class:`NoopModel` returns ``0`` per input: measures the serving overhead alone
  (queueing, batching, RPC, HTTP) with an MNIST-sized 784-double input.
* :class:`SklearnModel` wraps a fitted scikit-learn classifier; :func:`train_logreg` fits
  ``LogisticRegression(max_iter=1000)`` on ``sklearn.datasets.load_digits`` (64 features).
* :class:`PacedModel` sleeps a fixed time per batch plus per input: a replica whose capacity is
  known, for the autoscaling trace.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

NOOP_INPUT_SIZE = 784  # an MNIST image
DIGITS_INPUT_SIZE = 64  # an 8x8 sklearn digit


def _as_matrix(batch: Any) -> np.ndarray:
    """A batch (list of arrays, lists or raw little-endian float64 bytes) as a 2-D array."""
    rows = [
        np.frombuffer(x, dtype="<f8") if isinstance(x, bytes | bytearray | memoryview) else x
        for x in batch
    ]
    m = np.asarray(rows, dtype=np.float64)
    return m.reshape(len(rows), -1)


class NoopModel:
    """Returns ``0`` for every input without looking at it."""

    def predict(self, batch: Any) -> list[int]:
        return [0] * len(batch)


class SklearnModel:
    """A fitted scikit-learn estimator; ``predict`` returns one int class label per input."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def predict(self, batch: Any) -> list[int]:
        return [int(y) for y in self.estimator.predict(_as_matrix(batch))]


class PacedModel:
    """Sleeps ``per_batch_s + per_input_s * len(batch)`` and returns ``0`` per input: about
    ``1 / per_input_s`` inputs/s per replica however it batches (no CPU spent)."""

    def __init__(self, per_batch_s: float, per_input_s: float) -> None:
        self.per_batch_s = per_batch_s
        self.per_input_s = per_input_s

    def predict(self, batch: Any) -> list[int]:
        time.sleep(self.per_batch_s + self.per_input_s * len(batch))
        return [0] * len(batch)


class SpinModel:
    """Spends ``per_batch_s + per_input_s * len(batch)`` of CPU (a busy loop) and returns ``0``
    per input: a CPU-bound model of known cost, which competes for the core it runs on."""

    def __init__(self, per_batch_s: float, per_input_s: float) -> None:
        self.per_batch_s = per_batch_s
        self.per_input_s = per_input_s

    def predict(self, batch: Any) -> list[int]:
        end = time.perf_counter() + self.per_batch_s + self.per_input_s * len(batch)
        while time.perf_counter() < end:
            pass
        return [0] * len(batch)


def train_logreg() -> SklearnModel:
    """LogisticRegression(max_iter=1000) fitted on the digits data set."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    clf = LogisticRegression(max_iter=1000)
    clf.fit(x, y)
    return SklearnModel(clf)


def digits_inputs(n: int = 16) -> list[list[float]]:
    """The first ``n`` digits images as lists of 64 floats (request bodies for logreg)."""
    from sklearn.datasets import load_digits

    x, _ = load_digits(return_X_y=True)
    return [[float(v) for v in row] for row in x[:n]]


def picklable() -> None:
    """Make cloudpickle pickle this module's classes by value (the container can't import it)."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

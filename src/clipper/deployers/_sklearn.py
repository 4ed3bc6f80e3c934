"""scikit-learn estimators and pipelines: pickled, served with ``estimator.predict``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np

from clipper.deployers import _python
from clipper.deployers._common import InputSpec, check_width, has_base, require, rows

FILE = "model.pkl"
_log = logging.getLogger("clipper.deployers")


def matches(model: object) -> bool:
    if has_base(model, "sklearn"):
        return True
    # Third-party estimators built on sklearn's API (xgboost/lightgbm are matched before this).
    return (
        callable(getattr(model, "get_params", None))
        and callable(getattr(model, "predict", None))
        and has_base(model, "sklearn.base", "BaseEstimator")
    )


def save(model: object, dest: Path) -> dict[str, Any]:
    sklearn = require("sklearn", "sklearn", "deploying")
    # cloudpickle rather than joblib: custom steps from the user's own modules go by value.
    params: dict[str, Any] = {}
    get_params = getattr(model, "get_params", None)
    if callable(get_params):
        params = get_params(deep=True)
    _python.dump(model, dest / FILE, extra=params.values())
    return {
        "file": FILE,
        "estimator": f"{type(model).__module__}.{type(model).__qualname__}",
        "sklearn_version": sklearn.__version__,
    }


class SklearnModel:
    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator
        # Set by fit on numeric data (a pipeline reports its first step's); text and dict
        # pipelines have none, and then nothing is checked or generated.
        width = getattr(estimator, "n_features_in_", None)
        self.input_spec = (
            InputSpec(int(width), "scikit-learn n_features_in_")
            if isinstance(width, int | np.integer)
            else None
        )

    def predict(self, inputs: Any) -> list[Any]:
        # Passed through as they come: a numeric (n, d) array, or the strings or JSON values
        # that text and dict-vectorising pipelines take.
        check_width(self.input_spec, inputs)
        return rows(self.estimator.predict(inputs))


def load(path: Path, manifest: dict[str, Any]) -> SklearnModel:
    sklearn = require("sklearn", "sklearn", "loading")
    saved = manifest.get("sklearn_version")
    if saved and saved != sklearn.__version__:
        _log.warning(
            "%s was pickled with scikit-learn %s; this container has %s",
            path,
            saved,
            sklearn.__version__,
        )
    with (path / manifest.get("file", FILE)).open("rb") as f:
        return SklearnModel(cloudpickle.load(f))

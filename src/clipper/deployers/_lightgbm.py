"""LightGBM: a ``Booster`` or a scikit-learn-API model (``LGBMClassifier``, ``LGBMRegressor``),
saved with ``save_model`` as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from clipper.deployers._common import InputSpec, check_width, has_base, require, rows, stack
from clipper.errors import ConfigError

FILE = "model.txt"


def matches(model: object) -> bool:
    return has_base(model, "lightgbm")


def save(model: Any, dest: Path) -> dict[str, Any]:
    lgb = require("lightgbm", "lightgbm", "deploying")
    fields: dict[str, Any] = {"file": FILE, "lightgbm_version": lgb.__version__}
    if isinstance(model, lgb.Booster):
        model.save_model(str(dest / FILE))
        return {**fields, "kind": "booster"}
    if not isinstance(model, lgb.LGBMModel):
        raise ConfigError(f"{type(model).__name__} is neither a lightgbm Booster nor LGBMModel")
    if callable(model.objective):
        raise ConfigError(
            "a LightGBM model with a custom objective function predicts raw scores; "
            "deploy its booster_ with a wrapper that applies the link function"
        )
    model.booster_.save_model(str(dest / FILE))  # raises when the model is not fitted
    classes = getattr(model, "classes_", None)
    if classes is None:
        return {**fields, "kind": "regressor"}
    # The booster predicts class probabilities; the labels live only in the wrapper.
    return {**fields, "kind": "classifier", "classes": np.asarray(classes).tolist()}


class LightGBMModel:
    def __init__(self, booster: Any, classes: list[Any] | None) -> None:
        self.booster = booster
        self.classes = None if classes is None else np.asarray(classes)
        width = int(booster.num_feature())
        self.input_spec = InputSpec(width, "LightGBM num_feature") if width > 0 else None

    def predict(self, inputs: Any) -> list[Any]:
        x = stack(inputs, None)
        check_width(self.input_spec, x)
        out = self.booster.predict(x)
        if self.classes is None:
            return rows(out)
        # As LGBMClassifier.predict: argmax of [1 - p, p] (binary) or of the class columns.
        index = (out > 0.5).astype(np.intp) if out.ndim == 1 else np.argmax(out, axis=1)
        return rows(self.classes[index])


def load(path: Path, manifest: dict[str, Any]) -> LightGBMModel:
    lgb = require("lightgbm", "lightgbm", "loading")
    booster = lgb.Booster(model_file=str(path / manifest.get("file", FILE)))
    classes = manifest.get("classes") if manifest.get("kind") == "classifier" else None
    return LightGBMModel(booster, classes)

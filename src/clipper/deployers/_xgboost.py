"""XGBoost: a ``Booster`` or a scikit-learn-API model (``XGBClassifier``, ``XGBRegressor``...),
saved with ``save_model`` as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clipper.deployers._common import (
    InputSpec,
    check_width,
    has_base,
    require,
    rows,
    stack,
    type_modules,
)
from clipper.errors import ConfigError

FILE = "model.json"


def matches(model: object) -> bool:
    return has_base(model, "xgboost")


def _estimator_name(model: object, xgb: Any) -> str:
    # The nearest class xgboost itself exports: a user's subclass loads as its xgboost base.
    for mod, qual in type_modules(model):
        if mod.startswith("xgboost.") and isinstance(getattr(xgb, qual, None), type):
            return qual
    raise ConfigError(f"cannot find the xgboost class of {type(model).__name__}")


def save(model: Any, dest: Path) -> dict[str, Any]:
    xgb = require("xgboost", "xgboost", "deploying")
    fields: dict[str, Any] = {"file": FILE, "xgboost_version": xgb.__version__}
    if isinstance(model, xgb.Booster):
        model.save_model(str(dest / FILE))
        return {**fields, "kind": "booster"}
    if not isinstance(model, xgb.XGBModel):
        raise ConfigError(f"{type(model).__name__} is neither an xgboost Booster nor XGBModel")
    # The sklearn wrapper's save_model also stores what its predict() needs (the number of
    # classes, the objective), so loading into the same class gives labels for classifiers.
    model.save_model(str(dest / FILE))
    return {**fields, "kind": "sklearn", "estimator": _estimator_name(model, xgb)}


class XGBoostModel:
    def __init__(self, model: Any, booster: bool) -> None:
        self.model = model
        self.booster = booster
        try:
            width = int((model if booster else model.get_booster()).num_features())
        except Exception:  # an unfitted or odd model: nothing to check against
            width = 0
        self.input_spec = InputSpec(width, "XGBoost num_features") if width > 0 else None

    def predict(self, inputs: Any) -> list[Any]:
        x = stack(inputs, None)
        check_width(self.input_spec, x)
        if self.booster:
            # inplace_predict reads numpy directly: no DMatrix per batch.
            return rows(self.model.inplace_predict(x))
        return rows(self.model.predict(x))


def load(path: Path, manifest: dict[str, Any]) -> XGBoostModel:
    xgb = require("xgboost", "xgboost", "loading")
    file = str(path / manifest.get("file", FILE))
    if manifest.get("kind") == "booster":
        booster = xgb.Booster()
        booster.load_model(file)
        return XGBoostModel(booster, booster=True)
    cls = getattr(xgb, str(manifest.get("estimator")), None)
    if not (isinstance(cls, type) and issubclass(cls, xgb.XGBModel)):
        raise ConfigError(f"{path}: unknown xgboost estimator {manifest.get('estimator')!r}")
    model = cls()
    model.load_model(file)
    return XGBoostModel(model, booster=False)

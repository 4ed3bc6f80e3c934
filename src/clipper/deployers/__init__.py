"""Framework deployers: turn a trained model into an artifact directory a container can serve.

::

    from clipper.deployers import load, package

    path = package(model, Path("artifacts/digits"))   # framework detected from the type
    load(path).predict(X)                               # what the container does

An artifact is a directory holding ``clipper-model.json`` (``{"format": 1, "framework": ...}``
plus the framework's own fields) and the framework's own files. ``python -m clipper.container
--model-path DIR`` serves it. Frameworks are optional extras (``pip install
'clipper-serve[torch]'``); detection reads the object's type and never imports a framework, so
packaging a plain function does not pull torch in. See docs/deployers.md.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from clipper.deployers import _lightgbm, _onnx, _python, _sklearn, _torch, _xgboost
from clipper.deployers._common import MANIFEST, Predictor, read_manifest, require, write_manifest
from clipper.errors import ConfigError

__all__ = ["FRAMEWORKS", "MANIFEST", "Predictor", "detect_framework", "load", "package"]

# Detection order matters: XGBoost and LightGBM models are sklearn estimators too, and torch
# modules are callable like any plain function.
_MODULES: dict[str, ModuleType] = {
    "onnx": _onnx,
    "torch": _torch,
    "xgboost": _xgboost,
    "lightgbm": _lightgbm,
    "sklearn": _sklearn,
    "python": _python,
}
FRAMEWORKS: tuple[str, ...] = tuple(_MODULES)
# The module each framework's saving and loading cannot do without.
_REQUIRES = {
    "sklearn": "sklearn",
    "torch": "torch",
    "onnx": "onnxruntime",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
}


def detect_framework(model: Any) -> str:
    """The framework of ``model``, from its type alone (no framework is imported)."""
    for name, module in _MODULES.items():
        if module.matches(model):
            return name
    raise ConfigError(
        f"cannot deploy a {type(model).__name__}: expected a scikit-learn, PyTorch, XGBoost or "
        "LightGBM model, an ONNX file or ModelProto, an object with predict(), or a function"
    )


def _check_framework(model: Any, framework: str) -> None:
    if framework not in _MODULES:
        raise ConfigError(f"unknown framework {framework!r}; expected one of {FRAMEWORKS}")
    if framework in _REQUIRES:
        require(_REQUIRES[framework], framework, "deploying")
    # sklearn also takes duck-typed estimators that detection would call "python".
    ok = (
        callable(getattr(model, "predict", None))
        if framework == "sklearn"
        else _MODULES[framework].matches(model)
    )
    if not ok:
        raise ConfigError(f"a {type(model).__name__} cannot be deployed as a {framework} model")


def package(model: Any, dest: Path, *, framework: str | None = None) -> Path:
    """Write ``model`` as an artifact directory at ``dest`` (absent or empty) and return it."""
    dest = Path(dest)
    if framework is None:
        framework = detect_framework(model)
    else:
        _check_framework(model, framework)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest} already exists and is not an empty directory")
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        fields: dict[str, Any] = _MODULES[framework].save(model, dest)
        write_manifest(dest, framework, fields)
    except BaseException:
        # Leave nothing half-written behind (the manifest is written last anyway).
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        else:
            for child in dest.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        raise
    return dest


def load(path: Path) -> Predictor:
    """Load an artifact written by :func:`package`; the result has ``predict(inputs) -> list``."""
    path = Path(path)
    manifest = read_manifest(path)
    framework = manifest["framework"]
    module = _MODULES.get(framework)
    if module is None:
        raise ConfigError(
            f"{path / MANIFEST}: unknown framework {framework!r}; "
            f"this clipper-serve knows {', '.join(FRAMEWORKS)}"
        )
    model: Predictor = module.load(path, manifest)
    return model

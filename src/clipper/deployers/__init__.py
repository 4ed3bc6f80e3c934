"""Framework deployers: turn a trained model into an artifact directory a container can serve.

::

    from clipper.deployers import load, package

    path = package(model, Path("artifacts/digits"))   # framework detected from the type
    load(path).predict(X)                               # what the container does

An artifact is a directory holding ``clipper-model.json`` (``{"format": 1, "framework": ...}``
plus the framework's own fields) and the framework's own files. ``python -m clipper.container
--model-path DIR`` serves it. Frameworks are optional extras (``pip install
'clipper-serve[torch]'``); detection reads the object's type and never imports a framework, so
packaging a plain function does not pull torch in. :func:`check` holds a loaded model
against what a deploy declares (input type, input size) and runs a smoke prediction on
generated inputs of the shape the model file declares; the client runs it before uploading
and every container before it reports ready. See docs/deployers.md.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from clipper.deployers import _lightgbm, _onnx, _python, _sklearn, _torch, _xgboost
from clipper.deployers._common import (
    MANIFEST,
    SMOKE_ROWS,
    InputSpec,
    Predictor,
    input_spec,
    read_manifest,
    require,
    write_manifest,
)
from clipper.errors import ConfigError
from clipper.inputs import InputType

__all__ = [
    "FRAMEWORKS",
    "MANIFEST",
    "InputSpec",
    "Predictor",
    "check",
    "detect_framework",
    "load",
    "package",
    "verify",
]

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


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())  # frameworks' messages span lines; a refusal is one
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def check(
    model: Any, *, input_type: str | InputType | None = None, input_size: int | None = None
) -> InputSpec | None:
    """Hold a loaded model against what the deploy declares, then smoke-predict.

    Refused (a one-line ConfigError naming the shape and what was expected): a model whose
    file declares numeric inputs of one width, deployed with a non-numeric ``input_type`` or
    an ``input_size`` of another width. Then, when a width is known (from the model file, else
    ``input_size``) and the input type is numeric, :data:`SMOKE_ROWS` zero inputs of that width
    are predicted: an exception, or not one output per input, refuses the deploy with the
    model's own error. Returns the model's :class:`InputSpec` (None: the file declares none).
    """
    spec = input_spec(model)
    kind = InputType.parse(input_type) if isinstance(input_type, str) else input_type
    width = spec.width if spec is not None else None
    if width is not None and kind is not None and not kind.numeric:
        raise ConfigError(
            f"the model takes numeric inputs of {width} values ({spec.source if spec else ''}); "
            f"input type {kind.readable} cannot feed it: expected doubles, floats or integers"
        )
    if width is not None and input_size is not None and input_size != width:
        raise ConfigError(
            f"the model takes inputs of {width} values ({spec.source if spec else ''}); "
            f"the deploy declares inputs of {input_size}"
        )
    width = width if width is not None else input_size
    if width is None or (kind is not None and not kind.numeric):
        return spec  # nothing to generate an input from: the first query is the check
    dtype = np.dtype(kind.numpy_dtype) if kind is not None else np.dtype(np.float64)
    batch = np.zeros((SMOKE_ROWS, width), dtype=dtype)
    batch.flags.writeable = False  # as the container hands batches over
    try:
        out = model.predict(batch)
        count = len(out)
    except Exception as e:
        raise ConfigError(
            f"the smoke prediction on {SMOKE_ROWS} generated inputs of {width} zeros failed: "
            f"{_one_line(e)}"
        ) from e
    if count != SMOKE_ROWS:
        raise ConfigError(
            f"the smoke prediction on {SMOKE_ROWS} generated inputs of {width} zeros answered "
            f"{count} outputs; expected one per input"
        )
    return spec


def verify(
    path: Path, *, input_type: str | InputType | None = None, input_size: int | None = None
) -> InputSpec | None:
    """:func:`check` the artifact at ``path``, loaded as a container loads it (``setup()``
    included). An artifact whose framework is not installed here is not checked (the
    containers check it again before they report ready)."""
    framework = read_manifest(Path(path))["framework"]
    needed = _REQUIRES.get(framework)
    if needed is not None and importlib.util.find_spec(needed) is None:
        return None
    model = load(Path(path))
    setup = getattr(model, "setup", None)
    if callable(setup):
        setup()
    return check(model, input_type=input_type, input_size=input_size)

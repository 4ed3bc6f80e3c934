"""Pieces every framework deployer shares: the manifest, optional imports, output rows, and
what a model says about its input (:class:`InputSpec`) with the checks built on it."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from clipper.errors import ConfigError

__all__ = [
    "FORMAT",
    "MANIFEST",
    "SMOKE_ROWS",
    "InputSpec",
    "Predictor",
    "check_width",
    "has_base",
    "input_spec",
    "read_manifest",
    "require",
    "rows",
    "stack",
    "type_modules",
    "writable",
    "write_manifest",
]

MANIFEST = "clipper-model.json"
FORMAT = 1

# framework -> (how people call it, the pyproject extra that installs it)
LABELS: dict[str, tuple[str, str]] = {
    "sklearn": ("scikit-learn", "sklearn"),
    "torch": ("PyTorch", "torch"),
    "onnx": ("ONNX", "onnx"),
    "xgboost": ("XGBoost", "xgboost"),
    "lightgbm": ("LightGBM", "lightgbm"),
}


class Predictor(Protocol):
    """What :func:`clipper.deployers.load` returns: one output per input."""

    def predict(self, inputs: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class InputSpec:
    """What a model file says about one input: ``width`` values per input (None: the format
    does not say) and ``source``, where that was read, for messages ("scikit-learn
    n_features_in_", "ONNX input 'x' [3, 2] tensor(float)")."""

    width: int | None
    source: str


# A smoke prediction runs this many generated inputs: more than one, so "one output per input"
# is checked, and fewer than most fixed batch sizes, so padding is exercised.
SMOKE_ROWS = 2


def input_spec(model: object) -> InputSpec | None:
    """The loaded model's :class:`InputSpec`, or None when its loader could not tell."""
    spec = getattr(model, "input_spec", None)
    return spec if isinstance(spec, InputSpec) else None


def check_width(spec: InputSpec | None, arr: Any) -> None:
    """Fail a numeric batch whose inputs are not as wide as the model takes, naming both: the
    frameworks' own messages ("index: 1 Got: 3 Expected: 2") do not say which side is wrong."""
    if spec is None or spec.width is None or getattr(arr, "ndim", 0) != 2:
        return
    if arr.shape[1] != spec.width:
        raise ValueError(
            f"the model takes inputs of {spec.width} values ({spec.source}); "
            f"this input has {arr.shape[1]}"
        )


def require(module: str, framework: str, action: str) -> Any:
    """Import ``module`` or fail with a ConfigError that names the extra to install.

    Typed ``Any`` on purpose: the frameworks are optional, so mypy must not depend on them.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        label, extra = LABELS[framework]
        raise ConfigError(
            f"{action} a {label} model needs the {extra} extra: "
            f"pip install 'clipper-serve[{extra}]' (import {module} failed: {e})"
        ) from e


def type_modules(obj: object) -> list[tuple[str, str]]:
    """(module, qualname) of every class in ``type(obj)``'s MRO, read without importing."""
    return [(c.__module__, c.__qualname__) for c in type(obj).__mro__]


def has_base(obj: object, module_prefix: str, name: str | None = None) -> bool:
    """Whether a class in ``obj``'s MRO lives under ``module_prefix`` (and is called ``name``)."""
    for mod, qual in type_modules(obj):
        if (mod == module_prefix or mod.startswith(module_prefix + ".")) and (
            name is None or qual == name
        ):
            return True
    return False


def write_manifest(dest: Path, framework: str, fields: dict[str, Any]) -> None:
    doc = {"format": FORMAT, "framework": framework, **fields}
    tmp = dest / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    # Renamed last, so a half-written artifact never looks loadable.
    tmp.replace(dest / MANIFEST)


def read_manifest(path: Path) -> dict[str, Any]:
    file = path / MANIFEST
    try:
        doc = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} is not a model artifact: it has no {MANIFEST}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {file}: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"{file} must hold a JSON object")
    if doc.get("format") != FORMAT:
        raise ConfigError(
            f"{file} has format {doc.get('format')!r}; this clipper-serve reads format {FORMAT}"
        )
    if not isinstance(doc.get("framework"), str):
        raise ConfigError(f"{file} has no framework")
    return doc


def stack(inputs: Any, dtype: Any) -> Any:
    """The batch as one C-contiguous ``(n, d)`` array of ``dtype``.

    Numeric batches arrive as a read-only view of the received frame; a copy is made only
    when the dtype differs (frameworks never write into their input, so a view is safe for
    those that read numpy directly). Ragged batches cannot be stacked and raise ValueError.
    """
    arr = np.asarray(inputs, dtype=dtype)
    if arr.ndim != 2:
        raise ValueError(f"expected a batch of equal-length vectors, got shape {arr.shape}")
    return np.ascontiguousarray(arr)


def writable(arr: Any) -> Any:
    """``arr``, copied when read-only: torch tensors may not wrap read-only memory."""
    return arr if arr.flags.writeable else arr.copy()


def rows(out: Any) -> list[Any]:
    """One JSON-serialisable value per row: numpy scalars and arrays become Python values."""
    arr = np.asarray(out)
    if arr.ndim == 0:
        raise TypeError(f"the model returned a scalar ({arr!r}), not one output per input")
    result: list[Any] = arr.tolist()
    return result

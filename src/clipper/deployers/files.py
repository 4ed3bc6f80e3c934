"""Model files as frameworks write them, recognised by their content, not their name.

``clipper model deploy FILE`` takes what a framework's own save call wrote:

* a pickle or joblib file (cloudpickle, ``pickle.dump``, ``joblib.dump``): any model object;
* a ``torch.save`` file (a zip whose entries end in ``data.pkl`` and no ``code/``): a whole
  module is deployed; a ``state_dict`` (only tensors) is refused, naming what it needs;
* a TorchScript file (``torch.jit.save``: a zip with ``code/`` and ``constants.pkl``);
* an XGBoost model (``save_model`` as JSON or UBJSON: an object whose first key is
  ``learner``), loaded into its scikit-learn class when it was saved from one;
* a LightGBM text model (``Booster.save_model``: starts with ``tree`` and a version line);
* an ONNX model (a protobuf ``ModelProto``, checked by the onnx package).

:func:`read_model_file` answers the object and its framework for
:func:`clipper.deployers.package`; a file it does not recognise, or one that fails to load,
is a :class:`~clipper.errors.ConfigError` that says what was detected and what is expected.
Every one of these formats but ONNX, XGBoost and LightGBM's can run code when it is loaded:
read only files you trust (docs/deployers.md).
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clipper.deployers._common import require
from clipper.errors import ConfigError

__all__ = ["ModelFile", "read_model_file", "sniff"]

EXPECTED = (
    "expected a pickle or joblib file, a torch.save or TorchScript file, an XGBoost JSON/UBJSON "
    "model, a LightGBM text model, an ONNX file, or an artifact directory (docs/deployers.md)"
)


@dataclass(frozen=True, slots=True)
class ModelFile:
    """What a file was read as: ``model`` for :func:`~clipper.deployers.package`, with its
    ``framework`` (None: detected from the object) and the ``kind`` of file it was."""

    model: Any
    framework: str | None
    kind: str


_GLOBAL = re.compile(rb"c[A-Za-z_][\w.]*\n[A-Za-z_][\w.]*\n")  # protocol 0's GLOBAL opcode
# zlib, gzip, bz2, xz, lzma: the compressors joblib.dump writes with.
_COMPRESSED = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda", b"\x1f\x8b", b"BZh",
               b"\xfd7zXZ", b"\x5d\x00\x00")  # fmt: skip


def sniff(path: Path) -> str:
    """The kind of model file at ``path``, from its first bytes (and a zip's entry names):
    "torchscript", "torch", "xgboost-json", "xgboost-ubj", "lightgbm", "onnx", "pickle",
    or "unknown"."""
    with path.open("rb") as f:
        head = f.read(256)
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile:
            return "unknown"
        if any("/code/" in n for n in names) and any(n.endswith("constants.pkl") for n in names):
            return "torchscript"
        if any(n.endswith("data.pkl") for n in names):
            return "torch"
        return "unknown"
    if head[:1] == b"{":
        if head.lstrip(b"{ \t\r\n").startswith(b'"learner"'):
            return "xgboost-json"
        if b"learner" in head[:32] and head[1:2] in (b"L", b"l", b"i", b"U", b"I"):
            return "xgboost-ubj"
        return "unknown"
    if head.startswith(b"tree\n") and b"version=" in head:
        return "lightgbm"
    if head[:1] == b"\x80" or head.startswith((b"(", b"]", b"}")) or _GLOBAL.match(head):
        return "pickle"  # protocol 2+ starts with PROTO (0x80); 0 and 1 with a mark or a class
    if head.startswith(_COMPRESSED):
        return "pickle"  # joblib.dump(..., compress=...): zlib, gzip, bz2, xz or lzma
    if head[:1] == b"\x08":  # ModelProto's field 1 (ir_version), a varint
        return "onnx"
    return "unknown"


def read_model_file(path: Path) -> ModelFile:
    """Read the model in ``path`` (a file a framework wrote); see the module's docstring."""
    kind = sniff(path)
    reader = _READERS.get(kind)
    if reader is None:
        raise ConfigError(f"{path}: not a model file clipper-serve recognises; {EXPECTED}")
    try:
        return reader(path, kind)
    except ConfigError:
        raise
    except Exception as e:  # the framework's own failure, named, in one line
        detail = " ".join(str(e).split())[:300]
        raise ConfigError(
            f"{path}: read as {_LABELS[kind]}, but loading it failed: {type(e).__name__}: {detail}"
        ) from e


_LABELS = {
    "torchscript": "a TorchScript file",
    "torch": "a torch.save file",
    "xgboost-json": "an XGBoost JSON model",
    "xgboost-ubj": "an XGBoost UBJSON model",
    "lightgbm": "a LightGBM text model",
    "onnx": "an ONNX model",
    "pickle": "a pickle/joblib file",
}


def _torchscript(path: Path, kind: str) -> ModelFile:
    import warnings

    torch = require("torch", "torch", "reading")
    with warnings.catch_warnings():  # TorchScript's deprecation (docs/deployers.md)
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        module = torch.jit.load(str(path), map_location="cpu")
    return ModelFile(module, "torch", "torchscript")


def _torch(path: Path, kind: str) -> ModelFile:
    torch = require("torch", "torch", "reading")
    # A whole module is a pickle of its class: loading it runs code, as any pickle does.
    obj = torch.load(str(path), map_location="cpu", weights_only=False)
    if isinstance(obj, torch.nn.Module):
        return ModelFile(obj, "torch", "torch")
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        first = next(iter(obj))
        raise ConfigError(
            f"{path}: a PyTorch state_dict ({len(obj)} tensors, e.g. {first!r}): it holds the "
            "weights, not the model. Build the model class, load the weights "
            "(model.load_state_dict(torch.load(path))) and save the module "
            "(torch.save(model, path) or torch.jit.script(model).save(path)), or deploy it "
            "from Python"
        )
    keys = f" (keys: {', '.join(map(str, list(obj)[:5]))})" if isinstance(obj, dict) else ""
    raise ConfigError(
        f"{path}: a torch.save file holding a {type(obj).__name__}{keys}, not a torch.nn.Module; "
        "save the module itself (torch.save(model, path)) or a TorchScript file"
    )


def _xgboost(path: Path, kind: str) -> ModelFile:
    xgb = require("xgboost", "xgboost", "reading")
    # From memory: xgboost finds the format in the bytes; from a file, it guesses by the name.
    raw = bytearray(path.read_bytes())
    booster = xgb.Booster(model_file=raw)
    meta = booster.attr("scikit_learn")  # set when saved from XGBClassifier, XGBRegressor...
    if not meta:
        return ModelFile(booster, "xgboost", kind)
    estimator_type = json.loads(meta).get("_estimator_type")
    classes = {"classifier": "XGBClassifier", "regressor": "XGBRegressor", "ranker": "XGBRanker"}
    cls = getattr(xgb, classes.get(str(estimator_type), ""), None)
    if cls is None:
        return ModelFile(booster, "xgboost", kind)
    model = cls()
    model.load_model(raw)
    return ModelFile(model, "xgboost", kind)


def _lightgbm(path: Path, kind: str) -> ModelFile:
    lgb = require("lightgbm", "lightgbm", "reading")
    return ModelFile(lgb.Booster(model_file=str(path)), "lightgbm", "lightgbm")


def _onnx(path: Path, kind: str) -> ModelFile:
    onnx = require("onnx", "onnx", "reading")
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)  # a protobuf that is no ModelProto fails here
    return ModelFile(proto, "onnx", "onnx")


def _pickle(path: Path, kind: str) -> ModelFile:
    import cloudpickle

    try:
        with path.open("rb") as f:
            obj = cloudpickle.load(f)
    except (pickle.UnpicklingError, EOFError, ValueError, KeyError):
        try:
            import joblib
        except ImportError:
            raise ConfigError(f"{path}: not a pickle file; {EXPECTED}") from None
        obj = joblib.load(path)
    return ModelFile(obj, None, "pickle")


_READERS: dict[str, Callable[[Path, str], ModelFile]] = {
    "torchscript": _torchscript,
    "torch": _torch,
    "xgboost-json": _xgboost,
    "xgboost-ubj": _xgboost,
    "lightgbm": _lightgbm,
    "onnx": _onnx,
    "pickle": _pickle,
}

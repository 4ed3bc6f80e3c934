"""ONNX models (a ``.onnx`` file or an ``onnx.ModelProto``), run by onnxruntime on CPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from clipper.deployers._common import has_base, require, rows, stack
from clipper.errors import ConfigError

FILE = "model.onnx"
_PROVIDERS = ["CPUExecutionProvider"]
# onnxruntime's type strings for the input dtypes a numeric batch can be cast to.
_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def matches(model: object) -> bool:
    if isinstance(model, str | os.PathLike):
        return str(os.fspath(model)).lower().endswith(".onnx")
    return has_base(model, "onnx", "ModelProto")


def _session(ort: Any, file: Path) -> Any:
    return ort.InferenceSession(str(file), providers=_PROVIDERS)


def save(model: Any, dest: Path) -> dict[str, Any]:
    ort = require("onnxruntime", "onnx", "deploying")
    file = dest / FILE
    if isinstance(model, str | os.PathLike):
        src = Path(model)
        if not src.is_file():
            raise ConfigError(f"no ONNX file at {src}")
        shutil.copyfile(src, file)
    else:
        file.write_bytes(model.SerializeToString())
    try:
        # Opened once here so a broken file fails the deploy, not every replica's start.
        sess = _session(ort, file)
    except Exception as e:
        raise ConfigError(f"onnxruntime cannot load the model: {e}") from e
    first_in, first_out = sess.get_inputs()[0], sess.get_outputs()[0]
    return {
        "file": FILE,
        "input": first_in.name,
        "input_type": first_in.type,
        "output": first_out.name,
        "onnxruntime_version": ort.__version__,
    }


class OnnxModel:
    def __init__(self, session: Any) -> None:
        self.session = session
        first = session.get_inputs()[0]
        self.input_name = first.name
        if first.type not in _DTYPES:
            raise ConfigError(
                f"the model's first input {first.name!r} is a {first.type}; "
                f"clipper-serve feeds numeric batches ({', '.join(_DTYPES)})"
            )
        self.dtype = _DTYPES[first.type]
        self.output_name = session.get_outputs()[0].name

    def predict(self, inputs: Any) -> list[Any]:
        x = stack(inputs, self.dtype)
        (out,) = self.session.run([self.output_name], {self.input_name: x})
        return rows(out)


def load(path: Path, manifest: dict[str, Any]) -> OnnxModel:
    ort = require("onnxruntime", "onnx", "loading")
    return OnnxModel(_session(ort, path / manifest.get("file", FILE)))

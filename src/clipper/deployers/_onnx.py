"""ONNX models (a ``.onnx`` file or an ``onnx.ModelProto``), run by onnxruntime on CPU."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from clipper.deployers._common import InputSpec, check_width, has_base, require, rows, stack
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


def _dims(shape: Any) -> list[int | str]:
    """An ONNX shape as numbers and axis names ("N" for an unnamed symbolic axis)."""
    return [d if isinstance(d, int) else (d or "N") for d in shape]


def _shape_text(arg: Any) -> str:
    return f"{arg.name!r} [{', '.join(str(d) for d in _dims(arg.shape))}] {arg.type}"


class Layout:
    """How a batch of vectors feeds the model's one input: ``batch`` (None: a dynamic batch
    axis; a number: the fixed batch size every run must have), ``row`` (the shape of one
    input when every axis after the batch is fixed, else None) and the :class:`InputSpec`."""

    def __init__(self, arg: Any) -> None:
        dims = _dims(arg.shape)
        if len(dims) < 2:
            raise ConfigError(
                f"the model's input {_shape_text(arg)} has no batch axis and feature axis: "
                "clipper-serve feeds a batch of vectors, expected [batch, features, ...]"
            )
        if arg.type not in _DTYPES:
            raise ConfigError(
                f"the model's input {_shape_text(arg)} is not numeric: clipper-serve feeds "
                f"numeric batches ({', '.join(_DTYPES)})"
            )
        first, rest = dims[0], dims[1:]
        # A fixed first axis (logreg_iris.onnx's [3, 2]) is a model exported for one batch
        # size: batches are cut and padded to it, as Triton serves max_batch_size 0 models.
        self.batch: int | None = first if isinstance(first, int) and first > 0 else None
        fixed = all(isinstance(d, int) and d > 0 for d in rest)
        self.row: tuple[int, ...] | None = tuple(int(d) for d in rest) if fixed else None
        width = int(np.prod(self.row)) if self.row is not None else None
        self.spec = InputSpec(width, f"ONNX input {_shape_text(arg)}")
        self.dtype = _DTYPES[arg.type]


def _refuse_extra_inputs(sess: Any) -> None:
    inputs = sess.get_inputs()
    if len(inputs) != 1:
        shapes = ", ".join(_shape_text(i) for i in inputs)
        raise ConfigError(
            f"the model has {len(inputs)} inputs ({shapes}): clipper-serve feeds one input, "
            "a batch of vectors"
        )


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
    # What the graph declares is checked here, so a model that cannot be fed is refused in
    # one line at deploy rather than failing every query.
    _refuse_extra_inputs(sess)
    first_in, first_out = sess.get_inputs()[0], sess.get_outputs()[0]
    layout = Layout(first_in)
    return {
        "file": FILE,
        "input": first_in.name,
        "input_type": first_in.type,
        "input_shape": _dims(first_in.shape),
        "fixed_batch": layout.batch,
        "output": first_out.name,
        "onnxruntime_version": ort.__version__,
    }


class OnnxModel:
    def __init__(self, session: Any) -> None:
        self.session = session
        _refuse_extra_inputs(session)
        first = session.get_inputs()[0]
        self.input_name = first.name
        self.layout = Layout(first)
        self.input_spec = self.layout.spec
        self.dtype = self.layout.dtype
        self.output_name = session.get_outputs()[0].name

    def predict(self, inputs: Any) -> list[Any]:
        x = stack(inputs, self.dtype)
        check_width(self.input_spec, x)
        n = len(x)
        row = self.layout.row
        if row is not None and len(row) > 1:
            x = x.reshape((n, *row))  # an image model's [N, 3, 32, 32] from flat inputs
        size = self.layout.batch
        if size is None:
            return self._run(x)
        answers: list[Any] = []
        for start in range(0, n, size):
            chunk = x[start : start + size]
            k = len(chunk)
            if k < size:  # the last run is padded with zero inputs whose answers are dropped
                padded = np.zeros((size, *x.shape[1:]), dtype=self.dtype)
                padded[:k] = chunk
                chunk = padded
            out = self._run(chunk)
            if len(out) != size:
                raise ValueError(
                    f"the model's output {self.output_name!r} has {len(out)} rows for a run "
                    f"of {size} inputs (its fixed batch size)"
                )
            answers.extend(out[:k])
        return answers

    def _run(self, x: Any) -> list[Any]:
        (out,) = self.session.run([self.output_name], {self.input_name: x})
        return rows(out)


def load(path: Path, manifest: dict[str, Any]) -> OnnxModel:
    ort = require("onnxruntime", "onnx", "loading")
    return OnnxModel(_session(ort, path / manifest.get("file", FILE)))

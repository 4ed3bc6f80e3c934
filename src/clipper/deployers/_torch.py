"""PyTorch modules: TorchScript when the module scripts, else cloudpickle; served on CPU, or on
the GPU the local manager pins the replica to (``CLIPPER_DEVICE=cuda``, a ``local:gpus`` label)."""

from __future__ import annotations

import copy
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np

from clipper.deployers import _python
from clipper.deployers._common import (
    InputSpec,
    check_width,
    has_base,
    require,
    rows,
    stack,
    writable,
)

SCRIPT_FILE = "model.pt"
PICKLE_FILE = "model.pkl"
_log = logging.getLogger("clipper.deployers")


def matches(model: object) -> bool:
    return has_base(model, "torch.nn.modules.module", "Module") or has_base(
        model, "torch.jit", "ScriptModule"
    )


def save(model: Any, dest: Path) -> dict[str, Any]:
    torch = require("torch", "torch", "deploying")
    fields: dict[str, Any] = {"torch_version": torch.__version__, "input_dtype": "float32"}
    try:
        with warnings.catch_warnings():
            # torch >= 2.10 deprecates TorchScript; it still needs no source code in the
            # container and no example input here, which torch.export would. Later torch
            # releases warn with FutureWarning instead.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            scripted = model if has_base(model, "torch.jit") else torch.jit.script(model)
            scripted.save(str(dest / SCRIPT_FILE))
    except Exception as e:
        _log.info("torch.jit.script failed (%s: %s); pickling the module", type(e).__name__, e)
        (dest / SCRIPT_FILE).unlink(missing_ok=True)
        if any(p.device.type != "cpu" for p in model.parameters()):
            model = copy.deepcopy(model).cpu()  # the container runs on CPU
        _python.dump(model, dest / PICKLE_FILE)
        return {**fields, "file": PICKLE_FILE, "serialization": "cloudpickle"}
    return {**fields, "file": SCRIPT_FILE, "serialization": "torchscript"}


class TorchModel:
    def __init__(self, module: Any, torch: Any, dtype: Any, device: str = "cpu") -> None:
        self.module = module
        self.torch = torch
        self.dtype = dtype
        self.device = device
        self.input_spec = _sequential_width(module)

    def predict(self, inputs: Any) -> list[Any]:
        arr = stack(inputs, self.dtype)
        check_width(self.input_spec, arr)
        x = self.torch.from_numpy(writable(arr))
        if self.device != "cpu":
            x = x.to(self.device)
        with self.torch.no_grad():  # thread-local: set on the predict thread itself
            out = self.module(x)
        if not isinstance(out, self.torch.Tensor):
            raise TypeError(f"the module returned {type(out).__name__}, expected a tensor")
        return rows(out.detach().cpu().numpy())


def _sequential_width(module: Any) -> InputSpec | None:
    """The input width of a ``Sequential`` that starts with a ``Linear`` (scripted or not).

    Only there is the width certain from the module alone: any other ``forward`` may reshape
    its input before its first layer, so nothing is read from it (no check, no smoke input).
    """
    name = getattr(module, "original_name", type(module).__name__)
    if name != "Sequential":
        return None
    first = next(iter(module.children()), None)
    if first is None or getattr(first, "original_name", type(first).__name__) != "Linear":
        return None
    width = getattr(first, "in_features", None)
    return (
        InputSpec(width, "in_features of the first Linear layer")
        if isinstance(width, int)
        else None
    )


def serving_device(torch: Any) -> str:
    """``cuda`` when the replica was pinned to a GPU (``CLIPPER_DEVICE``), else ``cpu``; a
    pinned replica that sees no GPU fails its load, saying so, rather than run on CPU."""
    wanted = os.environ.get("CLIPPER_DEVICE", "cpu") or "cpu"
    if wanted == "cpu":
        return "cpu"
    if wanted != "cuda":
        raise ValueError(f"CLIPPER_DEVICE must be cpu or cuda, got {wanted!r}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "this replica is pinned to a GPU (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}) but torch sees none: a torch "
            f"build without CUDA ({torch.__version__}), no driver, or no such device"
        )
    return "cuda"


def load(path: Path, manifest: dict[str, Any]) -> TorchModel:
    torch = require("torch", "torch", "loading")
    device = serving_device(torch)
    file = path / manifest.get("file", SCRIPT_FILE)
    if manifest.get("serialization", "torchscript") == "torchscript":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            module = torch.jit.load(str(file), map_location=device)
    else:
        with file.open("rb") as f:
            module = cloudpickle.load(f)
        module = module.to(device)
    module.eval()  # dropout off, batch norm uses its running statistics
    return TorchModel(module, torch, np.dtype(manifest.get("input_dtype", "float32")), device)

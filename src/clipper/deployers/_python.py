"""Plain Python models: any object with ``predict(inputs)``, or a function, via cloudpickle.

Objects from the user's own scripts, notebooks or test files are pickled by value (the
container could not import those modules); installed packages stay by reference, so the
container must have them.
"""

from __future__ import annotations

import contextlib
import sys
import sysconfig
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import cloudpickle

__all__ = ["by_value", "dump", "is_local", "load", "matches", "save"]

FILE = "model.pkl"
# src/clipper: our own modules are importable in every container.
_CLIPPER_DIR = Path(__file__).resolve().parents[1]


def matches(model: object) -> bool:
    return callable(getattr(model, "predict", None)) or callable(model)


def _owner_module(obj: object) -> str | None:
    # A function or class names its own module; an instance is defined by its class.
    plain = isinstance(obj, type) or (callable(obj) and not hasattr(obj, "predict"))
    target = obj if plain else type(obj)
    name = getattr(target, "__module__", None)
    return name if isinstance(name, str) else None


# cloudpickle's by-value registry is one per process: two packagings in threads at once (the
# frontend packages a deploy off its event loop) would unregister each other's modules.
_BY_VALUE_LOCK = threading.RLock()


@contextlib.contextmanager
def by_value(objs: Iterable[object]) -> Iterator[None]:
    """Within the block, cloudpickle pickles the local modules that define ``objs`` by value.
    One block at a time per process (the registry is global)."""
    with _BY_VALUE_LOCK, _registered(objs):
        yield


@contextlib.contextmanager
def _registered(objs: Iterable[object]) -> Iterator[None]:
    registered: list[ModuleType] = []
    for obj in objs:
        module = sys.modules.get(_owner_module(obj) or "")
        if (
            module is not None
            and module.__name__ not in ("__main__", "builtins")
            and module not in registered
            and is_local(module)
        ):
            cloudpickle.register_pickle_by_value(module)
            registered.append(module)
    try:
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


def is_local(module: ModuleType) -> bool:
    """A module the container may not import: not from site-packages, the stdlib or clipper."""
    path = getattr(module, "__file__", None)
    if not path:
        return False
    resolved = str(Path(path).resolve())
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    if any(resolved.startswith(str(Path(r).resolve())) for r in roots):
        return False
    return not resolved.startswith(str(_CLIPPER_DIR))


def dump(model: object, file: Path, extra: Iterable[object] = ()) -> None:
    """cloudpickle ``model`` to ``file``; ``extra`` objects' local modules go by value too."""
    with by_value([model, *extra]):
        data = cloudpickle.dumps(model)
    file.write_bytes(data)


def save(model: object, dest: Path) -> dict[str, Any]:
    dump(model, dest / FILE)
    return {"file": FILE, "kind": "function" if not hasattr(model, "predict") else "object"}


class _Function:
    """Gives a plain function the ``predict`` the loaders promise."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def predict(self, inputs: Any) -> Any:
        return self.fn(inputs)


def load(path: Path, manifest: dict[str, Any]) -> Any:
    with (path / manifest.get("file", FILE)).open("rb") as f:
        model = cloudpickle.load(f)
    if callable(getattr(model, "predict", None)):
        return model  # as deployed, so its setup() still runs in the container
    if callable(model):
        return _Function(model)
    raise TypeError(f"{path}: the pickled {type(model).__name__} has no predict() to call")

"""One error hierarchy: every exception class defined anywhere in the package is a ClipperError."""

import importlib
import inspect
import pkgutil

import pytest

import clipper
from clipper.errors import ClipperError

# Modules that cannot be imported here: the compat shim needs the original clipper_admin package,
# and __main__ modules run the command when imported.
_SKIP = ("clipper.compat.clipper_admin",)


def _modules() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(clipper.__path__, "clipper.")]
    return [n for n in names if not n.endswith("__main__") and n not in _SKIP]


def test_the_walk_sees_the_whole_package() -> None:
    names = _modules()
    assert "clipper.errors" in names
    assert "clipper.frontend.admin_fields" in names
    assert "clipper.store.base" in names


@pytest.mark.parametrize("module", _modules())
def test_every_exception_class_derives_from_clipper_error(module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ImportError as e:  # an optional dependency (grpc, redis) is not installed here
        pytest.skip(f"{module}: {e}")
    strays = [
        name
        for name, obj in vars(mod).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == module
        and not issubclass(obj, ClipperError)
    ]
    assert not strays, f"{module} defines exceptions outside ClipperError: {strays}"


def test_the_docstring_tree_names_every_error_class() -> None:
    import clipper.errors

    doc = clipper.errors.__doc__ or ""
    found = set()
    for module in _modules():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, ClipperError) and obj.__module__ == module:
                found.add(name)
    assert found
    assert not {n for n in found if f" {n}\n" not in doc and f" {n} " not in doc}

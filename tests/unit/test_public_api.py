import subprocess
import sys

import clipper


def test_the_public_surface_is_exactly_all() -> None:
    # dir(), not vars(): the names resolve lazily, so vars() holds only those used so far
    public = {n for n in dir(clipper) if not n.startswith("_")}
    # subpackages are importable but not part of the flat surface
    modules = {n for n in public if type(getattr(clipper, n)).__name__ == "module"}
    assert public - modules == set(clipper.__all__) - {"__version__"}
    for name in clipper.__all__:
        assert hasattr(clipper, name), name


def test_every_error_is_a_clipper_error() -> None:
    errors = [getattr(clipper, n) for n in clipper.__all__ if n.endswith("Error")]
    assert errors
    assert all(issubclass(e, clipper.ClipperError) for e in errors)


def test_every_public_name_imports_from_the_package_and_is_the_defining_object() -> None:
    import importlib

    for name in clipper.__all__:
        origin = importlib.import_module(clipper._ORIGIN[name])
        assert getattr(clipper, name) is getattr(origin, name), name
    assert set(clipper._ORIGIN) == set(clipper.__all__)


def _modules_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_importing_the_package_imports_nothing_else() -> None:
    assert {m for m in _modules_after("import clipper") if m.startswith("clipper")} == {"clipper"}


def test_a_container_imports_only_what_it_uses() -> None:
    # A replica's start-up time is mostly imports: no frontend, store, HTTP or metrics code.
    loaded = _modules_after("import clipper.container.runtime")
    heavy = {
        "clipper.server",
        "clipper.frontend",
        "clipper.store",
        "clipper.batching",
        "clipper.selection",
        "clipper.client",
        "prometheus_client",
        "httptools",
    }
    assert not heavy & loaded

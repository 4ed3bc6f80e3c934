"""The package's import graph, read from the source (AST): every top-level module and package
of ``clipper`` sits in one layer of an ordered list, nothing imports from a layer above its own,
and nothing imports around a circle — between modules, or between top-level modules and
packages. Every import counts: at module level, inside a function, and under
``if TYPE_CHECKING:`` (a type-only import still says one file cannot be read without the other).

A new top-level module or package fails :func:`test_every_module_is_in_a_layer` until it is
placed here (docs/architecture.md explains the layers).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import clipper

ROOT = Path(clipper.__file__).resolve().parent.parent

# Lowest first. A unit may import units of its own layer or of layers below, never above; and
# the units' graph has no circle, so a layer is no excuse for two units that need each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    # Foundations: time, the one exception hierarchy, the metric families, bounded log lines,
    # traces (the W3C context, the OTEL_* settings, the lazily imported SDK).
    ("clock", "errors", "metrics", "logs", "tracing"),
    # Values and mechanisms that know nothing of a frontend.
    (
        "choices",
        "scaling",
        "rollout",
        "artifact_digest",
        "archives",
        "deployers",
        "config",
        "inputs",
        "cache",
        "selection",
        "store",
        "metrics_window",
        "version",
        "untrusted",
        "tenants",
    ),
    # The RPC wire and its auth; pipeline descriptions (data only).
    ("rpc", "pipeline"),
    # Domain records (what is served), and what runs a replica or renders its manifests.
    ("registry", "kube", "container"),
    # Mechanisms over the records: batching per version, replica placement, the store's view.
    ("batching", "managers", "persistence"),
    # Runtime services: the write side, the reconciler, the catalog (read side), the autoscaler.
    ("runtime",),
    # The query runtime: processor, runners, submit seam, typed answers.
    ("query",),
    # Protocols: parse at the edge, encode at the edge (query and admin ports, V2 REST/gRPC).
    ("frontend",),
    ("dashboard",),
    # The composition root, and what runs it.
    ("server",),
    ("background", "demo"),
    # The supervisor of `clipper start --workers N` and its worker processes.
    ("workers",),
    # Clients and tools: the Python client, desired-state files, the CLI.
    ("client", "tables"),
    ("declarative", "rollout_commands", "tenant_commands", "compat"),
    ("cli_ops",),
    ("commands",),
    ("cli",),
    # The public API and ``python -m clipper``.
    ("__init__", "__main__"),
)
# Imports that run upward, each with its reason. Empty: keep it so.
UPWARD_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted((ROOT / "clipper").rglob("*.py"))}


def _imports(path: Path, module: str, known: set[str]) -> Iterator[str]:
    """Every clipper module ``module`` imports, wherever the import stands. ``from pkg import
    name`` names the submodule when ``name`` is one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "clipper")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "clipper":
                continue
            subs = [f"{target}.{a.name}" for a in node.names]
            if all(s in known for s in subs):
                yield from subs
            else:
                yield target


def _resolve(name: str, known: set[str]) -> str:
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def _unit(module: str) -> str:
    """The top-level module or package a module belongs to (``__init__`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: {_resolve(d, known) for d in _imports(p, m, known)} - {m} for m, p in mods.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    found: list[list[str]] = []

    def walk(n: str) -> None:
        seen[n] = 1
        stack.append(n)
        for d in sorted(edges.get(n, ())):
            if seen.get(d) == 1:
                found.append([*stack[stack.index(d) :], d])
            elif d not in seen:
                walk(d)
        stack.pop()
        seen[n] = 2

    for n in sorted(edges):
        if n not in seen:
            walk(n)
    return found


def _layer_of() -> dict[str, int]:
    return {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def test_every_module_is_in_a_layer() -> None:
    placed = _layer_of()
    units = {_unit(m) for m in _modules()}
    assert sorted(units - set(placed)) == [], "place these in LAYERS"
    assert sorted(set(placed) - units) == [], "LAYERS names what no longer exists"
    named = [u for layer in LAYERS for u in layer]
    assert len(named) == len(set(named)), "a unit is in two layers"


def test_no_import_runs_from_a_lower_layer_to_a_higher_one() -> None:
    layer = _layer_of()
    upward = sorted(
        f"{m} imports {d}"
        for m, deps in _graph().items()
        for d in deps
        if layer[_unit(d)] > layer[_unit(m)] and (_unit(m), _unit(d)) not in UPWARD_ALLOWED
    )
    assert upward == []


def test_modules_import_each_other_without_circles() -> None:
    graph = _graph()
    # A package's __init__ re-exporting its own submodules is not a way back to it.
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    assert _cycles(edges) == []


def test_top_level_modules_and_packages_import_each_other_without_circles() -> None:
    units: dict[str, set[str]] = {}
    for m, deps in _graph().items():
        units.setdefault(_unit(m), set()).update(_unit(d) for d in deps if _unit(d) != _unit(m))
    # The root package's __init__ is the public API: it may import anything, nothing imports it.
    assert sorted(u for u, deps in units.items() if "__init__" in deps) == []
    assert _cycles(units) == []


def test_the_graph_reader_sees_type_checking_and_function_imports() -> None:
    """The rules above would pass vacuously if the reader missed imports: it must find the
    server's lazy gRPC import and a TYPE_CHECKING-only one."""
    graph = _graph()
    assert "clipper.choices" in graph["clipper.server"]  # inside __init__'s body
    type_only = graph["clipper.frontend.routes"]
    assert "clipper.frontend.admin" in type_only  # under if TYPE_CHECKING:

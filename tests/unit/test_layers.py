"""The package's import graph: no cycles between modules, and lower layers never import upper
ones. Read from the source (AST), so it holds for imports that only run in some code paths."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import clipper

ROOT = Path(clipper.__file__).resolve().parent.parent

# Lower layers: the mechanisms a frontend is assembled from. They know nothing of the frontend's
# protocols, its runtime services or its composition root.
LOWER = (
    "clipper.batching",
    "clipper.cache",
    "clipper.choices",
    "clipper.clock",
    "clipper.config",
    "clipper.container",
    "clipper.errors",
    "clipper.inputs",
    "clipper.metrics",
    "clipper.registry",
    "clipper.rpc",
    "clipper.selection",
    "clipper.store",
)
UPPER = (
    "clipper.background",
    "clipper.cli",
    "clipper.commands",
    "clipper.dashboard",
    "clipper.demo",
    "clipper.frontend",
    "clipper.persistence",
    "clipper.runtime",
    "clipper.server",
)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports(tree: ast.Module, *, top_level_only: bool) -> Iterator[str]:
    """Imported clipper modules; ``if TYPE_CHECKING:`` blocks are skipped (never run)."""

    def visit(nodes: list[ast.stmt]) -> Iterator[str]:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                yield from visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith("clipper"):
                    yield node.module
            elif isinstance(node, ast.Import):
                yield from (a.name for a in node.names if a.name.startswith("clipper"))
            if top_level_only and isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
            ):
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    yield from visit([c for c in children if isinstance(c, ast.stmt)])
            if isinstance(node, ast.ExceptHandler):
                yield from visit(node.body)

    yield from visit(tree.body)


def _graph(*, top_level_only: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "clipper").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[_module(path)] = set(_imports(tree, top_level_only=top_level_only))
    return graph


def test_lower_layers_never_import_upper_ones() -> None:
    graph = _graph(top_level_only=False)
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in graph.items()
        if _in(m, LOWER)
        for d in deps
        if _in(d, UPPER)
    )
    assert wrong == []


def test_modules_import_each_other_without_cycles() -> None:
    # Only what runs at import time can deadlock an import: lazy imports inside functions are
    # the deliberate way out of a cycle (and keep containers light).
    graph = _graph(top_level_only=True)
    # A package's __init__ importing its own submodules is not a cycle back to it.
    edges = {
        m: {
            d
            for d in deps
            if d in graph and d != m and not (m != "clipper" and d.startswith(m + "."))
        }
        for m, deps in graph.items()
    }
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    cycles: list[list[str]] = []

    def walk(m: str) -> None:
        seen[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if seen.get(d) == 1:
                cycles.append([*stack[stack.index(d) :], d])
            elif d not in seen:
                walk(d)
        stack.pop()
        seen[m] = 2

    for m in sorted(edges):
        if m not in seen:
            walk(m)
    assert cycles == [], "\n".join(" -> ".join(c) for c in cycles)


def test_the_runtime_imports_neither_the_protocols_nor_the_composition_root() -> None:
    # The write side's rules (runtime.operations, runtime.artifacts) are called by both front
    # doors: they must not depend on either.
    graph = _graph(top_level_only=False)
    wrong = sorted(
        f"{m} imports {d}"
        for m, deps in graph.items()
        if _in(m, ("clipper.runtime",))
        for d in deps
        if _in(d, ("clipper.frontend", "clipper.server"))
    )
    assert wrong == []

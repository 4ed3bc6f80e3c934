"""The lower layers' import graph, counting every import: those under ``if TYPE_CHECKING:`` and
those inside functions too (a lazy import still ties the modules together). A module of a lower
layer imports only modules of its own layer or below, and the top-level units of these layers
never import each other around a loop. (tests/unit/test_layers.py checks the whole package with
the looser rule: run-time imports at module level.)"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import clipper

PACKAGE = Path(clipper.__file__).resolve().parent

# Low to high. A unit is a top-level module or subpackage (``clipper.<unit>``); the pipeline's
# data modules are one unit, and its runner (pipeline.run) belongs to the query runtime, above.
LAYERS = (
    "clock errors metrics version",
    "archives artifact_digest cache choices config deployers inputs rollout scaling selection "
    "store tables",
    "rpc pipeline",
    "registry kube container",
    "batching managers persistence",
)
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer.split()}
ABOVE = len(LAYERS)  # anything not listed: the runtime, the protocols, the server, the CLI


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    if module == "clipper.pipeline.run" or module.startswith("clipper.pipeline.run."):
        return "pipeline.run"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def _imports(path: Path, module: str) -> set[str]:
    """Every clipper module ``path`` imports, wherever the import statement is."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
    return {m for m in found if m == "clipper" or m.startswith("clipper.")}


def _unit_graph() -> dict[str, dict[str, str]]:
    """unit -> {imported unit: one "module imports module" line that shows it}."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module(path)
        unit = _unit(module)
        for dep in sorted(_imports(path, module)):
            target = _unit(dep)
            if target != unit:
                graph.setdefault(unit, {}).setdefault(target, f"{module} imports {dep}")
    return graph


def _rank(unit: str) -> int:
    return RANK.get(unit, ABOVE)


def test_a_lower_layer_imports_nothing_above_it() -> None:
    wrong = sorted(
        line
        for unit, deps in _unit_graph().items()
        if _rank(unit) < ABOVE
        for target, line in deps.items()
        if _rank(target) > _rank(unit)
    )
    assert wrong == []


def test_the_lower_layers_import_each_other_without_loops() -> None:
    graph = {
        unit: {t: line for t, line in deps.items() if _rank(t) < ABOVE}
        for unit, deps in _unit_graph().items()
        if _rank(unit) < ABOVE
    }
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []
    loops: list[str] = []

    def walk(unit: str) -> None:
        seen[unit] = 1
        stack.append(unit)
        for target in sorted(graph.get(unit, {})):
            if seen.get(target) == 1:
                loop = [*stack[stack.index(target) :], target]
                loops.append("; ".join(graph[a][b] for a, b in itertools.pairwise(loop)))
            elif target not in seen:
                walk(target)
        stack.pop()
        seen[unit] = 2

    for unit in sorted(graph):
        if unit not in seen:
            walk(unit)
    assert loops == []


def test_every_listed_unit_exists() -> None:
    units = {_unit(_module(p)) for p in PACKAGE.rglob("*.py")}
    assert set(RANK) <= units, set(RANK) - units

"""Reading a desired-state file (YAML, or JSON) into plain values, remembering where each value
came from so that an error can name its line.

``Located`` maps a path (``("applications", 1, "slo_micros")``) to its 1-based line and column.
A YAML syntax error, and a key given twice in one mapping (YAML parsers keep the last one
silently), are :class:`DocumentError` with ``line:col``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipper.errors import ConfigError

__all__ = ["DocumentError", "Located", "format_path", "load_document"]

PathKey = tuple[str | int, ...]


def format_path(path: PathKey) -> str:
    """``("applications", 1, "slo_micros")`` -> ``applications[1].slo_micros``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(the document)"


class DocumentError(ConfigError):
    """A file that cannot be applied: every problem found, each with its line when known."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(slots=True)
class Located:
    source: str
    lines: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: PathKey) -> str:
        """``FILE:LINE:`` of the nearest located value on ``path`` (the value itself, else
        the object that holds it), or ``FILE:``."""
        for end in range(len(path), -1, -1):
            pos = self.lines.get(path[:end])
            if pos is not None:
                return f"{self.source}:{pos[0]}:"
        return f"{self.source}:"

    def problem(self, path: PathKey, message: str) -> str:
        return f"{self.where(path)} {format_path(path)}: {message}"


def load_document(path: Path) -> tuple[Any, Located]:
    """The file's value and where each part of it is. JSON when the name ends in ``.json``,
    YAML otherwise (plain JSON is also read correctly as YAML here)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DocumentError([f"{path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise DocumentError([f"{path}: cannot read it: {e}"]) from None
    located = Located(str(path))
    if path.suffix.lower() == ".json":
        try:
            value = json.loads(text, object_pairs_hook=_no_duplicates(path))
        except json.JSONDecodeError as e:
            raise DocumentError([f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}"]) from None
        # Lines for the schema's messages: JSON is YAML, so the YAML composer can place them.
        with contextlib.suppress(DocumentError):
            _compose(text, located)
        return value, located
    return _compose(text, located), located


def _no_duplicates(source: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise DocumentError([f"{source}: the key {k!r} is given twice in an object"])
            out[k] = v
        return out

    return build


def _compose(text: str, located: Located) -> Any:
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{located.source}:{mark.line + 1}:{mark.column + 1}" if mark else located.source
        what = " ".join(str(p) for p in (e.context, e.problem) if p)
        raise DocumentError([f"{where}: invalid YAML: {what}"]) from None
    except yaml.YAMLError as e:
        raise DocumentError([f"{located.source}: invalid YAML: {e}"]) from None
    if node is None:
        return None
    problems: list[str] = []
    _walk(node, (), located, problems)
    if problems:
        raise DocumentError(problems)
    try:
        return yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as e:  # a value the composer took but no constructor makes
        raise DocumentError([f"{located.source}: invalid YAML: {e}"]) from None


def _walk(node: Any, path: PathKey, located: Located, problems: list[str]) -> None:
    import yaml

    located.lines[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            line = key.start_mark.line + 1
            if name in seen:
                problems.append(
                    f"{located.source}:{line}:{key.start_mark.column + 1}: "
                    f"{format_path((*path, name))}: given twice (first on line {seen[name]})"
                )
            seen[name] = line
            _walk(value, (*path, name), located, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), located, problems)

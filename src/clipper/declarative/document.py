"""Reading a desired-state file (YAML, or JSON) into plain values, remembering where each value
came from so that an error can name its line.

``Located`` maps a path (``("applications", 1, "slo_micros")``) to its 1-based line and column.
A YAML syntax error, and a key given twice in one mapping (YAML parsers keep the last one
silently), are :class:`DocumentError` with ``line:col``. The file is untrusted input, read by
:mod:`clipper.untrusted`: a size limit (``--max-file-bytes``) checked before it is read, no
anchors or aliases, at most 64 levels deep and 100,000 values; each refusal is one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipper.errors import ConfigError
from clipper.untrusted import MAX_FILE_BYTES, PathKey, format_path, load_json, load_yaml, read_text

__all__ = ["DocumentError", "Located", "PathKey", "format_path", "load_document"]


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


def load_document(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> tuple[Any, Located]:
    """The file's value and where each part of it is. JSON when the name ends in ``.json``,
    YAML otherwise (plain JSON is also read correctly as YAML here)."""
    try:
        text = read_text(path, max_bytes, limit="--max-file-bytes")
    except ConfigError as e:
        raise DocumentError([str(e)]) from None
    located = Located(str(path))
    if path.suffix.lower() == ".json":
        try:
            value = load_json(text, str(path), object_pairs_hook=_no_duplicates(path))
        except DocumentError:
            raise
        except ConfigError as e:
            raise DocumentError([str(e)]) from None
        # Lines for the schema's messages: JSON is YAML, so the YAML reader can place them
        # (not always: YAML 1.1 lacks JSON's \/ escape; then the messages name no line).
        with contextlib.suppress(ConfigError):
            located.lines = load_yaml(text, str(path)).where
        return value, located
    try:
        parsed = load_yaml(text, str(path))
    except ConfigError as e:
        raise DocumentError([str(e)]) from None
    if parsed.duplicates:
        raise DocumentError(parsed.duplicates)
    located.lines = parsed.where
    return parsed.value, located


def _no_duplicates(source: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise DocumentError([f"{source}: the key {k!r} is given twice in an object"])
            out[k] = v
        return out

    return build

"""Reading a YAML or JSON file that a user hands the CLI (``clipper apply -f``, a pipeline
description) as untrusted input: a size limit checked before the file is read, no YAML anchors
or aliases, a nesting depth and a node count limit, and every refusal one line naming the file,
the line and column, and what was expected. Never a traceback.

YAML is read from the parser's event stream, iteratively, building plain values (dicts, lists,
scalars) as the events come: PyYAML's composer and constructor recurse once per nesting level
(a 50,000-deep list raised ``RecursionError``) and expand aliases before anything can count
them (a billion-laughs file grew to 5 GB). Here an alias or anchor is refused at its event, a
level past :data:`MAX_DEPTH` at its start, so neither is ever expanded or built. Scalars are
typed as PyYAML's safe loader types them (YAML 1.1: ``yes`` is true, ``1_000`` is 1000).

JSON is parsed by :mod:`json` after a scan of the text (outside strings) for its depth and
node count, since :func:`json.loads` recurses too.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from clipper.errors import ConfigError

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_NODES",
    "Parsed",
    "PathKey",
    "format_path",
    "load_json",
    "load_yaml",
    "read_text",
]

MAX_FILE_BYTES = 4 * 2**20  # a desired state of hundreds of models is tens of KB
MAX_DEPTH = 64  # mappings and lists inside each other; the schema needs 5
MAX_NODES = 100_000  # keys, values, lists and mappings together

PathKey = tuple[str | int, ...]

_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("null", "bool", "int", "float", "str", "binary", "timestamp")
)


def format_path(path: PathKey) -> str:
    """``("applications", 1, "slo_micros")`` -> ``applications[1].slo_micros``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "(the document)"


def read_text(path: Path, max_bytes: int = MAX_FILE_BYTES, *, limit: str = "") -> str:
    """The file's text, refused before it is read when it is larger than ``max_bytes`` (and
    read at most that far: a pipe or ``/dev/zero`` says its size is 0). ``limit`` names the
    setting that raises it, for the message."""
    how = f" ({limit})" if limit else ""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise ConfigError(
                    f"{path}: {size:,} bytes is over the limit of {max_bytes:,}{how}: expected "
                    "a small text file; nothing of it was read"
                )
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise ConfigError(
            f"{path}: more than the limit of {max_bytes:,} bytes{how}: expected a small text file"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(
            f"{path}:{line}:{col}: not UTF-8 text (byte 0x{data[e.start]:02x}): expected a "
            "YAML or JSON text file in UTF-8"
        ) from None


@dataclass(slots=True)
class Parsed:
    """A document's value; where each value in it starts (1-based line and column, by path);
    and the keys given twice in one mapping, each a line (a parser keeps the last silently)."""

    value: Any
    where: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    duplicates: list[str] = field(default_factory=list)


class _Refused(ConfigError):
    """A refusal with its place in the file (turned into one line by the caller)."""

    def __init__(self, mark: Any, message: str) -> None:
        super().__init__(message)
        self.mark = mark
        self.message = message


_UNSET: Any = object()


@dataclass(slots=True)
class _Open:
    """A mapping or list being built, with the key that waits for its value."""

    value: dict[Any, Any] | list[Any]
    path: PathKey
    key: Any = _UNSET
    key_name: str = ""
    seen: dict[str, int] = field(default_factory=dict)  # key -> its line


def load_yaml(
    text: str, source: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES
) -> Parsed:
    """One YAML document's plain value (``None`` when empty); :class:`ConfigError` (one line)
    for a syntax error, an anchor or alias, a tag other than the standard ones, a key that is
    not a plain value, a level past ``max_depth`` or more than ``max_nodes`` nodes."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return _build(yaml.parse(text, Loader=loader), source, max_depth, max_nodes)
    except _Refused as r:
        raise ConfigError(f"{_at(source, r.mark)}: {r.message}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        if "maximum nesting depth" in str(e.problem) and mark is not None:
            # libyaml's own limit (1,000), met while its scanner reads ahead of our walk: the
            # text before it, walked by the pure-Python parser, shows where level 65 starts.
            where = _deep_at_yaml(text, mark, source, max_depth)
            raise ConfigError(f"{where}: {_too_deep(max_depth)}") from None
        what = " ".join(str(p) for p in (e.context, e.problem) if p)
        raise ConfigError(f"{_at(source, mark)}: invalid YAML: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {' '.join(str(e).split())}") from None


def _deep_at_yaml(text: str, mark: Any, source: str, max_depth: int) -> str:
    import yaml

    lines = text.split("\n", mark.line + 1)[: mark.line + 1]
    lines[-1] = lines[-1][: mark.column]
    try:
        _build(yaml.parse("\n".join(lines), Loader=yaml.SafeLoader), source, max_depth, MAX_NODES)
    except _Refused as r:
        return _at(source, r.mark)
    except yaml.YAMLError:
        pass  # the cut text ends mid-document: an error past the place we look for
    return _at(source, mark)


def _too_deep(max_depth: int) -> str:
    return f"nested deeper than {max_depth} levels: expected mappings and lists at most that deep"


def _at(source: str, mark: Any) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source


def _build(events: Any, source: str, max_depth: int, max_nodes: int) -> Parsed:
    import yaml

    resolver = yaml.resolver.Resolver()
    constructor = yaml.constructor.SafeConstructor()
    out = Parsed(None)
    stack: list[_Open] = []
    nodes = documents = 0
    for ev in events:
        if isinstance(ev, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise _Refused(ev.start_mark, "a second YAML document (---): expected one")
            continue
        if not isinstance(ev, yaml.NodeEvent):
            if isinstance(ev, yaml.CollectionEndEvent):
                stack.pop()
            continue
        if isinstance(ev, yaml.AliasEvent):
            raise _Refused(
                ev.start_mark,
                f"a YAML alias (*{ev.anchor}) is not accepted: an alias can expand a small "
                "file into gigabytes; expected the value written out where it is used",
            )
        if ev.anchor is not None:
            raise _Refused(
                ev.start_mark,
                f"a YAML anchor (&{ev.anchor}) is not accepted (aliases are not either): "
                "expected the value written out where it is used",
            )
        nodes += 1
        if nodes > max_nodes:
            raise _Refused(
                ev.start_mark, f"more than {max_nodes:,} values: expected a smaller document"
            )
        top = stack[-1] if stack else None
        is_key = top is not None and isinstance(top.value, dict) and top.key is _UNSET
        if isinstance(ev, yaml.ScalarEvent):
            value = _scalar(ev, resolver, constructor)
            if is_key:
                assert top is not None
                try:
                    hash(value)
                except TypeError:
                    raise _Refused(ev.start_mark, "a key must be a plain value") from None
                top.key, top.key_name = value, str(ev.value)
                mark = ev.start_mark
                first = top.seen.get(top.key_name)
                if first is not None:
                    out.duplicates.append(
                        f"{source}:{mark.line + 1}:{mark.column + 1}: "
                        f"{format_path((*top.path, top.key_name))}: given twice (first on "
                        f"line {first})"
                    )
                top.seen[top.key_name] = mark.line + 1
                continue
            _place(out, top, value, ev.start_mark)
            continue
        # A mapping or a list starts.
        if is_key:
            raise _Refused(ev.start_mark, "a key must be a plain value, not a mapping or list")
        mapping = isinstance(ev, yaml.MappingStartEvent)
        if ev.tag not in (None, "!", _MAP if mapping else _SEQ):
            raise _Refused(
                ev.start_mark,
                f"the tag {ev.tag} is not accepted: expected a plain "
                f"{'mapping' if mapping else 'list'}",
            )
        if len(stack) >= max_depth:
            raise _Refused(ev.start_mark, _too_deep(max_depth))
        value = {} if mapping else []
        path = _place(out, top, value, ev.start_mark)
        stack.append(_Open(value, path))
    return out


def _place(out: Parsed, top: _Open | None, value: Any, mark: Any) -> PathKey:
    """Put ``value`` where it belongs (the document, a list's end, the waiting key); its path."""
    if top is None:
        path: PathKey = ()
        out.value = value
    elif isinstance(top.value, list):
        path = (*top.path, len(top.value))
        top.value.append(value)
    else:
        path = (*top.path, top.key_name)
        top.value[top.key] = value
        top.key = _UNSET
    out.where[path] = (mark.line + 1, mark.column + 1)
    return path


def _scalar(ev: Any, resolver: Any, constructor: Any) -> Any:
    import yaml

    tag = ev.tag
    if tag is None or tag == "!":
        tag = resolver.resolve(yaml.ScalarNode, ev.value, ev.implicit)
    if tag not in _SCALAR_TAGS:
        what = "the merge key <<" if tag.endswith(":merge") else f"the tag {tag}"
        raise _Refused(
            ev.start_mark,
            f"{what} is not accepted: expected a plain value (text, a number, true/false, null)",
        )
    node = yaml.ScalarNode(tag, ev.value, ev.start_mark, ev.end_mark, ev.style)
    make: Callable[[Any, Any], Any] = constructor.yaml_constructors[tag]
    try:
        return make(constructor, node)
    except yaml.MarkedYAMLError:
        raise
    except (ValueError, TypeError, OverflowError) as e:  # a date like 2024-13-45
        kind = tag.rsplit(":", 1)[-1]
        raise _Refused(ev.start_mark, f"{ev.value!r} is not a valid {kind}: {e}") from None


# A JSON string (escapes included): its brackets and commas are text, not structure.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def load_json(
    text: str,
    source: str,
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """A JSON document's value; :class:`ConfigError` (one line) for a syntax error, a level
    past ``max_depth`` or more than ``max_nodes`` nodes, checked before it is parsed."""
    bare = _JSON_STRING.sub('""', text)
    brackets = _BRACKETS.sub("", bare)
    if brackets and max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > max_depth:
        line, col = _deep_at(text, max_depth)
        raise ConfigError(
            f"{source}:{line}:{col}: nested deeper than {max_depth} levels: expected objects "
            f"and arrays at most {max_depth} deep"
        )
    # Each value but the document's follows a comma, a colon or an opening bracket.
    nodes = 1 + bare.count(",") + bare.count(":") + bare.count("[") + bare.count("{")
    if nodes > max_nodes:
        raise ConfigError(f"{source}: more than {max_nodes:,} values: expected a smaller document")
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{source}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None


def _deep_at(text: str, max_depth: int) -> tuple[int, int]:
    """Line and column of the first bracket past ``max_depth`` (a walk that stops there)."""
    depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text, re.DOTALL):
        c = m.group()
        if c in ("[", "{"):
            depth += 1
            if depth > max_depth:
                i = m.start()
                return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1
        elif c in ("]", "}"):
            depth -= 1
    return 1, 1

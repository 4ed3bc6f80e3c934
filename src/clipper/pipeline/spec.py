"""A pipeline's description: stages, the references that feed them, and its checks.

A pipeline is a small DAG of stages. Each stage is one model (its current version, through the
same cache and batching queue a single-model query uses) or one application with a selection
policy (its whole query path). A stage's ``input`` is a reference expression:

* ``"$request"``: the query's input; ``"$request.a.0"``: a field (or list index) within it;
* ``"$stage"``: an earlier stage's output; ``"$stage.field"``: a field within it;
* a list or an object: each element or value is itself an expression;
* any other JSON value is a constant; a string that starts with ``$$`` is the text after
  the first ``$`` (``"$$5"`` is the string ``"$5"``).

:func:`parse_pipeline` checks everything that can be checked without the registry (names,
references, cycles, budgets); :func:`check_against` what needs it (models, applications).
Every problem is a :class:`~clipper.errors.RegistryError` naming it: the admin API answers 400.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from clipper.errors import RegistryError

__all__ = [
    "MAX_STAGES",
    "REQUEST",
    "Pipeline",
    "Ref",
    "RegistryView",
    "Stage",
    "check_against",
    "parse_pipeline",
    "refs_in",
]

MAX_STAGES = 32
REQUEST = "request"  # the reserved name of the query's input in references
_STAGE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
_STAGE_KEYS = {"name", "model", "app", "input", "budget", "default", "optional", "fields"}
_PIPELINE_KEYS = {"stages", "output"}
OnMiss = Literal["fail", "default", "drop"]


@dataclass(frozen=True, slots=True)
class Ref:
    """``$source.path...``: ``source`` is ``request`` or a stage name; ``path`` the fields (or
    list indexes) within its value."""

    source: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return "$" + ".".join((self.source, *self.path))


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    model: str | None  # exactly one of model and app
    app: str | None
    input: Any  # a compiled expression: Ref, list, dict[str, expr], or a constant (Const)
    # A share of the query's latency budget in (0, 1], or None for "auto" (observed latency).
    share: float | None
    on_miss: OnMiss
    default: Any
    fields: tuple[str, ...] | None  # the declared fields of its output (None: not declared)
    deps: tuple[str, ...]  # stages its input refers to, in first-mention order

    @property
    def target(self) -> str:
        return f"model '{self.model}'" if self.model is not None else f"application '{self.app}'"


@dataclass(frozen=True, slots=True)
class Const:
    """A constant inside an expression (kept apart from strings that are references)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Pipeline:
    stages: dict[str, Stage]  # in topological order: every stage after those it reads
    output: Any  # compiled expression over stage outputs (and the request)
    sinks: tuple[str, ...]  # stages no other stage reads
    succs: dict[str, tuple[str, ...]]


def _err(msg: str) -> RegistryError:
    return RegistryError(f"invalid pipeline: {msg}")


def _compile(expr: Any, where: str) -> Any:
    """A JSON expression with its references parsed (see the module doc)."""
    if isinstance(expr, str):
        if expr.startswith("$$"):
            return Const(expr[1:])
        if expr.startswith("$"):
            parts = expr[1:].split(".")
            if not parts[0] or any(not p for p in parts):
                raise _err(
                    f"{where}: reference {expr!r} is malformed: write $request, $stage or "
                    "$stage.field.subfield (a field may be a list index)"
                )
            return Ref(parts[0], tuple(parts[1:]))
        return Const(expr)
    if isinstance(expr, list):
        return [_compile(e, where) for e in expr]
    if isinstance(expr, dict):
        for k in expr:
            if not isinstance(k, str):
                raise _err(f"{where}: object keys must be strings")
        return {k: _compile(v, where) for k, v in expr.items()}
    if expr is None or isinstance(expr, bool | int | float):
        return Const(expr)
    raise _err(f"{where}: {type(expr).__name__} is not a JSON value")


def refs_in(expr: Any) -> Iterator[Ref]:
    if isinstance(expr, Ref):
        yield expr
    elif isinstance(expr, list):
        for e in expr:
            yield from refs_in(e)
    elif isinstance(expr, dict):
        for e in expr.values():
            yield from refs_in(e)


def _stage(doc: Any, i: int) -> Stage:
    if not isinstance(doc, dict):
        raise _err(f"stage #{i + 1} must be an object, got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not _STAGE_NAME.match(name) or name == REQUEST:
        raise _err(
            f"stage #{i + 1} has name {name!r}: a stage name is letters, digits, '_' or '-' "
            f"(starting with a letter or '_', at most 63 characters), and not '{REQUEST}'"
        )
    where = f"stage '{name}'"
    unknown = sorted(set(doc) - _STAGE_KEYS)
    if unknown:
        raise _err(f"{where} has unknown keys {unknown}; expected {sorted(_STAGE_KEYS)}")
    model, app = doc.get("model"), doc.get("app")
    if (model is None) == (app is None):
        raise _err(f"{where} must name exactly one of 'model' (a model) or 'app' (an "
                   "application with a selection policy)")  # fmt: skip
    for key, value in (("model", model), ("app", app)):
        if value is not None and (not isinstance(value, str) or not value):
            raise _err(f"{where}: '{key}' must be a non-empty string")
    budget = doc.get("budget", "auto")
    share: float | None
    if budget == "auto":
        share = None
    elif isinstance(budget, int | float) and not isinstance(budget, bool) and 0 < budget <= 1:
        share = float(budget)
    else:
        raise _err(
            f'{where}: budget must be "auto" or a share of the latency SLO in (0, 1], '
            f"got {budget!r}"
        )
    optional = doc.get("optional", False)
    if not isinstance(optional, bool):
        raise _err(f"{where}: 'optional' must be true or false")
    if optional and "default" in doc:
        raise _err(
            f"{where} has both 'default' and 'optional': a stage that misses its budget "
            "either answers its default (degraded) or is dropped, not both"
        )
    on_miss: OnMiss = "default" if "default" in doc else "drop" if optional else "fail"
    fields = doc.get("fields")
    if fields is not None:
        if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
            raise _err(f"{where}: 'fields' must be a list of non-empty strings")
        fields = tuple(fields)
    expr = _compile(doc.get("input", "$" + REQUEST), f"{where} input")
    deps = tuple(dict.fromkeys(r.source for r in refs_in(expr) if r.source != REQUEST))
    return Stage(
        name=name,
        model=model,
        app=app,
        input=expr,
        share=share,
        on_miss=on_miss,
        default=doc.get("default"),
        fields=fields,
        deps=deps,
    )


def _check_refs(expr: Any, stages: Mapping[str, Stage], where: str) -> None:
    for ref in refs_in(expr):
        if ref.source == REQUEST:
            continue
        stage = stages.get(ref.source)
        if stage is None:
            raise _err(
                f"{where} refers to {ref}, but there is no stage '{ref.source}' (stages: "
                f"{', '.join(stages)}; the query's input is ${REQUEST})"
            )
        if ref.path and stage.fields is not None and ref.path[0] not in stage.fields:
            raise _err(
                f"{where} refers to {ref}, but stage '{ref.source}' declares only the fields "
                f"{list(stage.fields)}"
            )


def _topological(stages: dict[str, Stage]) -> list[str]:
    """The stages, each after those it reads; a cycle is named in the error."""
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> None:
        mark = state.get(name)
        if mark == 2:
            return
        if mark == 1:
            cycle = [*path[path.index(name) :], name]
            raise _err(f"stages form a cycle: {' -> '.join(cycle)} (each reads the next's output)")
        state[name] = 1
        path.append(name)
        for dep in stages[name].deps:
            visit(dep)
        path.pop()
        state[name] = 2
        order.append(name)

    for name in stages:
        visit(name)
    return order


def _check_shares(order: list[str], stages: dict[str, Stage]) -> None:
    """Static shares on one path from a first stage to a last one sum to at most 1."""
    best: dict[str, tuple[float, tuple[str, ...]]] = {}  # stage -> heaviest path ending there
    for name in order:
        s = stages[name]
        prev = max((best[d] for d in s.deps), key=lambda b: b[0], default=(0.0, ()))
        total = prev[0] + (s.share or 0.0)
        best[name] = (total, (*prev[1], name))
        if total > 1.0 + 1e-9:
            shares = " + ".join(
                f"{n} {stages[n].share:g}" for n in best[name][1] if stages[n].share
            )
            raise _err(
                f"budgets do not add up: the static shares on the path "
                f"{' -> '.join(best[name][1])} sum to {total:g} ({shares}), more than the "
                "whole latency SLO (1)"
            )


def parse_pipeline(doc: Any) -> Pipeline:
    """A pipeline description (see the module doc and docs/pipelines.md), checked."""
    if not isinstance(doc, dict):
        raise _err(f"a pipeline is an object with 'stages', got {type(doc).__name__}")
    unknown = sorted(set(doc) - _PIPELINE_KEYS)
    if unknown:
        raise _err(f"unknown keys {unknown}; expected {sorted(_PIPELINE_KEYS)}")
    docs = doc.get("stages")
    if not isinstance(docs, list) or not docs:
        raise _err("'stages' must be a non-empty list of stage objects")
    if len(docs) > MAX_STAGES:
        raise _err(f"{len(docs)} stages; at most {MAX_STAGES} are allowed")
    by_name: dict[str, Stage] = {}
    for i, d in enumerate(docs):
        stage = _stage(d, i)
        if stage.name in by_name:
            raise _err(f"duplicate stage name '{stage.name}' (stage names are unique)")
        by_name[stage.name] = stage
    for stage in by_name.values():
        _check_refs(stage.input, by_name, f"stage '{stage.name}' input")
    order = _topological(by_name)
    _check_shares(order, by_name)
    succs: dict[str, list[str]] = {name: [] for name in order}
    for name in order:
        for dep in by_name[name].deps:
            succs[dep].append(name)
    sinks = tuple(name for name in order if not succs[name])
    if "output" in doc:
        output = _compile(doc["output"], "output")
        _check_refs(output, by_name, "output")
    elif len(sinks) == 1:
        output = Ref(sinks[0], ())
    else:
        output = {name: Ref(name, ()) for name in sinks}
    return Pipeline(
        stages={name: by_name[name] for name in order},
        output=output,
        sinks=sinks,
        succs={name: tuple(v) for name, v in succs.items()},
    )


class _AppView(Protocol):
    @property
    def pipeline(self) -> object: ...


class RegistryView(Protocol):
    """What :func:`check_against` reads of the registry (a :class:`clipper.registry.Registry`
    is one): model names, applications (whether each is a pipeline) and their links."""

    @property
    def models(self) -> Mapping[str, object]: ...

    @property
    def apps(self) -> Mapping[str, _AppView]: ...

    @property
    def links(self) -> Mapping[str, Sequence[str]]: ...


def check_against(app_name: str, pipeline: Pipeline, registry: RegistryView) -> None:
    """The models and applications the stages name exist (in ``registry``, the draft of the
    change), and no stage's application is itself a pipeline."""
    for stage in pipeline.stages.values():
        if stage.model is not None and stage.model not in registry.models:
            raise _err(
                f"stage '{stage.name}' names model '{stage.model}', which does not exist"
                " (deploy or register it first)"
            )
        if stage.app is not None:
            app = registry.apps.get(stage.app)
            if app is None:
                raise _err(f"stage '{stage.name}' names application '{stage.app}', which does "
                           "not exist")  # fmt: skip
            if stage.app == app_name or app.pipeline is not None:
                raise _err(
                    f"stage '{stage.name}' names application '{stage.app}', which is a "
                    "pipeline: a stage is a model or an application with a selection policy"
                )
    if registry.links.get(app_name):
        raise _err(
            f"application '{app_name}' has linked models {registry.links[app_name]}: a "
            "pipeline's models are named by its stages; unlink them first"
        )

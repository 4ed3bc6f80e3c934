"""The desired-state file's schema: applications (pipelines included), models with their
versions (batching, autoscaling), each model's traffic split and shadow, links, and tenants
with their class and quotas (their API keys are secrets made by ``clipper tenant key``, never
in a file).

::

    applications:
      - name: digits
        input_type: doubles
        default_output: "-1"          # JSON text, or any value (written as JSON)
        slo_micros: 20000
        models: [logreg]              # the linked models (omit: leave the links alone)
    models:
      - name: logreg
        input_type: doubles
        current: "2"                  # default: the last version listed
        split: {"1": 90, "2": 10}     # omit: no split (the current version answers)
        shadow: {version: "3", share: 0.1}   # omit: no shadow
        versions:
          - version: "1"
            artifact: models/logreg-1.joblib   # relative to this file
            replicas: 2
          - version: "2"
            artifact: models/logreg-2          # an artifact directory
            batching: {controller: aimd, max_wait_micros: 500}
            autoscale: {min_replicas: 1, max_replicas: 4}   # omit: replicas as given
          - version: "3"
            artifact: models/logreg-3.joblib
    tenants:
      - name: team-a
        priority: critical            # critical, standard (the default) or sheddable
        quotas: {"*": {rate: 100, burst: 200}, digits: {rate: 20, burst: 40}}

Every value is checked with the same rules the frontend applies (names, SLO range, policies
and their parameters, batching), so a file that parses here fails on the frontend only for what
depends on its state. All problems are reported at once, each with its path and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from clipper.artifact_digest import is_digest
from clipper.config import BatchingConfig
from clipper.declarative.document import DocumentError, Located, PathKey, load_document
from clipper.errors import ClipperError, RegistryError
from clipper.inputs import InputType
from clipper.registry import Application, check_name
from clipper.rollout import Rollout, Shadow
from clipper.scaling import AutoscaleConfig
from clipper.tenants import PriorityClass, Tenant, quotas_from_doc
from clipper.untrusted import MAX_FILE_BYTES

__all__ = [
    "APP_DEFAULTS",
    "AUTOSCALE_DEFAULTS",
    "EXTERNAL_CONTAINER",
    "AppSpec",
    "DesiredState",
    "ModelSpec",
    "TenantSpec",
    "VersionSpec",
    "read_desired_state",
]

_TOP_KEYS = ("applications", "models", "tenants")
_TENANT_KEYS = ("name", "priority", "quotas")
# An application's settings are its record's fields (registry.Application.to_record), so a
# setting added there is declared, compared and exported without a change here; those below are
# typed here for a message with the path (the others are checked by Application itself).
# Record field -> its key in the file.
APP_REQUIRED = {
    "name": "name",
    "input_type": "input_type",
    "default_output": "default_output",
    "latency_slo_micros": "slo_micros",
}
APP_DEFAULTS: dict[str, Any] = {
    k: v
    for k, v in Application("d", InputType.DOUBLES, "null", 1).to_record().items()
    if k not in APP_REQUIRED
} | {"require_key": False}  # in an application's record only when set
_APP_TYPES: dict[str, type] = {
    "cache": bool, "overload": str, "policy": str, "policy_params": dict,
    "min_confidence": float, "loss": str, "loss_scale": float, "online_learning": bool,
    "require_key": bool,
}  # fmt: skip
_APP_KEYS = (*APP_REQUIRED.values(), *APP_DEFAULTS, "pipeline", "models")
_MODEL_KEYS = ("name", "input_type", "current", "split", "sticky", "shadow", "versions")
_VERSION_KEYS = (
    "version", "artifact", "replicas", "batching", "labels", "input_type", "container_name",
    "source_sha256", "autoscale", "pooled",
)  # fmt: skip
# The autoscaling settings a file gives (owner is the frontend that applies them).
AUTOSCALE_DEFAULTS: dict[str, Any] = AutoscaleConfig().to_record()
_AUTOSCALE_KEYS = tuple(k for k in AUTOSCALE_DEFAULTS if k != "owner")
_BATCHING_KEYS = tuple(f.name for f in fields(BatchingConfig))
# What the original add_model registers for containers started elsewhere.
EXTERNAL_CONTAINER = "NO_CONTAINER"


@dataclass(frozen=True, slots=True)
class AppSpec:
    path: PathKey
    app: Application
    links: list[str] | None  # None: the file leaves the links as they are

    @property
    def name(self) -> str:
        return self.app.name


@dataclass(frozen=True, slots=True)
class VersionSpec:
    path: PathKey
    model: str
    version: str
    input_type: InputType
    labels: tuple[str, ...]
    artifact: Path | None  # None: containers started elsewhere dial in (the original add_model)
    container_name: str | None
    batching: BatchingConfig
    replicas: int
    # The digest of the file the artifact was packaged from (``clipper export`` writes it), so
    # that a file naming that original file recognises the version on any frontend.
    source_sha256: str | None = None
    # Autoscaling (None: replicas as given); while enabled the autoscaler owns the count.
    autoscale: AutoscaleConfig | None = None
    # Served from a pool process, loaded on demand (docs/density.md).
    pooled: bool = False


@dataclass(frozen=True, slots=True)
class ModelSpec:
    path: PathKey
    name: str
    current: str
    versions: list[VersionSpec]
    # Its split and shadow (empty: none).
    rollout: Rollout | None = None


@dataclass(frozen=True, slots=True)
class TenantSpec:
    path: PathKey
    tenant: Tenant


@dataclass(frozen=True, slots=True)
class DesiredState:
    source: Path
    located: Located
    apps: list[AppSpec]
    models: list[ModelSpec]
    tenants: list[TenantSpec] = field(default_factory=list)


class _Reader:
    """Checks values, collecting every problem with its path and line."""

    def __init__(self, located: Located) -> None:
        self.located = located
        self.problems: list[str] = []

    def fail(self, path: PathKey, message: str) -> None:
        self.problems.append(self.located.problem(path, message))

    def mapping(self, value: Any, path: PathKey, keys: tuple[str, ...]) -> dict[str, Any] | None:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping with {', '.join(keys)}, got {_kind(value)}")
            return None
        for key in value:
            if key not in keys:
                self.fail((*path, str(key)), f"unknown key (expected one of: {', '.join(keys)})")
        return value

    def items(self, doc: dict[str, Any], key: str, path: PathKey) -> list[Any]:
        value = doc.get(key, [])
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail((*path, key), f"expected a list, got {_kind(value)}")
            return []
        return value

    def name(self, doc: dict[str, Any], key: str, path: PathKey, kind: str) -> str | None:
        """A name or version: a string, or an integer (``version: 2``) taken as its text."""
        value = doc.get(key)
        if value is None:
            self.fail((*path, key) if key in doc else path, f"{key} is required")
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            hint = (
                " (quote it: a version like 1.10 is read as the number 1.1)"
                if isinstance(value, float)
                else ""
            )
            self.fail((*path, key), f"expected a string, got {_kind(value)}{hint}")
            return None
        text = str(value)
        try:
            check_name(kind, text)
        except ClipperError as e:
            self.fail((*path, key), str(e))
            return None
        return text

    def typed(self, doc: dict[str, Any], key: str, path: PathKey, want: type, default: Any) -> Any:
        value = doc.get(key, default)
        if value is default:
            return value
        ok = isinstance(value, want) and not (isinstance(value, bool) and want is not bool)
        if want is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            self.fail((*path, key), f"expected {want.__name__}, got {_kind(value)}")
            return default
        return float(value) if want is float else value

    def input_type(self, value: Any, path: PathKey) -> InputType | None:
        try:
            return InputType.parse(str(value))
        except ValueError as e:
            self.fail(path, str(e))
            return None


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {value!r}"
    return f"{type(value).__name__} {value!r}"


def read_desired_state(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> DesiredState:
    """Parse and check ``path`` (refused unread when larger than ``max_bytes``);
    :class:`DocumentError` lists every problem."""
    value, located = load_document(path, max_bytes=max_bytes)
    r = _Reader(located)
    doc = r.mapping(value if value is not None else {}, (), _TOP_KEYS) or {}
    apps = [a for i, v in enumerate(r.items(doc, "applications", ())) if (a := _app(r, v, i))]
    models = [m for i, v in enumerate(r.items(doc, "models", ())) if (m := _model(r, v, i, path))]
    _unique(r, [(a.path, a.name) for a in apps], "application")
    _unique(r, [(m.path, m.name) for m in models], "model")
    tenants = [t for i, v in enumerate(r.items(doc, "tenants", ())) if (t := _tenant(r, v, i))]
    _unique(r, [(t.path, t.tenant.name) for t in tenants], "tenant")
    if r.problems:
        raise DocumentError(r.problems)
    return DesiredState(path, located, apps, models, tenants)


def _tenant(r: _Reader, value: Any, i: int) -> TenantSpec | None:
    path: PathKey = ("tenants", i)
    doc = r.mapping(value, path, _TENANT_KEYS)
    if doc is None:
        return None
    name = r.name(doc, "name", path, "tenant")
    if name is None:
        return None
    try:
        priority = PriorityClass.parse(doc.get("priority", "standard"))
        quotas = quotas_from_doc(doc.get("quotas") or {})
        return TenantSpec(path, Tenant(name, priority, quotas))
    except RegistryError as e:
        r.fail(path, str(e))
        return None


def _unique(r: _Reader, named: list[tuple[PathKey, str]], kind: str) -> None:
    seen: dict[str, PathKey] = {}
    for path, name in named:
        if name in seen:
            r.fail((*path, "name"), f"{kind} {name!r} is declared twice")
        seen[name] = path


def _app(r: _Reader, value: Any, i: int) -> AppSpec | None:
    path: PathKey = ("applications", i)
    doc = r.mapping(value, path, _APP_KEYS)
    if doc is None:
        return None
    name = r.name(doc, "name", path, "application")
    itype = None
    if "input_type" not in doc:
        r.fail(path, "input_type is required")
    else:
        itype = r.input_type(doc["input_type"], (*path, "input_type"))
    if "default_output" not in doc:
        r.fail(path, 'default_output is required (JSON text, e.g. "-1")')
    default = doc.get("default_output")
    default_text = default if isinstance(default, str) else orjson.dumps(default).decode()
    slo = doc.get("slo_micros")
    if slo is None:
        r.fail(path, "slo_micros is required (the latency objective in microseconds)")
    elif isinstance(slo, bool) or not isinstance(slo, int) or not 1 <= slo <= 2**31 - 1:
        r.fail((*path, "slo_micros"), f"expected a positive 32-bit integer, got {_kind(slo)}")
        slo = None
    options = {
        key: r.typed(doc, key, path, _APP_TYPES[key], default)
        if key in _APP_TYPES
        else doc.get(key, default)
        for key, default in APP_DEFAULTS.items()
    }
    pipeline = doc.get("pipeline")
    if pipeline is not None and not isinstance(pipeline, dict):
        r.fail(
            (*path, "pipeline"), f"expected a mapping (docs/pipelines.md), got {_kind(pipeline)}"
        )
        pipeline = None
    links: list[str] | None = None
    if "models" in doc:
        raw = doc["models"]
        if raw is None:
            raw = []
        if not isinstance(raw, list) or not all(isinstance(m, str) for m in raw):
            r.fail((*path, "models"), f"expected a list of model names, got {_kind(raw)}")
        else:
            links = list(raw)
            if len(set(links)) != len(links):
                r.fail((*path, "models"), "a model is listed twice")
    if name is None or itype is None or slo is None:
        return None
    record = {
        "name": name, "input_type": itype.readable, "default_output": default_text,
        "latency_slo_micros": slo, **options,
    } | ({} if pipeline is None else {"pipeline": pipeline})  # fmt: skip
    try:
        app = Application.from_record(record)
    except (ClipperError, TypeError, ValueError) as e:
        r.fail(path, str(e))
        return None
    if links is not None and app.policy == "single" and len(links) > 1:
        r.fail(
            (*path, "models"),
            f"policy single links at most one model, got {len(links)}: choose a selection "
            "policy (e.g. policy: exp3) to link several",
        )
    return AppSpec(path, app, links)


def _model(r: _Reader, value: Any, i: int, source: Path) -> ModelSpec | None:
    path: PathKey = ("models", i)
    doc = r.mapping(value, path, _MODEL_KEYS)
    if doc is None:
        return None
    name = r.name(doc, "name", path, "model")
    itype = r.input_type(doc["input_type"], (*path, "input_type")) if "input_type" in doc else None
    raw = r.items(doc, "versions", path)
    if not raw:
        r.fail(path, "versions is required: at least one version")
    versions = []
    for j, item in enumerate(raw):
        where: PathKey = (*path, "versions", j)
        v = _version(r, item, where, model=name, model_type=itype, source=source)
        if v is not None:
            versions.append(v)
    _unique(r, [(v.path, v.version) for v in versions], f"version of {name}")
    current = versions[-1].version if versions else None
    if "current" in doc:
        current = r.name(doc, "current", path, "version")
        if current is not None and versions and current not in {v.version for v in versions}:
            r.fail((*path, "current"), f"{current!r} is not one of the versions listed")
    if name is None or not versions or current is None:
        return None
    rollout = _rollout(r, doc, path, name, {v.version for v in versions})
    return ModelSpec(path, name, current, versions, rollout)


def _rollout(
    r: _Reader, doc: dict[str, Any], path: PathKey, name: str, listed: set[str]
) -> Rollout | None:
    split = doc.get("split")
    if split is not None and not isinstance(split, dict):
        r.fail((*path, "split"), f"expected a mapping {{version: weight}}, got {_kind(split)}")
        return None
    sticky = r.typed(doc, "sticky", path, bool, False)
    shadow = None
    raw = doc.get("shadow")
    if raw is not None:
        sd = r.mapping(raw, (*path, "shadow"), ("version", "share"))
        if sd is None:
            return None
        version = r.name(sd, "version", (*path, "shadow"), "version")
        share = r.typed(sd, "share", (*path, "shadow"), float, 1.0)
        if version is None:
            return None
        if version not in listed:
            r.fail((*path, "shadow", "version"), f"{version!r} is not one of the versions listed")
        shadow = Shadow(version, share)
    for v in split or {}:
        if str(v) not in listed:
            r.fail((*path, "split", str(v)), f"{str(v)!r} is not one of the versions listed")
    try:
        rollout = Rollout.build(name, split, sticky=sticky, shadow=shadow)
    except ClipperError as e:
        r.fail((*path, "split" if split else "shadow"), str(e))
        return None
    return None if rollout.empty and not rollout.sticky else rollout


def _version(
    r: _Reader,
    value: Any,
    path: PathKey,
    *,
    model: str | None,
    model_type: InputType | None,
    source: Path,
) -> VersionSpec | None:
    doc = r.mapping(value, path, _VERSION_KEYS)
    if doc is None:
        return None
    version = r.name(doc, "version", path, "version")
    itype = model_type
    if "input_type" in doc:
        itype = r.input_type(doc["input_type"], (*path, "input_type"))
    elif model_type is None:
        r.fail(path, "input_type is required (on the model or on each version)")
    labels = doc.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        r.fail((*path, "labels"), f"expected a list of strings, got {_kind(labels)}")
        labels = []
    autoscale = _autoscale(r, doc.get("autoscale"), (*path, "autoscale"))
    if doc.get("pooled") is True and autoscale is None:
        # As the frontend deploys a pooled version: from zero, at most one (docs/density.md).
        autoscale = AutoscaleConfig(min_replicas=0, max_replicas=1)
    # An autoscaled version starts at its minimum; the autoscaler moves it from there.
    start = autoscale.min_replicas if autoscale is not None and autoscale.enabled else 1
    replicas = doc.get("replicas", start)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        r.fail((*path, "replicas"), f"expected an integer >= 0, got {_kind(replicas)}")
        replicas = 1
    artifact: Path | None = None
    container: str | None = None
    if doc.get("artifact") is not None:
        if not isinstance(doc["artifact"], str):
            r.fail((*path, "artifact"), f"expected a path, got {_kind(doc['artifact'])}")
        else:
            artifact = (source.parent / Path(doc["artifact"]).expanduser()).resolve()
            if not artifact.exists():
                r.fail((*path, "artifact"), f"{artifact}: no such file or directory")
        if "container_name" in doc:
            r.fail((*path, "container_name"), "only for a version without an artifact")
    else:
        container = r.typed(doc, "container_name", path, str, EXTERNAL_CONTAINER)
        if autoscale is not None and autoscale.enabled:
            r.fail(
                (*path, "autoscale"),
                "only replicas clipper-serve starts can be autoscaled: give an artifact",
            )
        if replicas:
            r.fail(
                (*path, "replicas"),
                "a version without an artifact runs no replicas here (its containers are "
                "started elsewhere): give an artifact, or replicas: 0",
            )
    source_sha256 = doc.get("source_sha256")
    if source_sha256 is not None and (artifact is None or not is_digest(source_sha256)):
        r.fail(
            (*path, "source_sha256"),
            "expected the SHA-256 (lowercase hex) of the file the artifact was made from",
        )
        source_sha256 = None
    batching = _batching(r, doc.get("batching"), (*path, "batching"))
    pooled = r.typed(doc, "pooled", path, bool, False)
    if pooled and artifact is None:
        r.fail((*path, "pooled"), "a pool process loads the model from its artifact: give one")
    if model is None or version is None or itype is None or batching is None:
        return None
    return VersionSpec(
        path, model, version, itype, tuple(labels), artifact, container, batching, replicas,
        source_sha256, autoscale, pooled,
    )  # fmt: skip


def _autoscale(r: _Reader, value: Any, path: PathKey) -> AutoscaleConfig | None:
    if value is None:
        return None
    doc = r.mapping(value, path, _AUTOSCALE_KEYS)
    if doc is None:
        return None
    try:
        return AutoscaleConfig().updated(**{k: v for k, v in doc.items() if k in _AUTOSCALE_KEYS})
    except (ClipperError, TypeError) as e:
        r.fail(path, str(e))
        return None


def _batching(r: _Reader, value: Any, path: PathKey) -> BatchingConfig | None:
    if value is None:
        return BatchingConfig()
    doc = r.mapping(value, path, _BATCHING_KEYS)
    if doc is None:
        return None
    try:
        return BatchingConfig(**doc)
    except (ClipperError, TypeError) as e:
        r.fail(path, str(e))
        return None

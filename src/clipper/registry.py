"""Applications, model versions, links and version changes under way: the in-process registry.

Data only, no I/O. The registry is a view of the config store: the write side validates a change
on a :meth:`Registry.copy`, commits the difference to the store, and only then makes the registry
equal to the copy with :meth:`Registry.apply_snapshot` — the same call that applies another
frontend's changes and the snapshot loaded at start-up. Every difference is announced to
listeners as a :class:`Change`: the seam where the runtime (queues, replicas) attaches.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

import orjson

from clipper.choices import LOSSES, ON_MODEL_ERROR, OVERLOAD, OnModelError, Overload
from clipper.config import BatchingConfig
from clipper.errors import ClipperError, RegistryError
from clipper.inputs import InputType
from clipper.pipeline.spec import Pipeline, check_against, parse_pipeline
from clipper.rollout import Rollout
from clipper.rpc.wire import embed_output
from clipper.scaling import AutoscaleConfig
from clipper.tenants import MAX_TENANTS, Tenant

__all__ = [
    "GONE",
    "Application",
    "Change",
    "Intent",
    "ModelVersion",
    "Registry",
]

log = logging.getLogger("clipper.registry")

# Snapshot of the registry as store records: kind -> key -> JSON value.
Records = dict[str, dict[str, Any]]
# In a delta (Registry.apply_delta): the key was deleted.
GONE: Any = type("Gone", (), {"__repr__": lambda self: "GONE"})()

_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")


def check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise RegistryError(
            f"invalid {kind} name {name!r}: use letters, digits, '.', '_' or '-' "
            "(starting and ending with a letter or digit, at most 128 characters)"
        )


@dataclass(frozen=True, slots=True)
class Application:
    name: str
    input_type: InputType
    default_output: str
    latency_slo_micros: int
    cache: bool = True
    # What to do with a query that cannot meet its deadline: answer the default output at once,
    # or reject it with 503 so that a client with its own fallback can retry elsewhere.
    overload: Overload = "default"
    # A query a model raised on: an error for the client, or the default output (docs/
    # query-api.md); "auto" is each protocol's convention (V2: error, Clipper REST: default).
    on_model_error: OnModelError = "auto"
    # The model selection layer: which linked models answer a query and how their outputs
    # combine ("single" is the original: one model). Its state learns from feedback, scored
    # by `loss` ("0/1", "squared", "absolute"; `loss_scale` is where a loss saturates).
    policy: str = "single"
    policy_params: dict[str, Any] = field(default_factory=dict)
    min_confidence: float = 0.0
    loss: str = "0/1"
    loss_scale: float = 1.0
    # Send feedback on to models whose containers implement update(inputs, labels).
    online_learning: bool = False
    # A pipeline of stages instead of linked models (docs/pipelines.md): its description as
    # given (JSON), and parsed.
    pipeline: dict[str, Any] | None = None
    # Queries without an API key are refused with 401 (clipper.tenants).
    require_key: bool = False
    default_value: Any = field(default=None, compare=False)
    stages: Pipeline | None = field(default=None, init=False, compare=False, repr=False)
    # Derived once: read several times per query on the hot path.
    slo_s: float = field(default=0.0, init=False, compare=False, repr=False)
    # How long before its deadline a query is answered with what it has: the answer still has
    # to be written and reach the client, and a timer on a busy loop fires late. 10% of the
    # SLO, at most 2 ms.
    answer_margin_s: float = field(default=0.0, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_name("application", self.name)
        if not isinstance(self.latency_slo_micros, int) or not (
            1 <= self.latency_slo_micros <= 2**31 - 1
        ):
            raise RegistryError(
                "latency_slo_micros must be a positive 32-bit integer, "
                f"got {self.latency_slo_micros!r}"
            )
        if not isinstance(self.default_output, str):
            raise RegistryError("default_output must be a string (JSON text is embedded as JSON)")
        if self.overload not in OVERLOAD:
            raise RegistryError(OVERLOAD.unknown(self.overload))
        if self.on_model_error not in ON_MODEL_ERROR:
            raise RegistryError(ON_MODEL_ERROR.unknown(self.on_model_error))
        if not 0.0 <= self.min_confidence <= 1.0:
            raise RegistryError(f"min_confidence must be in [0, 1], got {self.min_confidence!r}")
        if self.loss not in LOSSES:
            raise RegistryError(f"loss must be 0/1, squared or absolute, got {self.loss!r}")
        if not self.loss_scale > 0:
            raise RegistryError(f"loss_scale must be > 0, got {self.loss_scale!r}")
        from clipper.selection import make_policy  # the policy's own checks name bad params

        weights = self.policy_params.get("weights")
        # Checked against stand-in models: the linked ones are not known yet (ab_split's
        # weights name them, so they stand in for themselves).
        models = [str(m) for m in weights] if isinstance(weights, dict) and weights else ["m"]
        try:
            make_policy(self.policy, models, **self.policy_params)
        except ClipperError as e:
            raise RegistryError(str(e)) from None
        if self.pipeline is not None:
            if self.policy != "single":
                raise RegistryError(
                    "a pipeline application has policy single: a stage that selects among "
                    "models names an application with that policy"
                )
            try:  # a copy of its own: the caller's dict may change after this
                doc = orjson.loads(orjson.dumps(self.pipeline))
            except (TypeError, orjson.JSONEncodeError) as e:
                raise RegistryError(f"invalid pipeline: not JSON ({e})") from None
            object.__setattr__(self, "pipeline", doc)
            object.__setattr__(self, "stages", parse_pipeline(doc))
        object.__setattr__(self, "default_value", embed_output(self.default_output))
        slo_s = self.latency_slo_micros / 1e6
        object.__setattr__(self, "slo_s", slo_s)
        object.__setattr__(self, "answer_margin_s", min(0.1 * slo_s, 0.002))

    def to_record(self) -> dict[str, Any]:
        return (
            {
                "name": self.name,
                "input_type": self.input_type.readable,
                "default_output": self.default_output,
                "latency_slo_micros": self.latency_slo_micros,
                "cache": self.cache,
                "overload": self.overload,
                "on_model_error": self.on_model_error,
                "policy": self.policy,
                "policy_params": dict(self.policy_params),
                "min_confidence": self.min_confidence,
                "loss": self.loss,
                "loss_scale": self.loss_scale,
                "online_learning": self.online_learning,
            }
            | ({} if self.pipeline is None else {"pipeline": self.pipeline})
            | ({"require_key": True} if self.require_key else {})
        )

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Application:
        return cls(
            name=r["name"],
            input_type=InputType.parse(r["input_type"]),
            default_output=r["default_output"],
            latency_slo_micros=int(r["latency_slo_micros"]),
            cache=bool(r.get("cache", True)),
            overload=r.get("overload", "default"),
            on_model_error=r.get("on_model_error", "auto"),
            policy=r.get("policy", "single"),
            policy_params=dict(r.get("policy_params", {})),
            min_confidence=float(r.get("min_confidence", 0.0)),
            loss=r.get("loss", "0/1"),
            loss_scale=float(r.get("loss_scale", 1.0)),
            online_learning=bool(r.get("online_learning", False)),
            pipeline=r.get("pipeline"),
            require_key=bool(r.get("require_key", False)),
        )


@dataclass(frozen=True, slots=True)
class ModelVersion:
    name: str
    version: str
    input_type: InputType
    labels: tuple[str, ...] = ()
    # A cloudpickle file with a function or an object with predict(); None for containers that
    # someone else starts (they dial in to the RPC port, as in the original).
    artifact: str | None = None
    container_name: str = "clipper-serve/python"
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    num_replicas: int = 1
    # Runs even when it is not the model's current version (deployed with set_current=False,
    # or kept after a switch with retire_previous=False): for queries that pin it.
    keep: bool = False
    # Replicas driven by the autoscaler between bounds (None: num_replicas as set).
    autoscale: AutoscaleConfig | None = None
    # Served from a shared pool process (loaded on demand, LRU-evicted within its memory
    # budget) instead of a process of its own: docs/density.md.
    pooled: bool = False

    def __post_init__(self) -> None:
        check_name("model", self.name)
        if not isinstance(self.pooled, bool):
            raise RegistryError(f"pooled must be true or false, got {self.pooled!r}")
        check_name("version", self.version)
        if self.num_replicas < 0:
            raise RegistryError(f"num_replicas must be >= 0, got {self.num_replicas}")

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)

    def to_record(self) -> dict[str, Any]:
        record = {
            "name": self.name,
            "version": self.version,
            "input_type": self.input_type.readable,
            "labels": list(self.labels),
            "artifact": self.artifact,
            "container_name": self.container_name,
            "batching": self.batching.to_dict(),
            "num_replicas": self.num_replicas,
            "keep": self.keep,
        }
        if self.autoscale is not None:  # absent, not null: older records stay equal
            record["autoscale"] = self.autoscale.to_record()
        if self.pooled:  # absent unless set, as autoscale
            record["pooled"] = True
        return record

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> ModelVersion:
        return cls(
            name=r["name"],
            version=r["version"],
            input_type=InputType.parse(r["input_type"]),
            labels=tuple(r.get("labels", ())),
            artifact=r.get("artifact"),
            container_name=r.get("container_name", "clipper-serve/python"),
            batching=BatchingConfig(**r.get("batching", {})),
            num_replicas=int(r.get("num_replicas", 1)),
            keep=bool(r.get("keep", False)),
            autoscale=(
                AutoscaleConfig.from_record(r["autoscale"])
                if r.get("autoscale") is not None
                else None
            ),
            pooled=r.get("pooled", False),
        )


@dataclass(frozen=True, slots=True)
class Intent:
    """A version change under way, recorded before it starts: switch ``name`` to ``version``
    (``added``: the change registered that version). A frontend that crashed with it unfinished
    rolls it back on start-up; ``owner`` is the frontend's node id, so that on a shared store
    each frontend recovers only its own."""

    name: str
    version: str
    previous: str | None
    added: bool
    owner: str

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "previous": self.previous,
            "added": self.added,
            "owner": self.owner,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Intent:
        return cls(
            name=str(r["name"]),
            version=str(r["version"]),
            previous=None if r.get("previous") is None else str(r["previous"]),
            added=bool(r.get("added", False)),
            owner=str(r.get("owner", "")),
        )


@dataclass(frozen=True, slots=True)
class Change:
    kind: Literal["app", "model", "link", "version", "replicas", "intent", "rollout", "tenant"]
    op: Literal["add", "update", "delete"]
    name: str
    version: str | None = None


Listener = Callable[[Change], None]


class Registry:
    """The catalogue of what is served. Links are app -> model name; a model name resolves
    to its current version at query time, so a version switch is one assignment."""

    def __init__(self) -> None:
        self.apps: dict[str, Application] = {}
        self.models: dict[str, dict[str, ModelVersion]] = {}
        self.current: dict[str, str] = {}
        self.links: dict[str, list[str]] = {}
        # model name -> the version change under way for it (at most one at a time)
        self.intents: dict[str, Intent] = {}
        # model name -> its traffic split and shadow (clipper.rollout), when it has one
        self.rollouts: dict[str, Rollout] = {}
        # tenant name -> its class, quotas and hashed keys (clipper.tenants)
        self.tenants: dict[str, Tenant] = {}
        self._listeners: list[Listener] = []

    def copy(self) -> Registry:
        """A draft with the same contents and no listeners: validate a change on it."""
        r = Registry()
        r.apps = dict(self.apps)
        r.models = {name: dict(versions) for name, versions in self.models.items()}
        r.current = dict(self.current)
        r.links = {app: list(models) for app, models in self.links.items()}
        r.intents = dict(self.intents)
        r.rollouts = dict(self.rollouts)
        r.tenants = dict(self.tenants)
        return r

    def records(self) -> Records:
        """The registry as the store holds it (one record per key, in the store's kinds)."""
        return {
            "app": {name: app.to_record() for name, app in self.apps.items()},
            "model": {
                f"{mv.name}:{mv.version}": mv.to_record()
                for versions in self.models.values()
                for mv in versions.values()
            },
            "current": dict(self.current),
            "links": {app: list(models) for app, models in self.links.items()},
            "intent": {name: i.to_record() for name, i in self.intents.items()},
            "rollout": {name: ro.to_record() for name, ro in self.rollouts.items()},
            "tenant": {name: t.to_record() for name, t in self.tenants.items()},
        }

    def apply_snapshot(self, target: Records) -> list[Change]:
        """Make the registry equal to ``target`` (store records), announcing each difference
        (see :meth:`apply_delta`)."""
        before = self.records()
        delta: Records = {}
        for kind, old in before.items():
            new = target.get(kind, {})
            changed = {key: value for key, value in new.items() if old.get(key, GONE) != value}
            changed.update({key: GONE for key in old if key not in new})
            delta[kind] = changed
        return self.apply_delta(delta)

    def apply_delta(self, delta: Records) -> list[Change]:
        """Apply store records that changed (kind -> key -> record, or :data:`GONE` for a
        deleted key), announcing each difference; only the keys named are looked at, so a
        change costs the same however much is registered.

        Additions go in dependency order (applications, models, current versions, links) and
        removals in reverse, so every listener sees a consistent registry. A record that does
        not parse is skipped with a warning: one bad record must not stop a frontend."""
        changes: list[Change] = []
        puts = {kind: {k: v for k, v in d.items() if v is not GONE} for kind, d in delta.items()}
        gone = {kind: [k for k, v in d.items() if v is GONE] for kind, d in delta.items()}
        for name, app in _parsed(puts.get("app", {}), Application.from_record).items():
            old = self.apps.get(name)
            if old is not None and old.input_type is not app.input_type:
                self._drop_app(name, changes)  # an input type never changes in place
                old = None
            if old is None or old.to_record() != puts["app"][name]:
                self.apps[name] = app
                self.links.setdefault(name, [])
                changes.append(Change("app", "add" if old is None else "update", name))
        for key, mv in _parsed(puts.get("model", {}), ModelVersion.from_record).items():
            was = self.models.get(mv.name, {}).get(mv.version)
            if was is None or was.to_record() != puts["model"][key]:
                self.models.setdefault(mv.name, {})[mv.version] = mv
                op: Literal["add", "update"] = "add" if was is None else "update"
                changes.append(Change("model", op, mv.name, mv.version))
        for name, version in puts.get("current", {}).items():
            if (
                isinstance(version, str)
                and version in self.models.get(name, {})
                and self.current.get(name) != version
            ):
                self.current[name] = version
                changes.append(Change("version", "update", name, version))
        for app_name, wanted in puts.get("links", {}).items():
            if (
                app_name in self.apps
                and isinstance(wanted, list)
                and self.links.get(app_name) != wanted
            ):
                self.links[app_name] = [str(m) for m in wanted]
                changes.append(Change("link", "update", app_name))
        for name, ro in _parsed(puts.get("rollout", {}), Rollout.from_record).items():
            if self.rollouts.get(name) != ro:
                op = "add" if name not in self.rollouts else "update"
                self.rollouts[name] = ro
                changes.append(Change("rollout", op, name))
        for name, intent in _parsed(puts.get("intent", {}), Intent.from_record).items():
            if self.intents.get(name) != intent:
                op = "add" if name not in self.intents else "update"
                self.intents[name] = intent
                changes.append(Change("intent", op, name, intent.version))
        for name in gone.get("intent", []):
            if name in self.intents:
                ended = self.intents.pop(name)
                changes.append(Change("intent", "delete", name, ended.version))
        for name, tenant in _parsed(puts.get("tenant", {}), Tenant.from_record).items():
            if self.tenants.get(name) != tenant:
                op = "add" if name not in self.tenants else "update"
                self.tenants[name] = tenant
                changes.append(Change("tenant", op, name))
        left = [n for n in gone.get("tenant", []) if self.tenants.pop(n, None) is not None]
        changes.extend(Change("tenant", "delete", name) for name in left)
        undone = [n for n in gone.get("rollout", []) if self.rollouts.pop(n, None) is not None]
        changes.extend(Change("rollout", "delete", name) for name in undone)
        dropped = [n for n in gone.get("current", []) if self.current.pop(n, None) is not None]
        changes.extend(Change("version", "delete", name) for name in dropped)
        for key in gone.get("model", []):
            name, _, version = key.partition(":")
            if version not in self.models.get(name, {}):
                continue
            del self.models[name][version]
            if not self.models[name]:
                del self.models[name]
            if self.current.get(name) == version:
                del self.current[name]
            changes.append(Change("model", "delete", name, version))
        for app_name in gone.get("links", []):
            if self.links.get(app_name) and app_name not in gone.get("app", []):
                self.links[app_name] = []
                changes.append(Change("link", "update", app_name))
        for name in gone.get("app", []):
            if name in self.apps:
                self._drop_app(name, changes)
        for change in changes:
            self._emit(change)
        return changes

    def _drop_app(self, name: str, changes: list[Change]) -> None:
        del self.apps[name]
        self.links.pop(name, None)
        changes.append(Change("app", "delete", name))

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, change: Change) -> None:
        for listener in self._listeners:
            listener(change)

    # applications
    def add_app(self, app: Application) -> None:
        if app.name in self.apps:
            raise RegistryError(f"application '{app.name}' already exists")
        if app.stages is not None:
            check_against(app.name, app.stages, self)
        self.apps[app.name] = app
        self.links[app.name] = []
        self._emit(Change("app", "add", app.name))

    def update_app(self, name: str, **changes: Any) -> Application:
        app = self.get_app(name)
        if changes.get("policy") == "single" and len(self.links.get(name, ())) > 1:
            raise RegistryError(
                f"application '{name}' links {len(self.links[name])} models; the single "
                "policy serves one: unlink the others first"
            )
        if "default_output" in changes:
            changes["default_value"] = None
        updated = replace(app, **changes)
        if updated.stages is not None:
            check_against(name, updated.stages, self)
        self.apps[name] = updated
        self._emit(Change("app", "update", name))
        return updated

    def delete_app(self, name: str) -> None:
        self.get_app(name)
        del self.apps[name]
        self.links.pop(name, None)
        self._emit(Change("app", "delete", name))

    def get_app(self, name: str) -> Application:
        try:
            return self.apps[name]
        except KeyError:
            raise RegistryError(f"Application '{name}' does not exist") from None

    # models
    def add_model(self, mv: ModelVersion) -> None:
        versions = self.models.setdefault(mv.name, {})
        if mv.version in versions:
            raise RegistryError(
                f"model with name '{mv.name}' and version '{mv.version}' already exists"
            )
        for app_name, names in self.links.items():
            app = self.apps[app_name]
            if mv.name in names and app.input_type is not mv.input_type:
                raise RegistryError(
                    f"model '{mv.name}' is linked to application '{app_name}' whose input type "
                    f"is {app.input_type.readable}, but version '{mv.version}' takes "
                    f"{mv.input_type.readable}"
                )
        versions[mv.version] = mv
        self._emit(Change("model", "add", mv.name, mv.version))

    def get_model(self, name: str, version: str | None = None) -> ModelVersion:
        versions = self.models.get(name)
        if not versions:
            raise RegistryError(f"No model with name '{name}' exists.")
        v = version if version is not None else self.current.get(name)
        if v is None or v not in versions:
            raise RegistryError(f"Requested version: {v} does not exist for model: {name}")
        return versions[v]

    def set_model_version(self, name: str, version: str) -> None:
        if name not in self.models:
            raise RegistryError(f"Cannot set version for nonexistent model '{name}'")
        if version not in self.models[name]:
            raise RegistryError(f"Cannot set non-existent version '{version}' for model '{name}'")
        self.current[name] = version
        self._emit(Change("version", "update", name, version))

    def replace_model(self, mv: ModelVersion) -> None:
        """Change a registered version's settings (artifact, batching, labels, replicas)."""
        self.get_model(mv.name, mv.version)
        self.models[mv.name][mv.version] = mv
        self._emit(Change("model", "update", mv.name, mv.version))

    def set_num_replicas(self, name: str, version: str, n: int) -> ModelVersion:
        mv = replace(self.get_model(name, version), num_replicas=n)
        self.models[name][version] = mv
        self._emit(Change("replicas", "update", name, version))
        return mv

    def delete_model_version(self, name: str, version: str) -> None:
        self.get_model(name, version)
        rollout = self.rollouts.get(name)
        if rollout is not None and version in rollout.versions:
            role = "shadows its queries" if version not in rollout.weights else "is in its split"
            raise RegistryError(
                f"version '{version}' of model '{name}' {role}: take it out of the rollout "
                "first (set_traffic_split / set_shadow), then delete it"
            )
        del self.models[name][version]
        if self.current.get(name) == version:
            del self.current[name]
        if not self.models[name]:
            del self.models[name]
        self._emit(Change("model", "delete", name, version))

    # links
    def link(self, app_name: str, model_name: str) -> None:
        app = self.apps.get(app_name)
        if app is None:
            raise RegistryError(f"No app with name '{app_name}' exists.")
        if model_name not in self.models:
            raise RegistryError(f"No model with name '{model_name}' exists.")
        if app.pipeline is not None:
            raise RegistryError(f"'{app_name}' is a pipeline: its stages name its models")
        linked = self.links[app_name]
        if model_name in linked:
            raise RegistryError(
                f"A model with name {model_name} is already linked to '{app_name}'."
            )
        if linked and app.policy == "single":
            raise RegistryError(
                "Applications must be linked with at most one model. "
                f"'{app_name}' is already linked to '{linked[0]}'. (An application with a "
                "selection policy other than single can link several.)"
            )
        bad = [mv for mv in self.models[model_name].values() if mv.input_type is not app.input_type]
        if bad:
            raise RegistryError(
                f"Model '{model_name}' takes {bad[0].input_type.readable} but application "
                f"'{app_name}' takes {app.input_type.readable}"
            )
        linked.append(model_name)
        self._emit(Change("link", "add", app_name, model_name))

    def unlink(self, app_name: str, model_name: str) -> None:
        if app_name not in self.apps:
            raise RegistryError(f"No app with name '{app_name}' exists.")
        if model_name not in self.links[app_name]:
            raise RegistryError(f"Model '{model_name}' is not linked to '{app_name}'")
        self.links[app_name].remove(model_name)
        self._emit(Change("link", "delete", app_name, model_name))

    def linked_models(self, app_name: str) -> list[str]:
        return list(self.links.get(app_name, ()))

    # version changes under way
    def begin_intent(self, intent: Intent) -> None:
        under_way = self.intents.get(intent.name)
        if under_way is not None:
            raise RegistryError(
                f"a version change of model '{intent.name}' (to version '{under_way.version}') "
                "is under way; retry when it has finished"
            )
        self.intents[intent.name] = intent
        self._emit(Change("intent", "add", intent.name, intent.version))

    def end_intent(self, name: str) -> None:
        gone = self.intents.pop(name, None)
        if gone is not None:
            self._emit(Change("intent", "delete", name, gone.version))

    # traffic splits and shadows
    def set_rollout(self, name: str, rollout: Rollout | None) -> Rollout | None:
        """Give ``name`` a rollout (None or an empty one removes it). Every version it names
        must be registered, have replicas to run, and not be a deploy under way."""
        if name not in self.models:
            raise RegistryError(f"No model with name '{name}' exists.")
        if rollout is not None and rollout.empty:
            rollout = None
        if rollout is None:
            if self.rollouts.pop(name, None) is not None:
                self._emit(Change("rollout", "delete", name))
            return None
        versions = self.models[name]
        for version in sorted(rollout.versions):
            mv = versions.get(version)
            if mv is None:
                raise RegistryError(
                    f"model '{name}' has no version '{version}' (its versions: "
                    f"{', '.join(sorted(versions))})"
                )
            if mv.artifact is not None and mv.num_replicas == 0:
                raise RegistryError(
                    f"version '{version}' of model '{name}' is set to 0 replicas: scale it up "
                    "first, or it would take its share of the traffic with nothing to answer"
                )
            intent = self.intents.get(name)
            if intent is not None and intent.added and intent.version == version:
                raise RegistryError(
                    f"version '{version}' of model '{name}' is still being deployed; retry "
                    "when the deploy has finished"
                )
        op: Literal["add", "update"] = "update" if name in self.rollouts else "add"
        self.rollouts[name] = rollout
        self._emit(Change("rollout", op, name))
        return rollout

    # tenants
    def set_tenant(self, tenant: Tenant) -> Tenant:
        """Add or replace a tenant (its quotas must name applications that exist)."""
        check_name("tenant", tenant.name)
        if tenant.name not in self.tenants and len(self.tenants) >= MAX_TENANTS:
            raise RegistryError(f"{MAX_TENANTS} tenants exist, the most a deployment holds")
        for q in tenant.quotas:
            if q.app is not None and q.app not in self.apps:
                raise RegistryError(
                    f"tenant '{tenant.name}': quota for application '{q.app}', which does not "
                    "exist (give app null for a quota across all applications)"
                )
        op: Literal["add", "update"] = "update" if tenant.name in self.tenants else "add"
        self.tenants[tenant.name] = tenant
        self._emit(Change("tenant", op, tenant.name))
        return tenant

    def get_tenant(self, name: str) -> Tenant:
        try:
            return self.tenants[name]
        except KeyError:
            raise RegistryError(f"Tenant '{name}' does not exist") from None

    def delete_tenant(self, name: str) -> None:
        self.get_tenant(name)
        del self.tenants[name]
        self._emit(Change("tenant", "delete", name))

    def runs(self, mv: ModelVersion) -> bool:
        """Whether ``mv`` should have replicas: it is current, kept, being switched to, or
        named by the model's rollout (a split or a shadow)."""
        intent = self.intents.get(mv.name)
        rollout = self.rollouts.get(mv.name)
        return (
            mv.keep
            or self.current.get(mv.name) == mv.version
            or (intent is not None and intent.version == mv.version)
            or (rollout is not None and mv.version in rollout.versions)
        )


T = TypeVar("T")


def _parsed(records: dict[str, Any], parse: Callable[[dict[str, Any]], T]) -> dict[str, T]:
    out: dict[str, T] = {}
    for key, record in records.items():
        try:
            out[key] = parse(record)
        except (ClipperError, KeyError, TypeError, ValueError, AttributeError) as e:
            log.warning("store record %r not applied: %s", key, e)
    return out

"""The admin API's request schemas, field parsers and replies (see admin.py for the routes).

:data:`FIELDS` is each JSON route's fields: :func:`check_body` checks a body against it before
the route's handler reads it, and the admin API's OpenAPI document (openapi.py) is written from
it, so the two cannot differ. :data:`SCHEMAS` keeps the original's one-line schema texts.

Each parser raises :class:`FieldError` for a field that is missing or of the wrong type (answered
``Error parsing JSON: ... Expected JSON schema: ...``, as the original does) and
:class:`OperationError` for a value the operation refuses (400 with the message).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import orjson

from clipper.choices import CONTROLLERS, LOSSES, ON_MODEL_ERROR, OVERLOAD, POLICIES, WAITS
from clipper.config import BatchingConfig
from clipper.errors import ClipperError, ConfigError, RegistryError
from clipper.frontend.http import JSON
from clipper.inputs import InputType
from clipper.runtime.artifacts import resolve_artifact
from clipper.runtime.operations import parse_input_type
from clipper.scaling import AutoscaleConfig

__all__ = [
    "BATCHING_KEYS",
    "FIELDS",
    "SCHEMAS",
    "TEXT",
    "AdminRoute",
    "Field",
    "FieldError",
    "OperationError",
    "Reply",
    "artifact_field",
    "batching_field",
    "bool_field",
    "check_body",
    "check_chars",
    "input_type_field",
    "int_field",
    "json_reply",
    "num_replicas_field",
    "opt_str_field",
    "pipeline_field",
    "require",
    "schema_error",
    "str_field",
    "str_list_field",
    "text_reply",
]


TEXT = b"text/plain; charset=utf-8"

Reply = tuple[int, bytes, bytes]

# The original's schema text lists input types in its own order: kept verbatim (compatibility).
_INPUT_TYPES = '"integers" | "bytes" | "floats" | "doubles" | "strings" | "json"'
_BATCHING = (
    f'{{"controller" := {CONTROLLERS.schema()}, "max_batch_size" := int, '
    f'"max_wait_micros" := int, "wait" := {WAITS.schema()}, "in_flight" := int, '
    '"target_fraction" := number, "params" := object}'
)

_SELECTION = (
    ', "require_key" := bool (optional)'
    f', "policy" := {POLICIES.schema()} (optional), "policy_params" := object (optional), '
    f'"min_confidence" := number (optional), "loss" := {LOSSES.schema()} '
    '(optional), "loss_scale" := number (optional), "online_learning" := bool (optional), '
    '"pipeline" := object | null (optional: docs/pipelines.md)}'
)

# The original's schema texts, as one line each (extensions in docs/admin-api.md).
SCHEMAS: dict[str, str] = {
    "add_app": (
        '{"name" := string, "input_type" := ' + _INPUT_TYPES + ', "default_output" := string, '
        '"latency_slo_micros" := int, "cache" := bool (optional), '
        f'"overload" := {OVERLOAD.schema()} (optional), '
        f'"on_model_error" := {ON_MODEL_ERROR.schema()} (optional)' + _SELECTION
    ),
    "delete_app": '{"name" := string}',
    "add_model": (
        '{"model_name" := string, "model_version" := string, "labels" := [string], '
        '"input_type" := ' + _INPUT_TYPES + ', "container_name" := string, '
        '"model_data_path" := string, "batch_size" := int}'
    ),
    "add_model_links": '{"app_name" := string, "model_names" := [string]}',
    "delete_model_links": '{"app_name" := string, "model_names" := [string]}',
    "set_model_version": '{"model_name" := string, "model_version" := string}',
    "delete_versioned_model": (
        '{"model_name" := string, "model_version" := string, "force" := bool (optional: '
        '"absent deletes, as the original")}'
    ),
    "get_all_applications": '{"verbose" := bool}',
    "get_application": '{"name" := string}',
    "get_linked_models": '{"app_name" := string}',
    "get_all_models": '{"verbose" := bool}',
    "get_model": '{"model_name" := string, "model_version" := string}',
    "get_all_containers": '{"verbose" := bool}',
    "get_container": '{"model_name" := string, "model_version" := string, "replica_id" := int}',
    "get_state": '{"app_name" := string, "uid" := int}',
    "deploy_model": (
        '{"model_name" := string, "model_version" := string, "input_type" := '
        + _INPUT_TYPES
        + ', "artifact_path" := string, "num_replicas" := int (default 1), '
        '"batching" := ' + _BATCHING + ' (optional), "labels" := [string] (optional), '
        '"pooled" := bool (optional: served from a pool process, docs/density.md)}'
    ),
    "stage_model": (
        '{"model_name" := string, "model_version" := string, "input_type" := '
        + _INPUT_TYPES
        + ', "artifact_path" := string, "num_replicas" := int (default 1), '
        '"batching" := ' + _BATCHING + " (optional)}"
    ),
    "upload_model": (
        "POST /admin/upload_model?name=<model>&version=<version>&input_type=<type>"
        "[&num_replicas=<int>][&batching=<JSON object>][&source_sha256=<hex>][&pooled=true] "
        "with the body "
        "a cloudpickle file or a gzipped tar of an artifact directory (clipper.deployers.package)"
    ),
    "set_num_replicas": (
        '{"model_name" := string, "model_version" := string (optional: the current one), '
        '"num_replicas" := int, "artifact_path" := string (optional)}'
    ),
    "update_app": (
        '{"name" := string, "latency_slo_micros" := int (optional), '
        '"default_output" := string (optional), "cache" := bool (optional), '
        f'"overload" := {OVERLOAD.schema()} (optional), '
        f'"on_model_error" := {ON_MODEL_ERROR.schema()} (optional)' + _SELECTION
    ),
    "get_replicas": '{"model_name" := string (optional), "model_version" := string (optional), '
    '"unconnected" := bool (optional)}',
    "set_autoscale": (
        '{"model_name" := string, "model_version" := string (optional: the current one), '
        '"enabled" := bool, "min_replicas" := int, "max_replicas" := int, '
        '"target_utilization" := number, "up_window_s" := number, "down_window_s" := number, '
        '"interval_s" := number, "shed_threshold" := number, "scale_to_zero_after_s" := number, '
        '"max_held_queries" := int} (all settings optional; min_replicas 0: scale to zero)'
    ),
    "get_logs": '{"max_bytes" := int (optional)}',
    "set_traffic_split": (
        '{"model_name" := string, "split" := {version: number > 0} | null (null or {}: no '
        'split), "sticky" := bool (optional, default false)}'
    ),
    "set_shadow": (
        '{"model_name" := string, "version" := string | null (null: no shadow), '
        '"share" := number in [0, 1] (optional, default 1)}'
    ),
    "get_traffic": '{"model_name" := string}',
    "add_tenant": (
        '{"name" := string, "priority" := "critical" | "standard" | "sheddable" (optional, '
        'default standard), "quotas" := {"*" | app: {"rate" := number, "burst" := int}} '
        "(optional)}"
    ),
    "update_tenant": (
        '{"name" := string, "priority" := "critical" | "standard" | "sheddable" (optional), '
        '"quotas" := {"*" | app: {"rate" := number, "burst" := int}} (optional: replaces them)}'
    ),
    "delete_tenant": '{"name" := string}',
    "get_tenants": '{"name" := string (optional)}',
    "create_key": (
        '{"tenant" := string, "priority" := "critical" | "standard" | "sheddable" (optional: '
        "the tenant's)}"
    ),
    "delete_key": '{"tenant" := string, "key_id" := string}',
}


# -- the field table --------------------------------------------------------------------------

Kind = Literal["string", "int", "number", "bool", "object", "strings", "int_map"]
_KIND_NAMES = {
    "string": "string",
    "int": "int",
    "number": "number",
    "bool": "bool",
    "object": "object",
    "strings": "array of strings",
    "int_map": "object of ints",
}


@dataclass(frozen=True, slots=True)
class Field:
    """One key of a route's JSON body (or, for ``upload_model``, one query parameter).

    ``choices``: the names a string takes (documented; the handler refuses others with the
    choice's own message). ``check=False``: documented here, checked by what the value is
    handed to (``set_autoscale``'s settings: :class:`~clipper.scaling.AutoscaleConfig`).
    """

    name: str
    kind: Kind
    required: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    doc: str = ""
    check: bool = True
    # The JSON Schema of the value, where the kind alone says too little (batching).
    schema: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class AdminRoute:
    """A route's request and answer: ``reply`` is the success's content (plain text, JSON or a
    gzipped tar); ``closed``: other keys are refused (``unknown keys [...]``); ``query``: the
    fields are query parameters and the body is a file (``upload_model``)."""

    fields: tuple[Field, ...]
    summary: str
    reply: Literal["text", "json", "gzip"] = "text"
    closed: bool = False
    query: bool = False
    # A change (answered once the config store has it; 503 when it cannot take it).
    change: bool = False
    method: Literal["GET", "POST"] = "POST"


_INPUT_TYPE_DOC = (
    "integers, bytes, floats, doubles, strings or json (or an alias: ints, d, ...); the type of "
    "each input's items"
)
# The keys of a version's "batching" object (BatchingConfig's fields).
BATCHING_KEYS = (
    "controller",
    "max_batch_size",
    "max_wait_micros",
    "wait",
    "in_flight",
    "target_fraction",
    "params",
)
_BATCHING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "controller": {"type": "string", "enum": list(CONTROLLERS.names)},
        "max_batch_size": {"type": ["integer", "null"]},
        "max_wait_micros": {"type": "integer"},
        "wait": {"type": "string", "enum": list(WAITS.names)},
        "in_flight": {"type": "integer"},
        "target_fraction": {"type": "number"},
        "params": {"type": "object"},
    },
}


def _s(name: str, required: bool = False, doc: str = "", **kw: Any) -> Field:
    return Field(name, "string", required, doc=doc, **kw)


def _i(name: str, required: bool = False, doc: str = "", **kw: Any) -> Field:
    return Field(name, "int", required, doc=doc, **kw)


def _b(name: str, required: bool = False, doc: str = "", **kw: Any) -> Field:
    return Field(name, "bool", required, doc=doc, **kw)


def _n(name: str, required: bool = False, doc: str = "", **kw: Any) -> Field:
    return Field(name, "number", required, doc=doc, **kw)


_MODEL = _s("model_name", True)
_VERSION = _s("model_version", True)
_OPT_VERSION = _s("model_version", nullable=True, doc="absent or null: the current version")
_INPUT_TYPE = _s("input_type", True, _INPUT_TYPE_DOC)
_VERBOSE = _b("verbose", doc="true: whole documents, false (the default): names")

# An application's settings after its name, latency SLO and default output (add_app, update_app).
_APP_SETTINGS = (
    _b("cache", doc="cache predictions (default true)"),
    _b("require_key", doc="refuse queries without an API key (401; docs/tenants.md)"),
    _s("overload", choices=OVERLOAD.names, doc=OVERLOAD.help()),
    _s("on_model_error", choices=ON_MODEL_ERROR.names, doc=ON_MODEL_ERROR.help()),
    _s("policy", choices=POLICIES.names, doc="the selection policy (docs/selection.md)"),
    Field("policy_params", "object"),
    _n("min_confidence"),
    _s("loss", choices=LOSSES.names),
    _n("loss_scale"),
    _b("online_learning"),
    Field("pipeline", "object", nullable=True, doc="a pipeline (docs/pipelines.md); null: none"),
)
_DEPLOY = (
    _MODEL,
    _VERSION,
    _INPUT_TYPE,
    _s("artifact_path", True, "a model artifact (file or directory) on the frontend's disk"),
    _i("num_replicas", doc="default 1"),
    Field("batching", "object", nullable=True, schema=_BATCHING_SCHEMA),
)
_PRIORITY = _s("priority", choices=("critical", "standard", "sheddable"), doc="the priority class")
_QUOTAS = Field(
    "quotas",
    "object",
    doc='{"*" | application: {"rate": queries a second, "burst": int}}; "*": across all',
)
_AUTOSCALE_KINDS: dict[Any, Kind] = {bool: "bool", int: "int", float: "number"}


def _autoscale_fields() -> tuple[Field, ...]:
    # AutoscaleConfig's settings: what set_autoscale hands to it, which checks them.
    return tuple(
        Field(f.name, _AUTOSCALE_KINDS[type(f.default)], check=False)
        for f in fields(AutoscaleConfig)
        if f.name != "owner"
    )


FIELDS: dict[str, AdminRoute] = {
    "ping": AdminRoute((), "Liveness: answers PONG", method="GET"),
    "add_app": AdminRoute(
        (
            _s("name", True),
            _INPUT_TYPE,
            _s("default_output", True, "the answer when no model answers in time"),
            _i("latency_slo_micros", True),
            *_APP_SETTINGS,
        ),
        "Add an application",
        change=True,
    ),
    "update_app": AdminRoute(
        (
            _s("name", True),
            _i("latency_slo_micros"),
            _s("default_output"),
            *_APP_SETTINGS,
        ),
        "Change an application's settings (the keys given)",
        closed=True,
        change=True,
    ),
    "delete_app": AdminRoute((_s("name", True),), "Delete an application", change=True),
    "add_model": AdminRoute(
        (
            _MODEL,
            _VERSION,
            _INPUT_TYPE,
            Field("labels", "strings"),
            _s("container_name"),
            _s("model_data_path", doc="deprecated, ignored"),
            _i("batch_size"),
        ),
        "Register a model version (the original's call; containers connect to it)",
        change=True,
    ),
    "add_model_links": AdminRoute(
        (_s("app_name", True), Field("model_names", "strings", True)),
        "Link models to an application",
        change=True,
    ),
    "delete_model_links": AdminRoute(
        (_s("app_name", True), Field("model_names", "strings", True)),
        "Unlink models from an application",
        change=True,
    ),
    "set_model_version": AdminRoute(
        (_MODEL, _VERSION), "Make a version the one a model is served by", change=True
    ),
    "delete_versioned_model": AdminRoute(
        (_MODEL, _VERSION, _b("force", doc="absent: true (the original's behaviour)")),
        "Delete a model version",
        change=True,
    ),
    "get_all_applications": AdminRoute((_VERBOSE,), "The applications", reply="json"),
    "get_application": AdminRoute(
        (_s("name", True),), "One application ({} when absent)", reply="json"
    ),
    "get_linked_models": AdminRoute(
        (_s("app_name", True),), "The models linked to an application", reply="json"
    ),
    "get_all_models": AdminRoute((_VERBOSE,), "The model versions", reply="json"),
    "get_model": AdminRoute((_MODEL, _VERSION), "One model version", reply="json"),
    "get_all_containers": AdminRoute((_VERBOSE,), "The connected replicas", reply="json"),
    "get_container": AdminRoute(
        (_MODEL, _VERSION, _i("replica_id", True)), "One connected replica", reply="json"
    ),
    "get_state": AdminRoute(
        (_s("app_name", True), _i("uid")), "An application's learned state", reply="text"
    ),
    "deploy_model": AdminRoute(
        (
            *_DEPLOY,
            Field("labels", "strings"),
            _b("pooled", doc="served from a shared pool process, loaded on demand (default false)"),
        ),
        "Deploy a model version from an artifact and wait for its replicas",
        reply="json",
        change=True,
    ),
    "stage_model": AdminRoute(
        _DEPLOY, "Say what the next add_model of this version starts", change=True
    ),
    "upload_model": AdminRoute(
        (
            _s("name", True),
            _s("version", True),
            _s("input_type", True, _INPUT_TYPE_DOC),
            _s("num_replicas", doc="an integer, default 1"),
            _s("batching", doc="a JSON object: the batching settings"),
            _s("source_sha256", doc="the SHA-256 of the source the artifact was built from"),
            _s("pooled", doc="true: served from a pool process (docs/density.md); default false"),
        ),
        "Deploy a model version from an uploaded file (cloudpickle or a gzipped tar)",
        reply="json",
        query=True,
        change=True,
    ),
    "set_num_replicas": AdminRoute(
        (_MODEL, _OPT_VERSION, _i("num_replicas", True), _s("artifact_path", nullable=True)),
        "Run a number of replicas of a version",
        change=True,
    ),
    "set_autoscale": AdminRoute(
        (_MODEL, _OPT_VERSION, *_autoscale_fields()),
        "Change a version's autoscaling (the settings given)",
        reply="json",
        change=True,
    ),
    "get_replicas": AdminRoute(
        (
            _s("model_name", nullable=True),
            _s("model_version", nullable=True),
            _b("unconnected", doc="also the slots no replica is connected to"),
        ),
        "The replicas, with their state and latency",
        reply="json",
    ),
    "get_logs": AdminRoute((_i("max_bytes"),), "The tail of every replica's log", reply="json"),
    "set_traffic_split": AdminRoute(
        (
            _MODEL,
            Field("split", "object", True, nullable=True, doc="{version: weight > 0}; null: none"),
            _b("sticky", doc="a uid keeps its version (default false)"),
        ),
        "Split a model's traffic between versions (docs/rollouts.md)",
        reply="json",
        closed=True,
        change=True,
    ),
    "set_shadow": AdminRoute(
        (
            _MODEL,
            _s("version", True, "the shadow version; null: none", nullable=True),
            _n("share", doc="the share of queries shadowed, in [0, 1] (default 1)"),
        ),
        "Shadow a model's queries to another version (docs/rollouts.md)",
        reply="json",
        closed=True,
        change=True,
    ),
    "get_traffic": AdminRoute((_MODEL,), "A model's split and shadow", reply="json", closed=True),
    "add_tenant": AdminRoute(
        (_s("name", True), _PRIORITY, _QUOTAS),
        "Add a tenant (docs/tenants.md)",
        reply="json",
        closed=True,
        change=True,
    ),
    "update_tenant": AdminRoute(
        (_s("name", True), _PRIORITY, _QUOTAS),
        "Change a tenant's class or quotas (the keys given)",
        reply="json",
        closed=True,
        change=True,
    ),
    "delete_tenant": AdminRoute(
        (_s("name", True),), "Delete a tenant and its keys", closed=True, change=True
    ),
    "get_tenants": AdminRoute(
        (_s("name", doc="one tenant; absent: all"),),
        "Tenants with their class, quotas and key ids (never the keys)",
        reply="json",
        closed=True,
    ),
    "create_key": AdminRoute(
        (_s("tenant", True), _PRIORITY),
        "Create an API key for a tenant: the answer is the only time the key is shown",
        reply="json",
        closed=True,
        change=True,
    ),
    "delete_key": AdminRoute(
        (_s("tenant", True), _s("key_id", True, "the id get_tenants lists")),
        "Revoke an API key",
        closed=True,
        change=True,
    ),
}


def _type_ok(kind: Kind, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "strings":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, dict) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value.values()
    )


def check_body(route: str, doc: dict[str, Any]) -> None:
    """``doc`` against the route's :data:`FIELDS`: a required key missing, a key of the wrong
    type or (for a closed route) a key it does not take is a :class:`FieldError`, named as
    the field parsers name it. Values (names, ranges) are the handler's to check."""
    spec = FIELDS[route]
    for f in spec.fields:
        if f.name not in doc:
            if f.required:
                raise FieldError(f"JSON object does not have required key: {f.name}")
            continue
        value = doc[f.name]
        if not f.check or (value is None and f.nullable) or _type_ok(f.kind, value):
            continue
        expected = _KIND_NAMES[f.kind] + (" or null" if f.nullable else "")
        raise FieldError(f"Type mismatch! JSON key {f.name} expected type {expected}")
    if spec.closed:
        unknown = sorted(set(doc) - {f.name for f in spec.fields})
        if unknown:
            raise FieldError(f"unknown keys {unknown}")


class FieldError(ClipperError):
    """A request body that does not follow its route's schema."""


class OperationError(RegistryError):
    """The original's ManagementOperationError: answered 400 with the message."""


# -- request fields -------------------------------------------------------------------------------


def pipeline_field(doc: dict[str, Any]) -> dict[str, Any]:
    """An application's optional ``pipeline`` (an object, or null for none): its contents are
    checked by the registry (clipper.pipeline.spec)."""
    if "pipeline" not in doc:
        return {}
    value = doc["pipeline"]
    if value is not None and not isinstance(value, dict):
        raise FieldError("Type mismatch! JSON key pipeline expected type object or null")
    return {"pipeline": value}


def require(doc: dict[str, Any], key: str) -> Any:
    if key not in doc:
        raise FieldError(f"JSON object does not have required key: {key}")
    return doc[key]


def str_field(doc: dict[str, Any], key: str, default: str | None = None) -> str:
    if default is not None and key not in doc:
        return default
    value = require(doc, key)
    if not isinstance(value, str):
        raise FieldError(f"Type mismatch! JSON key {key} expected type string")
    return value


def opt_str_field(doc: dict[str, Any], key: str) -> str | None:
    if doc.get(key) is None:
        return None
    return str_field(doc, key)


def int_field(doc: dict[str, Any], key: str, default: int | None = None) -> int:
    if default is not None and key not in doc:
        return default
    value = require(doc, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"Type mismatch! JSON key {key} expected type int")
    return value


def bool_field(doc: dict[str, Any], key: str, default: bool | None = None) -> bool:
    if default is not None and key not in doc:
        return default
    value = require(doc, key)
    if not isinstance(value, bool):
        raise FieldError(f"Type mismatch! JSON key {key} expected type bool")
    return value


def str_list_field(doc: dict[str, Any], key: str, default: list[str] | None = None) -> list[str]:
    if default is not None and key not in doc:
        return default
    value = require(doc, key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError(f"Type mismatch! JSON key {key} expected type array of strings")
    return value


def input_type_field(name: str) -> InputType:
    return parse_input_type(name)


def batching_field(doc: dict[str, Any]) -> BatchingConfig | None:
    spec = doc.get("batching")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise FieldError("Type mismatch! JSON key batching expected type object")
    allowed = set(BATCHING_KEYS)
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise FieldError(f"unknown batching keys {unknown}; expected some of {sorted(allowed)}")
    try:
        return BatchingConfig(**spec)
    except (ConfigError, TypeError) as e:
        raise OperationError(f"invalid batching: {e}") from None


def artifact_field(path: str) -> str:
    return resolve_artifact(path)


def num_replicas_field(doc: dict[str, Any], default: int | None = None) -> int:
    n = int_field(doc, "num_replicas", default)
    if n < 0:
        raise OperationError(f"num_replicas must be >= 0, got {n}")
    return n


def check_chars(kind: str, value: str) -> None:
    # The original's delimiters: "name:version" ids and comma-joined labels in Redis.
    if "," in value or ":" in value:
        raise OperationError(f"{kind} '{value}' contains prohibited characters (',' or ':')")


def text_reply(msg: str) -> Reply:
    return 200, msg.encode(), TEXT


def json_reply(doc: Any) -> Reply:
    return 200, orjson.dumps(doc), JSON


def schema_error(route: str, msg: str) -> bytes:
    return f"Error parsing JSON: {msg}. Expected JSON schema: {SCHEMAS[route]}".encode()

"""The admin API's request schemas, field parsers and replies (see admin.py for the routes).

Each parser raises :class:`FieldError` for a field that is missing or of the wrong type (answered
``Error parsing JSON: ... Expected JSON schema: ...``, as the original does) and
:class:`OperationError` for a value the operation refuses (400 with the message).
"""

from __future__ import annotations

from typing import Any

import orjson

from clipper.choices import CONTROLLERS, LOSSES, ON_MODEL_ERROR, OVERLOAD, POLICIES, WAITS
from clipper.config import BatchingConfig
from clipper.errors import ClipperError, ConfigError, RegistryError
from clipper.frontend.http import JSON
from clipper.inputs import InputType
from clipper.runtime.artifacts import resolve_artifact
from clipper.runtime.operations import parse_input_type

__all__ = [
    "SCHEMAS",
    "TEXT",
    "FieldError",
    "OperationError",
    "Reply",
    "artifact_field",
    "batching_field",
    "bool_field",
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
        '"batching" := ' + _BATCHING + ' (optional), "labels" := [string] (optional)}'
    ),
    "stage_model": (
        '{"model_name" := string, "model_version" := string, "input_type" := '
        + _INPUT_TYPES
        + ', "artifact_path" := string, "num_replicas" := int (default 1), '
        '"batching" := ' + _BATCHING + " (optional)}"
    ),
    "upload_model": (
        "POST /admin/upload_model?name=<model>&version=<version>&input_type=<type>"
        "[&num_replicas=<int>][&batching=<JSON object>] with the body a cloudpickle file or "
        "a gzipped tar of an artifact directory (clipper.deployers.package)"
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
        '"interval_s" := number, "shed_threshold" := number} (all settings optional)'
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
}


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
    allowed = {
        "controller",
        "max_batch_size",
        "max_wait_micros",
        "wait",
        "in_flight",
        "target_fraction",
        "params",
    }
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

"""The OpenAPI 3.1 documents of the two HTTP ports, served at ``GET /openapi.json`` on each.

The query port's (:func:`query_document`): the Clipper REST routes (predict, update, readiness,
health, metrics) and the V2 REST routes, their request and answer bodies and error documents.
The admin port's (:func:`admin_document`) is written from :data:`~clipper.frontend.admin_fields.
FIELDS`, the table every admin body is checked against before its handler reads it, for the
routes the admin API serves: a field the server checks is a field the document names, and a
route without a table entry refuses to start (admin.py). See docs/query-api.md and
docs/admin-api.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from clipper.frontend.admin_fields import FIELDS, SCHEMAS, Field
from clipper.frontend.v2_request import NP_DTYPES, OUTPUT_NAME
from clipper.version import __version__

__all__ = [
    "OPENAPI_VERSION",
    "admin_document",
    "document_bytes",
    "field_schema",
    "query_document",
    "request_schema",
]

OPENAPI_VERSION = "3.1.0"
_JSON = "application/json"
_TEXT = "text/plain"
_V2_DATATYPES = [*sorted(NP_DTYPES), "BYTES"]
_KINDS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "int": {"type": "integer"},
    "number": {"type": "number"},
    "bool": {"type": "boolean"},
    "object": {"type": "object"},
    "strings": {"type": "array", "items": {"type": "string"}},
    "int_map": {"type": "object", "additionalProperties": {"type": "integer"}},
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _content(media: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {media: {"schema": schema}}


def _answer(description: str, media: str | None = None, schema: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description}
    if media is not None:
        out["content"] = _content(media, schema if schema is not None else {})
    return out


def document_bytes(doc: dict[str, Any]) -> bytes:
    """A document as the routes send it (built once per port: the tables do not change)."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


# -- the admin API -----------------------------------------------------------------------------
def field_schema(f: Field) -> dict[str, Any]:
    """One field's JSON Schema: its kind (or its own schema), its choices, null when allowed."""
    schema = dict(f.schema) if f.schema is not None else dict(_KINDS[f.kind])
    if f.choices:
        schema["enum"] = list(f.choices)
    if f.nullable:
        base = schema["type"]
        schema["type"] = [base, "null"]
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    if f.doc:
        schema["description"] = f.doc
    return schema


def request_schema(route: str) -> dict[str, Any]:
    """The JSON Schema of a JSON route's body, from :data:`FIELDS`."""
    spec = FIELDS[route]
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {f.name: field_schema(f) for f in spec.fields},
    }
    required = [f.name for f in spec.fields if f.required]
    if required:
        schema["required"] = required
    if spec.closed:
        schema["additionalProperties"] = False
    return schema


_ADMIN_REPLIES: dict[str, tuple[str, dict[str, Any]]] = {
    "text": (_TEXT, {"type": "string"}),
    "json": (_JSON, {}),
    "gzip": ("application/gzip", {"type": "string", "contentMediaType": "application/gzip"}),
}
_DEPLOYED: dict[str, Any] = {
    "type": "object",
    "required": ["model_name", "model_version", "num_replicas"],
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "num_replicas": {"type": "integer"},
    },
}


def _admin_operation(name: str) -> dict[str, Any]:
    spec = FIELDS[name]
    media, schema = _ADMIN_REPLIES[spec.reply]
    if name in ("deploy_model", "upload_model"):
        schema = _DEPLOYED
    op: dict[str, Any] = {
        "operationId": name,
        "summary": spec.summary,
        "tags": ["change" if spec.change else "read"],
        "responses": {"200": _answer("done", media, schema)},
    }
    if name in SCHEMAS:
        op["description"] = f"Expected JSON schema (as its errors name it): {SCHEMAS[name]}"
    if spec.method == "GET":
        op["responses"]["200"] = _answer("PONG", _TEXT, {"type": "string", "const": "PONG"})
        return op
    op["responses"]["400"] = _answer(
        "a body off the schema (Error parsing JSON: ... Expected JSON schema: ...) or a "
        "value the operation refuses",
        _TEXT,
        {"type": "string"},
    )
    if spec.change:
        op["responses"]["409"] = _answer("the change would remove what is served", _TEXT)
        op["responses"]["503"] = _answer(
            "the config store could not take the change: nothing changed", _TEXT
        )
    if spec.query:
        op["parameters"] = [
            {
                "name": f.name,
                "in": "query",
                "required": f.required,
                "schema": field_schema(f),
            }
            for f in spec.fields
        ]
        op["requestBody"] = {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    else:
        op["requestBody"] = {"required": True, "content": _content(_JSON, request_schema(name))}
    return op


def admin_document(routes: Iterable[str]) -> dict[str, Any]:
    """The admin API's OpenAPI document for the routes it serves (``AdminApi.route_names``);
    a route that :data:`FIELDS` lacks is a KeyError."""
    paths = {}
    for name in routes:
        method = FIELDS[name].method.lower()
        paths[f"/admin/{name}"] = {method: _admin_operation(name)}
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "clipper-serve admin API",
            "version": __version__,
            "description": (
                "The management routes (docs/admin-api.md). Every route but ping is a POST; "
                "when the frontend has an admin token, every route but this document and "
                "the dashboard's pages needs Authorization: Bearer <token>."
            ),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
        "paths": paths,
    }


# -- the query API -----------------------------------------------------------------------------
_CLIPPER_ERROR = {
    "type": "object",
    "required": ["error", "cause"],
    "properties": {"error": {"type": "string"}, "cause": {"type": "string"}},
}
_V2_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_UID = {"type": ["string", "integer"], "description": "the user id (selection state, cache)"}
_PREDICTION = {
    "type": "object",
    "required": ["query_id", "output", "default"],
    "properties": {
        "query_id": {"type": "integer"},
        "output": {"description": "the model's output (any JSON value)"},
        "default": {"type": "boolean", "description": "true: the default output"},
        "default_explanation": {"type": "string"},
        "models": {"type": "array", "items": {"type": "string"}},
        "confidence": {"type": "number"},
        "degraded": {"type": "array", "items": {"type": "string"}},
        "dropped": {"type": "array", "items": {"type": "string"}},
    },
}
_PREDICT_REQUEST = {
    "type": "object",
    "properties": {
        "input": {"description": "one input, of the application's input type"},
        "input_batch": {"type": "array", "description": "several inputs: one answer each"},
        "version": {"type": "string", "description": "the model version to ask"},
        "uid": _UID,
    },
    "anyOf": [{"required": ["input"]}, {"required": ["input_batch"]}],
}
_PREDICT_RESPONSE = {
    "anyOf": [
        _ref("Prediction"),
        {
            "type": "object",
            "required": ["batch_predictions"],
            "properties": {"batch_predictions": {"type": "array", "items": _ref("Prediction")}},
        },
    ]
}
_FEEDBACK_REQUEST = {
    "type": "object",
    "required": ["input", "label"],
    "properties": {
        "input": {"description": "the input, of the application's input type"},
        "label": {"not": {"type": "null"}, "description": "the true output for the input"},
        "uid": _UID,
    },
}
_READINESS = {
    "type": "object",
    "required": ["ready", "reasons"],
    "properties": {
        "ready": {"type": "boolean"},
        "reasons": {"type": "array", "items": {"type": "string"}},
        "models_without_replicas": {"type": "array"},
        "draining": {"type": "boolean"},
        "app": {"type": "string"},
        "version": {"type": "string"},
    },
}
_TENSOR_DATA = {"type": "array", "description": "the tensor's elements, flat or nested"}
_V2_INPUT = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {"type": "string", "enum": _V2_DATATYPES},
        "parameters": {"type": "object"},
        "data": _TENSOR_DATA,
    },
}
_V2_INFER_REQUEST = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "inputs": {"type": "array", "minItems": 1, "items": _ref("V2InputTensor")},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
            },
        },
    },
}
_V2_INFER_RESPONSE = {
    "type": "object",
    "required": ["model_name", "model_version", "outputs"],
    "properties": {
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "datatype", "shape"],
                "properties": {
                    "name": {"type": "string", "const": OUTPUT_NAME},
                    "datatype": {"type": "string", "enum": _V2_DATATYPES},
                    "shape": {"type": "array", "items": {"type": "integer"}},
                    "parameters": {"type": "object"},
                    "data": _TENSOR_DATA,
                },
            },
        },
    },
}
_V2_TENSOR_META = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}
_V2_METADATA = {
    "type": "object",
    "required": ["name", "versions", "platform", "inputs", "outputs"],
    "properties": {
        "name": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": _V2_TENSOR_META},
        "outputs": {"type": "array", "items": _V2_TENSOR_META},
    },
}
_V2_READY = {
    "type": "object",
    "required": ["name", "ready", "reasons"],
    "properties": {
        "name": {"type": "string"},
        "ready": {"type": "boolean"},
        "reasons": {"type": "array", "items": {"type": "string"}},
    },
}


def _rest_errors(*codes: str) -> dict[str, Any]:
    what = {
        "400": "the body is not what the application takes (the cause names the schema)",
        "404": "no such application",
        "413": "more items than max_items_per_request",
        "503": "refused under overload, or the frontend is draining",
    }
    return {c: _answer(what[c], _JSON, _ref("ClipperError")) for c in codes}


def _v2_errors(*codes: str) -> dict[str, Any]:
    what = {
        "400": "a request the model cannot take",
        "404": "no such model (application) or version",
        "413": "more rows than max_items_per_request",
        "503": "refused under overload, or the frontend is draining",
    }
    return {c: _answer(what[c], _JSON, _ref("V2Error")) for c in codes}


_APP = {"name": "app", "in": "path", "required": True, "schema": {"type": "string"}}
_MODEL = {
    "name": "model",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "a V2 model is an application",
}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}


def _v2_model_paths(prefix: str, params: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        prefix: {
            "parameters": params,
            "get": {
                "operationId": f"v2_metadata{'_version' if len(params) > 1 else ''}",
                "summary": "The model's metadata",
                "responses": {
                    "200": _answer("the metadata", _JSON, _V2_METADATA),
                    **_v2_errors("404"),
                },
            },
        },
        f"{prefix}/ready": {
            "parameters": params,
            "get": {
                "operationId": f"v2_model_ready{'_version' if len(params) > 1 else ''}",
                "summary": "Whether the model can answer with a prediction",
                "responses": {
                    "200": _answer("ready", _JSON, _ref("V2Ready")),
                    "400": _answer("not ready (the reasons say why)", _JSON, _ref("V2Ready")),
                    **_v2_errors("404"),
                },
            },
        },
        f"{prefix}/config": {
            "parameters": params,
            "get": {
                "operationId": f"v2_model_config{'_version' if len(params) > 1 else ''}",
                "summary": "Triton's model configuration (tensors, max batch size, batching)",
                "responses": {
                    "200": _answer("the configuration", _JSON, {"type": "object"}),
                    **_v2_errors("404"),
                },
            },
        },
        f"{prefix}/infer": {
            "parameters": params,
            "post": {
                "operationId": f"v2_infer{'_version' if len(params) > 1 else ''}",
                "summary": "Predict: the first input's leading dimension is the batch",
                "requestBody": {
                    "required": True,
                    "content": {
                        **_content(_JSON, _ref("V2InferRequest")),
                        "application/octet-stream": {
                            "schema": {
                                "type": "string",
                                "description": (
                                    "the JSON header then binary tensor data, the header's "
                                    "length in the Inference-Header-Content-Length header"
                                ),
                            }
                        },
                    },
                },
                "responses": {
                    "200": {
                        "description": "one output tensor, named output",
                        "content": {
                            **_content(_JSON, _ref("V2InferResponse")),
                            "application/octet-stream": {"schema": {"type": "string"}},
                        },
                    },
                    **_v2_errors("400", "404", "413", "503"),
                },
            },
        },
    }


def query_document() -> dict[str, Any]:
    """The query API's OpenAPI document: Clipper REST and V2 REST."""
    status = {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "const": "ok"}},
    }
    live = {"200": _answer("the process answers", _JSON, status)}
    ready = {
        "200": _answer("ready", _JSON, _ref("Readiness")),
        "503": _answer("not ready (the reasons say why)", _JSON, _ref("Readiness")),
    }
    ready_params = [
        {"name": "app", "in": "query", "required": False, "schema": {"type": "string"}},
        {"name": "version", "in": "query", "required": False, "schema": {"type": "string"}},
    ]
    paths: dict[str, Any] = {
        "/{app}/predict": {
            "parameters": [_APP],
            "post": {
                "operationId": "predict",
                "summary": "Predict with an application",
                "requestBody": {
                    "required": True,
                    "content": _content(_JSON, _ref("PredictRequest")),
                },
                "responses": {
                    "200": _answer(
                        "a prediction (or the default output), one per input",
                        _JSON,
                        _ref("PredictResponse"),
                    ),
                    **_rest_errors("400", "404", "413", "503"),
                },
            },
        },
        "/{app}/update": {
            "parameters": [_APP],
            "post": {
                "operationId": "update",
                "summary": "Feedback: the true output for an input",
                "requestBody": {
                    "required": True,
                    "content": _content(_JSON, _ref("FeedbackRequest")),
                },
                "responses": {
                    "200": _answer("received", _TEXT, {"type": "string"}),
                    **_rest_errors("400", "404"),
                },
            },
        },
        "/{app}/ready": {
            "parameters": [_APP],
            "get": {
                "operationId": "app_ready",
                "summary": "Whether an application can answer with a prediction",
                "parameters": [ready_params[1]],
                "responses": {**ready, **_rest_errors("404")},
            },
        },
        "/health": {"get": {"operationId": "health", "summary": "Liveness", "responses": live}},
        "/healthz": {"get": {"operationId": "healthz", "summary": "Liveness", "responses": live}},
        "/health/live": {
            "get": {"operationId": "health_live", "summary": "Liveness", "responses": live}
        },
        "/ready": {
            "get": {
                "operationId": "ready",
                "summary": "The frontend's readiness (?app=: one application's)",
                "parameters": ready_params,
                "responses": {**ready, **_rest_errors("400", "404")},
            }
        },
        "/health/ready": {
            "get": {
                "operationId": "health_ready",
                "summary": "The frontend's readiness (?app=: one application's)",
                "parameters": ready_params,
                "responses": {**ready, **_rest_errors("400", "404")},
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Metrics: Prometheus text, or JSON (?format=json or Accept)",
                "parameters": [
                    {
                        "name": "format",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["json", "prometheus", "text"]},
                    }
                ],
                "responses": {
                    "200": {
                        "description": "the metrics",
                        "content": {
                            _TEXT: {"schema": {"type": "string"}},
                            _JSON: {"schema": {"type": "object"}},
                        },
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "responses": {"200": _answer("the document", _JSON, {"type": "object"})},
            }
        },
        "/v2": {
            "get": {
                "operationId": "v2_server_metadata",
                "summary": "The V2 server's metadata",
                "responses": {
                    "200": _answer(
                        "name, version, extensions",
                        _JSON,
                        {
                            "type": "object",
                            "required": ["name", "version", "extensions"],
                            "properties": {
                                "name": {"type": "string"},
                                "version": {"type": "string"},
                                "extensions": {"type": "array", "items": {"type": "string"}},
                            },
                        },
                    )
                },
            }
        },
        "/v2/health/live": {
            "get": {
                "operationId": "v2_live",
                "summary": "Liveness (an empty body)",
                "responses": {"200": _answer("live")},
            }
        },
        "/v2/health/ready": {
            "get": {
                "operationId": "v2_ready",
                "summary": "The frontend's readiness (an empty body)",
                "responses": {"200": _answer("ready"), "503": _answer("not ready")},
            }
        },
        **_v2_model_paths("/v2/models/{model}", [_MODEL]),
        **_v2_model_paths("/v2/models/{model}/versions/{version}", [_MODEL, _VERSION]),
    }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "clipper-serve query API",
            "version": __version__,
            "description": (
                "Clipper REST (docs/query-api.md) and the Open Inference Protocol's REST "
                "binding (docs/v2-protocol.md). An input's shape is the application's input "
                "type: the schemas here take any JSON value where it goes."
            ),
        },
        "components": {
            "schemas": {
                "ClipperError": _CLIPPER_ERROR,
                "PredictRequest": _PREDICT_REQUEST,
                "Prediction": _PREDICTION,
                "PredictResponse": _PREDICT_RESPONSE,
                "FeedbackRequest": _FEEDBACK_REQUEST,
                "Readiness": _READINESS,
                "V2Error": _V2_ERROR,
                "V2InputTensor": _V2_INPUT,
                "V2InferRequest": _V2_INFER_REQUEST,
                "V2InferResponse": _V2_INFER_RESPONSE,
                "V2Ready": _V2_READY,
            }
        },
        "paths": paths,
    }

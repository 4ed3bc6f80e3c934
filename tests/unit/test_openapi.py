"""The OpenAPI documents at GET /openapi.json on the query and admin ports: both are valid
OpenAPI 3.1, the admin one names every route the admin API serves with the fields its bodies
are checked against (admin_fields.FIELDS), and real requests and answers match their
documented schemas."""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

import orjson
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from clipper.frontend.admin_fields import FIELDS, SCHEMAS, Field
from clipper.frontend.http import Refusal
from clipper.frontend.openapi import request_schema
from clipper.frontend.routes import AdminRoutes
from tests.inprocess import InProcessFrontend, RouterClient, RouterResponse, in_process_frontend
from tests.integration import models

SLO_US = 2_000_000


async def document(client: RouterClient) -> dict[str, Any]:
    resp = await client.get("/openapi.json")
    assert resp.status == 200, resp.body
    assert resp.content_type == "application/json"
    doc: dict[str, Any] = resp.json()
    return doc


def check(doc: dict[str, Any], schema: dict[str, Any], instance: Any) -> None:
    """``instance`` against ``schema`` (an object of ``doc``, its $refs resolved in ``doc``)."""
    root = {"allOf": [schema], "components": doc.get("components", {})}
    errors = [e.message for e in Draft202012Validator(root).iter_errors(instance)]
    assert errors == [], (instance, errors)


def answer_schema(
    doc: dict[str, Any], path: str, method: str, status: int, media: str = "application/json"
) -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][path][method]["responses"][str(status)]["content"][media][
        "schema"
    ]
    return schema


def body_schema(doc: dict[str, Any], path: str) -> dict[str, Any]:
    schema: dict[str, Any] = doc["paths"][path]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    return schema


def checked_against(
    doc: dict[str, Any], path: str, method: str, resp: RouterResponse
) -> RouterResponse:
    media = resp.content_type.split(";")[0]
    body: Any = resp.json() if media == "application/json" else resp.body.decode()
    check(doc, answer_schema(doc, path, method, resp.status, media), body)
    return resp


async def test_both_documents_are_valid_openapi_3_1(inproc_frontend: InProcessFrontend) -> None:
    for client in (inproc_frontend.query, inproc_frontend.admin):
        doc = await document(client)
        assert doc["openapi"] == "3.1.0"
        validate(cast(Any, doc))  # raises on any departure from the 3.1 schema


async def test_the_query_document_names_every_query_route(
    inproc_frontend: InProcessFrontend,
) -> None:
    paths = set((await document(inproc_frontend.query))["paths"])
    assert {
        "/{app}/predict", "/{app}/update", "/{app}/ready", "/health", "/ready", "/metrics",
        "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{model}",
        "/v2/models/{model}/ready", "/v2/models/{model}/infer",
        "/v2/models/{model}/versions/{version}/ready",
        "/v2/models/{model}/versions/{version}/infer",
    } <= paths  # fmt: skip


async def test_every_admin_route_is_documented_with_the_fields_it_checks(
    inproc_frontend: InProcessFrontend,
) -> None:
    names = inproc_frontend.clipper.admin.route_names()
    doc = await document(inproc_frontend.admin)
    assert set(doc["paths"]) == {f"/admin/{n}" for n in names}
    assert len(names) == len(set(names)) > 30
    for name in names:
        spec = FIELDS[name]
        op = doc["paths"][f"/admin/{name}"][spec.method.lower()]
        if spec.method == "GET":
            assert "requestBody" not in op
            continue
        if spec.query:
            documented = [p["name"] for p in op["parameters"]]
            required = {p["name"] for p in op["parameters"] if p["required"]}
        else:
            schema = body_schema(doc, f"/admin/{name}")
            documented = list(schema["properties"])
            required = set(schema.get("required", []))
        assert documented == [f.name for f in spec.fields], name
        assert required == {f.name for f in spec.fields if f.required}, name


def test_every_field_is_named_in_its_routes_schema_text() -> None:
    # The one-line schema of the error messages and the table say the same keys.
    for name, spec in FIELDS.items():
        if name == "ping":
            continue
        text = SCHEMAS[name]
        for f in spec.fields:
            assert re.search(rf'"{f.name}"|\b{f.name}=', text), (name, f.name, text)


_GOOD: dict[str, Any] = {
    "string": "x", "int": 1, "number": 0.5, "bool": True, "object": {}, "strings": ["a"],
    "int_map": {"1": 0},
}  # fmt: skip
_BAD: dict[str, Any] = {
    "string": 5, "int": "5", "number": "0.5", "bool": "yes", "object": [1], "strings": [1],
}  # fmt: skip


def _json_routes() -> list[str]:
    return [n for n, s in FIELDS.items() if s.method == "POST" and not s.query]


@pytest.mark.parametrize("route", _json_routes())
async def test_the_server_refuses_what_the_document_refuses(
    inproc_frontend: InProcessFrontend, route: str
) -> None:
    """Per field: a missing required key and a value of the wrong type are refused by the
    server with the schema message, and by the documented schema; nothing is changed."""
    fields = FIELDS[route].fields
    schema = request_schema(route)
    required = [f for f in fields if f.required]
    base = {f.name: _GOOD[f.kind] for f in required}
    cases: list[tuple[dict[str, Any], str]] = [
        ({k: v for k, v in base.items() if k != f.name}, f"does not have required key: {f.name}")
        for f in required
    ]
    cases += [
        ({**base, f.name: _BAD[f.kind]}, f"JSON key {f.name} expected type")
        for f in fields
        if f.check and f.schema is None
    ]
    if FIELDS[route].closed:
        cases.append(({**base, "bogus": 1}, "unknown keys ['bogus']"))
    assert cases or not fields, route
    for body, says in cases:
        resp = await inproc_frontend.admin.post(f"/admin/{route}", json=body)
        assert resp.status == 400, (route, body, resp.body)
        assert says in resp.body.decode(), (route, body, resp.body)
        assert list(Draft202012Validator(schema).iter_errors(body)), (route, body)
    assert inproc_frontend.clipper.registry.apps == {}


def test_a_nullable_choice_takes_null_and_its_names() -> None:
    f = Field("mode", "string", nullable=True, choices=("a", "b"))
    schema = {"type": "object", "properties": {"mode": _schema_of(f)}}
    v = Draft202012Validator(schema)
    assert [v.is_valid({"mode": m}) for m in ("a", None, "c", 1)] == [True, True, False, False]


def _schema_of(f: Field) -> dict[str, Any]:
    from clipper.frontend.openapi import field_schema

    return field_schema(f)


async def test_the_admin_document_needs_no_token_and_the_routes_still_do() -> None:
    async with in_process_frontend(admin_token="s3cret") as fe:
        doc = await document(fe.admin)
        assert "/admin/add_app" in doc["paths"]
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        refused = await fe.admin.post("/admin/get_all_applications", json={})
        assert refused.status == 401
        routes = cast(AdminRoutes, fe.admin.router)
        assert routes.gate(b"GET", "/openapi.json", {}, False) is True
        assert isinstance(routes.gate(b"POST", "/openapi.json", {}, True), Refusal)
        assert isinstance(routes.gate(b"GET", "/admin/ping", {}, False), Refusal)


async def test_real_requests_match_their_documented_schemas(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    admin_doc, query_doc = await document(fe.admin), await document(fe.query)
    add_app = {
        "name": "lonely", "input_type": "doubles", "default_output": "-1.0",
        "latency_slo_micros": SLO_US, "overload": "reject", "policy": "single",
    }  # fmt: skip
    check(admin_doc, body_schema(admin_doc, "/admin/add_app"), add_app)
    added = await fe.admin.post("/admin/add_app", json=add_app)
    assert added.status == 200, added.body
    checked_against(admin_doc, "/admin/add_app", "post", added)
    again = checked_against(
        admin_doc, "/admin/add_app", "post", await fe.admin.post("/admin/add_app", json=add_app)
    )
    assert again.status == 400
    listed = {"verbose": True}
    check(admin_doc, body_schema(admin_doc, "/admin/get_all_applications"), listed)
    apps = await fe.admin.post("/admin/get_all_applications", json=listed)
    assert [a["name"] for a in apps.json()] == ["lonely"]

    # Clipper REST: one input, a batch, an unknown application, a body off the schema.
    for body in ({"input": [1.0, 2.0], "uid": 3}, {"input_batch": [[1.0], [2.0]]}):
        check(query_doc, body_schema(query_doc, "/{app}/predict"), body)
        resp = await fe.query.post("/lonely/predict", json=body)
        assert resp.status == 200, resp.body
        checked_against(query_doc, "/{app}/predict", "post", resp)
    missing = checked_against(
        query_doc, "/{app}/predict", "post", await fe.query.post("/nope/predict", json={})
    )
    assert missing.status == 404
    off = checked_against(
        query_doc, "/{app}/predict", "post", await fe.query.post("/lonely/predict", json={})
    )
    assert off.status == 400
    check(query_doc, {"not": body_schema(query_doc, "/{app}/predict")}, {"uid": 1})
    ready = checked_against(query_doc, "/ready", "get", await fe.query.get("/ready"))
    assert ready.status == 200
    app_ready = await fe.query.get("/lonely/ready")
    assert checked_against(query_doc, "/{app}/ready", "get", app_ready).status == 503
    health = checked_against(query_doc, "/health", "get", await fe.query.get("/health"))
    assert health.json() == {"status": "ok"}

    # V2: an infer (the default output: no model is linked), the metadata, an unknown model.
    infer = {"id": "r1", "inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP64",
                                     "data": [[1.0], [2.0]]}]}  # fmt: skip
    check(query_doc, body_schema(query_doc, "/v2/models/{model}/infer"), infer)
    resp = await fe.query.post("/v2/models/lonely/infer", json=infer)
    assert resp.status == 200, resp.body
    assert checked_against(query_doc, "/v2/models/{model}/infer", "post", resp).json()["id"] == "r1"
    meta = await fe.query.get("/v2/models/lonely")
    assert checked_against(query_doc, "/v2/models/{model}", "get", meta).status == 200
    v2_ready = await fe.query.get("/v2/models/lonely/ready")
    assert checked_against(query_doc, "/v2/models/{model}/ready", "get", v2_ready).status == 400
    unknown = await fe.query.post("/v2/models/nope/infer", json=infer)
    assert checked_against(query_doc, "/v2/models/{model}/infer", "post", unknown).status == 404
    server = checked_against(query_doc, "/v2", "get", await fe.query.get("/v2"))
    assert orjson.loads(server.body)["extensions"] == []


@pytest.mark.integration
async def test_a_deployed_models_answers_match_their_documented_schemas(
    inproc_frontend: InProcessFrontend,
) -> None:
    c = inproc_frontend.clipper
    admin_doc = await document(inproc_frontend.admin)
    async with asyncio.timeout(120):
        await c.deploy_model("sums", "1", models.row_sums, input_type="doubles")
    link = {"app_name": "doubles", "model_names": ["sums"]}
    check(admin_doc, body_schema(admin_doc, "/admin/add_model_links"), link)
    await c.register_application("doubles", "doubles", "-1.0", SLO_US)
    linked = await inproc_frontend.admin.post("/admin/add_model_links", json=link)
    checked_against(admin_doc, "/admin/add_model_links", "post", linked)
    query = RouterClient.for_server(c.http, limit_s=30)
    doc = await document(query)
    predicted = await query.post("/doubles/predict", json={"input": [1.0, 2.0, 3.5]})
    one = checked_against(doc, "/{app}/predict", "post", predicted).json()
    assert (one["output"], one["default"]) == (6.5, False)
    infer = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP64", "data": [1.0, 2.0]}]}
    answered = await query.post("/v2/models/doubles/versions/1/infer", json=infer)
    out = checked_against(doc, "/v2/models/{model}/versions/{version}/infer", "post", answered)
    assert out.json()["outputs"][0]["data"] == [3.0]
    replicas = await inproc_frontend.admin.post("/admin/get_replicas", json={"model_name": "sums"})
    assert [r["model_name"] for r in replicas.json()] == ["sums"]

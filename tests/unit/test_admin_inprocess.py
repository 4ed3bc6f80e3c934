"""The admin port's routes (AdminRoutes: the bearer token, then AdminApi) driven in process
through the router its HTTP server calls. Changes answer from tasks once the store has them:
the client awaits that answer. Behaviours as tests/integration/test_admin_api.py checks them on
the wire; no model is deployed here.
"""

from __future__ import annotations

from typing import Any

import pytest

from clipper.frontend.admin_fields import SCHEMAS
from clipper.query.prediction import NO_MODELS
from tests.inprocess import InProcessFrontend, RouterClient, RouterResponse, in_process_frontend

SLO_US = 2_000_000
TEXT = "text/plain; charset=utf-8"


def app_doc(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "input_type": "doubles",
        "default_output": "-1.0",
        "latency_slo_micros": SLO_US,
        **extra,
    }


def text_of(resp: RouterResponse, status: int = 200) -> str:
    assert resp.status == status, (resp.status, resp.body)
    assert resp.content_type == TEXT
    return resp.text


def json_of(resp: RouterResponse) -> Any:
    assert resp.status == 200, (resp.status, resp.body)
    assert resp.content_type == "application/json"
    return resp.json()


async def admin_json(admin: RouterClient, route: str, doc: Any) -> Any:
    return json_of(await admin.post(f"/admin/{route}", json=doc))


async def test_ping(inproc_frontend: InProcessFrontend) -> None:
    assert text_of(await inproc_frontend.admin.get("/admin/ping")) == "PONG"
    assert text_of(await inproc_frontend.admin.get("/admin/ping/")) == "PONG"
    assert (
        text_of(await inproc_frontend.admin.post("/admin/ping", json={}), 405)
        == "use GET /admin/ping"
    )


async def test_bearer_token_is_required_when_configured() -> None:
    async with in_process_frontend(admin_token="s3cret") as fe:
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for method, path in (("GET", "/admin/ping"), ("POST", "/admin/get_all_applications")):
                resp = await fe.admin.request(method, path, json={}, headers=headers)
                assert resp.status == 401, (headers, path)
                assert resp.content_type == "application/json"
                assert resp.json()["error"] == "Unauthorized"
                assert "Authorization: Bearer <token>" in resp.json()["cause"]
        resp = await fe.admin.get("/admin/ping", headers={"Authorization": "Bearer s3cret"})
        assert text_of(resp) == "PONG"
        # The query port takes no token.
        assert (await fe.query.get("/health")).status == 200


async def test_bearer_scheme_is_case_insensitive_and_a_repeated_header_refused() -> None:
    async with in_process_frontend(admin_token="s3cret") as fe:
        for scheme in ("bearer", "BEARER", "BeArEr"):
            resp = await fe.admin.get("/admin/ping", headers={"Authorization": f"{scheme} s3cret"})
            assert text_of(resp) == "PONG", scheme
        # Two Authorization headers, combined as RFC 9110 says (one value, comma-joined):
        # refused even when one of them is right, whichever the HTTP layer would keep.
        for value in ("Bearer s3cret, Bearer wrong", "Bearer wrong, Bearer s3cret"):
            resp = await fe.admin.get("/admin/ping", headers={"Authorization": value})
            assert resp.status == 400, value
            assert "more than once" in resp.json()["cause"]
        for near in ("Bearer s3cre", "Bearer s3cret2", "Bearers3cret", "Basic s3cret"):
            resp = await fe.admin.get("/admin/ping", headers={"Authorization": near})
            assert resp.status == 401, near


def test_token_comparison() -> None:
    from clipper.frontend.routes import bearer_token_matches, repeated_authorization

    assert bearer_token_matches(b"Bearer t0k", b"t0k")
    assert bearer_token_matches(b"bearer  t0k ", b"t0k")
    assert not bearer_token_matches(None, b"t0k")
    assert not bearer_token_matches(b"Bearer", b"t0k")
    assert not bearer_token_matches(b"Bearer t0", b"t0k")
    assert repeated_authorization(b"Bearer a, Bearer b")
    assert not repeated_authorization(b"Bearer a")


async def test_no_token_configured_lets_every_request_in(
    inproc_frontend: InProcessFrontend,
) -> None:
    assert inproc_frontend.clipper.config.admin_token is None
    resp = await inproc_frontend.admin.get(
        "/admin/ping", headers={"Authorization": "Bearer anything"}
    )
    assert text_of(resp) == "PONG"


async def test_application_round_trip(inproc_frontend: InProcessFrontend) -> None:
    admin, query = inproc_frontend.admin, inproc_frontend.query
    assert await admin_json(admin, "get_all_applications", {}) == []
    added = text_of(await admin.post("/admin/add_app", json=app_doc("rt", input_type="d")))
    assert added == "Successfully added application with name 'rt'"
    assert await admin_json(admin, "get_all_applications", {"verbose": False}) == ["rt"]
    expected = {
        "input_type": "doubles",
        "default_output": "-1.0",
        "latency_slo_micros": SLO_US,
        "name": "rt",
        "linked_models": [],
    }
    assert await admin_json(admin, "get_all_applications", {"verbose": True}) == [expected]
    assert await admin_json(admin, "get_application", {"name": "rt"}) == expected
    doc = json_of(await query.post("/rt/predict", json={"input": [1.0]}))
    assert (doc["output"], doc["default_explanation"]) == (-1.0, NO_MODELS)

    change = {"name": "rt", "default_output": '{"x": 1}', "latency_slo_micros": 50_000}
    updated = text_of(await admin.post("/admin/update_app", json=change))
    assert updated == "Successfully updated application with name 'rt'"
    got = await admin_json(admin, "get_application", {"name": "rt"})
    assert (got["default_output"], got["latency_slo_micros"]) == ('{"x": 1}', 50_000)
    assert json_of(await query.post("/rt/predict", json={"input": [1.0]}))["output"] == {"x": 1}

    deleted = text_of(await admin.post("/admin/delete_app", json={"name": "rt"}))
    assert deleted == "Successfully deleted application with name 'rt'"
    assert await admin_json(admin, "get_all_applications", {}) == []
    assert await admin_json(admin, "get_application", {"name": "rt"}) == {}
    assert (await query.post("/rt/predict", json={"input": [1.0]})).status == 404
    again = await admin.post("/admin/delete_app", json={"name": "rt"})
    assert text_of(again, 400) == "Application 'rt' does not exist"


async def test_refused_operations_answer_400_with_the_reason(
    inproc_frontend: InProcessFrontend,
) -> None:
    admin = inproc_frontend.admin
    text_of(await admin.post("/admin/add_app", json=app_doc("dup")))
    dup = await admin.post("/admin/add_app", json=app_doc("dup"))
    assert text_of(dup, 400) == "application 'dup' already exists"
    bad = await admin.post("/admin/add_app", json=app_doc("bt", input_type="tensor"))
    assert "unknown input type 'tensor'" in text_of(bad, 400)
    unknown_key = await admin.post("/admin/update_app", json={"name": "dup", "slo": 5})
    assert "unknown keys ['slo']" in text_of(unknown_key, 400)
    assert await admin_json(admin, "get_all_applications", {}) == ["dup"]


@pytest.mark.parametrize(
    ("route", "doc", "message"),
    [
        (
            "add_app",
            app_doc("x", latency_slo_micros="100"),
            "Type mismatch! JSON key latency_slo_micros expected type int",
        ),
        (
            "add_app",
            {"name": "x", "input_type": "doubles"},
            "JSON object does not have required key: ",
        ),
        (
            "update_app",
            {"name": "x", "cache": "yes"},
            "Type mismatch! JSON key cache expected type bool",
        ),
        (
            "get_all_applications",
            {"verbose": "yes"},
            "Type mismatch! JSON key verbose expected type bool",
        ),
        ("get_all_models", [1, 2], "the body must be a JSON object"),
    ],
)
async def test_schema_errors_name_the_field_and_the_schema(
    inproc_frontend: InProcessFrontend, route: str, doc: Any, message: str
) -> None:
    text = text_of(await inproc_frontend.admin.post(f"/admin/{route}", json=doc), 400)
    assert text.startswith(f"Error parsing JSON: {message}"), text
    assert text.endswith(f". Expected JSON schema: {SCHEMAS[route]}"), text
    assert await admin_json(inproc_frontend.admin, "get_all_applications", {}) == []


async def test_malformed_json_names_the_schema(inproc_frontend: InProcessFrontend) -> None:
    text = text_of(await inproc_frontend.admin.post("/admin/add_app", body=b"{not json"), 400)
    assert text.startswith("Error parsing JSON: ")
    assert text.endswith(f"Expected JSON schema: {SCHEMAS['add_app']}")


@pytest.mark.parametrize("route", ["add_app", "get_all_applications", "delete_app"])
async def test_get_of_a_post_route_is_405(inproc_frontend: InProcessFrontend, route: str) -> None:
    resp = await inproc_frontend.admin.get(f"/admin/{route}")
    assert text_of(resp, 405) == f"use POST /admin/{route} with a JSON body"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/admin/no_such_route"), ("GET", "/admin/no_such_route"), ("GET", "/no_such_route")],
)
async def test_unknown_route_is_404(
    inproc_frontend: InProcessFrontend, method: str, path: str
) -> None:
    resp = await inproc_frontend.admin.request(method, path)
    assert (resp.status, resp.content_type) == (404, "application/json")
    doc = resp.json()
    assert doc["error"] == "Not found"
    assert f"no admin route for {method} {path}" in doc["cause"]

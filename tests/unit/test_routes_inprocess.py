"""The query port's routes (QueryRoutes, and the V2 REST module behind it) driven in process
through the router its HTTP server calls: no socket but the ones Clipper binds on port 0.

Behaviours as tests/integration/test_query_path.py and test_v2_rest.py check them on the wire;
here without containers, except the one test marked ``integration`` that deploys a model.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

import clipper as clipper_pkg
from clipper.query.prediction import NO_MODELS
from clipper.server import Clipper
from tests.inprocess import InProcessFrontend, RouterClient, RouterResponse, in_process_frontend
from tests.integration import models

SLO_US = 2_000_000
NOT_CONNECTED = "No replica of model m:1 is alive (1 configured); none is connected"


async def lonely_app(c: Clipper, name: str = "lonely", default: str = "-1.0") -> None:
    """An application of doubles with no model linked: it answers its default output."""
    await c.register_application(name, "doubles", default, SLO_US)


async def linked_without_replicas(fe: InProcessFrontend, app: str = "waiting") -> None:
    """``app`` linked to model m:1, which wants one replica and has none: registered by
    ``add_model`` for containers started elsewhere, none of which has dialled in (no
    process is started)."""
    await lonely_app(fe.clipper, app)
    added = await fe.admin.post(
        "/admin/add_model",
        json={"model_name": "m", "model_version": "1", "labels": [], "input_type": "doubles"},
    )
    assert added.status == 200, added.body
    await fe.clipper.link_model_to_app(app, "m")
    await fe.clipper.set_num_replicas("m", 1, wait=False)
    assert fe.clipper.manager.all_replicas() == []


def json_of(resp: RouterResponse, status: int = 200) -> Any:
    assert resp.status == status, (resp.status, resp.body)
    assert resp.content_type == "application/json"
    return resp.json()


def error_of(resp: RouterResponse, status: int) -> dict[str, str]:
    """The Clipper REST error document ``{"error", "cause"}``."""
    doc: dict[str, str] = json_of(resp, status)
    assert set(doc) == {"error", "cause"}, doc
    return doc


def v2_error_of(resp: RouterResponse, status: int) -> str:
    """The V2 REST error document ``{"error": cause}``."""
    doc = json_of(resp, status)
    assert set(doc) == {"error"}, doc
    cause: str = doc["error"]
    return cause


def tensor(data: Any, shape: list[int], datatype: str = "FP64") -> dict[str, Any]:
    return {"name": "input", "shape": shape, "datatype": datatype, "data": data}


# -- predict -----------------------------------------------------------------------------------


async def test_predict_without_a_linked_model_answers_the_default(
    inproc_frontend: InProcessFrontend,
) -> None:
    await lonely_app(inproc_frontend.clipper)
    doc = json_of(await inproc_frontend.query.post("/lonely/predict", json={"input": [1.0]}))
    assert set(doc) == {"query_id", "output", "default", "default_explanation"}
    assert type(doc["query_id"]) is int
    assert (doc["output"], doc["default"], doc["default_explanation"]) == (-1.0, True, NO_MODELS)
    batch = json_of(
        await inproc_frontend.query.post(
            "/lonely/predict/?trace=1", json={"input_batch": [[1.0], [2.0]]}
        )
    )
    assert [(p["output"], p["default"]) for p in batch["batch_predictions"]] == [(-1.0, True)] * 2


async def test_default_follows_a_model_that_has_no_replica(
    inproc_frontend: InProcessFrontend,
) -> None:
    await linked_without_replicas(inproc_frontend)
    doc = json_of(await inproc_frontend.query.post("/waiting/predict", json={"input": [1.0]}))
    assert (doc["default"], doc["default_explanation"]) == (True, NOT_CONNECTED)


async def test_unknown_app_is_404(inproc_frontend: InProcessFrontend) -> None:
    await lonely_app(inproc_frontend.clipper)
    for verb in ("predict", "update"):
        doc = error_of(
            await inproc_frontend.query.post(f"/no-such-app/{verb}", json={"input": [1.0]}), 404
        )
        assert doc["error"] == "Not found"
        assert "no application named 'no-such-app'" in doc["cause"], verb
    doc = error_of(
        await inproc_frontend.query.post("/no-such-app/predict", json={"input": [1.0]}), 404
    )
    # Callers on the query port do not learn the other applications' names.
    assert "lonely" not in doc["cause"]
    assert doc["cause"] == "no application named 'no-such-app'"


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        (b"{oops", "Error parsing JSON: "),
        (b"[1.0]", "the body must be a JSON object"),
        (b'{"inputs": [1.0]}', "does not have required keys input or input_batch"),
        (b'{"input_batch": []}', '"input_batch" must be a non-empty array'),
        (b'{"input": [1.0], "version": 1}', '"version" must be a string'),
    ],
)
async def test_malformed_predict_body_is_400(
    inproc_frontend: InProcessFrontend, body: bytes, cause: str
) -> None:
    await lonely_app(inproc_frontend.clipper)
    doc = error_of(await inproc_frontend.query.post("/lonely/predict", body=body), 400)
    assert doc["error"] == "Json error"
    assert cause in doc["cause"]
    # The app still answers afterwards.
    assert json_of(await inproc_frontend.query.post("/lonely/predict", json={"input": [2.0]}))[
        "default"
    ]


async def test_unknown_route_is_404(inproc_frontend: InProcessFrontend) -> None:
    for method, path in (("POST", "/lonely/explode"), ("GET", "/lonely/predict"), ("GET", "/")):
        doc = error_of(await inproc_frontend.query.request(method, path), 404)
        assert f"no route for {method} {path}" in doc["cause"]
        assert "expected POST /<app>/predict" in doc["cause"]


async def test_body_over_the_limit_is_413() -> None:
    async with in_process_frontend(max_body_bytes=64) as fe:
        await lonely_app(fe.clipper)
        big = orjson.dumps({"input": [0.5] * 32})
        doc = error_of(await fe.query.post("/lonely/predict", body=big), 413)
        assert doc["cause"] == "request body exceeds the limit of 64 bytes"
        assert json_of(await fe.query.post("/lonely/predict", json={"input": [0.5]}))["default"]


# -- health, readiness, metrics ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/health", "/healthz", "/health/live"])
async def test_health(inproc_frontend: InProcessFrontend, path: str) -> None:
    assert json_of(await inproc_frontend.query.get(path)) == {"status": "ok"}


async def test_ready_lists_the_models_without_replicas(inproc_frontend: InProcessFrontend) -> None:
    for path in ("/ready", "/health/ready"):
        doc = json_of(await inproc_frontend.query.get(path))
        assert doc == {
            "ready": True,
            "models_without_replicas": [],
            "reasons": [],
            "draining": False,
        }
    assert (await inproc_frontend.query.get("/v2/health/ready")).status == 200
    await linked_without_replicas(inproc_frontend)
    for path in ("/ready", "/health/ready"):
        doc = json_of(await inproc_frontend.query.get(path), 503)
        assert doc == {
            "ready": False,
            "models_without_replicas": ["m:1"],
            "reasons": ["application 'waiting': model 'm:1' has no replica connected"],
            "draining": False,
        }
    v2 = await inproc_frontend.query.get("/v2/health/ready")
    assert (v2.status, v2.body) == (503, b"")
    # Scaled to none wanted, nothing is missing.
    await inproc_frontend.clipper.set_num_replicas("m", 0, wait=False)
    assert json_of(await inproc_frontend.query.get("/ready"))["ready"] is True


async def test_a_draining_frontend_is_not_ready_on_every_readiness_path(
    inproc_frontend: InProcessFrontend,
) -> None:
    from clipper.frontend.grpc import inference_pb2 as pb
    from clipper.frontend.grpc.server import Servicer

    servicer = Servicer(inproc_frontend.clipper.services)
    ready = await servicer.ServerReady(pb.ServerReadyRequest(), None)
    assert ready.ready is True
    inproc_frontend.clipper.catalog.withdraw("draining: stopping")  # what stop() does first
    for path in ("/ready", "/health/ready"):
        doc = json_of(await inproc_frontend.query.get(path), 503)
        assert doc["ready"] is False and doc["draining"] is True
        assert doc["reasons"] == ["draining: stopping"]
    v2 = await inproc_frontend.query.get("/v2/health/ready")
    assert (v2.status, v2.body) == (503, b"")
    assert (await servicer.ServerReady(pb.ServerReadyRequest(), None)).ready is False
    # Liveness is another matter: the frontend runs.
    assert json_of(await inproc_frontend.query.get("/health")) == {"status": "ok"}


PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("path", "accept", "want_json"),
    [
        ("/metrics", None, False),
        ("/metrics", "*/*", False),  # curl, browsers: text (python-requests: JSON, below)
        ("/metrics", "application/json", True),
        ("/metrics", PROMETHEUS_ACCEPT, False),
        ("/metrics", "text/plain", False),
        ("/metrics?format=json", PROMETHEUS_ACCEPT, True),
        ("/metrics?format=json", None, True),
        ("/metrics?format=prometheus", "*/*", False),
        ("/metrics?format=text", "application/json", False),
    ],
)
async def test_metrics_in_both_formats(
    inproc_frontend: InProcessFrontend, path: str, accept: str | None, want_json: bool
) -> None:
    await lonely_app(inproc_frontend.clipper)
    json_of(await inproc_frontend.query.post("/lonely/predict", json={"input": [1.0]}))
    resp = await inproc_frontend.query.get(path, headers={"Accept": accept} if accept else None)
    assert resp.status == 200
    if want_json:
        doc = json_of(resp)
        assert doc['clipper_app_requests_total{app="lonely"}'] == 1.0
        assert doc['clipper_app_default_outputs_total{app="lonely",reason="no_model"}'] == 1.0
    else:
        assert resp.content_type == "text/plain; version=0.0.4; charset=utf-8"
        assert "# TYPE clipper_app_requests_total counter" in resp.text
        assert 'clipper_app_requests_total{app="lonely"} 1.0' in resp.text


# -- the Open Inference Protocol (V2) REST module, through the same router -----------------------


async def test_v2_server_routes(inproc_frontend: InProcessFrontend) -> None:
    live = await inproc_frontend.query.get("/v2/health/live")
    assert (live.status, live.body, live.content_type) == (200, b"", "text/plain")
    assert json_of(await inproc_frontend.query.get("/v2")) == {
        "name": "clipper-serve",
        "version": clipper_pkg.__version__,
        "extensions": [],
    }
    assert json_of(await inproc_frontend.query.get("/v2/")) == json_of(
        await inproc_frontend.query.get("/v2")
    )


async def test_v2_model_metadata_of_an_app(inproc_frontend: InProcessFrontend) -> None:
    await lonely_app(inproc_frontend.clipper)
    await inproc_frontend.clipper.register_application("words", "strings", "none", SLO_US)
    assert json_of(await inproc_frontend.query.get("/v2/models/lonely")) == {
        "name": "lonely",
        "versions": [],
        "platform": "clipper-serve",
        "inputs": [{"name": "input", "datatype": "FP64", "shape": [-1, -1]}],
        "outputs": [{"name": "output", "datatype": "FP64", "shape": [-1, -1]}],
    }
    words = json_of(await inproc_frontend.query.get("/v2/models/words"))
    assert words["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1, -1]}]
    assert "no version '3'" in v2_error_of(
        await inproc_frontend.query.get("/v2/models/lonely/versions/3"), 404
    )
    for path in ("/v2/models/nope", "/v2/models/nope/ready", "/v2/nothing"):
        v2_error_of(await inproc_frontend.query.get(path), 404)
    await linked_without_replicas(inproc_frontend)
    assert json_of(await inproc_frontend.query.get("/v2/models/waiting"))["versions"] == ["1"]


async def test_v2_infer_answers_the_default_without_a_model(
    inproc_frontend: InProcessFrontend,
) -> None:
    await lonely_app(inproc_frontend.clipper)
    doc = json_of(
        await inproc_frontend.query.post(
            "/v2/models/lonely/infer", json={"id": "r1", "inputs": [tensor([[1.0], [2.0]], [2, 1])]}
        )
    )
    assert doc["id"] == "r1"
    assert doc["outputs"] == [
        {"name": "output", "datatype": "FP64", "shape": [2], "data": [-1.0, -1.0]}
    ]
    assert doc["parameters"] == {"default": True, "default_explanations": [NO_MODELS, NO_MODELS]}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v2/models/nope/infer", {"inputs": [tensor([1.0], [1, 1])]}, 404, "unknown model 'nope'"),
        ("/v2/models/lonely/infer", b"{not json", 400, "malformed JSON"),
        ("/v2/models/lonely/infer", b"[1, 2]", 400, "JSON object"),
        ("/v2/models/lonely/infer", {"inputs": []}, 400, "inputs"),
        (
            "/v2/models/lonely/infer",
            {"inputs": [tensor(["a"], [1, 1], "BYTES")]},
            400,
            "datatype BYTES",
        ),
        (
            "/v2/models/lonely/infer",
            {"inputs": [tensor([1.0, 2.0, 3.0], [2, 2])]},
            400,
            "needs 4 elements",
        ),
        (
            "/v2/models/lonely/infer",
            {"inputs": [tensor([1.0, "x"], [1, 2])]},
            400,
            "not of datatype FP64",
        ),
        (
            "/v2/models/lonely/infer",
            {"inputs": [tensor([1.0], [1, 1], "FP128")]},
            400,
            "unknown datatype",
        ),
        ("/v2/models/lonely/explain", b"{}", 404, "no route"),
    ],
)
async def test_v2_infer_errors(
    inproc_frontend: InProcessFrontend, path: str, body: Any, status: int, needle: str
) -> None:
    await lonely_app(inproc_frontend.clipper)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    cause = v2_error_of(await inproc_frontend.query.post(path, body=data), status)
    assert needle in cause, cause


# -- one real model, through the in-process router ------------------------------------------------


@pytest.mark.integration
async def test_a_deployed_model_answers_through_the_router(
    inproc_frontend: InProcessFrontend,
) -> None:
    c = inproc_frontend.clipper
    async with asyncio.timeout(120):
        await c.deploy_model("sums", "1", models.row_sums, input_type="doubles")
        await c.register_application("doubles", "doubles", "-1.0", SLO_US)
        await c.link_model_to_app("doubles", "sums")
    query = RouterClient.for_server(c.http, limit_s=30)
    doc = json_of(await query.post("/doubles/predict", json={"input": [1.0, 2.0, 3.5]}))
    assert (doc["output"], doc["default"]) == (6.5, False)
    batch = json_of(await query.post("/doubles/predict", json={"input_batch": [[1.0], [2.0, 2.0]]}))
    assert [p["output"] for p in batch["batch_predictions"]] == [1.0, 4.0]
    v2 = json_of(
        await query.post(
            "/v2/models/doubles/infer", json={"inputs": [tensor([[1.0, 2.0]], [1, 2])]}
        )
    )
    assert v2["outputs"] == [{"name": "output", "datatype": "FP64", "shape": [1], "data": [3.0]}]
    assert json_of(await query.get("/ready"))["ready"] is True

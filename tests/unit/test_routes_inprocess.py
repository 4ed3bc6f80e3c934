"""The query port's routes (QueryRoutes, and the V2 REST module behind it) driven in process
through the router its HTTP server calls: no socket but the ones Clipper binds on port 0.

Behaviours as tests/integration/test_query_path.py and test_v2_rest.py check them on the wire;
here without containers, except the one test marked ``integration`` that deploys a model.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

import clipper as clipper_pkg
from clipper.batching.scheduler import Replica
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
            "failing_models": [],
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
            "failing_models": [],
            "reasons": ["application 'waiting': model 'm:1' has no replica connected"],
            "draining": False,
        }
    v2 = await inproc_frontend.query.get("/v2/health/ready")
    assert (v2.status, v2.body) == (503, b"")
    # Scaled to none wanted, nothing is missing.
    await inproc_frontend.clipper.set_num_replicas("m", 0, wait=False)
    assert json_of(await inproc_frontend.query.get("/ready"))["ready"] is True


# -- one application's readiness: GET /<app>/ready, GET /ready?app=, V2's model ready --------


def connect_stand_in(c: Clipper, model: str, version: str) -> object:
    """A replica of ``model:version`` as readiness sees one: an entry in its scheduler's list of
    connected replicas (no process; nothing is queried through it). Taken out again with
    :func:`disconnect_stand_in` before the frontend stops."""
    sched = c.catalog.scheduler(model, version)
    assert sched is not None, f"{model}:{version} has no scheduler"
    stand_in = SimpleNamespace(in_flight={}, scheduler=None, draining=False)
    sched.replicas.append(cast(Replica, stand_in))
    return stand_in


def disconnect_stand_in(c: Clipper, model: str, version: str, stand_in: object) -> None:
    sched = c.catalog.scheduler(model, version)
    assert sched is not None
    sched.replicas.remove(cast(Replica, stand_in))


async def add_model(fe: InProcessFrontend, name: str, version: str = "1") -> None:
    """``name:version`` registered for containers started elsewhere (``add_model``: it becomes
    current), one replica wanted, none started."""
    added = await fe.admin.post(
        "/admin/add_model",
        json={"model_name": name, "model_version": version, "input_type": "doubles"},
    )
    assert added.status == 200, added.body
    await fe.clipper.set_num_replicas(name, 1, version, wait=False)


async def readiness(fe: InProcessFrontend, app: str, status: int) -> Any:
    """``app``'s readiness document, the same by each of its routes (V2's in its own form)."""
    doc = json_of(await fe.query.get(f"/{app}/ready"), status)
    for path in (f"/{app}/ready/", f"/ready?app={app}", f"/health/ready?app={app}"):
        assert json_of(await fe.query.get(path), status) == doc, path
    assert set(doc) == {"app", "ready", "reasons"} and doc["app"] == app
    v2 = json_of(await fe.query.get(f"/v2/models/{app}/ready"), 200 if status == 200 else 400)
    assert v2 == {"name": app, "ready": doc["ready"], "reasons": doc["reasons"]}
    return doc


async def test_a_single_model_application_is_ready_once_its_model_has_a_replica(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe, c = inproc_frontend, inproc_frontend.clipper
    await lonely_app(c, "single")
    await add_model(fe, "m")
    await c.link_model_to_app("single", "m")
    doc = await readiness(fe, "single", 503)
    assert doc["reasons"] == ["application 'single': model 'm:1' has no replica connected"]
    stand_in = connect_stand_in(c, "m", "1")
    try:
        assert await readiness(fe, "single", 200) == {"app": "single", "ready": True,
                                                      "reasons": []}  # fmt: skip
        # A version pinned: that one, which must exist.
        pinned = json_of(await fe.query.get("/single/ready?version=1"))
        assert pinned == {"app": "single", "version": "1", "ready": True, "reasons": []}
        unknown = json_of(await fe.query.get("/ready?app=single&version=9"), 503)
        why = ["application 'single': model 'm' has no version '9'"]
        assert unknown == {"app": "single", "version": "9", "ready": False, "reasons": why}
        v2 = json_of(await fe.query.get("/v2/models/single/versions/9/ready"), 400)
        assert v2["reasons"] == unknown["reasons"]
        # Scaled to none, it cannot answer: the reason says why there is no replica.
    finally:
        disconnect_stand_in(c, "m", "1", stand_in)
    await c.set_num_replicas("m", 0, wait=False)
    doc = await readiness(fe, "single", 503)
    assert doc["reasons"] == ["application 'single': model 'm:1' has no replica connected "
                              "(none is configured: num_replicas is 0)"]  # fmt: skip


async def test_an_application_with_no_model_linked_is_not_ready(
    inproc_frontend: InProcessFrontend,
) -> None:
    await lonely_app(inproc_frontend.clipper)
    doc = await readiness(inproc_frontend, "lonely", 503)
    assert doc["reasons"] == [
        "application 'lonely': no model is linked (it answers only default outputs)"
    ]


async def test_a_split_is_ready_when_its_current_version_is(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe, c = inproc_frontend, inproc_frontend.clipper
    await lonely_app(c, "split")
    await add_model(fe, "m", "1")
    await add_model(fe, "m", "2")  # current
    await c.link_model_to_app("split", "m")
    one, two = connect_stand_in(c, "m", "1"), connect_stand_in(c, "m", "2")
    try:
        await c.set_traffic_split("m", {"1": 50, "2": 50}, ready_timeout_s=5)
        assert c.catalog.rollout("m") is not None
        assert (await readiness(fe, "split", 200))["reasons"] == []
        disconnect_stand_in(c, "m", "2", two)
        # Version 1 of the split still has its replica, but a draw of a version without one
        # falls back on the current version: that is the one that must answer.
        doc = await readiness(fe, "split", 503)
        assert doc["reasons"] == ["application 'split': model 'm:2' has no replica connected"]
    finally:
        disconnect_stand_in(c, "m", "1", one)


async def test_a_selection_is_ready_when_any_linked_model_has_a_replica(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe, c = inproc_frontend, inproc_frontend.clipper
    await c.register_application("sel", "doubles", "-1.0", SLO_US, policy="exp4")
    for name in ("a", "b"):
        await add_model(fe, name)
        await c.link_model_to_app("sel", name)
    doc = await readiness(fe, "sel", 503)
    assert doc["reasons"] == [
        "application 'sel': model 'a:1' has no replica connected",
        "application 'sel': model 'b:1' has no replica connected",
    ]
    stand_in = connect_stand_in(c, "b", "1")
    try:
        assert (await readiness(fe, "sel", 200))["reasons"] == []
        # The whole frontend's rule still wants every linked model's replicas.
        whole = json_of(await fe.query.get("/ready"), 503)
        assert whole["reasons"] == ["application 'sel': model 'a:1' has no replica connected"]
    finally:
        disconnect_stand_in(c, "b", "1", stand_in)


async def test_a_pipeline_is_ready_when_every_required_stage_can_run(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe, c = inproc_frontend, inproc_frontend.clipper
    for name in ("feat", "score", "enrich", "pick"):
        await add_model(fe, name)
    await c.register_application("sel", "doubles", "-1.0", SLO_US, policy="exp4")
    await c.link_model_to_app("sel", "pick")
    stages = [
        {"name": "f", "model": "feat"},
        {"name": "s", "model": "score", "input": "$f", "default": 0},
        {"name": "e", "model": "enrich", "optional": True},
        {"name": "p", "app": "sel", "input": "$f"},
    ]
    await c.register_application(
        "pipe", "doubles", "-1.0", SLO_US, pipeline={"stages": stages, "output": "$p"}
    )
    doc = await readiness(fe, "pipe", 503)
    assert doc["reasons"] == [
        "application 'pipe': stage 'f' (model 'feat'): model 'feat:1' has no replica connected",
        "application 'pipe': stage 'p' (application 'sel'): model 'pick:1' has no replica "
        "connected",
    ]
    feat = connect_stand_in(c, "feat", "1")
    try:
        doc = await readiness(fe, "pipe", 503)
        assert doc["reasons"] == ["application 'pipe': stage 'p' (application 'sel'): model "
                                  "'pick:1' has no replica connected"]  # fmt: skip
        pick = connect_stand_in(c, "pick", "1")
        try:
            # The stage with a default and the optional one have no replica: it still answers.
            assert (await readiness(fe, "pipe", 200))["reasons"] == []
        finally:
            disconnect_stand_in(c, "pick", "1", pick)
    finally:
        disconnect_stand_in(c, "feat", "1", feat)


async def test_one_application_without_replicas_leaves_another_ready(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe, c = inproc_frontend, inproc_frontend.clipper
    await linked_without_replicas(fe)  # application waiting, model m:1
    await lonely_app(c, "serving")
    await add_model(fe, "n")
    await c.link_model_to_app("serving", "n")
    stand_in = connect_stand_in(c, "n", "1")
    try:
        assert (await readiness(fe, "serving", 200))["ready"] is True
        doc = await readiness(fe, "waiting", 503)
        assert doc["reasons"] == ["application 'waiting': model 'm:1' has no replica connected"]
        # Plain /ready keeps the whole frontend's rule.
        whole = json_of(await fe.query.get("/ready"), 503)
        assert whole["models_without_replicas"] == ["m:1"]
    finally:
        disconnect_stand_in(c, "n", "1", stand_in)


async def test_readiness_routes_refuse_what_they_do_not_take(
    inproc_frontend: InProcessFrontend,
) -> None:
    query = inproc_frontend.query
    await lonely_app(inproc_frontend.clipper)
    for path in ("/nope/ready", "/ready?app=nope"):
        assert error_of(await query.get(path), 404)["cause"] == "no application named 'nope'"
    cause = v2_error_of(await query.get("/v2/models/nope/ready"), 404)
    assert cause.startswith("unknown model 'nope'"), cause
    for path, needle in [
        ("/ready?version=1", "takes ?app=<application>[&version=<version>]"),
        ("/ready?ap=lonely", "unknown parameter 'ap'; it takes app, version, ignore"),
        ("/ready?ignore=replicas", "parameter 'ignore' takes only 'model_errors'"),
        ("/ready?app=lonely&app=other", "parameter 'app' is given more than once"),
        ("/ready?app=", "parameter 'app' is empty"),
        ("/lonely/ready?app=lonely", "unknown parameter 'app'; it takes version"),
    ]:
        assert needle in error_of(await query.get(path), 400)["cause"], path
    # Under /v2 the V2 API answers, unless an application is itself named v2.
    assert "no route for GET /v2/ready" in v2_error_of(await query.get("/v2/ready"), 404)
    await lonely_app(inproc_frontend.clipper, "v2")
    assert json_of(await query.get("/v2/ready"), 503)["app"] == "v2"
    # /health/ready is the frontend's: an application named health is asked for by ?app=.
    await lonely_app(inproc_frontend.clipper, "health")
    assert "models_without_replicas" in json_of(await query.get("/health/ready"))
    assert json_of(await query.get("/ready?app=health"), 503)["app"] == "health"


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
    # Each application's readiness too: a balancer checking one application takes it out.
    await lonely_app(inproc_frontend.clipper, "one")
    doc = json_of(await inproc_frontend.query.get("/one/ready"), 503)
    assert doc["reasons"][0] == "draining: stopping"
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

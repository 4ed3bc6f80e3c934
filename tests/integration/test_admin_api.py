"""The admin REST API end to end (port 1338): the original management routes and extensions.

Compatibility spec: clipper-original.md section 3; extensions: docs/admin-api.md. One frontend
serves the module; each test uses its own application and model names.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import orjson
import pytest
import pytest_asyncio

from clipper import Clipper, ConfigError, FrontendConfig
from clipper.query.prediction import NO_MODELS, SLO_MISSED
from tests.integration.helpers import (
    Response,
    pid_alive,
    post_json,
    predict,
    predict_ok,
    request,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SLO_US = 2_000_000


# -- models, cloudpickled by value (this module is not importable by the containers) ----------


def sums(xs: Any) -> list[float]:
    return [float(np.asarray(x, dtype=np.float64).sum()) for x in xs]


def tagged_sums(xs: Any) -> list[dict[str, Any]]:
    return [{"tag": "uploaded", "sum": float(np.asarray(x).sum())} for x in xs]


def slow_sums(xs: Any) -> list[float]:
    time.sleep(0.3)  # the model's simulated compute cost
    return sums(xs)


class NeverReady:
    """Its setup() outlasts any test: the replica never connects."""

    def setup(self) -> None:
        time.sleep(600)

    def predict(self, xs: list[Any]) -> list[str]:
        return ["never" for _ in xs]


def pickle_model(model: Any, path: Path) -> Path:
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        path.write_bytes(cloudpickle.dumps(model))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    return path


# -- fixtures and helpers -------------------------------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clipper() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        yield c


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("artifacts")
    return {
        "sums": pickle_model(sums, d / "sums.pkl"),
        "tagged": pickle_model(tagged_sums, d / "tagged.pkl"),
        "slow": pickle_model(slow_sums, d / "slow.pkl"),
        "never": pickle_model(NeverReady(), d / "never.pkl"),
    }


async def admin(c: Clipper, route: str, doc: Any, *, limit_s: float = 60.0) -> Response:
    return await post_json(f"{c.admin_url}/admin/{route}", doc, limit_s=limit_s)


async def ok_text(c: Clipper, route: str, doc: Any, *, limit_s: float = 60.0) -> str:
    resp = await admin(c, route, doc, limit_s=limit_s)
    assert resp.status == 200, (route, resp.status, resp.body)
    assert resp.headers["content-type"].startswith("text/plain")
    return resp.body.decode()


async def ok_json(c: Clipper, route: str, doc: Any, *, limit_s: float = 60.0) -> Any:
    resp = await admin(c, route, doc, limit_s=limit_s)
    assert resp.status == 200, (route, resp.status, resp.body)
    assert resp.headers["content-type"] == "application/json"
    return resp.json()


async def fails(c: Clipper, route: str, doc: Any, *, limit_s: float = 60.0) -> str:
    """The route answers 400 with a plain-text message; returns it."""
    resp = await admin(c, route, doc, limit_s=limit_s)
    assert resp.status == 400, (route, resp.status, resp.body)
    assert resp.headers["content-type"].startswith("text/plain")
    return resp.body.decode()


async def add_app(c: Clipper, name: str, input_type: str = "doubles", **extra: Any) -> None:
    doc = {
        "name": name,
        "input_type": input_type,
        "default_output": "-1.0",
        "latency_slo_micros": SLO_US,
        **extra,
    }
    assert await ok_text(c, "add_app", doc) == f"Successfully added application with name '{name}'"


async def add_model(
    c: Clipper, name: str, version: str = "1", input_type: str = "doubles", **extra: Any
) -> str:
    doc = {
        "model_name": name,
        "model_version": version,
        "labels": ["a", "b"],
        "input_type": input_type,
        "container_name": "NO_CONTAINER",
        "model_data_path": "DEPRECATED",
        "batch_size": -1,
        **extra,
    }
    return await ok_text(c, "add_model", doc)


async def deploy(
    c: Clipper, name: str, artifact: Path, *, version: str = "1", num_replicas: int = 1
) -> Any:
    return await ok_json(
        c,
        "deploy_model",
        {
            "model_name": name,
            "model_version": version,
            "input_type": "doubles",
            "artifact_path": str(artifact),
            "num_replicas": num_replicas,
            "batching": {"max_wait_micros": 500},
        },
    )


def http_get(url: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """A blocking GET that keeps the query string (run it in a thread)."""
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


def http_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read()


# -- ping and JSON errors ---------------------------------------------------------------------


async def test_ping(clipper: Clipper) -> None:
    resp = await request(f"{clipper.admin_url}/admin/ping")
    assert (resp.status, resp.body) == (200, b"PONG")
    resp = await request(f"{clipper.admin_url}/admin/ping", "POST", b"{}")
    assert resp.status == 405


async def test_unknown_route_is_404(clipper: Clipper) -> None:
    resp = await admin(clipper, "no_such_route", {})
    assert resp.status == 404


async def test_bad_json_names_the_schema(clipper: Clipper) -> None:
    resp = await request(f"{clipper.admin_url}/admin/add_app", "POST", b"{not json")
    assert resp.status == 400
    text = resp.body.decode()
    assert text.startswith("Error parsing JSON: ")
    assert 'Expected JSON schema: {"name" := string' in text


async def test_missing_and_mistyped_fields(clipper: Clipper) -> None:
    text = await fails(clipper, "add_app", {"name": "x", "input_type": "doubles"})
    assert text.startswith("Error parsing JSON: JSON object does not have required key: ")
    assert "Expected JSON schema: " in text
    text = await fails(
        clipper,
        "add_app",
        {"name": "x", "input_type": "d", "default_output": "1", "latency_slo_micros": "100"},
    )
    assert "Type mismatch! JSON key latency_slo_micros expected type int" in text
    text = await fails(clipper, "get_all_models", {"verbose": "yes"})
    assert "JSON key verbose expected type bool" in text
    text = await fails(clipper, "get_all_models", [1, 2])
    assert text.startswith("Error parsing JSON: the body must be a JSON object.")


# -- applications ---------------------------------------------------------------------------


async def test_add_app_and_get_application(clipper: Clipper) -> None:
    await add_app(clipper, "app-a", "d")  # an alias: stored and returned readable
    doc = await ok_json(clipper, "get_application", {"name": "app-a"})
    assert doc == {
        "input_type": "doubles",
        "default_output": "-1.0",
        "latency_slo_micros": SLO_US,
        "name": "app-a",
        "linked_models": [],
    }
    assert "app-a" in await ok_json(clipper, "get_all_applications", {"verbose": False})
    verbose = await ok_json(clipper, "get_all_applications", {"verbose": True})
    assert doc in verbose
    assert await ok_json(clipper, "get_application", {"name": "no-such-app"}) == {}


async def test_add_app_failures(clipper: Clipper) -> None:
    await add_app(clipper, "app-dup", "strings")
    doc = {
        "name": "app-dup",
        "input_type": "strings",
        "default_output": "x",
        "latency_slo_micros": 1000,
    }
    assert await fails(clipper, "add_app", doc) == "application 'app-dup' already exists"
    bad_type = await fails(clipper, "add_app", {**doc, "name": "app-bt", "input_type": "tensor"})
    assert "unknown input type 'tensor'" in bad_type
    assert "app-bt" not in await ok_json(clipper, "get_all_applications", {"verbose": False})
    assert "invalid application name" in await fails(clipper, "add_app", {**doc, "name": "a:b"})
    slo = await fails(clipper, "add_app", {**doc, "name": "app-slo", "latency_slo_micros": 0})
    assert "latency_slo_micros" in slo


async def test_delete_app(clipper: Clipper) -> None:
    await add_app(clipper, "app-del")
    await add_model(clipper, "m-del")
    await ok_text(clipper, "add_model_links", {"app_name": "app-del", "model_names": ["m-del"]})
    doc = await predict_ok(clipper.query_url, "app-del", {"input": [1.0]})
    assert doc["default"] is True  # linked, no replicas: the default output
    text = await ok_text(clipper, "delete_app", {"name": "app-del"})
    assert text == "Successfully deleted application with name 'app-del'"
    resp = await predict(clipper.query_url, "app-del", {"input": [1.0]})
    assert resp.status == 404
    assert await ok_json(clipper, "get_application", {"name": "app-del"}) == {}
    assert await fails(clipper, "delete_app", {"name": "app-del"}) == (
        "Application 'app-del' does not exist"
    )
    # Its links went with it: the same name starts unlinked.
    await add_app(clipper, "app-del")
    assert await ok_json(clipper, "get_linked_models", {"app_name": "app-del"}) == []


async def test_get_state_answers_the_default_output(clipper: Clipper) -> None:
    await add_app(clipper, "app-state")
    resp = await admin(clipper, "get_state", {"app_name": "app-state", "uid": 0})
    assert (resp.status, resp.body) == (200, b"-1.0")
    text = await fails(clipper, "get_state", {"app_name": "no-such-app", "uid": 0})
    assert text == "No application with name 'no-such-app' exists."


# -- models ---------------------------------------------------------------------------------


async def test_add_model_sets_the_current_version(clipper: Clipper) -> None:
    text = await add_model(clipper, "m-cur", "1", "ints")
    assert text == "Successfully added model with name 'm-cur' and input type 'integers'"
    await add_model(clipper, "m-cur", "2", "integers", labels=["x"], container_name="img:2")
    models = await ok_json(clipper, "get_all_models", {"verbose": True})
    mine = {m["model_version"]: m for m in models if m["model_name"] == "m-cur"}
    assert mine["2"] == {
        "model_name": "m-cur",
        "model_version": "2",
        "input_type": "integers",
        "labels": ["x"],
        "container_name": "img:2",
        "model_data_path": "DEPRECATED",
        "is_current_version": True,
    }
    assert mine["1"]["is_current_version"] is False
    names = await ok_json(clipper, "get_all_models", {"verbose": False})
    assert {"m-cur:1", "m-cur:2"} <= set(names)
    assert (
        await ok_json(clipper, "get_model", {"model_name": "m-cur", "model_version": "1"})
        == (mine["1"])
    )
    missing = {"model_name": "m-cur", "model_version": "9"}
    assert await ok_json(clipper, "get_model", missing) == {}


async def test_add_model_failures(clipper: Clipper) -> None:
    await add_model(clipper, "m-fail")
    doc = {
        "model_name": "m-fail",
        "model_version": "1",
        "labels": [],
        "input_type": "doubles",
        "container_name": "NO_CONTAINER",
        "model_data_path": "DEPRECATED",
        "batch_size": -1,
    }
    assert await fails(clipper, "add_model", doc) == (
        "model with name 'm-fail' and version '1' already exists"
    )
    for bad in (0, -2):
        text = await fails(clipper, "add_model", {**doc, "model_version": "2", "batch_size": bad})
        assert f"Invalid batch size {bad}" in text
    await ok_text(clipper, "add_model", {**doc, "model_version": "3", "batch_size": 8})
    for field, value in (("model_name", "m:x"), ("model_version", "1,2")):
        assert "prohibited characters" in await fails(clipper, "add_model", {**doc, field: value})
    text = await fails(clipper, "add_model", {**doc, "model_version": "4", "labels": ["a,b"]})
    assert "label 'a,b' contains prohibited characters" in text
    # Incompatible with an application the model is linked to.
    await add_app(clipper, "app-mf")
    await ok_text(clipper, "add_model_links", {"app_name": "app-mf", "model_names": ["m-fail"]})
    text = await fails(clipper, "add_model", {**doc, "model_version": "5", "input_type": "strings"})
    assert "is linked to application 'app-mf'" in text
    versions = await ok_json(clipper, "get_all_models", {"verbose": False})
    assert [v for v in versions if v.startswith("m-fail:")] == ["m-fail:1", "m-fail:3"]


async def test_links(clipper: Clipper) -> None:
    await add_app(clipper, "app-link")
    await add_model(clipper, "m-link")
    await add_model(clipper, "m-link-other")
    await add_model(clipper, "m-link-str", input_type="strings")
    link = {"app_name": "app-link", "model_names": ["m-link"]}
    assert await ok_text(clipper, "add_model_links", link) == (
        "Successfully linked model with name 'm-link' to application 'app-link'"
    )
    assert await ok_json(clipper, "get_linked_models", {"app_name": "app-link"}) == ["m-link"]
    app = await ok_json(clipper, "get_application", {"name": "app-link"})
    assert app["linked_models"] == ["m-link"]
    assert await fails(clipper, "add_model_links", link) == (
        "A model with name m-link is already linked to 'app-link'."
    )
    other = {"app_name": "app-link", "model_names": ["m-link-other"]}
    assert "is already linked to 'm-link'" in await fails(clipper, "add_model_links", other)
    two = {"app_name": "app-link", "model_names": ["m-link", "m-link-other"]}
    assert (await fails(clipper, "add_model_links", two)).startswith(
        "Applications must be linked with at most one model."
    )
    assert await fails(clipper, "add_model_links", {**link, "app_name": "zz"}) == (
        "No app with name 'zz' exists."
    )
    await add_app(clipper, "app-link2")
    unknown = {"app_name": "app-link2", "model_names": ["zz"]}
    assert await fails(clipper, "add_model_links", unknown) == "No model with name 'zz' exists."
    incompatible = {"app_name": "app-link2", "model_names": ["m-link-str"]}
    assert "takes strings" in await fails(clipper, "add_model_links", incompatible)
    text = await fails(clipper, "get_linked_models", {"app_name": "zz"})
    assert text == "No application with name 'zz' exists."
    # Unlinking.
    assert await ok_text(clipper, "delete_model_links", link) == "Success!"
    assert await ok_json(clipper, "get_linked_models", {"app_name": "app-link"}) == []
    assert "is not linked" in await fails(clipper, "delete_model_links", link)
    assert await fails(clipper, "delete_model_links", {**link, "app_name": "zz"}) == (
        "No app with name 'zz' exists."
    )


async def test_set_model_version(clipper: Clipper) -> None:
    await add_model(clipper, "m-ver", "1")
    await add_model(clipper, "m-ver", "2")
    doc = {"model_name": "m-ver", "model_version": "1"}
    assert await ok_text(clipper, "set_model_version", doc) == (
        "Successfully set model with name 'm-ver' to version '1'"
    )
    assert (await ok_json(clipper, "get_model", doc))["is_current_version"] is True
    text = await fails(clipper, "set_model_version", {**doc, "model_name": "zz"})
    assert text == "Cannot set version for nonexistent model 'zz'"
    text = await fails(clipper, "set_model_version", {**doc, "model_version": "9"})
    assert text.startswith("Cannot set non-existent version '9'")


async def test_delete_versioned_model(clipper: Clipper) -> None:
    await add_model(clipper, "m-dv", "1")
    doc = {"model_name": "m-dv", "model_version": "1"}
    assert await ok_text(clipper, "delete_versioned_model", doc) == (
        "Successfully deleted model with name 'm-dv' and version '1'"
    )
    assert await ok_json(clipper, "get_model", doc) == {}
    assert await fails(clipper, "delete_versioned_model", doc) == (
        "Model with name 'm-dv' and version '1' does not exist"
    )


# -- deployment and replicas (extensions) -----------------------------------------------------


async def test_deploy_model_from_a_path(clipper: Clipper, artifacts: dict[str, Path]) -> None:
    assert await deploy(clipper, "m-deploy", artifacts["sums"]) == {
        "model_name": "m-deploy",
        "model_version": "1",
        "num_replicas": 1,
    }
    await add_app(clipper, "app-deploy")
    await ok_text(
        clipper, "add_model_links", {"app_name": "app-deploy", "model_names": ["m-deploy"]}
    )
    doc = await predict_ok(clipper.query_url, "app-deploy", {"input": [1.0, 2.5]})
    assert (doc["output"], doc["default"]) == (3.5, False)
    model = await ok_json(clipper, "get_model", {"model_name": "m-deploy", "model_version": "1"})
    assert model["is_current_version"] is True
    assert model["model_data_path"] == str(artifacts["sums"].resolve())
    # Its container, in the original's shapes.
    containers = await ok_json(clipper, "get_all_containers", {"verbose": False})
    assert "m-deploy:1:0" in containers
    verbose = await ok_json(clipper, "get_all_containers", {"verbose": True})
    expected = {
        "model_id": "m-deploy:1",
        "model_name": "m-deploy",
        "model_version": "1",
        "model_replica_id": 0,
        "input_type": "doubles",
    }
    assert expected in verbose
    one = {"model_name": "m-deploy", "model_version": "1", "replica_id": 0}
    assert await ok_json(clipper, "get_container", one) == expected
    assert await ok_json(clipper, "get_container", {**one, "replica_id": 7}) == {}
    # The extension's details: pid, framing, latency.
    [replica] = await ok_json(clipper, "get_replicas", {"model_name": "m-deploy"})
    assert replica["replica_id"] == 0
    # Its log is named by its slot, which `clipper status` shows beside the replica id.
    assert replica["slot"] == 0 and replica["log"] == "m-deploy-1-0.log"
    assert (clipper.state_dir / "logs" / replica["log"]).exists()
    assert replica["framing"] == "fast"
    assert replica["restarts"] == 0
    assert pid_alive(replica["pid"])
    assert replica["in_flight_batches"] == 0
    assert 0 <= replica["seconds_since_heard"] < 5
    assert replica["batch_latency_p50_ms"] > 0
    assert replica["max_batch_size"] >= 1


async def test_deploy_model_failures(clipper: Clipper, tmp_path: Path) -> None:
    doc = {
        "model_name": "m-bad",
        "model_version": "1",
        "input_type": "doubles",
        "artifact_path": str(tmp_path / "missing.pkl"),
    }
    assert "does not exist on the frontend's machine" in await fails(clipper, "deploy_model", doc)
    garbage = tmp_path / "garbage.pkl"
    garbage.write_bytes(b"this is not a pickle")
    doc["artifact_path"] = str(garbage)
    text = await fails(clipper, "deploy_model", {**doc, "batching": {"controller": "magic"}})
    assert "unknown batching controller" in text
    text = await fails(clipper, "deploy_model", {**doc, "num_replicas": -1})
    assert "num_replicas must be >= 0" in text
    text = await fails(clipper, "deploy_model", doc)
    assert "exited" in text  # the facade's ReplicaError, with the replica's log tail
    assert "log ends with" in text
    assert await ok_json(clipper, "get_model", {"model_name": "m-bad", "model_version": "1"}) == {}


async def test_upload_model_with_headers(clipper: Clipper, artifacts: dict[str, Path]) -> None:
    headers = {
        "X-Clipper-Name": "m-up",
        "X-Clipper-Version": "1",
        "X-Clipper-Input-Type": "d",
        "X-Clipper-Num-Replicas": "1",
    }
    resp = await request(
        f"{clipper.admin_url}/admin/upload_model",
        "POST",
        artifacts["tagged"].read_bytes(),
        headers=headers,
        limit_s=60,
    )
    assert resp.status == 200, resp.body
    assert resp.json() == {"model_name": "m-up", "model_version": "1", "num_replicas": 1}
    saved = clipper.state_dir / "uploads" / "m-up" / "1" / "model.pkl"
    assert saved.read_bytes() == artifacts["tagged"].read_bytes()
    await add_app(clipper, "app-up")
    await ok_text(clipper, "add_model_links", {"app_name": "app-up", "model_names": ["m-up"]})
    doc = await predict_ok(clipper.query_url, "app-up", {"input": [2.0, 2.0]})
    assert doc["output"] == {"tag": "uploaded", "sum": 4.0}
    # Uploading over a registered version is refused, and the running file stays as it is.
    resp = await request(
        f"{clipper.admin_url}/admin/upload_model", "POST", b"other", headers=headers
    )
    assert resp.status == 400
    assert resp.body.decode() == "model with name 'm-up' and version '1' already exists"
    assert saved.read_bytes() == artifacts["tagged"].read_bytes()
    # The same upload again (a client retrying a lost answer) succeeds and changes nothing.
    pids = [p.pid for p in clipper.manager.replicas("m-up", "1")]
    resp = await request(
        f"{clipper.admin_url}/admin/upload_model",
        "POST",
        artifacts["tagged"].read_bytes(),
        headers=headers,
    )
    assert resp.status == 200, resp.body
    assert [p.pid for p in clipper.manager.replicas("m-up", "1")] == pids


async def test_upload_model_with_query_string(clipper: Clipper, artifacts: dict[str, Path]) -> None:
    """Needs the HTTP layer to hand the query string to the admin router (see the report)."""
    url = (
        f"{clipper.admin_url}/admin/upload_model"
        "?name=m-upq&version=1&input_type=doubles&num_replicas=1"
    )
    status, _, body = await asyncio.to_thread(http_post, url, artifacts["tagged"].read_bytes(), {})
    assert status == 200, body
    assert orjson.loads(body) == {"model_name": "m-upq", "model_version": "1", "num_replicas": 1}
    assert (clipper.state_dir / "uploads" / "m-upq" / "1" / "model.pkl").exists()


def _tar_gz(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def test_upload_limits_and_cleanup() -> None:
    """A small archive that unpacks past the limit, or holds too many files, is refused
    before it fills the disk; neither it nor a deploy that fails leaves files behind."""
    async with Clipper(
        query_port=0,
        rpc_port=0,
        admin_port=0,
        max_upload_unpacked_bytes=1_000_000,
        max_upload_files=10,
    ) as c:
        uploads = c.state_dir / "uploads"
        bomb = _tar_gz({"model.pkl": b"\0" * 4_000_000})  # 4 MB of zeros in ~4 KB
        assert len(bomb) < 20_000
        crowd = _tar_gz({f"f{i}.txt": b"x" for i in range(11)})
        fine = _tar_gz({f"f{i}.txt": b"x" for i in range(5)})  # unpacks, then fails to deploy
        cases = [
            ("bomb", bomb, "unpacks to more than 1000000 bytes"),
            ("crowd", crowd, "more than 10 entries"),
        ]
        for name, body, cause in cases:
            headers = {"X-Clipper-Name": name, "X-Clipper-Version": "1"}
            headers["X-Clipper-Input-Type"] = "doubles"
            status, _, text = await asyncio.to_thread(
                http_post, f"{c.admin_url}/admin/upload_model", body, headers
            )
            assert status == 400, text
            assert cause in text.decode()
            assert not (uploads / name).exists()  # nothing left on disk
            assert name not in c.registry.models
        # A body that unpacks but is no model: the deploy fails and its upload is removed.
        headers = {"X-Clipper-Name": "nomodel", "X-Clipper-Version": "1"}
        headers["X-Clipper-Input-Type"] = "doubles"
        status, _, text = await asyncio.to_thread(
            http_post, f"{c.admin_url}/admin/upload_model", fine, headers
        )
        assert status != 200, text
        assert "nomodel" not in c.registry.models
        assert not (uploads / "nomodel").exists()


async def test_upload_limits_are_settings() -> None:
    assert FrontendConfig().max_upload_unpacked_bytes == 2 * 2**30
    assert FrontendConfig().max_upload_files == 10_000
    with pytest.raises(ConfigError, match="max_upload"):
        FrontendConfig(max_upload_files=0)


async def test_set_num_replicas_up_and_down(clipper: Clipper, artifacts: dict[str, Path]) -> None:
    await deploy(clipper, "m-scale", artifacts["sums"])
    doc = {"model_name": "m-scale", "num_replicas": 3}  # the current version
    text = await ok_text(clipper, "set_num_replicas", doc)
    assert text == (
        "Successfully set the number of replicas of model with name 'm-scale' and version '1' to 3"
    )
    replicas = await ok_json(clipper, "get_replicas", {"model_name": "m-scale"})
    assert sorted(r["replica_id"] for r in replicas) == [0, 1, 2]
    pids = {r["pid"] for r in replicas}
    assert len(pids) == 3
    assert all(pid_alive(p) for p in pids)
    await ok_text(clipper, "set_num_replicas", {**doc, "model_version": "1", "num_replicas": 1})
    replicas = await ok_json(
        clipper, "get_replicas", {"model_name": "m-scale", "model_version": "1"}
    )
    assert len(replicas) == 1
    stopped = pids - {replicas[0]["pid"]}
    await wait_for(
        lambda: not any(pid_alive(p) for p in stopped), what="scaled-down processes to exit"
    )
    containers = await ok_json(clipper, "get_all_containers", {"verbose": False})
    assert [x for x in containers if x.startswith("m-scale:")] == [
        f"m-scale:1:{replicas[0]['replica_id']}"
    ]


async def test_set_num_replicas_failures(clipper: Clipper, artifacts: dict[str, Path]) -> None:
    text = await fails(clipper, "set_num_replicas", {"model_name": "zz", "num_replicas": 1})
    assert text == "No model with name 'zz' exists."
    text = await fails(clipper, "set_num_replicas", {"model_name": "zz", "num_replicas": -1})
    assert "num_replicas must be >= 0" in text
    # Registered without an artifact: nothing to run unless one is given.
    await add_model(clipper, "m-noart")
    doc = {"model_name": "m-noart", "model_version": "1", "num_replicas": 1}
    assert "has no artifact" in await fails(clipper, "set_num_replicas", doc)
    await ok_text(clipper, "set_num_replicas", {**doc, "num_replicas": 0})
    await ok_text(clipper, "set_num_replicas", {**doc, "artifact_path": str(artifacts["sums"])})
    [replica] = await ok_json(clipper, "get_replicas", {"model_name": "m-noart"})
    assert pid_alive(replica["pid"])


async def test_update_app_changes_what_predict_answers(
    clipper: Clipper, artifacts: dict[str, Path]
) -> None:
    await add_app(clipper, "app-upd")
    doc = await predict_ok(clipper.query_url, "app-upd", {"input": [1.0]})
    assert (doc["output"], doc["default_explanation"]) == (-1.0, NO_MODELS)
    text = await ok_text(clipper, "update_app", {"name": "app-upd", "default_output": '{"x": 1}'})
    assert text == "Successfully updated application with name 'app-upd'"
    doc = await predict_ok(clipper.query_url, "app-upd", {"input": [1.0]})
    assert doc["output"] == {"x": 1}
    app = await ok_json(clipper, "get_application", {"name": "app-upd"})
    assert app["default_output"] == '{"x": 1}'
    # A slow model answers within the generous SLO, and misses a tight one.
    await deploy(clipper, "m-slow", artifacts["slow"])
    await ok_text(clipper, "add_model_links", {"app_name": "app-upd", "model_names": ["m-slow"]})
    doc = await predict_ok(clipper.query_url, "app-upd", {"input": [1.0, 2.0]})
    assert (doc["output"], doc["default"]) == (3.0, False)
    await ok_text(clipper, "update_app", {"name": "app-upd", "latency_slo_micros": 50_000})
    assert (await ok_json(clipper, "get_application", {"name": "app-upd"}))[
        "latency_slo_micros"
    ] == 50_000
    doc = await predict_ok(clipper.query_url, "app-upd", {"input": [5.0, 6.0]})
    assert doc["default"] is True
    assert doc["output"] == {"x": 1}
    # Missed at the deadline, or shed at once because the replica is known to be too slow.
    why = doc["default_explanation"]
    assert why == SLO_MISSED or why.startswith("Query shed under overload"), why


async def test_update_app_failures(clipper: Clipper) -> None:
    await add_app(clipper, "app-updf")
    assert "latency_slo_micros" in await fails(
        clipper, "update_app", {"name": "app-updf", "latency_slo_micros": 0}
    )
    assert "unknown overload answer 'panic'; expected one of default, reject" in await fails(
        clipper, "update_app", {"name": "app-updf", "overload": "panic"}
    )
    text = await fails(clipper, "update_app", {"name": "app-updf", "cache": "yes"})
    assert text.startswith("Error parsing JSON: Type mismatch! JSON key cache expected type bool")
    assert "unknown keys ['slo']" in await fails(
        clipper, "update_app", {"name": "app-updf", "slo": 5}
    )
    assert await fails(clipper, "update_app", {"name": "zz", "cache": False}) == (
        "Application 'zz' does not exist"
    )
    app = await ok_json(clipper, "get_application", {"name": "app-updf"})
    assert app["latency_slo_micros"] == SLO_US


async def test_staged_add_model_starts_replicas(
    clipper: Clipper, artifacts: dict[str, Path]
) -> None:
    stage = {
        "model_name": "m-staged",
        "model_version": "1",
        "input_type": "doubles",
        "artifact_path": str(artifacts["sums"]),
        "num_replicas": 2,
    }
    assert "Successfully staged" in await ok_text(clipper, "stage_model", stage)
    assert await ok_json(clipper, "get_replicas", {"model_name": "m-staged"}) == []
    mismatch = await fails(
        clipper,
        "add_model",
        {
            "model_name": "m-staged",
            "model_version": "1",
            "labels": [],
            "input_type": "strings",
            "container_name": "x",
            "model_data_path": "DEPRECATED",
            "batch_size": -1,
        },
    )
    assert "was staged with input type doubles" in mismatch
    await ok_text(clipper, "stage_model", stage)  # the failed add_model consumed it
    await add_model(clipper, "m-staged", container_name=str(artifacts["sums"]))
    assert len(await ok_json(clipper, "get_replicas", {"model_name": "m-staged"})) == 2
    model = await ok_json(clipper, "get_model", {"model_name": "m-staged", "model_version": "1"})
    assert model["is_current_version"] is True
    assert "already exists" in await fails(clipper, "stage_model", stage)


async def test_get_logs(clipper: Clipper, artifacts: dict[str, Path]) -> None:
    await deploy(clipper, "m-logs", artifacts["sums"])
    logs = await ok_json(clipper, "get_logs", {})
    names = [entry["file"] for entry in logs]
    assert "m-logs-1-0.log" in names
    assert all(isinstance(entry["text"], str) for entry in logs)
    short = await ok_json(clipper, "get_logs", {"max_bytes": 10})
    assert all(len(entry["text"].encode()) <= 10 for entry in short)


async def test_stop_cancels_operations_in_flight(artifacts: dict[str, Path]) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        doc = {
            "model_name": "m-never",
            "model_version": "1",
            "input_type": "doubles",
            "artifact_path": str(artifacts["never"]),
        }
        pending = asyncio.create_task(admin(c, "deploy_model", doc))
        await wait_for(
            lambda: any(p.pid for p in c.manager.replicas("m-never", "1")),
            what="the replica process to start",
        )
        [proc] = c.manager.replicas("m-never", "1")
        pid = proc.pid
        assert pid is not None
        await c.admin.stop()
        resp = await pending
        assert resp.status == 503
        assert "m-never" not in c.registry.models  # the deploy was undone
        assert not pid_alive(pid)


# -- access -----------------------------------------------------------------------------------


async def test_admin_token() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, admin_token="s3cret") as c:
        resp = await request(f"{c.admin_url}/admin/ping")
        assert resp.status == 401
        resp = await request(f"{c.admin_url}/admin/ping", headers={"Authorization": "Bearer wrong"})
        assert resp.status == 401
        resp = await request(
            f"{c.admin_url}/admin/ping", headers={"Authorization": "Bearer s3cret"}
        )
        assert (resp.status, resp.body) == (200, b"PONG")


async def test_admin_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="admin token"):
        FrontendConfig(admin_host="0.0.0.0")
    assert FrontendConfig(admin_host="0.0.0.0", admin_token="t").admin_token == "t"


# -- GET /metrics content negotiation (query port) -------------------------------------------
# clipper_admin's inspect_instance() sends requests' "Accept: */*" and calls .json();
# Prometheus sends openmetrics/text-plain; curl sends */* and shows text. See docs/admin-api.md.

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("path", "accept", "want_json"),
    [
        ("/metrics", "*/*", False),
        ("/metrics", "application/json", True),
        ("/metrics", PROMETHEUS_ACCEPT, False),
        ("/metrics", "text/plain", False),
        ("/metrics?format=json", PROMETHEUS_ACCEPT, True),
        ("/metrics?format=prometheus", "*/*", False),
    ],
)
async def test_metrics_negotiation(
    clipper: Clipper, path: str, accept: str, want_json: bool
) -> None:
    status, ctype, body = await asyncio.to_thread(
        http_get, f"{clipper.query_url}{path}", {"Accept": accept}
    )
    assert status == 200
    if want_json:
        assert ctype == "application/json"
        assert isinstance(orjson.loads(body), dict)
    else:
        assert ctype.startswith("text/plain")
        assert b"# TYPE " in body


async def test_metrics_for_python_requests_taking_anything_is_json(clipper: Clipper) -> None:
    """What clipper_admin's inspect_instance() sends (and then decodes as JSON)."""
    headers = {"Accept": "*/*", "User-Agent": "python-requests/2.32.3"}
    status, ctype, body = await asyncio.to_thread(http_get, f"{clipper.query_url}/metrics", headers)
    assert (status, ctype) == (200, "application/json")
    assert isinstance(orjson.loads(body), dict)
    headers["User-Agent"] = "curl/8.5.0"
    status, ctype, body = await asyncio.to_thread(http_get, f"{clipper.query_url}/metrics", headers)
    assert ctype.startswith("text/plain") and body.count(b"\n") > 10


async def test_metrics_without_accept_stays_text(clipper: Clipper) -> None:
    resp = await request(f"{clipper.query_url}/metrics")
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("text/plain")

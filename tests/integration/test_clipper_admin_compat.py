"""The original ``clipper_admin`` (PyPI 0.4.1) driving clipper-serve through LocalClipperManager.

clipper-original.md section 5.5. clipper_admin is synchronous (requests), so its calls run in a
thread while the frontend serves on this test's event loop. Install for this module:
``pip install clipper-admin==0.4.1 && pip install 'cloudpickle>=3'`` (the 0.5.3 pin cannot be
imported on Python 3.11).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import cloudpickle
import numpy as np
import pytest
import pytest_asyncio

from clipper import Clipper
from tests.integration.helpers import pid_alive, predict_ok, wait_for

try:
    import clipper_admin  # noqa: F401
except Exception as e:  # ImportError, or cloudpickle 0.5.3's TypeError on Python 3.8+
    pytest.skip(
        f"the original clipper_admin package does not import ({type(e).__name__}: {e}); "
        "install it with: pip install clipper-admin==0.4.1 && pip install 'cloudpickle>=3'",
        allow_module_level=True,
    )

from clipper_admin import ClipperConnection, ClipperException

from clipper.compat.clipper_admin import LocalClipperManager

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

T = TypeVar("T")


def add_one(xs: Any) -> list[float]:
    return [float(np.asarray(x).sum()) + 1.0 for x in xs]


def add_two(xs: Any) -> list[float]:
    return [float(np.asarray(x).sum()) + 2.0 for x in xs]


def pickle_model(model: Any, path: Path) -> str:
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        path.write_bytes(cloudpickle.dumps(model))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    return str(path)


async def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking clipper_admin call, off the event loop the frontend serves on."""
    return await asyncio.to_thread(fn, *args, **kwargs)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clipper() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def conn(clipper: Clipper) -> ClipperConnection:
    cm = LocalClipperManager.for_frontend(clipper)
    connection = ClipperConnection(cm)
    # Start nothing, check that both APIs answer (GET /metrics and GET /admin/ping).
    await call(connection.start_clipper)
    return connection


async def test_manager_addresses(clipper: Clipper) -> None:
    cm = LocalClipperManager(clipper.admin_url + "/", clipper.query_url)
    assert cm.get_admin_addr() == f"127.0.0.1:{clipper.admin_http.port}"
    assert cm.get_query_addr() == f"127.0.0.1:{clipper.query_port}"
    assert cm.get_metric_addr() == cm.get_query_addr()
    assert cm.cluster_identifier == "clipper-serve"
    await call(ClipperConnection(cm).connect)


async def test_unreachable_frontend_fails_to_connect() -> None:
    cm = LocalClipperManager("127.0.0.1:1", "127.0.0.1:1", timeout_s=2)
    with pytest.raises(ClipperException, match="unreachable"):
        await call(ClipperConnection(cm).connect)


async def test_clipper_admin_end_to_end(
    clipper: Clipper, conn: ClipperConnection, tmp_path: Path
) -> None:
    v1 = pickle_model(add_one, tmp_path / "add_one.pkl")
    v2 = pickle_model(add_two, tmp_path / "add_two.pkl")

    await call(conn.register_application, "sums", "doubles", "-1.0", 2_000_000)
    assert (await call(conn.get_app_info, "sums"))["input_type"] == "doubles"
    assert await call(conn.get_app_info, "missing-app") is None

    # deploy_model: the manager stages the artifact, register_model (add_model) starts it.
    await call(conn.deploy_model, "adder", "1", "doubles", v1, num_replicas=2)
    assert await call(conn.get_num_replicas, "adder", "1") == 2
    assert await call(conn.get_current_model_version, "adder") == "1"
    await call(conn.link_model_to_app, "sums", "adder")
    assert await call(conn.get_linked_models, "sums") == ["adder"]

    doc = await predict_ok(clipper.query_url, "sums", {"input": [1.0, 2.0]})
    assert (doc["output"], doc["default"]) == (4.0, False)

    # Scale 2 -> 1 through ClipperConnection.set_num_replicas (cm.set_num_replicas).
    await call(conn.set_num_replicas, "adder", 1)
    assert await call(conn.get_num_replicas, "adder") == 1
    replicas = await call(conn.get_all_model_replicas, True)
    assert [(r["model_id"], r["input_type"]) for r in replicas] == [("adder:1", "doubles")]
    replica_id = replicas[0]["model_replica_id"]
    info = await call(conn.get_model_replica_info, "adder", "1", replica_id)
    assert info["model_name"] == "adder"

    models = await call(conn.get_all_models, True)
    [m1] = [m for m in models if m["model_name"] == "adder"]
    assert (m1["model_version"], m1["is_current_version"]) == ("1", True)
    assert await call(conn.get_all_models) == ["adder:1"]

    # A second version, then roll back with set_model_version.
    await call(conn.deploy_model, "adder", "2", "doubles", v2)
    doc = await predict_ok(clipper.query_url, "sums", {"input": [1.0, 2.0]})
    assert doc["output"] == 5.0
    await call(conn.set_model_version, "adder", "1")
    assert await call(conn.get_current_model_version, "adder") == "1"
    doc = await predict_ok(clipper.query_url, "sums", {"input": [1.0, 2.0]})
    assert (doc["output"], doc["default"]) == (4.0, False)

    # Logs of the replicas, copied from the frontend's state directory.
    paths = await call(conn.get_clipper_logs, str(tmp_path / "logs"))
    assert any(Path(p).name == "adder-1-0.log" for p in paths)

    # stop_models: the manager scales every version to 0, then the versions are deleted.
    pids = [p.pid for p in clipper.manager.all_replicas() if p.model == "adder" and p.pid]
    assert pids
    await call(conn.stop_models, ["adder"])
    assert await call(conn.get_all_models) == []
    await wait_for(lambda: not any(pid_alive(p) for p in pids), what="adder processes to exit")
    doc = await predict_ok(clipper.query_url, "sums", {"input": [1.0, 2.0]})
    assert doc["default"] is True

    await call(conn.unregister_application, "sums")
    assert await call(conn.get_all_apps) == []
    with pytest.raises(ClipperException, match="does not exist"):
        await call(conn.unregister_application, "sums")


async def test_stop_all_model_containers(
    clipper: Clipper, conn: ClipperConnection, tmp_path: Path
) -> None:
    artifact = pickle_model(add_one, tmp_path / "add_one.pkl")
    await call(conn.deploy_model, "stopper", "1", "doubles", artifact)
    assert await call(conn.get_num_replicas, "stopper", "1") == 1
    await call(conn.stop_all_model_containers)
    assert "stopper" not in clipper.registry.models
    assert clipper.manager.replicas("stopper", "1") == []
    await call(conn.stop_all)  # leaves the frontend running
    await call(conn.connect)


async def test_registered_model_without_artifact_cannot_scale(
    conn: ClipperConnection,
) -> None:
    # register_model records a containerless model; clipper_admin itself refuses to scale it.
    await call(conn.register_model, "external", "1", "doubles")
    with pytest.raises(ClipperException, match="containerless"):
        await call(conn.set_num_replicas, "external", 1)
    await call(conn.stop_versioned_models, {"external": ["1"]})
    assert await call(conn.get_model_info, "external", "1") is None


async def test_inspect_instance(clipper: Clipper, conn: ClipperConnection) -> None:
    """GET /metrics with requests' ``Accept: */*``, decoded with ``.json()``."""
    await clipper.register_application("inspected", "doubles", "-1.0", 1_000_000)
    await predict_ok(clipper.query_url, "inspected", {"input": [1.0]})
    metrics = await call(conn.inspect_instance)
    assert isinstance(metrics, dict)
    assert metrics['clipper_app_requests_total{app="inspected"}'] >= 1

"""Autoscaling settings: stored with their version (records, snapshots, older records), and set
through the admin API in process (answers, refusals, the model view ``clipper status`` reads).
No replica runs here: the version under test is registered but not current."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from clipper.inputs import InputType
from clipper.registry import ModelVersion, Registry
from clipper.scaling import AutoscaleConfig
from tests.inprocess import InProcessFrontend, RouterResponse


def scaled(**settings: Any) -> ModelVersion:
    cfg = AutoscaleConfig(owner="n1").updated(**settings)
    return ModelVersion("m", "1", InputType.DOUBLES, artifact="/models/m", autoscale=cfg)


def test_settings_round_trip_through_records_and_snapshots() -> None:
    a = Registry()
    a.add_model(scaled(min_replicas=2, max_replicas=5, up_window_s=30, interval_s=2))
    a.add_model(ModelVersion("m", "2", InputType.DOUBLES))
    records = a.records()
    assert records["model"]["m:1"]["autoscale"]["max_replicas"] == 5
    assert "autoscale" not in records["model"]["m:2"]  # records without it are as before
    b = Registry()
    b.apply_snapshot(records)
    assert b.models["m"]["1"] == a.models["m"]["1"]
    assert b.models["m"]["2"].autoscale is None
    assert b.records() == records
    # a change to the settings alone is one model update, and comes back out of the records
    changed = records["model"]["m:1"] | {"autoscale": {**records["model"]["m:1"]["autoscale"]}}
    changed["autoscale"]["target_utilization"] = 0.5
    changes = b.apply_delta({"model": {"m:1": changed}})
    assert [(c.kind, c.op) for c in changes] == [("model", "update")]
    cfg = b.models["m"]["1"].autoscale
    assert cfg is not None and cfg.target_utilization == 0.5


def test_a_bad_autoscale_record_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    record = scaled().to_record()
    record["autoscale"]["min_replicas"] = 9  # above max_replicas
    r = Registry()
    with caplog.at_level(logging.WARNING, logger="clipper.registry"):
        r.apply_snapshot({"model": {"m:1": record}})
    assert "m" not in r.models
    assert "min_replicas" in caplog.text


async def register_idle(fe: InProcessFrontend, **changes: Any) -> None:
    """A version with an artifact that is not current: no replica starts."""
    mv = ModelVersion("m", "1", InputType.DOUBLES, artifact="/models/m", num_replicas=0)
    await fe.clipper.control.register_model(replace(mv, **changes), set_current=False)


def ok(resp: RouterResponse) -> Any:
    assert resp.status == 200, (resp.status, resp.body)
    return resp.json()


async def test_set_autoscale_answers_the_model_view(inproc_frontend: InProcessFrontend) -> None:
    fe = inproc_frontend
    await register_idle(fe)
    doc = {"model_name": "m", "model_version": "1", "min_replicas": 2, "max_replicas": 3}
    view = ok(await fe.admin.post("/admin/set_autoscale", json=doc))
    auto = view["autoscale"]
    assert (auto["min_replicas"], auto["max_replicas"], auto["enabled"]) == (2, 3, True)
    assert auto["num_replicas"] == 2  # brought into the bounds in the same commit
    assert auto["owner"] == fe.clipper.control.node_id and auto["driven_here"] is True
    assert auto["status"] is None  # not running (not current): nothing to drive
    # settings not given keep their values
    doc = {"model_name": "m", "model_version": "1", "target_utilization": 0.5, "enabled": False}
    auto = ok(await fe.admin.post("/admin/set_autoscale", json=doc))["autoscale"]
    assert (auto["min_replicas"], auto["max_replicas"]) == (2, 3)
    assert (auto["target_utilization"], auto["enabled"]) == (0.5, False)
    models = ok(await fe.admin.post("/admin/get_all_models", json={"verbose": True}))
    assert [m["autoscale"]["target_utilization"] for m in models] == [0.5]
    stored = await fe.clipper.store.load()
    assert stored["model"]["m:1"]["autoscale"]["target_utilization"] == 0.5


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"min_replicas": 5, "max_replicas": 4}, "min_replicas <= max_replicas"),
        ({"max_replicas": "4"}, "max_replicas must be an integer"),
        ({"target_utilization": 2}, "target_utilization must be in (0, 1]"),
        ({"down_window_s": 1, "up_window_s": 10}, "down_window_s (1) must be at least"),
        ({"owner": "elsewhere"}, "owner is not a setting"),
        ({"max_replica": 4}, "unknown autoscale settings ['max_replica']"),
        ({"model_version": "7"}, "Requested version: 7 does not exist"),
        ({"model_name": "nope"}, "No model with name 'nope' exists"),
    ],
)
async def test_set_autoscale_refuses_bad_settings_and_changes_nothing(
    inproc_frontend: InProcessFrontend, doc: dict[str, Any], says: str
) -> None:
    fe = inproc_frontend
    await register_idle(fe)
    resp = await fe.admin.post(
        "/admin/set_autoscale", json={"model_name": "m", "model_version": "1", **doc}
    )
    assert resp.status == 400 and says in resp.text, resp.text
    assert fe.clipper.registry.models["m"]["1"].autoscale is None


async def test_a_version_whose_containers_run_elsewhere_cannot_be_autoscaled(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    await register_idle(fe, artifact=None)
    resp = await fe.admin.post("/admin/set_autoscale", json={"model_name": "m"})
    # the version is not current: name it
    assert resp.status == 400
    resp = await fe.admin.post(
        "/admin/set_autoscale", json={"model_name": "m", "model_version": "1"}
    )
    assert resp.status == 400 and "has no artifact" in resp.text
    assert fe.clipper.registry.models["m"]["1"].autoscale is None
    resp = await fe.admin.post("/admin/set_autoscale", json=["m"])
    assert resp.status == 400 and "Expected JSON schema" in resp.text

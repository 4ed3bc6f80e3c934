"""The operator routes (export_state, get_artifact, get_replica_logs, get_status) through the
admin port's router, in process: guarded by the token like every admin route, bounded, and
refusing unknown models and bad bodies with a 400 that says what was wrong."""

from __future__ import annotations

from pathlib import Path

from clipper.artifact_digest import content_digest
from clipper.frontend.admin_state import _read_log
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from tests.inprocess import InProcessFrontend, in_process_frontend


async def test_the_routes_need_the_token() -> None:
    async with in_process_frontend(admin_token="s3cret") as fe:
        for route in ("export_state", "get_artifact", "get_replica_logs", "get_status"):
            resp = await fe.admin.post(f"/admin/{route}", json={})
            assert resp.status == 401, route
        ok = await fe.admin.post(
            "/admin/get_status", json={}, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status == 200 and ok.json()["replicas"] == []


async def test_export_state_has_every_setting_and_the_digest_of_what_runs(
    inproc_frontend: InProcessFrontend, tmp_path: Path
) -> None:
    c = inproc_frontend.clipper
    await c.register_application("a", "doubles", "-1", 5000, cache=False, policy="exp3")
    artifact = tmp_path / "m"
    artifact.mkdir()
    (artifact / "func.pkl").write_bytes(b"never run: no replicas")
    await c.deploy_model("m", "1", artifact=artifact, input_type="doubles", num_replicas=0)
    state = (await inproc_frontend.admin.post("/admin/export_state", json={})).json()
    (app,) = state["applications"]
    assert app["cache"] is False and app["policy"] == "exp3" and app["linked_models"] == []
    (model,) = state["models"]
    assert model["current"] == "1"
    (version,) = model["versions"]
    assert version["artifact_sha256"] == content_digest(artifact)
    assert version["source_sha256"] is None and version["num_replicas"] == 0

    resp = await inproc_frontend.admin.post("/admin/get_artifact", json={"model_name": "m"})
    assert resp.status == 200 and resp.content_type == "application/gzip"
    again = await inproc_frontend.admin.post("/admin/get_artifact", json={"model_name": "m"})
    assert again.body == resp.body  # reproducible


async def test_unknown_models_and_bad_bodies_are_400_with_the_reason(
    inproc_frontend: InProcessFrontend,
) -> None:
    admin = inproc_frontend.admin
    resp = await admin.post("/admin/get_replica_logs", json={"model_name": "nope"})
    assert resp.status == 400 and resp.text == "no model named 'nope' (models: none)"
    resp = await admin.post("/admin/get_artifact", json={})
    assert resp.status == 400 and "required key: model_name" in resp.text
    assert resp.text.endswith('"model_version" := string (optional: the serving one)}')
    await inproc_frontend.clipper.control.register_model(_external("m", "1"))
    resp = await admin.post("/admin/get_artifact", json={"model_name": "m"})
    assert resp.status == 400 and "has no artifact here" in resp.text
    resp = await admin.post(
        "/admin/get_replica_logs", json={"model_name": "m", "model_version": "9"}
    )
    assert resp.status == 400 and "has no version '9' (versions: 1)" in resp.text
    for bad in ({"offsets": [1]}, {"offsets": {"0": -1}}, {"max_bytes": 1 << 30}, {"replica": "0"}):
        resp = await admin.post("/admin/get_replica_logs", json={"model_name": "m", **bad})
        assert resp.status == 400, bad
    resp = await admin.post("/admin/get_replica_logs", json={"model_name": "m"})
    assert resp.status == 200 and resp.json()["replicas"] == []  # none started yet


def _external(name: str, version: str) -> ModelVersion:
    return ModelVersion(name, version, InputType.DOUBLES, num_replicas=0)


def test_reading_a_log_from_an_offset_and_across_its_rotation(tmp_path: Path) -> None:
    log = tmp_path / "m-1-0.log"
    log.write_bytes(b"0123456789")
    tail = _read_log(log, None, 4)
    assert tail["text"] == "6789" and tail["next_offset"] == 10
    assert _read_log(log, 10, 4)["text"] == ""
    log.with_name(log.name + ".1").write_bytes(b"0123456789AB")  # rotated at 12 bytes
    log.write_bytes(b"new")
    after = _read_log(log, 10, 100)
    assert after["rotated"] and after["text"] == "ABnew" and after["next_offset"] == 3

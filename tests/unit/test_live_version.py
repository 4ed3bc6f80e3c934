"""The version an application is served by is deleted only with ``force`` (409 otherwise), and
readiness says when an application is left with nothing to serve."""

from __future__ import annotations

from typing import Any

import pytest

from clipper import cli
from clipper.client import Client
from tests.inprocess import InProcessFrontend
from tests.unit.test_routes_inprocess import json_of, linked_without_replicas

DELETE = "/admin/delete_versioned_model"


async def test_the_live_version_is_deleted_only_with_force(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    await linked_without_replicas(fe)  # waiting -> m:1, current
    doc = {"model_name": "m", "model_version": "1"}
    refused = await fe.admin.post(DELETE, json={**doc, "force": False})
    assert refused.status == 409
    assert refused.body.decode() == (
        "m:1 is the current version of m, which serves waiting: deleting it leaves them "
        "nothing but default outputs. Switch to another version first (set_model_version), "
        'unlink m, or delete it anyway with --force (admin API: "force": true)'
    )
    assert "1" in fe.clipper.registry.models["m"]  # nothing changed
    assert json_of(await fe.query.get("/ready"), 503)["reasons"] == [
        "application 'waiting': model 'm:1' has no replica connected"
    ]
    bad = await fe.admin.post(DELETE, json={**doc, "force": "yes"})
    assert bad.status == 400 and b'"force" := bool (optional' in bad.body
    deleted = await fe.admin.post(DELETE, json={**doc, "force": True})
    assert deleted.status == 200, deleted.body
    assert "m" not in fe.clipper.registry.models
    # The application is left with nothing to serve: not ready, and the body says why.
    ready = json_of(await fe.query.get("/ready"), 503)
    assert ready["ready"] is False and ready["models_without_replicas"] == []
    assert ready["reasons"] == [
        "application 'waiting': model 'm' has no current version (it answers only default outputs)"
    ]
    assert (await fe.query.get("/v2/health/ready")).status == 503
    await fe.clipper.unlink_model_from_app("waiting", "m")
    assert json_of(await fe.query.get("/ready"))["ready"] is True


async def test_a_body_without_force_deletes_as_the_original_did(
    inproc_frontend: InProcessFrontend,
) -> None:
    """The original clipper_admin sends no ``force`` and expects the delete to happen."""
    fe = inproc_frontend
    await linked_without_replicas(fe)
    deleted = await fe.admin.post(DELETE, json={"model_name": "m", "model_version": "1"})
    assert deleted.status == 200, deleted.body
    assert "m" not in fe.clipper.registry.models


async def test_versions_no_application_is_served_by_need_no_force(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    await linked_without_replicas(fe)
    added = await fe.admin.post(
        "/admin/add_model",
        json={"model_name": "m", "model_version": "2", "labels": [], "input_type": "doubles"},
    )
    assert added.status == 200, added.body
    await fe.clipper.set_model_version("m", "1")
    # Not the current version: deleted without a word.
    gone = await fe.admin.post(DELETE, json={"model_name": "m", "model_version": "2"})
    assert gone.status == 200, gone.body
    await fe.clipper.unlink_model_from_app("waiting", "m")
    # The current version of a model no application links: nothing is served by it.
    gone = await fe.admin.post(DELETE, json={"model_name": "m", "model_version": "1"})
    assert gone.status == 200, gone.body


@pytest.mark.parametrize(("argv", "sent"), [([], {"force": False}), (["--force"], {"force": True})])
def test_the_client_and_the_cli_pass_force_through(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], sent: dict[str, Any]
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def admin(self: Client, route: str, doc: dict[str, Any] | None = None) -> Any:
        calls.append((route, doc or {}))
        return "ok"

    monkeypatch.setattr(Client, "admin", admin)
    assert cli.main(["model", "delete", "m", "1", *argv]) == 0
    assert calls == [("delete_versioned_model", {"model_name": "m", "model_version": "1", **sent})]


def test_a_refused_delete_is_exit_1_with_the_servers_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = b"m:1 is the current version of m, which serves a: ..."
    monkeypatch.setattr(Client, "_call", lambda self, url, body, **kw: (409, reason))
    assert cli.main(["model", "delete", "m", "1"]) == 1
    assert capsys.readouterr().err == f"clipper: {reason.decode()}\n"

"""``clipper export`` then ``clipper apply`` carry the whole state (docs/cli.md).

A frontend is given every kind of state through every mutating admin route; its export applied to
a fresh frontend and exported again gives the same bytes, the two registries hold the same
records and answer the same queries, and a change made by hand afterwards is drift that apply
reports and repairs. The admin API's routes are enumerated from its route table: a route that is
neither a read, nor carried by the file, nor on the documented allow-list fails the test until
it is classified (and the file carries what it sets).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from clipper.client import Client
from clipper.declarative.export import export_state
from clipper.deployers import package
from clipper.server import Clipper
from tests.integration import models
from tests.integration.test_cli_ops import cli

pytestmark = pytest.mark.integration

# Routes that change nothing the registry holds.
READS = {
    "ping", "get_all_applications", "get_application", "get_linked_models", "get_all_models",
    "get_model", "get_all_containers", "get_container", "get_state", "get_replicas", "get_logs",
    "get_traffic", "export_state", "get_artifact", "get_replica_logs", "get_status",
    "get_tenants",
}  # fmt: skip
# Mutating routes that are not state the file carries (docs/cli.md lists them).
NOT_STATE = {
    # Remembers a deployment for the add_model that follows it; the version that add_model
    # makes is what is carried.
    "stage_model": "a deployment waiting for its add_model",
    # API keys are secrets shown once: never in a file (apply leaves them as they are).
    "create_key": "a tenant's API key",
    "delete_key": "a tenant's API key",
}
# Mutating routes whose every effect the file carries: each is called below.
CARRIED = {
    "add_app", "update_app", "delete_app", "add_model_links", "delete_model_links", "add_model",
    "delete_versioned_model", "deploy_model", "upload_model", "set_num_replicas",
    "set_autoscale", "set_model_version", "set_traffic_split", "set_shadow",
    "add_tenant", "update_tenant", "delete_tenant",
}  # fmt: skip

PIPELINE = {"stages": [{"name": "total", "model": "summer", "budget": 0.5}], "output": "$total"}


def _routes(c: Clipper) -> set[str]:
    return set(c.admin._sync) | set(c.admin._async) | {"ping", "upload_model"}


def _record_calls(c: Clipper) -> set[str]:
    """The routes called on ``c`` from now on (each handler wrapped)."""
    called: set[str] = set()

    def wrap(name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            called.add(name)
            return handler(*args)

        return run

    for table in (c.admin._sync, c.admin._async):
        for name, handler in list(table.items()):
            table[name] = wrap(name, handler)
    upload: Callable[..., Coroutine[Any, Any, Any]] = c.admin._upload_model
    setattr(c.admin, "_upload_model", wrap("upload_model", upload))  # noqa: B010
    return called


def _artifacts(d: Path) -> None:
    # Artifact directories, packaged by value as deploy does.
    package(models.row_sums, d / "summer")
    package(models.version_one, d / "v1")
    package(models.version_two, d / "v2")
    package(models.version_two, d / "v10")


def _build_state(a: Clipper, work: Path) -> None:
    """Every kind of state, each through its admin route (the client, as the CLI sends them)."""
    c = Client(a.admin_url, a.query_url)
    c.register_application("sums", "doubles", "-1", 1_000_000)
    c.update_application("sums", cache=False, on_model_error="default")
    c.register_application(
        "ens", "doubles", "null", 1_000_000, policy="exp3", min_confidence=0.2, loss="squared"
    )
    c.register_application("tmp", "doubles", "0", 5000)
    c.delete_application("tmp")
    c.deploy_model(
        "summer", "1", artifact=work / "summer", input_type="doubles", num_replicas=0,
        labels=["sum", "fast"],
    )  # fmt: skip
    c.set_num_replicas("summer", 1, "1")
    # Versions deployed out of order (2, 10, 1): the export lists them 1, 2, 10.
    for v in ("2", "10", "1"):
        c.deploy_model("versioned", v, artifact=work / f"v{v}", input_type="doubles")
    c.admin(
        "deploy_model",
        {"model_name": "versioned", "model_version": "3", "input_type": "doubles",
         "artifact_path": str(a.registry.models["versioned"]["2"].artifact), "num_replicas": 0,
         "batching": {"max_wait_micros": 300}, "labels": ["by-path"]},
    )  # fmt: skip
    c.set_model_version("versioned", "1")
    c.set_autoscale("versioned", "1", min_replicas=1, max_replicas=2, target_utilization=0.6)
    c.set_traffic_split("versioned", {"1": 90, "10": 10}, sticky=True)
    c.set_shadow("versioned", "2", 0.5)
    c.admin(
        "add_model",
        {"model_name": "ext", "model_version": "1", "input_type": "doubles",
         "labels": ["outside"], "container_name": "team/ext", "batch_size": 8},
    )  # fmt: skip
    c.admin("add_model", {"model_name": "ext", "model_version": "2", "input_type": "doubles"})
    c.set_model_version("ext", "1")
    c.delete_model_version("ext", "2")
    c.link_model_to_app("sums", "summer")
    c.link_model_to_app("ens", "summer")
    c.link_model_to_app("ens", "versioned")
    c.unlink_model_from_app("ens", "summer")
    c.register_application("chain", "doubles", "-2", 1_000_000, pipeline=PIPELINE)
    c.add_tenant("gold", priority="critical", quotas={"*": {"rate": 100, "burst": 200}})
    c.update_tenant(
        "gold", quotas={"*": {"rate": 2.5, "burst": 5}, "sums": {"rate": 1, "burst": 2}}
    )
    c.add_tenant("bulk", priority="sheddable")
    c.add_tenant("tmp")
    c.delete_tenant("tmp")


def _reads(a: Clipper) -> None:
    c = Client(a.admin_url, a.query_url)
    bodies: dict[str, dict[str, Any]] = {
        "get_application": {"name": "sums"}, "get_linked_models": {"app_name": "sums"},
        "get_model": {"model_name": "summer", "model_version": "1"},
        "get_container": {"model_name": "summer", "model_version": "1", "replica_id": 0},
        "get_state": {"app_name": "sums"}, "get_traffic": {"model_name": "versioned"},
        "get_replica_logs": {"model_name": "summer"},
    }  # fmt: skip
    for route in sorted(READS - {"ping", "get_artifact"}):
        c.admin(route, bodies.get(route, {}))
    c.download_artifact("summer", "1")  # get_artifact


def _records(c: Clipper) -> dict[str, Any]:
    """The registry as stored, less what differs by machine: artifact paths (their content is
    compared by the export) and which frontend drives an autoscaled version."""
    r = c.registry.records()
    for record in r["model"].values():
        record["artifact"] = record["artifact"] is not None
        if "autoscale" in record:
            record["autoscale"] = {k: v for k, v in record["autoscale"].items() if k != "owner"}
    r["rollout"] = {
        k: v for k, v in r["rollout"].items() if v["split"] or v["shadow"] or v["sticky"]
    }
    return r


def _answers(c: Clipper) -> list[Any]:
    client = Client(c.admin_url, c.query_url)
    out = [client.predict("sums", [1.0, 2.5])["output"], client.predict("chain", [2.0, 3.0])]
    out[-1] = out[-1]["output"]
    out += [client.predict("versioned_app", [1.0], uid=u)["output"] for u in ("u1", "u2", "u3")]
    return out


async def _export(c: Clipper, out: Path) -> bytes:
    path = await asyncio.to_thread(export_state, Client(c.admin_url), out)
    return path.read_bytes()


async def test_the_whole_state_round_trips_and_drift_is_repaired(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _artifacts(work)
    async with (
        Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "a") as a,
        Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "b") as b,
    ):
        routes = _routes(a)
        unclassified = routes - READS - set(NOT_STATE) - CARRIED
        assert not unclassified, (
            f"admin routes {sorted(unclassified)} are not classified: make the export carry "
            "what they set (then add them to CARRIED), or list them as reads / not state"
        )
        assert not (READS | set(NOT_STATE) | CARRIED) - routes, "a classified route is gone"
        called = _record_calls(a)
        await asyncio.to_thread(_build_state, a, work)
        assert called >= CARRIED, f"not exercised: {sorted(CARRIED - called)}"
        # An application of the split model, to query it with sticky uids.
        ca = Client(a.admin_url, a.query_url)
        await asyncio.to_thread(
            ca.register_application, "versioned_app", "doubles", "null", 1_000_000
        )
        await asyncio.to_thread(ca.link_model_to_app, "versioned_app", "versioned")

        before = a.registry.records()
        await asyncio.to_thread(_reads, a)
        assert a.registry.records() == before, "a read route changed the state"

        first = await _export(a, tmp_path / "export-a")
        text = first.decode()
        assert "pipeline:" in text and "split:" in text and "shadow:" in text
        assert "autoscale:" in text and "labels:" in text and "tenants:" in text
        assert text.index("version: '1'") < text.index("version: '2'") < text.index("version: '10'")

        file = tmp_path / "export-a" / "clipper.yaml"
        code, out, err = await cli(a, "apply", "-f", str(file))
        assert (code, out.strip()) == (0, "no changes"), err
        code, out, err = await cli(b, "apply", "-f", str(file))
        assert code == 0 and "applied" in out, err + out
        assert await _export(b, tmp_path / "export-b") == first
        assert _records(b) == _records(a)
        code, out, err = await cli(b, "apply", "-f", str(file))
        assert (code, out.strip()) == (0, "no changes"), err
        assert await asyncio.to_thread(_answers, b) == await asyncio.to_thread(_answers, a)

        # Changed by hand on b: apply reports each change as drift and puts it back.
        cb = Client(b.admin_url, b.query_url)
        await asyncio.to_thread(cb.set_traffic_split, "versioned", {"1": 50, "10": 50})
        await asyncio.to_thread(cb.set_autoscale, "versioned", "1", max_replicas=3)
        await asyncio.to_thread(cb.update_application, "sums", cache=True)
        code, out, _ = await cli(b, "apply", "-f", str(file), "--dry-run")
        assert code == 0 and "0 to create, 3 to change, 0 to delete" in out, out
        assert "split 1=50, 10=50 -> 1=90, 10=10 (sticky)" in out
        assert "autoscaling {max_replicas 3}" in out and "cache True -> False" in out
        code, out, err = await cli(b, "apply", "-f", str(file))
        assert code == 0 and "applied 3 changes" in out, err + out
        assert await _export(b, tmp_path / "export-b2") == first
        assert _records(b) == _records(a)

"""The management operations' rules (runtime/operations.py, runtime/artifacts.py), written once
and called by both front doors: the embedded API on ``Clipper`` and the admin API. Each rule is
driven through both where both have it, in process; no replica process starts (versions have
no replicas, or are not current)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from clipper.errors import RegistryError
from clipper.inputs import InputType
from clipper.registry import ModelVersion
from clipper.runtime.artifacts import DIGEST_FILE, Artifacts, upload_dir
from clipper.runtime.operations import parse_input_type
from tests.inprocess import InProcessFrontend, RouterResponse

TEXT = "text/plain; charset=utf-8"
EXISTS = "model with name 'm' and version '1' already exists"


def refused(resp: RouterResponse) -> str:
    assert resp.status == 400, (resp.status, resp.body)
    assert resp.content_type == TEXT
    return resp.text


def ok(resp: RouterResponse) -> Any:
    assert resp.status == 200, (resp.status, resp.body)
    return resp.json() if resp.content_type == "application/json" else resp.text


def gzipped_tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def untar(dest: Path, body: bytes) -> None:
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        tar.extractall(dest, filter="data")


async def deployed_without_replicas(fe: InProcessFrontend, tmp_path: Path) -> None:
    artifact = tmp_path / "model.pkl"
    artifact.write_bytes(b"not started: no replicas")
    await fe.clipper.deploy_model("m", "1", artifact=artifact, input_type="doubles", num_replicas=0)


# -- "already exists": one rule, refused before anything is written ---------------------------


async def test_a_second_version_of_the_same_name_is_refused_by_both_front_doors(
    inproc_frontend: InProcessFrontend, tmp_path: Path
) -> None:
    fe = inproc_frontend
    await deployed_without_replicas(fe, tmp_path)
    state = fe.clipper.state_dir
    # The embedded API: a Python object would be packaged over the running version's files.
    with pytest.raises(RegistryError) as embedded:
        await fe.clipper.deploy_model("m", "1", lambda xs: xs, input_type="doubles")
    assert str(embedded.value) == EXISTS
    assert not (state / "models" / "m" / "1").exists()
    # The admin API: an upload, a staged deployment, an add_model.
    upload = await fe.admin.post(
        "/admin/upload_model?name=m&version=1&input_type=doubles&num_replicas=0", body=b"other"
    )
    assert refused(upload) == EXISTS
    assert not upload_dir(state, "m", "1").exists()
    stage = {
        "model_name": "m",
        "model_version": "1",
        "input_type": "doubles",
        "artifact_path": str(tmp_path / "model.pkl"),
    }
    assert refused(await fe.admin.post("/admin/stage_model", json=stage)) == EXISTS
    add = {"model_name": "m", "model_version": "1", "labels": [], "input_type": "doubles"}
    assert refused(await fe.admin.post("/admin/add_model", json=add)) == EXISTS
    with pytest.raises(RegistryError, match=f"^{EXISTS}$"):
        fe.clipper.operations.check_new_version("m", "1")
    fe.clipper.operations.check_new_version("m", "2")  # another version is new


async def test_the_same_deploy_again_is_a_no_op_from_both_front_doors(
    inproc_frontend: InProcessFrontend, tmp_path: Path
) -> None:
    fe = inproc_frontend
    await deployed_without_replicas(fe, tmp_path)
    before = fe.clipper.registry.models["m"]["1"]
    again = await fe.clipper.deploy_model(
        "m", "1", artifact=tmp_path / "model.pkl", input_type="doubles", num_replicas=0
    )
    assert again.to_record() == before.to_record()
    doc = {
        "model_name": "m",
        "model_version": "1",
        "input_type": "doubles",
        "artifact_path": str(tmp_path / "model.pkl"),
        "num_replicas": 0,
    }
    answer = ok(await fe.admin.post("/admin/deploy_model", json=doc))
    assert answer == {"model_name": "m", "model_version": "1", "num_replicas": 0}
    # Different settings under the same version: refused, with the same words.
    doc["labels"] = ["x"]
    assert refused(await fe.admin.post("/admin/deploy_model", json=doc)) == EXISTS


# -- autoscale settings: configured once --------------------------------------------------------


async def test_autoscale_settings_from_both_front_doors_are_identical(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    for name in ("a", "b"):
        await fe.clipper.control.register_model(
            ModelVersion(name, "1", InputType.DOUBLES, artifact="/models/x", num_replicas=0),
            set_current=False,
        )
    settings = {"min_replicas": 2, "max_replicas": 6, "target_utilization": 0.5}
    await fe.clipper.set_autoscale("a", "1", **settings)
    route = "/admin/set_autoscale"
    ok(await fe.admin.post(route, json={"model_name": "b", "model_version": "1", **settings}))
    a = fe.clipper.registry.models["a"]["1"]
    b = fe.clipper.registry.models["b"]["1"]
    assert a.autoscale is not None and a.autoscale.owner == fe.clipper.control.node_id
    assert a.autoscale == b.autoscale
    assert a.num_replicas == b.num_replicas == 2  # moved into the bounds in the same commit
    # A partial change keeps the other settings, through either door.
    await fe.clipper.set_autoscale("a", "1", max_replicas=4)
    ok(
        await fe.admin.post(
            route, json={"model_name": "b", "model_version": "1", "max_replicas": 4}
        )
    )
    a = fe.clipper.registry.models["a"]["1"]
    b = fe.clipper.registry.models["b"]["1"]
    assert a.autoscale is not None and a.autoscale.min_replicas == 2
    assert a.autoscale.max_replicas == 4
    assert a.autoscale == b.autoscale
    # "owner" is not a setting, for either.
    with pytest.raises(RegistryError) as embedded:
        await fe.clipper.set_autoscale("a", "1", owner="someone")
    admin = await fe.admin.post(
        route, json={"model_name": "b", "model_version": "1", "owner": "someone"}
    )
    assert refused(admin) == str(embedded.value)


# -- artifact placement -----------------------------------------------------------------------


def test_an_upload_is_placed_with_its_digests(tmp_path: Path) -> None:
    places = Artifacts(tmp_path)
    pickled = places.place_upload(
        "m", "1", b"pickle", digest="d1", unpack=untar, source_sha256="s" * 64
    )
    assert pickled == upload_dir(tmp_path, "m", "1") / "model.pkl"
    assert pickled.read_bytes() == b"pickle"
    assert places.upload_digest("m", "1") == "d1"
    assert (pickled.parent / "source.sha256").read_text() == "s" * 64
    # A gzipped tar is an artifact directory; holding only model.pkl, it is that model.
    lone = places.place_upload(
        "m", "2", gzipped_tar({"model.pkl": b"p"}), digest="d2", unpack=untar
    )
    assert lone == upload_dir(tmp_path, "m", "2") / "artifact" / "model.pkl"
    full = gzipped_tar({"clipper-model.json": b"{}", "model.pkl": b"p"})
    directory = places.place_upload("m", "3", full, digest="d3", unpack=untar)
    assert directory == upload_dir(tmp_path, "m", "3") / "artifact"
    assert places.upload_digest("m", "9") is None
    places.remove_upload("m", "3")
    assert not upload_dir(tmp_path, "m", "3").exists()
    assert upload_dir(tmp_path, "m", "2").exists()  # the model's other versions stay
    places.remove_upload("m", "1")
    places.remove_upload("m", "2")
    assert not (tmp_path / "uploads" / "m").exists()


async def test_an_upload_retried_is_a_no_op_and_a_failed_one_leaves_nothing(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    route = "/admin/upload_model?name=m&version=1&input_type=doubles&num_replicas=0"
    first = ok(await fe.admin.post(route, body=b"pickled"))
    assert first == {"model_name": "m", "model_version": "1", "num_replicas": 0}
    mv = fe.clipper.registry.models["m"]["1"]
    assert mv.artifact == str(upload_dir(fe.clipper.state_dir, "m", "1") / "model.pkl")
    assert (Path(mv.artifact).parent / DIGEST_FILE).exists()
    assert ok(await fe.admin.post(route, body=b"pickled")) == first
    assert fe.clipper.registry.models["m"]["1"] is mv

    def broken(dest: Path, body: bytes) -> None:
        dest.mkdir(parents=True)
        raise RegistryError("the uploaded archive cannot be unpacked: test")

    new = ModelVersion("m", "2", InputType.DOUBLES, num_replicas=0)
    with pytest.raises(RegistryError, match="cannot be unpacked"):
        await fe.clipper.operations.deploy_upload(new, b"\x1f\x8b rest", unpack=broken)
    assert not upload_dir(fe.clipper.state_dir, "m", "2").exists()
    assert "2" not in fe.clipper.registry.models["m"]


async def test_a_python_model_is_packaged_in_the_state_directory(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    mv = await fe.clipper.deploy_model(
        "m", "1", lambda xs: xs, input_type="doubles", num_replicas=0
    )
    assert mv.artifact is not None
    assert Path(mv.artifact).is_relative_to(fe.clipper.state_dir / "models" / "m" / "1")
    assert fe.clipper.registry.models["m"]["1"].artifact == mv.artifact


# -- the other pre-checks, with the admin API's words -------------------------------------------


async def test_unknown_models_are_refused_with_the_same_words_by_both_front_doors(
    inproc_frontend: InProcessFrontend,
) -> None:
    fe = inproc_frontend
    cases = [
        (
            fe.clipper.set_traffic_split("nope", {"1": 1}),
            ("set_traffic_split", {"model_name": "nope", "split": {"1": 1}}),
        ),
        (
            fe.clipper.set_shadow("nope", "1"),
            ("set_shadow", {"model_name": "nope", "version": "1"}),
        ),
        (
            fe.clipper.set_model_version("nope", "1"),
            ("set_model_version", {"model_name": "nope", "model_version": "1"}),
        ),
        (
            fe.clipper.stop_model("nope", "1"),
            ("delete_versioned_model", {"model_name": "nope", "model_version": "1"}),
        ),
        (
            fe.clipper.link_model_to_app("no-app", "m"),
            ("add_model_links", {"app_name": "no-app", "model_names": ["m"]}),
        ),
        (
            fe.clipper.unlink_model_from_app("no-app", "m"),
            ("delete_model_links", {"app_name": "no-app", "model_names": ["m"]}),
        ),
    ]
    for call, (route, doc) in cases:
        with pytest.raises(RegistryError) as embedded:
            await call
        assert refused(await fe.admin.post(f"/admin/{route}", json=doc)) == str(embedded.value)
    with pytest.raises(RegistryError, match=r"^No model with name 'nope' exists\.$"):
        fe.clipper.traffic_of("nope")
    answer = await fe.admin.post("/admin/get_traffic", json={"model_name": "nope"})
    assert refused(answer) == "No model with name 'nope' exists."


async def test_input_types_parse_alike_in_both_front_doors(
    inproc_frontend: InProcessFrontend,
) -> None:
    assert parse_input_type("d") is InputType.DOUBLES
    assert parse_input_type(InputType.BYTES) is InputType.BYTES
    fe = inproc_frontend
    with pytest.raises(RegistryError) as embedded:
        await fe.clipper.register_application("a", "quaternions", "-1", 1000)
    doc = {
        "name": "a",
        "input_type": "quaternions",
        "default_output": "-1",
        "latency_slo_micros": 1000,
    }
    assert refused(await fe.admin.post("/admin/add_app", json=doc)) == str(embedded.value)
    assert "quaternions" in str(embedded.value)

"""The Python client and the CLI against a real frontend and real container processes."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import orjson
import pytest
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

from clipper import Clipper, ClipperError, RegistryError, RequestError
from clipper.client import Client
from tests.integration import models

pytestmark = pytest.mark.integration


@pytest.fixture
async def frontend(tmp_path: Path) -> Any:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path) as c:
        yield c


async def test_client_journey_register_deploy_predict_scale_rollback(frontend: Clipper) -> None:
    client = Client(frontend.admin_url, frontend.query_url)
    x, y = load_digits(return_X_y=True)
    est = LogisticRegression(max_iter=2000).fit(x, y)

    def journey() -> dict[str, Any]:
        client.register_application("digits", "doubles", "-1", 1_000_000)
        client.deploy_model("logreg", "1", est, input_type="doubles")
        client.link_model_to_app("digits", "logreg")
        answers = client.predict_batch("digits", [row.tolist() for row in x[:20]])
        client.set_num_replicas("logreg", 2)
        replicas = client.list_replicas("logreg")
        client.deploy_model("logreg", "2", models.version_two, input_type="doubles")
        after_v2 = client.predict("digits", [1.0] * 64)
        client.set_model_version("logreg", "1")  # rollback
        after_rollback = client.predict("digits", x[0].tolist())
        return {
            "answers": answers,
            "replicas": replicas,
            "after_v2": after_v2,
            "after_rollback": after_rollback,
            "models": client.list_models(),
        }

    got = await asyncio.to_thread(journey)
    assert [a["default"] for a in got["answers"]] == [False] * 20
    assert [a["output"] for a in got["answers"]] == est.predict(x[:20]).tolist()
    assert len(got["replicas"]) == 2
    assert got["after_v2"]["output"]["version"] == 2
    assert got["after_rollback"] == {**got["after_rollback"], "default": False}
    assert got["after_rollback"]["output"] == int(est.predict(x[:1])[0])
    current = {m["model_version"]: m["is_current_version"] for m in got["models"]}
    assert current == {"1": True, "2": False}


async def test_client_errors_are_exceptions_with_the_servers_message(frontend: Clipper) -> None:
    client = Client(frontend.admin_url, frontend.query_url)

    def calls() -> list[Exception]:
        errors: list[Exception] = []
        client.register_application("a", "doubles", "-1", 20_000)
        for call in (
            lambda: client.register_application("a", "doubles", "-1", 20_000),
            lambda: client.link_model_to_app("a", "missing"),
            lambda: client.predict("nope", [1.0]),
            lambda: client.predict("a", "not numbers"),
            lambda: Client("http://127.0.0.1:1", "http://127.0.0.1:1").list_models(),
        ):
            try:
                call()
            except ClipperError as e:
                errors.append(e)
        return errors

    dup, link, unknown, bad, unreachable = await asyncio.to_thread(calls)
    assert isinstance(dup, RegistryError) and "already exists" in str(dup)
    assert isinstance(link, RegistryError) and "No model with name 'missing'" in str(link)
    assert isinstance(unknown, RequestError) and unknown.status == 404
    assert isinstance(bad, RequestError) and bad.status == 400
    assert "must be an array of numbers" in str(bad)
    assert type(unreachable) is ClipperError and "cannot reach" in str(unreachable)


SRC = str(Path(__file__).resolve().parents[2] / "src")


async def clipper_cli(c: Clipper, *args: str) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "CLIPPER_ADMIN_URL": c.admin_url,
        "CLIPPER_URL": c.query_url,
        "PYTHONPATH": SRC,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clipper", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_journey_with_exit_codes(frontend: Clipper, tmp_path: Path) -> None:
    model_file = tmp_path / "sums.pkl"
    cloudpickle.register_pickle_by_value(models)
    try:
        await asyncio.to_thread(model_file.write_bytes, cloudpickle.dumps(models.row_sums))
    finally:
        cloudpickle.unregister_pickle_by_value(models)
    c = frontend
    code, _, err = await clipper_cli(
        c, "app", "register", "sums", "--input-type", "doubles",
        "--default-output", "-1", "--slo-micros", "1000000",
    )  # fmt: skip
    assert code == 0, err
    code, out, err = await clipper_cli(
        c, "model", "deploy", str(model_file), "--name", "summer", "--version", "1",
        "--input-type", "doubles", "--replicas", "2",
    )  # fmt: skip
    assert code == 0, err
    assert "2 replicas ready" in out
    assert (await clipper_cli(c, "link", "sums", "summer"))[0] == 0
    code, out, _ = await clipper_cli(c, "predict", "sums", "[1, 2, 3.5]")
    assert code == 0 and orjson.loads(out)["output"] == 6.5
    code, out, _ = await clipper_cli(c, "status", "--json")
    status = orjson.loads(out)
    assert [a["name"] for a in status["applications"]] == ["sums"]
    assert len(status["replicas"]) == 2
    code, out, _ = await clipper_cli(c, "app", "list")
    assert code == 0 and out.splitlines()[0].startswith("NAME") and "sums" in out
    # exit codes scripts can trust
    code, _, err = await clipper_cli(c, "app", "register", "sums", "--input-type", "doubles")
    assert code == 1 and "already exists" in err
    code, _, err = await clipper_cli(c, "predict", "sums", "[1,")
    assert code == 2 and "must be JSON" in err
    code, _, err = await clipper_cli(c, "--help")
    assert code == 0
    env_down = await clipper_cli(c, "model", "list", "--admin-url", "http://127.0.0.1:1")
    assert env_down[0] == 3 and "cannot reach" in env_down[2]

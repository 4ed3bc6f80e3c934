"""The operator commands against real frontends and real replica processes: ``clipper apply``
(idempotent, --dry-run, --prune, line-numbered errors that change nothing), ``clipper export``
(round trip to a fresh frontend), ``clipper logs`` (-f ended by Ctrl-C), ``clipper status``
(replica states, restarts, rates) and ``clipper stop``. No command may print a traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import orjson
import pytest

from clipper import Clipper
from clipper.batching.health import MIN_ANSWERED
from clipper.client import Client
from clipper.declarative.export import to_document
from clipper.deployers import package
from tests.integration import models
from tests.integration.frontend_process import SRC, FrontendProcess
from tests.integration.helpers import predict_ok, request, wait_for

pytestmark = pytest.mark.integration

STATE = """\
applications:
  - name: sums
    input_type: doubles
    default_output: -1
    slo_micros: 1000000
    models: [summer]
  - name: versions
    input_type: doubles
    default_output: "null"
    slo_micros: 1000000
    cache: false
    models: [versioned]
models:
  - name: summer
    input_type: doubles
    versions:
      - version: 1
        artifact: sums.pkl
        batching: {max_wait_micros: 200}
  - name: versioned
    input_type: doubles
    current: "1"
    versions:
      - version: "1"
        artifact: v1
      - version: "2"
        artifact: v2
"""


def _env(c: Clipper | FrontendProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
    env["PYTHONPATH"] = SRC
    env["CLIPPER_ADMIN_URL"] = c.admin_url
    if isinstance(c, Clipper):
        env["CLIPPER_URL"] = c.query_url
    return env


async def cli(c: Clipper | FrontendProcess, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clipper", *args, env=_env(c),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    assert b"Traceback" not in err, err.decode()
    return proc.returncode, out.decode(), err.decode()


def _write_models(d: Path) -> None:
    cloudpickle.register_pickle_by_value(models)
    try:
        (d / "sums.pkl").write_bytes(cloudpickle.dumps(models.row_sums))
    finally:
        cloudpickle.unregister_pickle_by_value(models)
    package(models.version_one, d / "v1")  # artifact directories (by value, as deploy does)
    package(models.version_two, d / "v2")


@pytest.fixture
async def two_frontends(tmp_path: Path) -> Any:
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    async with (
        Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=a_dir) as a,
        Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=b_dir) as b,
    ):
        yield a, b


async def _replica_pids(c: Clipper) -> list[int]:
    return sorted(p.pid for p in c.manager.all_replicas() if p.pid is not None)


async def test_apply_is_idempotent_and_an_export_reproduces_the_state_elsewhere(
    two_frontends: tuple[Clipper, Clipper], tmp_path: Path
) -> None:
    a, b = two_frontends
    work = tmp_path / "work"
    work.mkdir()
    _write_models(work)
    state = work / "state.yaml"
    state.write_text(STATE)

    code, out, _ = await cli(a, "apply", "-f", str(state), "--dry-run")
    assert code == 0 and "dry run: nothing was changed" in out
    assert "5 to create" not in out and "to create, 0 to change, 0 to delete" in out
    assert not a.registry.apps and not a.registry.models  # --dry-run changed nothing

    code, out, err = await cli(a, "apply", "-f", str(state))
    assert code == 0, err
    assert "applied" in out
    assert a.registry.current == {"summer": "1", "versioned": "1"}
    assert a.registry.linked_models("versions") == ["versioned"]
    assert not a.registry.apps["versions"].cache
    client = Client(a.admin_url, a.query_url)
    answer = await asyncio.to_thread(client.predict, "versions", [1.0, 2.0])
    assert answer["output"]["version"] == 1  # the current version, though 2 came later
    pids = await _replica_pids(a)

    code, out, _ = await cli(a, "apply", "-f", str(state))
    assert code == 0 and out.strip() == "no changes"
    assert await _replica_pids(a) == pids  # nothing restarted

    exported = tmp_path / "export"
    code, out, err = await cli(a, "export", "-o", str(exported))
    assert code == 0, err
    assert (exported / "clipper.yaml").is_file()
    assert (await cli(a, "apply", "-f", str(exported / "clipper.yaml")))[1].strip() == "no changes"

    code, out, err = await cli(b, "apply", "-f", str(exported / "clipper.yaml"))
    assert code == 0, err
    a_state = await asyncio.to_thread(client.admin, "export_state", {})
    b_state = await asyncio.to_thread(Client(b.admin_url).admin, "export_state", {})
    assert to_document(b_state) == to_document(a_state)
    for file in (exported / "clipper.yaml", state):  # the export, and the original file
        assert (await cli(b, "apply", "-f", str(file)))[1].strip() == "no changes"
    answer = await asyncio.to_thread(Client(b.admin_url, b.query_url).predict, "sums", [1, 2.5])
    assert answer["output"] == 3.5


async def test_bad_files_say_where_and_change_nothing_and_prune_is_explicit(
    two_frontends: tuple[Clipper, Clipper], tmp_path: Path
) -> None:
    a, _ = two_frontends
    bad = tmp_path / "bad.yaml"
    bad.write_text("applications:\n  - name: x\n    slo_micros: [1, 2\n")
    code, _, err = await cli(a, "apply", "-f", str(bad))
    assert code == 2 and f"{bad}:4:1: invalid YAML" in err

    bad.write_text(
        "applications:\n"
        "  - name: x\n    input_type: doubles\n    default_output: '-1'\n    slo_micros: 10\n"
        "  - name: y\n    input_type: doubles\n    default_output: '-1'\n    slo_micros: -5\n"
        "    models: [nobody]\n"
    )
    code, _, err = await cli(a, "apply", "-f", str(bad))
    assert code == 2 and f"{bad}:9: applications[1].slo_micros: expected a positive" in err
    bad.write_text(bad.read_text().replace("-5", "5"))
    code, _, err = await cli(a, "apply", "-f", str(bad))
    assert code == 2 and f"{bad}:10: applications[1].models[0]: no model 'nobody'" in err
    assert not a.registry.apps  # x was valid, but nothing is done while anything is wrong

    code, _, err = await cli(a, "apply", "-f", str(tmp_path / "missing.yaml"))
    assert code == 2 and "no such file" in err

    await a.register_application("extra", "doubles", "-1", 1000)
    good = tmp_path / "good.json"
    good.write_text(
        '{"applications": [{"name": "x", "input_type": "doubles", "default_output": "-1",'
        ' "slo_micros": 10}]}'
    )
    code, out, _ = await cli(a, "apply", "-f", str(good))
    assert code == 0 and "--prune deletes them): application extra" in out
    assert set(a.registry.apps) == {"x", "extra"}
    code, out, _ = await cli(a, "apply", "-f", str(good), "--prune", "--dry-run")
    assert "- application extra" in out and "extra" in a.registry.apps
    code, out, _ = await cli(a, "apply", "-f", str(good), "--prune", "--json")
    assert code == 0 and orjson.loads(out)["applied"] is True
    assert set(a.registry.apps) == {"x"}


def _ctrl_c_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_logs_status_and_a_killed_replica(tmp_path: Path) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "s") as c:
        await c.register_application("sums", "doubles", "-1", 1_000_000)
        await c.deploy_model("summer", "1", models.row_sums, input_type="doubles", num_replicas=2)
        await c.link_model_to_app("sums", "summer")
        client = Client(c.admin_url, c.query_url)
        for _ in range(5):
            await asyncio.to_thread(client.predict, "sums", [1.0])

        code, out, _ = await cli(c, "logs", "summer")
        assert code == 0 and "[replica 0]" in out and "[replica 1]" in out
        code, out, _ = await cli(c, "logs", "summer:1", "--replica", "1")
        assert code == 0 and "summer:1" in out and "[replica" not in out
        code, _, err = await cli(c, "logs", "nope")
        assert code == 1 and err.strip() == "clipper: no model named 'nope' (models: summer)"
        code, _, err = await cli(c, "logs", "summer", "--replica", "7")
        assert code == 1 and "has no replica 7 (its replicas: 0, 1)" in err

        code, out, _ = await cli(c, "status", "--json")
        status = orjson.loads(out)
        (app,) = status["applications"]
        assert app["qps"] is not None and app["qps"] > 0 and app["p50_ms"] is not None
        assert app["error_fraction"] == 0.0
        replicas = status["replicas"]
        assert [(r["replica"], r["state"]) for r in replicas] == [(0, "ready"), (1, "ready")]
        assert {r["log"] for r in replicas} == {p.name for p in (tmp_path / "s" / "logs").iterdir()}

        victim = replicas[0]["pid"]
        os.kill(victim, signal.SIGKILL)

        async def restarted() -> bool:
            _, out, _ = await cli(c, "status", "--json")
            r0 = orjson.loads(out)["replicas"][0]
            return bool(r0["restarts"] == 1 and r0["state"] == "ready" and r0["pid"] != victim)

        await wait_for(restarted, limit_s=60, interval=0.2, what="replica 0 restarted and ready")
        code, out, _ = await cli(c, "status")
        assert code == 0 and "summer-1-0.log" in out and "ready" in out

        # -f prints what comes, and Ctrl-C ends it quietly. A test run started in the
        # background of a shell has SIGINT ignored, which its children inherit (Python then
        # installs no handler): the child gets Ctrl-C's default back, as in a terminal.
        follow = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clipper", "logs", "summer", "-f", "--replica", "0",
            env=_env(c), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            preexec_fn=_ctrl_c_default,  # signal() only: safe between fork and exec
        )  # fmt: skip
        assert follow.stdout is not None
        first = await asyncio.wait_for(follow.stdout.readline(), 30)
        assert first
        follow.send_signal(signal.SIGINT)
        _, ferr = await asyncio.wait_for(follow.communicate(), 30)
        assert follow.returncode == 0 and b"Traceback" not in ferr, ferr.decode()


async def test_stop_refuses_to_signal_a_program_that_embeds_a_frontend(tmp_path: Path) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path) as c:
        code, _, err = await cli(c, "stop", "--state-dir", str(tmp_path))
        assert code == 1, err
        assert f"(pid {os.getpid()}" in err and "runs embedded in another program" in err
        assert c.registry is not None  # this test process was not signalled


async def test_stop_ends_the_frontend_of_a_state_directory(tmp_path: Path) -> None:
    fe = FrontendProcess(tmp_path / "state")
    try:
        await fe.start()
        code, out, _ = await cli(fe, "stop", "--state-dir", str(fe.state_dir))
        assert code == 0 and out.startswith(f"stopped the frontend on {fe.state_dir} (pid {fe.pid}")
        assert f"admin port {fe.ports.admin}" in out
        assert fe.proc is not None and fe.proc.poll() is not None  # exited, not only signalled
        code, out, _ = await cli(fe, "stop", "--state-dir", str(fe.state_dir))
        nothing = f"no frontend is running on {fe.state_dir}: nothing to stop"
        assert code == 0 and out.strip() == nothing
        code, out, _ = await cli(fe, "stop", "--state-dir", str(tmp_path / "never"))
        assert code == 0 and "nothing to stop" in out
    finally:
        fe.cleanup()


async def test_a_model_failing_every_query_is_not_ready_where_operators_look(
    tmp_path: Path,
) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "s") as c:
        await c.register_application("broken", "doubles", "-1", 1_000_000, cache=False)
        await c.deploy_model("chatty", "1", models.chatty_failure, input_type="doubles")
        await c.link_model_to_app("broken", "chatty")
        await c.register_application("sums", "doubles", "-1", 1_000_000)
        await c.deploy_model("summer", "1", models.row_sums, input_type="doubles")
        await c.link_model_to_app("sums", "summer")
        assert (await request(f"{c.query_url}/ready")).status == 200  # connected: ready so far
        for i in range(MIN_ANSWERED):
            doc = await predict_ok(c.query_url, "broken", {"input": [float(i)]})
            assert doc["default"] is True
            ok = await predict_ok(c.query_url, "sums", {"input": [float(i)]})
            assert ok["default"] is False

        ready = await request(f"{c.query_url}/ready")
        assert ready.status == 503
        body = orjson.loads(ready.body)
        [why] = body["reasons"]
        assert why.startswith(f"application 'broken': model 'chatty:1' answered {MIN_ANSWERED} ")
        assert "(100% in the last 60 s" in why and "cannot take a batch of 1" in why
        [failing] = body["failing_models"]
        assert (failing["model"], failing["error_fraction"]) == ("chatty", 1.0)
        assert (await request(f"{c.query_url}/broken/ready")).status == 503
        v2 = await request(f"{c.query_url}/v2/models/broken/ready")  # V2's "not ready": 400
        assert v2.status == 400 and orjson.loads(v2.body)["reasons"] == [why]
        # The healthy application on the same frontend stays ready.
        assert (await request(f"{c.query_url}/sums/ready")).status == 200

        code, out, _ = await cli(c, "status", "--json")
        status = orjson.loads(out)
        apps = {a["name"]: a for a in status["applications"]}
        assert apps["broken"]["ready"] is False and apps["sums"]["ready"] is True
        assert apps["broken"]["error_fraction"] == 1.0 and apps["broken"]["default_fraction"] == 1.0
        by_model = {m["model_name"]: m for m in status["models"]}
        assert by_model["chatty"]["failing"] is True and by_model["chatty"]["error_fraction"] == 1.0
        assert by_model["summer"]["error_fraction"] == 0.0
        code, out, _ = await cli(c, "status")
        assert code == 0
        lines = out.splitlines()
        [broken_row] = [line for line in lines if line.startswith("broken ")]
        assert broken_row.split()[4:5] == ["no"]  # READY
        assert "100.0%" in broken_row
        [chatty_row] = [line for line in lines if line.startswith("chatty ") and "%" in line]
        assert chatty_row.split()[-2:] == ["100.0%", "100.0%"]  # ERRORS, DEFAULTS
        assert "not ready:" in lines
        assert any("model 'chatty:1' answered" in line for line in lines)

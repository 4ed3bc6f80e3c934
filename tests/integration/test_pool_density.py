"""Many models per process (docs/density.md) with a real frontend and a real pool process.

One pool process with a budget that holds two of three 8 MB models: each of the three answers
in turn (loaded on its first query, held while it loads); the third load evicts the least
recently used one, which the status then shows unloaded, and a query for it loads it again;
no process is started per model. A query with an SLO shorter than a load, for an unloaded
model, gets the default with reason ``loading``; a model over the whole budget is refused at
deploy with the reason. The same through ``clipper start --pool-processes`` (a frontend
process) and the client; ``clipper model deploy --pooled``; a pool process killed is restarted
and its model loads again; ``pooled`` without pool processes is refused.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from clipper.errors import ClipperError
from clipper.server import Clipper
from tests.integration import models
from tests.integration.frontend_process import FrontendProcess, container_pids
from tests.integration.helpers import predict_ok, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SLO_US = 30_000_000  # 30 s: a load fits however busy the machine


async def test_three_models_share_one_pool_process_within_its_budget(tmp_path: Path) -> None:

    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path,
        pool_processes=1, pool_memory_mb=20,
    ) as c:  # fmt: skip
        for i, name in enumerate(("a", "b", "c"), start=1):
            await c.register_application(name, "doubles", "-1", SLO_US)
            await c.deploy_model(
                name, "1", models.Ballast(float(i), 8), input_type="doubles", pooled=True,
                num_replicas=0,
            )  # fmt: skip
            await c.link_model_to_app(name, name)
        assert c.registry.models["a"]["1"].num_replicas == 0

        def loaded(name: str) -> bool:
            sched = c.schedulers.get((name, "1"))
            return sched is not None and len(sched.replicas) == 1

        def state(name: str) -> str:
            return str(c.manager.pool_view(name, "1")["state"])  # type: ignore[attr-defined]

        for i, name in enumerate(("a", "b"), start=1):
            doc = await predict_ok(c.query_url, name, {"input": [1.0, 2.0]}, limit_s=40)
            assert doc["default"] is False and doc["output"] == 3.0 * i, doc
        assert loaded("a") and loaded("b") and state("a") == "loaded"
        pool_pids = container_pids(os.getpid())
        assert len(pool_pids) == 1, pool_pids  # one process for every model
        # A child on this machine: the frontend's private Unix socket, no keys (containers.md)
        argv = (await asyncio.to_thread(Path(f"/proc/{pool_pids[0]}/cmdline").read_bytes)).split(
            b"\0"
        )
        assert c.rpc.local_address is not None
        assert argv[argv.index(b"--ipc") + 1] == c.rpc.local_address.removeprefix("ipc://").encode()
        assert b"--rpc-keys" not in argv

        doc = await predict_ok(c.query_url, "c", {"input": [1.0, 2.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 9.0, doc
        # a was used least recently: evicted for c; the version counts at zero replicas
        await wait_for(lambda: not loaded("a") and state("a") == "unloaded", limit_s=20,
                       what="a evicted")  # fmt: skip
        await wait_for(lambda: c.registry.models["a"]["1"].num_replicas == 0, limit_s=20,
                       what="a counted at zero replicas")  # fmt: skip
        assert loaded("b") and loaded("c")
        last = c.autoscaler.last_decision("a", "1")
        assert last is not None and last.decision.reason == "unloaded", last
        [pool] = c.manager.pool.describe()  # type: ignore[attr-defined]
        assert pool["models"] == 2 and pool["evictions"] == 1 and pool["loads"] == 3, pool
        assert pool["used_bytes"] <= pool["budget_bytes"], pool

        # a again: reloaded (b, now least recently used, makes room)
        doc = await predict_ok(c.query_url, "a", {"input": [5.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 5.0, doc
        await wait_for(lambda: not loaded("b"), limit_s=20, what="b evicted for a")
        assert container_pids(os.getpid()) == pool_pids

        # b is unloaded now: a 5 ms SLO cannot wait for its load
        await c.register_application("quick", "doubles", "-1", 5_000)
        await c.link_model_to_app("quick", "b")
        doc = await predict_ok(c.query_url, "quick", {"input": [1.0]})
        assert doc["default"] is True, doc
        assert "not loaded in a pool process" in doc["default_explanation"] or (
            "loading into a pool process" in doc["default_explanation"]
        ), doc
        text = c.metrics.registry.get_sample_value(
            "clipper_app_default_outputs_total", {"app": "quick", "reason": "loading"}
        )
        assert text is not None and text >= 1, text

        # a model bigger than the whole budget: refused at deploy, saying why
        await c.register_application("huge", "doubles", "-1", SLO_US)
        with pytest.raises(ClipperError, match="whole memory budget"):
            await c.deploy_model(
                "huge", "1", models.Ballast(1.0, 32), input_type="doubles", pooled=True,
                ready_timeout_s=40,
            )  # fmt: skip
        assert container_pids(os.getpid()) == pool_pids


async def test_pooled_needs_pool_processes(tmp_path: Path) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path) as c:
        with pytest.raises(ClipperError, match="pooled models need the local manager"):
            await c.deploy_model("m", "1", models.row_sums, input_type="doubles", pooled=True)


async def test_the_cli_deploys_a_pooled_model_and_the_admin_view_shows_its_place(
    tmp_path: Path,
) -> None:
    import cloudpickle

    from tests.integration.test_client_cli import clipper_cli

    model_file = tmp_path / "double.pkl"
    model_file.write_bytes(cloudpickle.dumps(lambda xs: [2.0 * float(sum(x)) for x in xs]))
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "state",
        pool_processes=2, pool_memory_mb=64,
    ) as c:  # fmt: skip
        await c.register_application("d", "doubles", "-1", SLO_US)
        code, out, err = await clipper_cli(
            c, "model", "deploy", str(model_file), "--name", "d", "--version", "1",
            "--input-type", "doubles", "--pooled",
        )  # fmt: skip
        assert code == 0, err
        assert "pooled (loaded on demand)" in out
        await c.link_model_to_app("d", "d")
        doc = await predict_ok(c.query_url, "d", {"input": [1.0, 2.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 6.0, doc
        mv = c.registry.models["d"]["1"]
        assert mv.pooled and mv.autoscale is not None and mv.autoscale.min_replicas == 0
        view = c.admin._model_doc(mv)
        assert view["pooled"] is True and view["pool"]["state"] == "loaded", view
        logs = c.manager.log_files("d", "1")
        assert logs is not None
        [log] = logs.values()
        assert log.name.startswith("pool-") and "loaded d:1" in log.read_text()
        assert view["pool"]["pid"] in container_pids(os.getpid())
        # its autoscaling cannot be turned into more than one replica
        code, out, err = await clipper_cli(c, "model", "autoscale", "d", "--max", "3")
        assert code != 0 and "is pooled" in err, (out, err)


async def test_a_pool_process_that_dies_is_restarted_and_its_models_load_again(
    tmp_path: Path,
) -> None:
    import signal

    from tests.integration.helpers import pid_alive

    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path,
        pool_processes=1, pool_memory_mb=64,
    ) as c:  # fmt: skip
        await c.register_application("s", "doubles", "-1", SLO_US)
        await c.deploy_model("s", "1", models.row_sums, input_type="doubles", pooled=True)
        await c.link_model_to_app("s", "s")
        doc = await predict_ok(c.query_url, "s", {"input": [1.0, 2.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 3.0
        [first] = container_pids(os.getpid())
        os.kill(first, signal.SIGKILL)
        await wait_for(lambda: c.registry.models["s"]["1"].num_replicas == 0, limit_s=20,
                       what="its model counted unloaded")  # fmt: skip
        last = c.autoscaler.last_decision("s", "1")
        assert last is not None and last.decision.reason == "unloaded"
        assert "pool process exited" in last.decision.detail
        await wait_for(lambda: len(container_pids(os.getpid())) == 1, limit_s=20,
                       what="the pool process restarted")  # fmt: skip
        assert not pid_alive(first) or first not in container_pids(os.getpid())
        doc = await predict_ok(c.query_url, "s", {"input": [4.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 4.0, doc
        [pool] = c.manager.pool.describe()  # type: ignore[attr-defined]
        assert pool["restarts"] == 1 and pool["models"] == 1, pool


class PooledFrontend(FrontendProcess):
    """``clipper start`` with one pool process of a 20 MB budget."""

    def command(self) -> list[str]:
        return [*super().command(), "--pool-processes", "1", "--pool-memory-mb", "20"]


async def test_a_clipper_start_frontend_serves_three_models_from_one_process(
    tmp_path: Path,
) -> None:
    import asyncio
    import functools

    from clipper.client import Client

    fe = PooledFrontend(tmp_path / "state")
    try:
        await fe.start()
        client = Client(fe.admin_url, f"http://127.0.0.1:{fe.ports.query}")
        for i, name in enumerate(("a", "b", "c"), start=1):
            await asyncio.to_thread(client.register_application, name, "doubles", "-1", SLO_US)
            await asyncio.to_thread(
                functools.partial(
                    client.deploy_model, name, "1", models.Ballast(float(i), 8),
                    input_type="doubles", num_replicas=0, pooled=True,
                )
            )  # fmt: skip
            await asyncio.to_thread(client.link_model_to_app, name, name)
        query = f"http://127.0.0.1:{fe.ports.query}"
        for i, name in enumerate(("a", "b", "c"), start=1):
            doc = await predict_ok(query, name, {"input": [1.0]}, limit_s=40)
            assert doc["default"] is False and doc["output"] == float(i), doc
        assert len(container_pids(fe.pid)) == 1  # one pool process, no process per model

        async def unloaded_a() -> bool:
            doc = await fe.admin_ok("get_model", {"model_name": "a", "model_version": "1"})
            return bool(doc["pool"]["state"] == "unloaded")

        await wait_for(unloaded_a, limit_s=20, what="a evicted for c")
        doc = await predict_ok(query, "a", {"input": [2.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 2.0, doc
        assert len(container_pids(fe.pid)) == 1
    finally:
        fe.cleanup()

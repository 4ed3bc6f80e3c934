"""Scale to zero with a real frontend and real container processes (local manager, free ports).

A python closure autoscaled with ``min_replicas`` 0 and a short idle window goes to zero
replicas (its container process stops) while ``/ready`` stays 200 and says ``scaled to zero``;
a query then wakes it: it is held while a container starts and is answered by the model. Set
through the CLI, the settings show in ``clipper status``; a query whose SLO is shorter than the
cold start gets the default with reason ``cold_start``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clipper.server import Clipper
from tests.integration import models
from tests.integration.helpers import pid_alive, predict_ok, request, wait_for
from tests.integration.test_client_cli import clipper_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SLO_US = 30_000_000  # 30 s: a container start (a few seconds on a busy machine) fits


async def test_an_idle_version_goes_to_zero_and_a_query_wakes_it(tmp_path: Path) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path) as c:
        await c.register_application("sums", "doubles", "-1", SLO_US)
        await c.deploy_model("sums", "1", models.row_sums, input_type="doubles")
        await c.link_model_to_app("sums", "sums")
        assert (await predict_ok(c.query_url, "sums", {"input": [1.0, 2.0]}))["output"] == 3.0
        [replica] = c.manager.replicas("sums", "1")
        first = replica.pid
        assert first is not None and pid_alive(first)
        code, out, err = await clipper_cli(
            c, "model", "autoscale", "sums", "--min", "0", "--max", "2", "--interval", "0.2",
            "--up-window", "1", "--down-window", "1", "--scale-to-zero-after", "1",
        )  # fmt: skip
        assert code == 0, err
        assert "0 to 2 replicas" in out and "to zero after 1 s without a query" in out

        def sched_replicas() -> int:
            sched = c.schedulers.get(("sums", "1"))
            return len(sched.replicas) if sched is not None else -1

        def count() -> int:
            return c.registry.models["sums"]["1"].num_replicas

        await wait_for(lambda: count() == 0 and sched_replicas() == 0, limit_s=30,
                       what="scaled to zero")  # fmt: skip
        await wait_for(lambda: not pid_alive(first), limit_s=15, what="its process to stop")
        ready = await request(f"{c.query_url}/ready")
        assert ready.status == 200, ready.body
        assert ready.json()["scaled_to_zero"] == ["sums:1 (scaled to zero)"]
        app_ready = await request(f"{c.query_url}/sums/ready")
        assert app_ready.status == 200 and app_ready.json()["scaled_to_zero"] == [
            "sums:1 (scaled to zero)"
        ]
        view = c.autoscaler.view(c.registry.models["sums"]["1"])
        assert view is not None and view["state"] == "scaled to zero"
        last = c.autoscaler.last_decision("sums", "1")
        assert last is not None and last.decision.reason == "idle"
        code, out, err = await clipper_cli(c, "status")
        assert code == 0, err
        assert "scaled to zero" in out.split("autoscaling:\n", 1)[1]

        # the wake: one query, held while a container starts, answered by the model
        doc = await predict_ok(c.query_url, "sums", {"input": [2.0, 5.0]}, limit_s=40)
        assert doc["default"] is False and doc["output"] == 7.0, doc
        last = c.autoscaler.last_decision("sums", "1")
        assert last is not None and last.decision.reason == "cold_start"
        assert count() == 1 and sched_replicas() == 1
        ready = await request(f"{c.query_url}/ready")
        assert ready.status == 200 and "scaled_to_zero" not in ready.json()

        # back to zero; then a query whose SLO a container start cannot fit
        await wait_for(lambda: count() == 0 and sched_replicas() == 0, limit_s=30,
                       what="scaled to zero again")  # fmt: skip
        await c.register_application("quick", "doubles", "-1", 5_000)  # 5 ms
        await c.link_model_to_app("quick", "sums")
        doc = await predict_ok(c.query_url, "quick", {"input": [1.0]})
        assert (
            doc["default"] is True and "starting from zero replicas" in doc["default_explanation"]
        ), doc
        # it woke the version all the same: the next patient query gets the model's answer
        await wait_for(lambda: sched_replicas() == 1, limit_s=40, what="the woken replica")
        doc = await predict_ok(c.query_url, "sums", {"input": [4.0]})
        assert doc["default"] is False and doc["output"] == 4.0

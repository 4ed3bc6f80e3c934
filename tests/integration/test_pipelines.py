"""Pipelines through a real frontend and real containers: a three-stage answer end to end, a
slow optional stage dropped, a slow stage with a default listed under ``degraded``, a slow
required stage answering the application's default with the reason (the stage after it never
called), per-stage metrics, descriptions refused with 400 and nothing changed, the client, the
CLI's description file, and a pipeline surviving a restart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio

from clipper import Clipper
from clipper.client import Client
from clipper.errors import RegistryError
from tests.integration.helpers import post_json, predict_ok, request, wait_for
from tests.integration.pipeline_models import StageModel
from tests.integration.redis_server import REDIS_SERVER, start_redis, stop_redis
from tests.integration.test_client_cli import clipper_cli

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SLO_US = 600_000  # the slow stages sleep far past it; the fast ones fit on a loaded machine
SLOW_S = 1.5


def full(name: str = "post", post_input: Any = None) -> dict[str, Any]:
    return {
        "stages": [
            {"name": "feat", "model": "feat", "fields": ["vec", "n"]},
            {"name": "score", "model": "score", "input": "$feat.vec"},
            {"name": "post", "model": name,
             "input": post_input or {"name": "$request.name", "score": "$score"}},
        ]
    }  # fmt: skip


def with_slow(slow: str, **how: Any) -> dict[str, Any]:
    return {
        "stages": [
            {"name": "feat", "model": "feat"},
            {"name": "slow", "model": slow, "input": "$feat.vec", **how},
            {"name": "post", "model": "post", "input": {"name": "$request.name", "score": "$slow"}},
        ]
    }


class Frontend:
    def __init__(self, c: Clipper, calls: Path) -> None:
        self.c = c
        self.calls = calls

    def count(self, model: str) -> int:
        path = self.calls / model
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fe(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Frontend]:
    calls = tmp_path_factory.mktemp("calls")
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        stages = {
            "feat": StageModel("feat"),
            "score": StageModel("score"),
            "score-too": StageModel("score"),
            "post": StageModel("post"),
            "counted-post": StageModel("post", calls=str(calls / "counted-post")),
            # one slow model per test: a version's learned latency would shed the next query
            "slow-a": StageModel("score", sleep_s=SLOW_S),
            "slow-b": StageModel("score", sleep_s=SLOW_S),
            "slow-c": StageModel("score", calls=str(calls / "slow-c"), sleep_s=SLOW_S),
        }
        types = {"feat": "json", "post": "json", "counted-post": "json"}
        await asyncio.gather(
            *(
                c.deploy_model(name, "1", model, input_type=types.get(name, "doubles"))
                for name, model in stages.items()
            )
        )
        yield Frontend(c, calls)


async def test_three_stages_answer_end_to_end(fe: Frontend) -> None:
    c = fe.c
    resp = await post_json(
        f"{c.admin_url}/admin/add_app",
        {"name": "chain", "input_type": "json", "default_output": '"none"',
         "latency_slo_micros": SLO_US, "pipeline": full()},
    )  # fmt: skip
    assert resp.status == 200, resp.body
    doc = await predict_ok(c.query_url, "chain", {"input": {"x": [1, 2, 3.5], "name": "ann"}})
    assert doc["output"] == "ann:13.0" and doc["default"] is False
    assert "degraded" not in doc and "dropped" not in doc
    batch = await predict_ok(
        c.query_url, "chain", {"input_batch": [{"x": [1], "name": "a"}, {"x": [2], "name": "b"}]}
    )
    assert [p["output"] for p in batch["batch_predictions"]] == ["a:2.0", "b:4.0"]
    resp = await post_json(f"{c.query_url}/chain/update", {"input": {"x": [1]}, "label": 1})
    assert resp.status == 400 and b"no linked model" in resp.body  # feedback goes to a stage
    got = (await post_json(f"{c.admin_url}/admin/get_application", {"name": "chain"})).json()
    assert got["pipeline"] == full() and got["linked_models"] == []
    metrics = await metrics_text(c)
    assert (
        'clipper_pipeline_stage_outcomes_total{app="chain",outcome="answered",stage="score"} 3.0'
        in metrics
    )
    assert 'clipper_pipeline_stage_latency_seconds_count{app="chain",stage="post"} 3.0' in metrics


async def test_a_stage_can_be_an_application_with_a_selection_policy(fe: Frontend) -> None:
    c = fe.c
    await c.register_application("vote", "doubles", "-1", SLO_US, policy="exp4")
    await c.link_model_to_app("vote", "score")
    await c.link_model_to_app("vote", "score-too")
    spec = full()
    spec["stages"][1] = {"name": "score", "app": "vote", "input": "$feat.vec"}
    await c.register_application("voted", "json", "null", SLO_US, pipeline=spec)
    doc = await predict_ok(c.query_url, "voted", {"input": {"x": [1, 2], "name": "v"}})
    assert doc["output"] == "v:6.0" and doc["default"] is False, doc
    # the stage ran the application's own query path
    metrics = await metrics_text(c)
    assert 'clipper_app_requests_total{app="vote"} 1.0' in metrics


async def metrics_text(c: Clipper) -> str:
    resp = await request(f"{c.query_url}/metrics")
    assert resp.status == 200
    return resp.body.decode()


async def test_a_slow_optional_stage_is_dropped(fe: Frontend) -> None:
    c = fe.c
    await c.register_application(
        "drops", "json", '"none"', SLO_US, pipeline=with_slow("slow-a", optional=True)
    )
    doc = await predict_ok(c.query_url, "drops", {"input": {"x": [1], "name": "d"}})
    # the dropped stage's key is left out of post's input
    assert doc["output"] == "d:None" and doc["default"] is False, doc
    assert doc["dropped"] == ["slow"] and "degraded" not in doc
    metrics = await metrics_text(c)
    assert 'clipper_pipeline_stage_budget_misses_total{app="drops",stage="slow"} 1.0' in metrics
    assert (
        'clipper_pipeline_stage_outcomes_total{app="drops",outcome="dropped",stage="slow"} 1.0'
        in metrics
    )


async def test_a_slow_stage_with_a_default_is_listed_under_degraded(fe: Frontend) -> None:
    c = fe.c
    await c.register_application(
        "degrades", "json", '"none"', SLO_US, pipeline=with_slow("slow-b", default=-1)
    )
    doc = await predict_ok(c.query_url, "degrades", {"input": {"x": [1], "name": "g"}})
    assert doc["output"] == "g:-1" and doc["default"] is False and doc["degraded"] == ["slow"], doc


async def test_a_slow_required_stage_answers_the_app_default_and_nothing_runs_after_it(
    fe: Frontend,
) -> None:
    c = fe.c
    spec = with_slow("slow-c")
    spec["stages"][2]["model"] = "counted-post"
    await c.register_application("fails", "json", '{"label": "fallback"}', SLO_US, pipeline=spec)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    doc = await predict_ok(c.query_url, "fails", {"input": {"x": [1], "name": "f"}})
    assert loop.time() - t0 < SLO_US / 1e6 + 0.5  # at its deadline, not after the slow stage
    assert doc["default"] is True and doc["output"] == {"label": "fallback"}
    assert doc["default_explanation"].startswith(
        "Pipeline stage 'slow' (model 'slow-c') did not answer within its budget of"
    )
    # the slow stage finishes later; its answer goes nowhere, and post is never called
    await wait_for(lambda: fe.count("slow-c") == 1, limit_s=10, what="the slow stage to finish")
    await wait_for(
        lambda: _has(c, 'clipper_replica_batch_latency_seconds_count{model="slow-c"'),
        limit_s=10, what="its late answer to reach the frontend",
    )  # fmt: skip
    assert fe.count("counted-post") == 0
    metrics = await metrics_text(c)
    assert (
        'clipper_pipeline_stage_outcomes_total{app="fails",outcome="failed",stage="slow"} 1.0'
        in metrics
    )
    assert (
        'clipper_pipeline_stage_outcomes_total{app="fails",outcome="skipped",stage="post"} 1.0'
        in metrics
    )
    assert 'clipper_app_default_outputs_total{app="fails",reason="slo"} 1.0' in metrics
    # the stage after it works: the same pipeline with the fast scorer calls it
    spec["stages"][1]["model"] = "score"
    await c.set_pipeline("fails", spec)
    doc = await predict_ok(c.query_url, "fails", {"input": {"x": [1], "name": "f"}})
    assert doc["output"] == "f:2.0", doc
    assert fe.count("counted-post") == 1


async def _has(c: Clipper, needle: str) -> bool:
    return needle in await metrics_text(c)


BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"stages": [{"name": "a", "model": "feat", "input": "$b"},
                    {"name": "b", "model": "score", "input": "$a"}]},
        "stages form a cycle: a -> b -> a",
    ),
    ({"stages": [{"name": "a", "model": "nope"}]}, "names model 'nope', which does not exist"),
    ({"stages": [{"name": "a", "model": "feat", "input": "$zz"}]}, "there is no stage 'zz'"),
    (full(post_input={"s": "$feat.label"}), "declares only the fields ['vec', 'n']"),
    (
        {"stages": [{"name": "a", "model": "feat", "budget": 0.6},
                    {"name": "b", "model": "score", "input": "$a.vec", "budget": 0.5}]},
        "budgets do not add up: the static shares on the path a -> b sum to 1.1",
    ),
    (
        {"stages": [{"name": "a", "model": "feat"}, {"name": "a", "model": "score"}]},
        "duplicate stage name 'a'",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "problem"), BAD, ids=[p[:24] for _, p in BAD])
async def test_bad_descriptions_are_refused_and_change_nothing(
    fe: Frontend, spec: dict[str, Any], problem: str
) -> None:
    c = fe.c
    if "bad-base" not in c.registry.apps:
        await c.register_application("bad-base", "json", '"none"', SLO_US, pipeline=full())
    before = c.registry.records()
    stored = await c.store.load()
    resp = await post_json(
        f"{c.admin_url}/admin/update_app", {"name": "bad-base", "pipeline": spec}
    )
    assert resp.status == 400 and problem in resp.body.decode(), resp.body
    resp = await post_json(
        f"{c.admin_url}/admin/add_app",
        {"name": "bad-new", "input_type": "json", "default_output": "null",
         "latency_slo_micros": SLO_US, "pipeline": spec},
    )  # fmt: skip
    assert resp.status == 400 and problem in resp.body.decode(), resp.body
    assert c.registry.records() == before and await c.store.load() == stored
    doc = await predict_ok(c.query_url, "bad-base", {"input": {"x": [1], "name": "b"}})
    assert doc["output"] == "b:2.0"


async def test_the_client_and_the_cli_describe_pipelines(fe: Frontend, tmp_path: Path) -> None:
    c = fe.c
    client = Client(c.admin_url, c.query_url)
    await asyncio.to_thread(
        client.register_application, "by-client", "json", "null", SLO_US, pipeline=full()
    )
    doc = await asyncio.to_thread(client.predict, "by-client", {"x": [2], "name": "k"})
    assert doc["output"] == "k:4.0"
    with pytest.raises(RegistryError, match="duplicate stage name"):
        await asyncio.to_thread(client.set_pipeline, "by-client", BAD[-1][0])
    description = tmp_path / "pipeline.json"
    description.write_bytes(
        orjson.dumps({"input_type": "json", "latency_slo_micros": SLO_US,
                      "default_output": "none", **full()})
    )  # fmt: skip
    code, out, err = await clipper_cli(c, "app", "pipeline", "by-cli", "-f", str(description))
    assert code == 0 and "registered pipeline application by-cli (3 stages)" in out, err
    assert c.registry.apps["by-cli"].default_output == "none"  # text, as the admin API takes it
    doc = await predict_ok(c.query_url, "by-cli", {"input": {"x": [3], "name": "z"}})
    assert doc["output"] == "z:6.0"
    description.write_bytes(orjson.dumps(with_slow("score", default=0)))
    code, out, err = await clipper_cli(c, "app", "pipeline", "by-cli", "-f", str(description))
    assert code == 0 and "updated the pipeline" in out, err
    assert c.registry.apps["by-cli"].pipeline == with_slow("score", default=0)
    description.write_bytes(orjson.dumps(full(name="absent")))
    code, _, err = await clipper_cli(c, "app", "pipeline", "by-cli", "-f", str(description))
    assert code == 1 and "names model 'absent'" in err
    code, _, err = await clipper_cli(c, "app", "pipeline", "by-cli", "--remove")
    assert code == 0, err
    assert c.registry.apps["by-cli"].pipeline is None


async def test_a_pipeline_survives_a_restart(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    kw: dict[str, Any] = {"query_port": 0, "rpc_port": 0, "admin_port": 0}
    async with Clipper(state_dir=tmp_path, store=store, **kw) as c:
        await asyncio.gather(
            c.deploy_model("feat", "1", StageModel("feat"), input_type="json"),
            c.deploy_model("score", "1", StageModel("score"), input_type="doubles"),
            c.deploy_model("post", "1", StageModel("post"), input_type="json"),
        )
        await c.register_application("kept", "json", "null", SLO_US, pipeline=full())
    async with Clipper(state_dir=tmp_path, store=store, **kw) as c:
        assert c.registry.apps["kept"].pipeline == full()
        for model in ("feat", "score", "post"):
            await c.wait_for_replicas(model, "1", 1)
        doc = await predict_ok(c.query_url, "kept", {"input": {"x": [5], "name": "r"}})
        assert doc["output"] == "r:10.0"


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
async def test_a_pipeline_syncs_between_frontends_on_redis(tmp_path: Path) -> None:
    proc, port = start_redis()
    try:
        store = f"redis://127.0.0.1:{port}/0?prefix=p{uuid.uuid4().hex[:8]}"
        kw: dict[str, Any] = {"query_port": 0, "rpc_port": 0, "admin_port": 0, "store": store}
        async with (
            Clipper(state_dir=tmp_path / "a", **kw) as a,
            Clipper(state_dir=tmp_path / "b", **kw) as b,
        ):
            for name, itype in (("feat", "json"), ("score", "doubles"), ("post", "json")):
                resp = await post_json(
                    f"{a.admin_url}/admin/add_model",
                    {"model_name": name, "model_version": "1", "labels": [], "input_type": itype,
                     "container_name": "NO_CONTAINER", "model_data_path": "", "batch_size": -1},
                )  # fmt: skip
                assert resp.status == 200, resp.body
            await a.register_application("synced", "json", "null", SLO_US, pipeline=full())

            def synced() -> bool:
                app = b.registry.apps.get("synced")
                return app is not None and app.stages is not None and app.pipeline == full()

            await wait_for(synced, limit_s=10, what="the pipeline on the other frontend")
            await a.set_pipeline("synced", None)
            await wait_for(
                lambda: b.registry.apps["synced"].stages is None,
                limit_s=10, what="the pipeline's removal on the other frontend",
            )  # fmt: skip
    finally:
        stop_redis(proc)

"""State that outlives a frontend: restart on the same store, two frontends on one Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clipper import Clipper
from tests.integration.helpers import predict_ok, wait_for
from tests.integration.models import row_sums

pytestmark = pytest.mark.integration


async def test_a_restarted_frontend_serves_what_it_served_with_no_manual_step(
    tmp_path: Path,
) -> None:
    settings = {
        "query_port": 0, "rpc_port": 0, "admin_port": 0,
        "state_dir": tmp_path, "store": f"sqlite:///{tmp_path}",
    }  # fmt: skip
    async with Clipper(**settings) as c:  # type: ignore[arg-type]
        await c.register_application("sums", "doubles", "-1", 1_000_000, cache=False)
        await c.deploy_model("summer", "1", row_sums, input_type="doubles", num_replicas=2)
        await c.link_model_to_app("sums", "summer")
        await c.update_application("sums", latency_slo_micros=900_000)
        before = await predict_ok(c.query_url, "sums", {"input": [1.0, 2.0]})
    assert before["output"] == 3.0

    async with Clipper(**settings) as c:  # type: ignore[arg-type]
        assert c.registry.apps["sums"].latency_slo_micros == 900_000
        assert c.registry.links == {"sums": ["summer"]}
        assert c.registry.current == {"summer": "1"}
        await c.wait_for_replicas("summer", "1", 2)  # started again by the restart itself
        after = await predict_ok(c.query_url, "sums", {"input": [1.0, 2.0]})
        assert after == {**after, "output": 3.0, "default": False}


async def test_two_frontends_on_one_redis_see_each_others_changes_within_a_second(
    redis_url: str, tmp_path: Path
) -> None:
    common = {"query_port": 0, "rpc_port": 0, "admin_port": 0, "store": redis_url}
    async with (
        Clipper(state_dir=tmp_path / "a", **common) as a,  # type: ignore[arg-type]
        Clipper(state_dir=tmp_path / "b", **common) as b,  # type: ignore[arg-type]
    ):
        loop = asyncio.get_running_loop()
        await a.register_application("shared", "doubles", "-1", 1_000_000)
        t0 = loop.time()
        await wait_for(lambda: "shared" in b.registry.apps, limit_s=1.0, what="the app on b")
        assert loop.time() - t0 < 1.0
        # a deploys and links; b starts its own replicas of the same artifact and serves it
        await a.deploy_model("summer", "1", row_sums, input_type="doubles")
        await a.link_model_to_app("shared", "summer")
        await wait_for(lambda: b.registry.links.get("shared") == ["summer"], limit_s=1.0)
        await b.wait_for_replicas("summer", "1", 1, ready_timeout_s=30)
        answer = await predict_ok(b.query_url, "shared", {"input": [2.0, 3.0]})
        assert answer == {**answer, "output": 5.0, "default": False}
        # and back: an SLO change made on b reaches a
        await b.update_application("shared", latency_slo_micros=500_000)
        await wait_for(lambda: a.registry.apps["shared"].latency_slo_micros == 500_000, limit_s=1.0)

"""Version switches and rollbacks under load: no failed and no defaulted query."""

from __future__ import annotations

import asyncio
import collections

import pytest

from clipper import Clipper
from tests.integration.helpers import versioned_client, wait_for
from tests.integration.models import version_one, version_two

pytestmark = pytest.mark.integration


async def test_deploy_and_rollback_under_load_lose_nothing() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await c.register_application("v", "doubles", "-1", 1_000_000, cache=False)
        await c.deploy_model("m", "1", version_one, input_type="doubles", num_replicas=2)
        await c.link_model_to_app("v", "m")

        outcomes: collections.Counter[str] = collections.Counter()
        stop = asyncio.Event()

        clients = [
            asyncio.create_task(versioned_client(c.query_url, "v", k, stop=stop, outcomes=outcomes))
            for k in range(8)
        ]
        try:
            await wait_for(lambda: outcomes["v1"] >= 50, what="traffic on version 1")
            # roll forward: v2 starts, takes over once ready, v1 drains and stops
            await c.deploy_model("m", "2", version_two, input_type="doubles", num_replicas=2)
            seen_v2 = outcomes["v2"]
            await wait_for(lambda: outcomes["v2"] >= seen_v2 + 50, what="traffic on version 2")
            await wait_for(
                lambda: (
                    not c.registry.runs(c.registry.models["m"]["1"])
                    and not c.manager.replicas("m", "1")
                ),
                what="version 1 to drain and stop",
            )
            # roll back: v1 starts again, takes over, v2 drains and stops
            await c.set_model_version("m", "1")
            seen_v1 = outcomes["v1"]
            await wait_for(lambda: outcomes["v1"] >= seen_v1 + 50, what="traffic back on v1")
            await wait_for(
                lambda: not c.manager.replicas("m", "2"), what="version 2 to drain and stop"
            )
        finally:
            stop.set()
            await asyncio.gather(*clients)
        failures = {k: n for k, n in outcomes.items() if not k.startswith("v")}
        assert failures == {}, failures
        assert outcomes["v1"] > 100 and outcomes["v2"] > 50
        assert c.registry.current["m"] == "1"
        assert len(c.schedulers[("m", "1")].replicas) == 2

"""Selection routes around a dead model, through a real frontend and containers: an ``exp3`` and
an ``epsilon_greedy`` application over two models keep answering from the live one while the
other's only replica is SIGKILLed and restarted by the local manager; no query gets the
"no replica" default."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Callable

import pytest

from clipper import Clipper
from tests.integration import models
from tests.integration.helpers import predict, request, wait_for

pytestmark = pytest.mark.integration

APPS = ("ex3", "eg")
CLIENTS_PER_APP = 2
WARM_UP = 20  # queries per application with both models up
MAX_QUERIES = 4000  # per application while a is down: bounds the loop if the restart never comes
AFTER_RESTART = 20  # queries per application once the replica is back


async def test_a_killed_model_is_routed_around_while_it_restarts() -> None:
    slo_us = 2_000_000
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await asyncio.gather(
            c.deploy_model("a", "1", models.label_of, input_type="doubles"),
            c.deploy_model("b", "1", models.off_by_one, input_type="doubles"),
        )
        await c.register_application("ex3", "doubles", "-1", slo_us, policy="exp3")
        await c.register_application("eg", "doubles", "-1", slo_us, policy="epsilon_greedy")
        for app in APPS:
            for model in ("a", "b"):
                await c.link_model_to_app(app, model)
        sched = c.schedulers[("a", "1")]
        [proc] = c.manager.replicas("a", "1")
        pid = proc.pid
        assert pid is not None and len(sched.replicas) == 1

        sent = Counter[str]()
        # (phase, app) -> (model that answered, default?) -> count
        answers: dict[tuple[str, str], Counter[tuple[str, bool]]] = {}

        async def client(phase: str, app: str, k: int, more: Callable[[str], bool]) -> None:
            while more(app):
                x = float(sent[app] * CLIENTS_PER_APP + k)  # distinct inputs: no cache hits
                sent[app] += 1
                down = not sched.replicas
                resp = await predict(c.query_url, app, {"input": [x]})
                assert resp.status == 200, resp.body
                doc = resp.json()
                # "down": a had no replica from before the query was sent until its answer; a
                # query that a's reconnection overtook is counted apart.
                name = phase if phase != "down" or (down and not sched.replicas) else "edge"
                got = answers.setdefault((name, app), Counter())
                got[doc["models"][0] if doc["models"] else "", doc["default"]] += 1

        async def phase(name: str, more: Callable[[str], bool]) -> None:
            await asyncio.gather(
                *(client(name, app, k, more) for app in APPS for k in range(CLIENTS_PER_APP))
            )

        def count(name: str, app: str) -> int:
            return sum(answers.get((name, app), Counter()).values())

        await phase("up", lambda app: count("up", app) < WARM_UP)

        # Nothing is in flight when a dies: every query below is chosen while a is down (a
        # query already on a replica when it dies waits for the restart, up to its deadline).
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: not sched.replicas, limit_s=10, what="the replica's removal")
        await phase("down", lambda app: not sched.replicas and count("down", app) < MAX_QUERIES)
        await wait_for(
            lambda: proc.restarts >= 1 and len(sched.replicas) == 1,
            limit_s=30,
            what="the killed replica to be restarted and reconnected",
        )
        assert proc.pid != pid
        await phase("back", lambda app: count("back", app) < AFTER_RESTART)

        resp = await request(f"{c.query_url}/metrics", headers={"Accept": "application/json"})
        assert resp.status == 200
        stats = resp.json()
        for app in APPS:
            key = f'clipper_app_default_outputs_total{{app="{app}",reason="no_replica"}}'
            assert stats.get(key, 0) == 0, (app, answers)
            for (_, of), got in answers.items():
                assert of != app or not any(default for _, default in got), (app, answers)
            # The outage was exercised, and b answered everything in it.
            down = answers["down", app]
            assert down["b", False] >= 5, (app, down)
            assert set(down) == {("b", False)}, (app, down)
        # epsilon-greedy tries the untried model first: a, whenever it is up.
        for name in ("up", "back"):
            assert answers[name, "eg"]["a", False] >= WARM_UP // 2, answers[name, "eg"]
        assert answers["up", "ex3"]["a", False] + answers["back", "ex3"]["a", False] >= 1

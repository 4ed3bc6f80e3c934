"""Files and series stay bounded with real replica processes: a replica that prints and fails
on every batch keeps a size-capped log with one traceback per kind of failure, and deleting
its version removes its logs (after the grace period, 0 here) and its metric series."""

from __future__ import annotations

import pytest

from clipper import Clipper
from tests.integration import models
from tests.integration.helpers import predict, request, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LOG_CAP = 4096


async def test_replica_logs_rotate_and_are_removed_with_their_version() -> None:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, replica_log_bytes=LOG_CAP, deleted_logs_grace_s=0
    ) as c:
        await c.deploy_model("chatty", "1", models.chatty_failure, input_type="doubles")
        await c.register_application("chat", "doubles", "-1.0", 2_000_000)
        await c.link_model_to_app("chat", "chatty")
        for i in range(60):  # distinct inputs: each one is a batch of its own, and fails
            resp = await predict(c.query_url, "chat", {"input": [float(i)]})
            assert resp.status == 200 and resp.json()["default"] is True
        logs = c.state_dir / "logs"
        log = logs / "chatty-1-0.log"

        def both() -> str:
            files = [p for p in (log, log.with_name(log.name + ".1")) if p.exists()]
            return "".join(p.read_text(errors="replace") for p in files)

        # 60 batches x ~230 bytes of output: past the cap, so rotated; each file within it.
        await wait_for(lambda: log.with_name(log.name + ".1").exists(), what="a rotation")
        assert log.stat().st_size <= LOG_CAP
        assert log.with_name(log.name + ".1").stat().st_size <= LOG_CAP
        assert sorted(p.name for p in logs.iterdir()) == ["chatty-1-0.log", "chatty-1-0.log.1"]
        text = both()
        assert "chatty model output" in text
        # One traceback for the kind, not one per batch (none at all may be left after
        # rotation; never more than one).
        assert text.count("Traceback (most recent call last)") <= 1
        metrics = (await request(f"{c.query_url}/metrics")).body.decode()
        assert 'model="chatty"' in metrics
        await c.stop_model("chatty", "1")
        await wait_for(lambda: not any(logs.iterdir()), what="the deleted version's logs to go")
        metrics = (await request(f"{c.query_url}/metrics")).body.decode()
        assert 'model="chatty"' not in metrics

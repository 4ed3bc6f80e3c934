"""A replica whose stop is cancelled half-way (the frontend stopping while a reconcile stops
its version) still ends: its process is out of the manager's groups by then, so nothing else
would stop it."""

from __future__ import annotations

import asyncio

import pytest

from clipper import Clipper
from tests.integration.helpers import pid_alive, wait_for
from tests.integration.models import row_sums

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cancel_after", [0, 1, 3, 10])
async def test_a_cancelled_stop_still_ends_the_process(cancel_after: int) -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        mv = await c.deploy_model("m", "1", row_sums, input_type="doubles")
        (proc,) = c.manager.replicas("m", "1")
        pid = proc.pid
        assert pid is not None and pid_alive(pid)
        stopping = asyncio.create_task(c.manager.ensure(mv, 0))
        for _ in range(cancel_after):  # cancelled while draining, or while terminating
            await asyncio.sleep(0)
        stopping.cancel()
        await asyncio.gather(stopping, return_exceptions=True)
        await c.manager.stop_all()
        await wait_for(lambda: not pid_alive(pid), limit_s=5.0, what="the process to end")

"""Shared fixtures: a frontend driven in process through its routers, and one on real ports.

``inproc_frontend`` yields an :class:`~tests.inprocess.InProcessFrontend`: ``.clipper`` (the
started :class:`~clipper.server.Clipper`), ``.query`` and ``.admin``
(:class:`~tests.inprocess.RouterClient` over the routers of the query and admin ports)::

    async def test_health(inproc_frontend: InProcessFrontend) -> None:
        resp = await inproc_frontend.query.get("/health")
        assert resp.status == 200

For other settings (an admin token, a body limit), use
``async with in_process_frontend(admin_token="t") as fe:`` from :mod:`tests.inprocess`.

``frontend_on_port_0`` yields a started :class:`Clipper` whose ports are real sockets (port 0,
chosen by the OS): for tests that need a client on the wire (``c.query_url``, ``c.admin_url``).
Both are per test and stop the frontend, and every process it started, afterwards. (Not named
``frontend``: several integration modules define a ``frontend`` fixture of their own.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from clipper.server import Clipper
from tests.inprocess import InProcessFrontend, in_process_frontend


@pytest_asyncio.fixture
async def inproc_frontend() -> AsyncIterator[InProcessFrontend]:
    async with in_process_frontend() as fe:
        yield fe


@pytest_asyncio.fixture
async def frontend_on_port_0() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        yield c


@pytest.fixture
def trust_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission prices queues after one measured batch (in service, after a few): for tests
    whose arithmetic follows a single batch."""
    monkeypatch.setattr("clipper.batching.scheduler.TRUSTED_AFTER_BATCHES", 1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests (the longest integration scenarios: shared replicas through an owner's
    death, HAProxy failover, workers, the autoscaler's load trace, the longest SIGKILL rounds)
    run only when selected (``-m slow``, as ``.ci/run`` does), so the README's test command
    stays within about five minutes. Any ``-m`` expression that does not exclude them decides
    for itself (``-m kill`` keeps its slow long rounds)."""
    markexpr = str(config.getoption("markexpr", "") or "")
    if markexpr and "not slow" not in markexpr:
        return
    skip = pytest.mark.skip(reason="a slow integration scenario: run with -m slow (.ci/run does)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)

"""The k8s:// manager's pod listing is refreshed on its clock: every poll interval of a
FakeClock, an API outage included, with the API calls faked (no cluster, no real waits)."""

from __future__ import annotations

import asyncio

import pytest

from clipper.clock import FakeClock
from clipper.managers.kubernetes import KubernetesManager, parse_url


async def turns(n: int = 20) -> None:
    """Let the loop run ``n`` turns (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_the_pod_listing_is_refreshed_every_poll_interval_on_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(start=0.0)
    settings, conn = parse_url("clipper")
    manager = KubernetesManager(
        settings,
        conn,
        rpc_host=lambda: "127.0.0.1",
        rpc_port=lambda: 7000,
        rpc_keys=None,
        heartbeat_interval_s=0.5,
        drain=None,
        poll_s=2.0,
        clock=clock,
    )
    refreshed: list[float] = []

    async def refresh() -> None:
        refreshed.append(clock.now())
        if len(refreshed) == 2:
            raise RuntimeError("the API server is down (test)")

    monkeypatch.setattr(manager, "_refresh", refresh)
    manager._start_poller()
    await turns()
    assert refreshed == [0.0]
    clock.advance(1.5)
    await turns()
    assert refreshed == [0.0]  # not before the interval
    clock.advance(0.5)
    await turns()
    assert refreshed == [0.0, 2.0]  # this one fails: logged, and the polling goes on
    clock.advance(2.0)
    await turns()
    assert refreshed == [0.0, 2.0, 4.0]
    await manager.stop_all()  # no API connection was made: it only stops the poller
    assert clock.pending() == 0  # the cancelled wait disarmed its timer

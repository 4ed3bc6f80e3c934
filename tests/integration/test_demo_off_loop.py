"""``clipper start --demo`` trains its digits model off the event loop: while the fit runs, the
loop keeps turning (queries, replica heartbeats), so no replica is declared silent at start-up."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import clipper.demo
from clipper import Clipper

pytestmark = pytest.mark.integration

FIT_S = 0.6


def zeros(xs: Any) -> list[int]:
    return [0] * len(xs)


async def test_the_demo_fit_runs_on_a_worker_thread_while_the_loop_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    fit_threads: list[int] = []
    turns_during_fit: list[int] = []
    turns = 0

    def slow_fit() -> Any:
        fit_threads.append(threading.get_ident())
        before = turns
        time.sleep(FIT_S)  # a fit holds its thread, as scikit-learn's does
        turns_during_fit.append(turns - before)
        return zeros

    monkeypatch.setattr(clipper.demo, "train_digits", slow_fit)

    async def ticker() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0.01)
            turns += 1

    c = Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=tmp_path / "state")
    await c.start()
    tick = asyncio.create_task(ticker())
    try:
        lines = await clipper.demo.deploy_demo(c)
    finally:
        tick.cancel()
        await c.stop()
    assert fit_threads and fit_threads[0] != loop_thread
    # 0.6 s of fitting: the loop turned on (at 10 ms a turn, far more than a handful).
    assert turns_during_fit[0] >= 10, turns_during_fit
    assert any("digits app" in line for line in lines)

"""The parse pool (bounded, errors handed back, stopped by its owner) and the GIL-free item
scan it runs."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from clipper.frontend.item_scan import batch_items, v2_rows
from clipper.frontend.parse_pool import ParseBusy, ParsePool


async def _until(cond: object, limit: int = 2000) -> None:
    for _ in range(limit):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.001)  # a worker thread's progress: nothing to drive it
    raise AssertionError("condition not reached")


async def test_the_pool_is_bounded_and_hands_back_results_and_errors() -> None:
    pool = ParsePool(threads=1, max_bodies=2)
    pool.start()
    gate = threading.Event()
    got: list[tuple[object, object]] = []

    def wait() -> int:
        gate.wait(5)
        return 7

    def boom() -> None:
        raise ValueError("bad body")

    pool.submit(wait, lambda r, e: got.append((r, e)))
    pool.submit(boom, lambda r, e: got.append((r, e)))
    with pytest.raises(ParseBusy, match="2 request bodies"):
        pool.submit(wait, lambda r, e: got.append((r, e)))
    assert pool.busy == 1 and pool.in_flight == 2
    gate.set()
    await _until(lambda: len(got) == 2)
    assert got[0] == (7, None)
    assert got[1][0] is None and isinstance(got[1][1], ValueError)
    assert pool.in_flight == 0
    await pool.stop()
    with pytest.raises(ParseBusy, match="stopping"):
        pool.submit(wait, lambda r, e: None)


async def test_stop_waits_for_the_body_in_hand() -> None:
    pool = ParsePool(threads=1, max_bodies=2)
    pool.start()
    gate = threading.Event()
    got: list[object] = []
    pool.submit(lambda: gate.wait(5), lambda r, e: got.append(r))
    stopping = asyncio.ensure_future(pool.stop())
    await asyncio.sleep(0)
    assert not stopping.done()
    gate.set()
    await asyncio.wait_for(stopping, 5)
    assert pool.in_flight == 0


def test_the_scan_counts_input_batch_as_a_parse_would() -> None:
    assert batch_items(b'{"input_batch": [[1,2],[3]], "x": [1,2,3,4]}') == 2
    assert batch_items(b'{"input_batch": ["a,]b\\\\", "c\\"]", "d"]}') == 3
    assert batch_items(b'{"input_batch": [ ]}') == 0
    assert batch_items(b'{"input": [1, 2]}') is None
    assert batch_items(b'{"input_b\\u0061tch": [1, 2, 3]}') == 3  # an escaped key counts
    big = orjson.dumps({"input_batch": [[0.5]] * 100_000, "uid": "u"})
    assert batch_items(big) == 100_000
    with pytest.raises(ValueError, match="more than once"):
        batch_items(b'{"input_batch": [1], "input_batch": [2]}')
    for bad in (b'{"input_batch": [1}', b"[1", b"]["):
        with pytest.raises(ValueError, match="brackets"):
            batch_items(bad)


def test_the_scan_reads_v2_batch_dimensions_of_inputs_only() -> None:
    doc = {
        "inputs": [{"name": "x", "shape": [7, 1], "data": [1] * 7}, {"name": "y", "shape": [9]}],
        "outputs": [{"name": "o", "shape": [100]}],
    }
    assert v2_rows(orjson.dumps(doc)) == ("", 9)
    assert v2_rows(b'{"outputs": [{"shape": [5]}]}') is None
    assert v2_rows(b'{"inputs": [{"shape": [[1], 2]}]}') is None

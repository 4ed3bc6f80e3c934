"""How long one request holds the event loop, by item count: sizes ``max_items_per_request``.

Times, in process and synchronously (what the loop is held for), ``orjson.loads`` of the body,
the whole Clipper ``POST /<app>/predict`` (parse, cache look-up and enqueue on a live replica's
queue) and V2 ``infer`` (JSON and binary tensors), for several item counts. Run:

    PYTHONPATH=src python benchmarks/request_size.py
"""

from __future__ import annotations

import asyncio
import statistics
import time
from functools import partial

import numpy as np
import orjson
from benchmarks.models import NoopModel

from clipper.config import BatchingConfig
from clipper.frontend import v2
from clipper.server import Clipper

COUNTS = (100, 1_000, 10_000, 100_000)


class _Sink:
    def answer(self, predictions: object) -> None: ...
    def fail(self, err: object) -> None: ...


def _best_ms(fn: object, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _ignore(*_: object) -> None:
    """A V2 answer nobody reads."""


async def main() -> None:
    cfg = dict(query_port=0, rpc_port=0, admin_port=0, queue_capacity=10**6, cache_bytes=0)
    async with Clipper(**cfg) as c:  # type: ignore[arg-type]
        await c.deploy_model(
            "m", "1", NoopModel(), input_type="doubles", batching=BatchingConfig(max_wait_micros=0)
        )
        await c.register_application("a", "doubles", "-1", 10**7, cache=False)
        await c.link_model_to_app("a", "m")
        proc = c.processor
        print("items  loads_ms  clipper_predict_ms  v2_json_ms  v2_binary_ms")
        for n in COUNTS:
            rows = np.random.default_rng(0).random((n, 4)).tolist()
            body = orjson.dumps({"input_batch": rows})
            loads = _best_ms(partial(orjson.loads, body))
            pred = _best_ms(partial(proc.predict, "a", body, _Sink()))  # type: ignore[arg-type]
            vj = orjson.dumps(
                {"inputs": [{"name": "x", "shape": [n, 4], "datatype": "FP64", "data": rows}]}
            )
            head = orjson.dumps(
                {"inputs": [{"name": "x", "shape": [n, 4], "datatype": "FP64",
                             "parameters": {"binary_data_size": n * 32}}]}
            )  # fmt: skip
            vb = head + np.asarray(rows, "<f8").tobytes()
            hb = {b"inference-header-content-length": str(len(head)).encode()}
            infer = partial(v2.handle, c.services, b"POST", "/v2/models/a/infer")
            vjt = _best_ms(partial(infer, {}, vj, _ignore))
            vbt = _best_ms(partial(infer, hb, vb, _ignore))
            print(f"{n:>6} {loads:9.2f} {pred:19.2f} {vjt:11.2f} {vbt:13.2f}")
            await asyncio.sleep(1.0)  # let the replica drain between sizes


if __name__ == "__main__":
    asyncio.run(main())

"""The query path's own CPU cost per query, in-process: the Clipper REST body parse, the
processor's routing, the runner, the submit seam and a prediction cache hit, the typed answer
and its encoding — no sockets, no replica, no event loop.

    PYTHONPATH=src python benchmarks/query_path_cost.py [--queries 5000] [--repeats 15]

It reports the per-query CPU time (``time.process_time``, so time the process was not
scheduled does not count) as the minimum and the median of the repeats. End-to-end figures on
a shared two-core machine move by tens of percent from run to run; this one moves by a few,
which is what an optimisation of the per-query path needs to be seen (compare two builds by
running this script from each, alternately).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Sequence

from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import PredictionCache
from clipper.clock import FakeClock
from clipper.config import BatchingConfig
from clipper.errors import ReplicaError, RequestError
from clipper.frontend.clipper_rest import PredictParser
from clipper.frontend.routes import encode_predictions
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.query.prediction import Prediction
from clipper.query.runtime import build_query_runtime
from clipper.registry import Application, ModelVersion, Registry
from clipper.rpc.link import Connection
from clipper.runtime.catalog import Catalog, SchedulerTable

BODY = b'{"input": [' + b", ".join(b"%d.5" % i for i in range(64)) + b"]}"


class _Transport:
    def send_batch(self, link: Connection[Replica], itype: InputType, payloads: list[bytes]) -> int:
        return 0


class _Reply:
    __slots__ = ("answered",)

    def __init__(self) -> None:
        self.answered = 0

    def answer(self, predictions: list[Prediction]) -> None:
        encode_predictions(predictions)
        self.answered += 1

    def fail(self, err: RequestError) -> None:
        raise AssertionError(f"the query was refused: {err}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queries", type=int, default=5000, help="queries per repeat")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    clock, registry, metrics = FakeClock(), Registry(), Metrics()
    cache = PredictionCache(1 << 24)
    app = Application("app", InputType.DOUBLES, "-1", 20_000)
    registry.add_app(app)
    mv = ModelVersion(
        "m", "1", InputType.DOUBLES, batching=BatchingConfig(controller="fixed", max_batch_size=8)
    )
    registry.add_model(mv)
    registry.set_model_version("m", "1")
    registry.link("app", "m")
    table = SchedulerTable()
    sched = ModelScheduler(
        mv, slo_s=app.slo_s, cache=cache, clock=clock, transport=_Transport(), metrics=metrics,
        queue_capacity=100,
    )  # fmt: skip
    sched.add_replica(Replica(Connection(b"r", 0, True, 3.0, clock.now())))
    table.put(mv.key, sched)
    query = build_query_runtime(Catalog(registry, table), cache, clock=clock, metrics=metrics)
    parse, predict = PredictParser(1000).parse, query.processor.predict
    payloads, _, _ = parse(app, BODY)
    cache.complete(("m", "1", payloads[0]), 1.0, 8)  # every query below is a cache hit
    reply = _Reply()
    gc.collect()
    gc.freeze()
    costs = []
    for _ in range(args.repeats):
        t = time.process_time()
        for _ in range(args.queries):
            payloads, version, uid = parse(app, BODY)
            predict(app, payloads, version, uid, reply, clock.now())
        costs.append((time.process_time() - t) / args.queries)
    assert reply.answered == args.repeats * args.queries
    print(
        f"per query: min {min(costs) * 1e6:.2f} us, median {statistics.median(costs) * 1e6:.2f} us"
        f" ({args.repeats} repeats of {args.queries})"
    )
    sched.close(ReplicaError("done"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

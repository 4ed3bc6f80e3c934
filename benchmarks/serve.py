"""clipper-serve under a benchmark configuration (one application ``bench``, one model ``m``).

    PYTHONPATH=src python benchmarks/serve.py --query-port 1337 --rpc-port 7000 \\
        --model logreg --controller aimd --max-wait-ms 2 --slo-ms 20

* ``--model noop``: :class:`models.NoopModel` (send 784 doubles);
  ``--model logreg``: LogisticRegression on the digits data set (send 64 doubles);
  ``--model spin``: :class:`models.SpinModel`, 1 ms of CPU per batch + 50 us per input.
* ``--cpus 0``: pin the frontend and its model containers to these CPUs.
* ``--controller aimd|quantile|fixed|unbatched``: the batching controller; ``unbatched`` is
  ``fixed`` with ``max_batch_size=1``; ``fixed`` uses ``--max-batch-size`` (default 32).

Queries go to ``POST http://127.0.0.1:<query-port>/bench/predict``. Prints ``ready`` on stdout
once the model replicas are connected; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models

APP = "bench"
MODEL = "m"
VERSION = "1"


def _make_model(name: str) -> Any:
    models.picklable()  # the container cannot import benchmarks/models.py: pickle by value
    if name == "noop":
        return models.NoopModel()
    if name == "logreg":
        return models.train_logreg()
    if name == "spin":
        return models.SpinModel(0.001, 0.00005)
    raise ValueError(f"unknown model {name!r}")


def _batching(args: argparse.Namespace) -> Any:
    from clipper import BatchingConfig

    wait = round(args.max_wait_ms * 1000)
    if args.controller == "unbatched":
        return BatchingConfig(controller="fixed", max_batch_size=1, max_wait_micros=0, in_flight=1)
    if args.controller == "fixed":
        return BatchingConfig(
            controller="fixed",
            max_batch_size=args.max_batch_size or 32,
            max_wait_micros=wait,
            in_flight=args.in_flight,
            wait=args.wait,
        )
    params = {} if args.backoff_after is None else {"backoff_after": args.backoff_after}
    return BatchingConfig(
        controller=args.controller,
        max_batch_size=args.max_batch_size,
        max_wait_micros=wait,
        in_flight=args.in_flight,
        wait=args.wait,
        params=params if args.controller == "aimd" else {},
    )


async def run(args: argparse.Namespace) -> None:
    from clipper import Clipper

    model = _make_model(args.model)
    async with Clipper(
        query_port=args.query_port,
        rpc_port=args.rpc_port,
        admin_port=0,
        trace_ratio=args.trace_ratio,  # traces only when OTEL_* turn them on (docs/tracing.md)
        rpc_auth=not args.no_rpc_auth,
        rpc_local_socket=not args.rpc_tcp,
        **({} if args.container_nice is None else {"container_nice": args.container_nice}),
    ) as clipper:
        if args.shed_on_wall_lag:  # the "before" of pricing the loop's own backlog only
            clipper.loop_lag._cpu = time.monotonic  # every late millisecond counts as work
        if args.no_shed:  # the "before" of load shedding: never shed for loop lag
            clipper.query.single.loop_lag = None
            clipper.query.split.loop_lag = None
        if args.no_socket_wait:  # the "before" of counting the socket wait in the histogram
            clipper.query.answers.loop_lag = None
        await clipper.register_application(
            APP,
            input_type="doubles",
            default_output="-1",
            latency_slo_micros=round(args.slo_ms * 1000),
            cache=args.cache,
        )
        await clipper.deploy_model(
            MODEL,
            VERSION,
            model,
            input_type="doubles",
            num_replicas=args.replicas,
            batching=_batching(args),
        )
        await clipper.link_model_to_app(APP, MODEL)
        if args.no_extend:  # the "before" of sending a long queue whole
            clipper.catalog.by_key[(MODEL, VERSION)].extend = False
        if args.no_forget:  # the "before" of the latency fit forgetting on a shift
            from clipper.batching import controllers

            controllers.SHIFT_RUN = 1 << 30
        if args.no_burst_pricing:  # the "before" of pricing a burst at its whole batch
            clipper.catalog.by_key[(MODEL, VERSION)].burst_pricing = False
        if args.no_collect:  # the "before" of reading waiting answers at a deadline
            clipper.rpc.collect = lambda: None
        clipper.freeze_heap()  # before "ready": the load starts at once
        print("ready", flush=True)
        if args.trace:
            tracer = asyncio.get_running_loop().create_task(_trace(clipper, args.trace))
        try:
            await clipper.serve_forever()
        finally:
            if args.trace:
                tracer.cancel()


async def _trace(clipper: Any, path: str) -> None:
    """Every 50 ms, one JSON line: the model's admission counters, its estimate, its batch
    cap and queue, and the loop's lag: where the defaults of a run came from."""
    import orjson

    sched = clipper.catalog.by_key[(MODEL, VERSION)]
    mon = clipper.loop_lag
    with open(path, "wb") as f:  # noqa: ASYNC230 (a benchmark's diagnostic, small lines)
        while True:
            r = sched.replicas[0] if sched.replicas else None
            f.write(
                orjson.dumps(
                    {
                        "t": time.monotonic(),
                        "cpu": time.process_time(),
                        **{
                            k: getattr(sched, k)
                            for k in ("offered", "shed", "late", "stalled", "overran", "lag_shed")
                        },
                        "cap_rps": sched._capacity_rps,
                        "batch_ms": sched.batch_latency_s * 1e3,
                        "queue": len(sched.queue),
                        "max_batch": r.controller.max_batch_size() if r and r.controller else 0,
                        "lag_ms": mon.lag_s * 1e3,
                        "backlog_ms": mon.backlog_s * 1e3,
                    }
                )
                + b"\n"
            )
            await asyncio.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--query-port", type=int, default=1337)
    p.add_argument("--rpc-port", type=int, default=7000)
    p.add_argument("--model", choices=["noop", "logreg", "spin"], default="noop")
    p.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 0 or 0,1")
    p.add_argument(
        "--shed-on-wall-lag",
        action="store_true",
        help="shed for all of the loop's lateness, descheduled time included (the old rule)",
    )
    p.add_argument(
        "--controller", choices=["aimd", "quantile", "fixed", "unbatched"], default="aimd"
    )
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="batch wait, 0..4 ms")
    p.add_argument(
        "--wait", choices=["adaptive", "fixed"], default="adaptive", help="batch wait policy"
    )
    p.add_argument("--no-shed", action="store_true", help="no shedding for event-loop lag")
    p.add_argument(
        "--no-socket-wait",
        action="store_true",
        help="the latency histogram leaves out the estimated socket wait",
    )
    p.add_argument("--max-batch-size", type=int, default=None, help="cap (fixed: default 32)")
    p.add_argument("--in-flight", type=int, default=1, help="batches in flight per replica")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--cache", action="store_true", help="enable the prediction cache")
    p.add_argument(
        "--no-rpc-auth", action="store_true",
        help="no CURVE on the replica RPC (its handshake and the encryption of every message)",
    )  # fmt: skip
    p.add_argument(
        "--rpc-tcp", action="store_true",
        help="the model containers dial the TCP port with CURVE, not the private Unix socket",
    )  # fmt: skip
    p.add_argument(
        "--trace-ratio", type=float, default=None, help="trace sampling ratio (with OTEL_*)"
    )
    p.add_argument("--trace", default=None, help="write admission state every 50 ms here")
    p.add_argument("--no-extend", action="store_true", help="batches never past the cap")
    p.add_argument("--no-collect", action="store_true", help="deadlines read no waiting answer")
    p.add_argument(
        "--backoff-after", type=int, default=None, help="aimd: over-target batches in a row"
    )
    p.add_argument(
        "--no-forget", action="store_true", help="the latency fit never forgets on a shift"
    )
    p.add_argument(
        "--no-burst-pricing", action="store_true",
        help="price a burst at the measured capacity, not at the batch its queue forms",
    )  # fmt: skip
    p.add_argument("--container-nice", type=int, default=None, help="container nice (default 0)")
    args = p.parse_args(argv)
    if args.cpus:  # before any container starts: they inherit it
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    uvloop.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

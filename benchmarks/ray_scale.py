"""Throughput and p99 with 1, 2 and 3 replicas spread over the nodes of a Ray cluster on this
machine (the ray:// manager; run it with Ray installed, e.g. in .ci/run's ``.venv-ray``)::

    .venv-ray/bin/python benchmarks/ray_scale.py [--duration 10] [--concurrency 32] [--json]

A 3-node ``ray.cluster_utils`` cluster (one logical CPU per node, in a network namespace of its
own when run as root: ``tests/raycluster.py``) and an embedded frontend with
``--manager ray://...``; every replica asks for one CPU, so replicas land on different nodes.
Two models, each with batches of at most 4 inputs:

* ``sleep``: 10 ms per batch without using the CPU (a model waiting on an accelerator or a
  remote call): replicas add capacity until the frontend is the bottleneck;
* ``cpu``: 10 ms of CPU per batch (numpy): every node is a process on the same cores, so more
  replicas add capacity only while cores are idle.

A closed loop against the query API: ``--concurrency`` keep-alive connections, each with one
query outstanding, every query a different input (the frontend answers identical queries in
flight once, and the cache is off), so every query reaches a replica. The answers that were the
default output (SLO missed) are counted. Reports, it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.raycluster import ray_cluster

from clipper import BatchingConfig, Clipper

BATCH = 4
BATCH_S = 0.010


async def closed_loop(
    host: str, port: int, path: str, concurrency: int, duration_s: float
) -> dict[str, float]:
    """Throughput, p50/p99 (ms) and default answers of a closed loop with distinct inputs."""
    latencies: list[float] = []
    defaults = 0
    end = time.monotonic() + duration_s

    async def connection(k: int) -> None:
        nonlocal defaults
        reader, writer = await asyncio.open_connection(host, port)
        i = 0
        try:
            while time.monotonic() < end:
                body = orjson.dumps({"input": [float(k), float(i)] + [1.0] * 14})
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                t0 = time.monotonic()
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                answer = orjson.loads(await reader.readexactly(length))
                latencies.append(time.monotonic() - t0)
                defaults += bool(answer.get("default"))
                i += 1
        finally:
            writer.close()

    t0 = time.monotonic()
    await asyncio.gather(*(connection(k) for k in range(concurrency)))
    elapsed = time.monotonic() - t0
    lat = sorted(latencies)
    return {
        "throughput_rps": round(len(lat) / elapsed, 1),
        "goodput_rps": round((len(lat) - defaults) / elapsed, 1),  # answered by a model
        "p50_ms": round(lat[len(lat) // 2] * 1e3, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1e3, 2),
        "defaults": defaults,
    }


def sleep_model(xs: Any) -> list[float]:
    import time

    time.sleep(BATCH_S)
    return [float(x.sum()) for x in xs]


def cpu_model(xs: Any) -> list[float]:
    import time

    import numpy as np

    m = np.ones((64, 64))
    end = time.thread_time() + BATCH_S
    while time.thread_time() < end:
        m = m @ m / 64.0
    return [float(x.sum()) for x in xs]


cloudpickle.register_pickle_by_value(sys.modules[__name__])


async def run(args: argparse.Namespace, url: str, state: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with Clipper(
        query_port=0, admin_port=0, rpc_port=0, state_dir=state, manager=url,
        cache_bytes=0,  # wrk sends one body: every query must reach a replica
    ) as c:  # fmt: skip
        for kind, model in (("sleep", sleep_model), ("cpu", cpu_model)):
            app = f"bench-{kind}"
            await c.register_application(app, "doubles", "-1", 100_000)  # 100 ms SLO
            await c.deploy_model(
                kind, "1", model, input_type="doubles", num_replicas=1,
                batching=BatchingConfig(controller="fixed", max_batch_size=BATCH),
            )  # fmt: skip
            await c.link_model_to_app(app, kind)
            for n in (1, 2, 3):
                await c.set_num_replicas(kind, n, "1")
                nodes = {r.location for r in c.manager.all_replicas() if r.model == kind}
                path = f"/{app}/predict"
                await closed_loop("127.0.0.1", c.query_port, path, args.concurrency, 2)  # warm
                res = await closed_loop(
                    "127.0.0.1", c.query_port, path, args.concurrency, args.duration
                )
                rows.append({"model": kind, "replicas": n, "nodes": len(nodes), **res})
                print(rows[-1], flush=True)
            await c.set_num_replicas(kind, 0, "1")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    t0 = time.monotonic()
    with ray_cluster(nodes=3) as cluster:
        url = cluster.manager_url(poll_s="1")
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            rows = asyncio.run(run(args, url, Path(tmp) / "state"))
    if args.json:
        print(orjson.dumps(rows).decode())
    else:
        print("\n| model | replicas | nodes | answers/s | by a model/s | p50 ms | p99 ms |"
              " defaults |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        keys = ("model", "replicas", "nodes", "throughput_rps", "goodput_rps", "p50_ms", "p99_ms",
                "defaults")  # fmt: skip
        for r in rows:
            print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    print(f"({time.monotonic() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

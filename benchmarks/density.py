"""Many models per process: 200 small scikit-learn models on 4 pool processes, a Zipf mix.

    python benchmarks/density.py [--models 200] [--pool-processes 4] [--pool-memory-mb 2]
        [--duration 60] [--zipf 1.1] [--concurrency 8] [--slo-ms 1000] [--compare]
        [--own-only] [--own-starts 0,2]

One in-process frontend (local manager, free ports) started with ``pool_processes`` and
``pool_memory_mb``. Each model is a LogisticRegression trained here on its own random data
(``--features`` inputs, ``--classes`` classes: its weights are what its pool process holds),
packaged and deployed with ``pooled: true`` behind an application of its own (SLO
``--slo-ms``), at zero replicas. Then ``--concurrency`` closed-loop clients (keep-alive HTTP
over loopback, on the frontend's event loop) send for ``--duration`` seconds, each query to a
model drawn from a Zipf distribution (exponent ``--zipf``, rank 1 the most popular), every
input distinct (no cache hit).

Reported: queries, p50/p99 latency (all, and those whose model was loaded when sent or not),
the hit rate (share of queries whose model had a connected replica when the query was sent),
predictions vs defaults by reason, loads and evictions, each pool process's resident memory
(the largest of one sample a second) against its budget. With ``--compare`` the same load runs
again with every version on its own process, autoscaled with ``min_replicas`` 0 (scale to
zero) and the same idle window: processes started, their total resident memory, p99, hit rate;
once for each ``--own-starts`` value, the frontend's ``replica_starts`` (how many replica
processes it starts at once: 0 no limit, by default one per core), so a start storm is seen
with and without the limit. ``--own-only`` runs only those.
Writes results.json under benchmarks/results/. Every process is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from clipper import Clipper
from clipper.deployers import package
from clipper.runtime.processes import containers_with

HERE = Path(__file__).resolve().parent

SCALE_TO_ZERO_AFTER_S = 30.0


def train(i: int, features: int, classes: int) -> Any:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(i)
    X = rng.normal(size=(10 * classes, features))
    y = np.arange(10 * classes) % classes
    return LogisticRegression(max_iter=50).fit(X, y)


class Client:
    """One keep-alive HTTP/1.1 connection to the query port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(ln.split(":", 1)[1]) for ln in lines if ln.lower().startswith("content-length:")
        )
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def zipf_weights(n: int, s: float) -> list[float]:
    w = [1.0 / (rank**s) for rank in range(1, n + 1)]
    total = sum(w)
    return [x / total for x in w]


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def defaults_by_reason(c: Clipper) -> dict[str, float]:
    out: Counter[str] = Counter()
    for family in c.metrics.defaults.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["reason"]] += sample.value
    return dict(out)


def container_rss() -> dict[int, int]:
    """The resident memory of each container process this frontend (our pid) started."""
    out = {}
    for pid in containers_with(b"--parent-pid", str(os.getpid()).encode()):
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                out[pid] = int(f.read().split()[1]) * 4096
        except OSError:
            continue
    return out


async def drive(
    c: Clipper, names: list[str], args: argparse.Namespace, features: int
) -> dict[str, Any]:
    weights = zipf_weights(len(names), args.zipf)
    rng = random.Random(1)
    host, port = "127.0.0.1", c.http.port
    latencies: list[tuple[float, bool]] = []
    answers: Counter[str] = Counter()
    peak_rss: dict[int, int] = {}
    seen_pids: set[int] = set()
    stop_at = time.monotonic() + args.duration
    counter = iter(range(10**9))

    async def client() -> None:
        conn = Client(host, port)
        try:
            while time.monotonic() < stop_at:
                name = rng.choices(names, weights)[0]
                sched = c.schedulers.get((name, "1"))
                hit = sched is not None and bool(sched.replicas)
                row = [0.0] * features
                row[0] = float(next(counter))  # distinct: never a cache hit
                body = orjson.dumps({"input": row})
                t0 = time.perf_counter()
                status, data = await conn.post(f"/{name}/predict", body)
                latencies.append((time.perf_counter() - t0, hit))
                if status != 200:
                    answers[f"http {status}"] += 1
                    continue
                doc = orjson.loads(data)
                answers["default" if doc.get("default") else "prediction"] += 1
        finally:
            conn.close()

    async def sample() -> None:
        while time.monotonic() < stop_at:
            for pid, rss in container_rss().items():
                seen_pids.add(pid)
                peak_rss[pid] = max(peak_rss.get(pid, 0), rss)
            await asyncio.sleep(1.0)

    before = defaults_by_reason(c)
    await asyncio.gather(sample(), *(client() for _ in range(args.concurrency)))
    after = defaults_by_reason(c)
    all_s = [t for t, _ in latencies]
    hits = [t for t, h in latencies if h]
    misses = [t for t, h in latencies if not h]
    return {
        "queries": len(latencies),
        "qps": len(latencies) / args.duration,
        "p50_ms": _ms(pct(all_s, 0.50)),
        "p99_ms": _ms(pct(all_s, 0.99)),
        "p99_loaded_ms": _ms(pct(hits, 0.99)),
        "p99_unloaded_ms": _ms(pct(misses, 0.99)),
        "hit_rate": len(hits) / len(latencies) if latencies else None,
        "answers": dict(answers),
        "defaults_by_reason": {k: after[k] - before.get(k, 0.0) for k in after},
        "container_processes_seen": len(seen_pids),
        "peak_rss_mb_by_process": sorted(round(v / 2**20, 1) for v in peak_rss.values()),
        "peak_rss_mb_total": round(sum(peak_rss.values()) / 2**20, 1),
    }


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1e3, 1)


async def setup(c: Clipper, artifacts: list[Path], args: argparse.Namespace, pooled: bool) -> None:
    for i, artifact in enumerate(artifacts):
        name = f"m{i:03d}"
        await c.register_application(name, "doubles", "-1", int(args.slo_ms * 1000))
        await c.deploy_model(
            name, "1", artifact=str(artifact), input_type="doubles", pooled=pooled,
            num_replicas=0,
        )  # fmt: skip
        if pooled:
            await c.set_autoscale(
                name, min_replicas=0, max_replicas=1, scale_to_zero_after_s=SCALE_TO_ZERO_AFTER_S
            )
        else:
            await c.set_autoscale(
                name, min_replicas=0, max_replicas=1, scale_to_zero_after_s=SCALE_TO_ZERO_AFTER_S,
                up_window_s=SCALE_TO_ZERO_AFTER_S, down_window_s=SCALE_TO_ZERO_AFTER_S,
            )  # fmt: skip
        await c.link_model_to_app(name, name)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"settings": vars(args)}
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        root = Path(tmp)
        t0 = time.monotonic()
        artifacts = [
            package(train(i, args.features, args.classes), root / f"a{i}")
            for i in range(args.models)
        ]
        size = statistics.median(
            sum(f.stat().st_size for f in a.rglob("*") if f.is_file()) for a in artifacts
        )
        print(f"trained and packaged {args.models} models in {time.monotonic() - t0:.1f} s "
              f"(artifact median {size / 1024:.0f} KiB)", flush=True)  # fmt: skip
        results["artifact_median_kib"] = round(size / 1024, 1)
        if not args.own_only:
            await run_pooled(root, artifacts, args, results)
        if args.compare or args.own_only:
            for starts in args.own_starts:
                async with Clipper(
                    query_port=0, rpc_port=0, admin_port=0, state_dir=root / f"state-own{starts}",
                    replica_starts=starts,
                ) as c:  # fmt: skip
                    await setup(c, artifacts, args, pooled=False)
                    names = [f"m{i:03d}" for i in range(args.models)]
                    out = await drive(c, names, args, args.features)
                    out["replica_starts"] = starts
                    results.setdefault("own_process", []).append(out)
                    _print(f"own process, min_replicas 0, replica_starts {starts}", out)
    return results


async def run_pooled(
    root: Path, artifacts: list[Path], args: argparse.Namespace, results: dict[str, Any]
) -> None:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, state_dir=root / "state",
        pool_processes=args.pool_processes, pool_memory_mb=args.pool_memory_mb,
    ) as c:  # fmt: skip
        await setup(c, artifacts, args, pooled=True)
        pool = c.manager.pool  # type: ignore[attr-defined]
        out = await drive(c, [f"m{i:03d}" for i in range(args.models)], args, args.features)
        members = pool.describe()
        out["loads"] = sum(m["loads"] for m in members)
        out["evictions"] = sum(m["evictions"] for m in members)
        out["models_loaded_at_end"] = [m["models"] for m in members]
        out["charged_mb_at_end"] = [round(m["used_bytes"] / 2**20, 2) for m in members]
        out["budget_mb"] = args.pool_memory_mb
        results["pooled"] = out
        _print("pooled", out)


def _print(title: str, out: dict[str, Any]) -> None:
    print(f"--- {title}", flush=True)
    for k, v in out.items():
        print(f"  {k}: {v}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=200)
    p.add_argument("--pool-processes", type=int, default=4)
    p.add_argument("--pool-memory-mb", type=int, default=2)
    p.add_argument("--features", type=int, default=256)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--slo-ms", type=float, default=1000.0)
    p.add_argument("--compare", action="store_true")
    p.add_argument(
        "--own-starts", type=lambda v: [int(x) for x in v.split(",")], default=[0, _cores()],
        help="with --compare: the process-per-version runs' --replica-starts, one run each "
        "(default: 0 = no limit, then one per core)",
    )  # fmt: skip
    p.add_argument("--own-only", action="store_true", help="only the process-per-version runs")
    p.add_argument("--work-dir", default=None, help="where the temporary state goes")
    args = p.parse_args(argv)
    results = asyncio.run(run(args))
    out_dir = HERE / "results" / f"density-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(f"results: {out_dir / 'results.json'}", flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

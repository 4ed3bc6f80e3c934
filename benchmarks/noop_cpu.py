"""Where the no-op path's core goes: CPU per request of the frontend and of its model container,
with the replica link over TCP with CURVE, TCP without it, or the private Unix socket, and with
the container on the frontend's core or on the other one.

    python benchmarks/noop_cpu.py [--rounds 3] [--duration 10] [--size 784]
        [--variants bare,tcp,plain,local,apart]

Each variant is ``serve.py --model noop --cpus 0`` under wrk (64 connections, 2 threads) on
CPU 1, sending ``{"input": [size doubles]}``:

* ``tcp``: the container dials the TCP port, every batch and answer encrypted by ZeroMQ's
  CURVE (``serve.py --rpc-tcp``; the default before the private Unix socket);
* ``plain``: the TCP port without CURVE (``--rpc-tcp --no-rpc-auth``; loopback only);
* ``local``: the default, the container on the frontend's private Unix socket (no CURVE);
* ``apart``: the default, with the container's threads moved to CPU 1 once it is connected
  (the frontend alone on its core; the container beside wrk);
* ``bare``: ``bare_server.py`` (uvloop + httptools + orjson, no model) on CPU 0, the ceiling.

Reported per variant: req/s and its share of the bare server's in the same round (the
frontend/bare ratio of issue 20), p99, and the CPU (user + system, from ``/proc/<pid>/stat``)
the server and its containers spent during the load, per response. The variants alternate within
each round, so drift on a shared machine hits them alike. Loopback only; every server is stopped
by PID.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from report import HERE, Config, Run, free_port, server
from tracing_cost import cpu_s

VARIANTS = {
    "bare": [],
    "tcp": ["--rpc-tcp"],
    "plain": ["--rpc-tcp", "--no-rpc-auth"],
    "local": [],
    "apart": [],
}


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (its model containers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def move_to(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus``."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def one(run: Run, variant: str, body: bytes, duration: float) -> dict[str, float]:
    qp, rp = free_port(), free_port()
    if variant == "bare":
        args = [str(HERE / "bare_server.py"), "--port", str(qp), "--cpus", "0"]
    else:
        args = [
        str(HERE / "serve.py"), "--query-port", str(qp), "--rpc-port", str(rp), "--model",
        "noop", "--controller", "aimd", "--max-wait-ms", "0", "--slo-ms", "20", "--cpus", "0",
            *VARIANTS[variant],
        ]  # fmt: skip
    url = f"http://127.0.0.1:{qp}/bench/predict"
    with server(f"noop_{variant}", args, qp, run) as proc:
        kids = children(proc.pid)
        if variant.startswith("apart"):
            for kid in kids:
                move_to(kid, {1})
        loadgen.closed_loop(url, body, 64, duration_s=2.0, engine="wrk", threads=2)  # warm-up
        before = cpu_s(proc.pid), sum(cpu_s(k) for k in kids)
        res = loadgen.closed_loop(url, body, 64, duration_s=duration, engine="wrk", threads=2)
        after = cpu_s(proc.pid), sum(cpu_s(k) for k in kids)
    n = max(res.requests, 1)
    row = {
        "rps": res.throughput_rps,
        "frontend_us": (after[0] - before[0]) / n * 1e6,
        "containers_us": (after[1] - before[1]) / n * 1e6,
        "p99_ms": res.p99_us / 1e3,
    }
    row["total_us"] = row["frontend_us"] + row["containers_us"]
    run.log(
        f"{variant}: {row['rps']:,.0f} req/s, CPU per request: frontend {row['frontend_us']:.1f}"
        f" us + containers {row['containers_us']:.1f} us = {row['total_us']:.1f} us"
    )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--size", type=int, default=784, help="doubles per input")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        p.error(f"--variants: unknown {', '.join(sorted(unknown))}; expected {', '.join(VARIANTS)}")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs: the frontend on one, the load on the other")
    os.sched_setaffinity(0, {1})  # the load (wrk, a child) on CPU 1
    out_dir = Path(args.out or HERE / "results" / f"noop-cpu-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(out_dir=out_dir, cfg=Config())
    body = loadgen.make_body(args.size)
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            rows[v].append(one(run, v, body, args.duration))
    head = f"{'variant':11} {'req/s (runs) (/ bare)':>52} {'server us':>10} {'containers us':>14}"
    print(f"\n{head} {'total':>7}")
    if "bare" in rows:
        for runs in rows.values():
            for r, b in zip(runs, rows["bare"], strict=True):
                r["ratio"] = r["rps"] / b["rps"]
    for v, runs in rows.items():
        rps = " / ".join(f"{r['rps']:,.0f}" for r in runs)
        if "ratio" in runs[0]:
            rps += " (" + " / ".join(f"{r['ratio']:.2f}" for r in runs) + ")"
        rps += f"; p99 {min(r['p99_ms'] for r in runs):.1f}-{max(r['p99_ms'] for r in runs):.1f} ms"
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"{v:11} {rps:>52} {med['frontend_us']:10.1f} {med['containers_us']:14.1f} "
            f"{med['total_us']:7.1f}"
        )
    (out_dir / "results.json").write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    print(f"\n(CPU per request: medians of {args.rounds} rounds; every run in {out_dir})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The first seconds after a deploy: default outputs per half second of Poisson load.

    python benchmarks/cold_start.py [--starts 3] [--rate 2300] [--duration 6] [--hog]

Each start is a fresh frontend (``serve.py --model spin --cpus 0``: 1 ms of CPU per batch +
50 us per input, SLO 20 ms, cache off), loaded from the moment it says ``ready`` with Poisson
arrivals at ``--rate`` from this process on CPU 1 (every query distinct, connections opened as
the load needs them, as LoadGen's SUT does). It prints, per half second, the queries sent, the
default outputs by their explanation, and the client p99; then the totals per start. With
``--hog`` a busy loop shares CPU 0 with the frontend for the whole run. Loopback only; every
process is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from busy_machine import hog
from report import HERE, Config, Run, free_port, server

BUCKET_S = 0.5
MAX_CONNECTIONS = 512


def _request(port: int, i: int) -> bytes:
    body = orjson.dumps({"input": [i * 1e-6] + [0.5] * 63})  # distinct: no cache hits
    return (
        b"POST /bench/predict HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n%s" % (port, len(body), body)
    )


def _why(body: bytes) -> str | None:
    """The default's explanation, with its figures blanked (None: a prediction)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "unparsable answer"
    if not isinstance(doc, dict) or doc.get("default") is not True:
        return None
    text = str(doc.get("default_explanation", "?"))
    return re.sub(r"[\d.]+", "#", text)[:90]


async def poisson(port: int, rate: float, duration_s: float, seed: int) -> list[Any]:
    """Send at Poisson times; return (sent offset s, latency s, why) per answer."""
    loop = asyncio.get_running_loop()
    rows: list[Any] = []
    idle: list[loadgen.KeepAliveConnection] = []
    waiting: collections.deque[tuple[int, int]] = collections.deque()
    state = {"open": 0, "outstanding": 0}
    t0 = time.perf_counter_ns()
    done = asyncio.Event()
    scheduling = True

    def answered(conn: loadgen.KeepAliveConnection, status: int, body: bytes, s: int) -> None:
        now = time.perf_counter_ns()
        why = _why(body) if status == 200 else f"HTTP {status}"
        rows.append(((s - t0) / 1e9, (now - s) / 1e9, why))
        state["outstanding"] -= 1
        if waiting:
            send(conn, *waiting.popleft())
        elif not conn.closed:
            idle.append(conn)
        if not scheduling and state["outstanding"] == 0:
            done.set()

    def lost(conn: loadgen.KeepAliveConnection) -> None:
        state["open"] -= 1
        if conn in idle:
            idle.remove(conn)
        if conn.busy:
            state["outstanding"] -= 1
            rows.append(((conn.start_ns - t0) / 1e9, 0.0, "connection lost"))

    def send(conn: loadgen.KeepAliveConnection, i: int, sched: int) -> None:
        conn.request = _request(port, i)
        conn.send(sched)

    async def connect() -> None:
        try:
            _, conn = await loop.create_connection(
                lambda: loadgen.KeepAliveConnection(b"", answered, lost), "127.0.0.1", port
            )
        except OSError:
            state["open"] -= 1
            return
        if waiting:
            send(conn, *waiting.popleft())
        else:
            idle.append(conn)

    tasks: set[asyncio.Task[None]] = set()

    def issue(i: int, sched: int) -> None:
        state["outstanding"] += 1
        if idle:
            send(idle.pop(), i, sched)
            return
        waiting.append((i, sched))
        if state["open"] < MAX_CONNECTIONS:
            state["open"] += 1
            t = loop.create_task(connect())
            tasks.add(t)
            t.add_done_callback(tasks.discard)

    rng = random.Random(seed)
    total = int(rate * duration_s)
    next_off = 0.0
    i = 0
    while i < total:
        now = time.perf_counter_ns()
        due = t0 + int(next_off)
        if due > now:
            await asyncio.sleep((due - now) / 1e9)
            continue
        while i < total and t0 + int(next_off) <= now:
            issue(i, t0 + int(next_off))
            i += 1
            next_off += rng.expovariate(1.0) * 1e9 / rate
        await asyncio.sleep(0)
    scheduling = False
    if state["outstanding"]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 5.0)
    return rows


def _p99_ms(lat: list[float]) -> float:
    if not lat:
        return float("nan")
    lat = sorted(lat)
    return lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3


def report(rows: list[Any]) -> dict[str, Any]:
    buckets: dict[int, list[Any]] = collections.defaultdict(list)
    for r in rows:
        buckets[int(r[0] / BUCKET_S)].append(r)
    for b in sorted(buckets):
        got = buckets[b]
        why = collections.Counter(r[2] for r in got if r[2] is not None)
        print(
            f"  {b * BUCKET_S:4.1f}s sent {len(got):5d} defaults {sum(why.values()):4d} "
            f"p99 {_p99_ms([r[1] for r in got]):6.1f} ms  {dict(why.most_common(3))}"
        )
    why = collections.Counter(r[2] for r in rows if r[2] is not None)
    out = {
        "sent": len(rows),
        "defaults": sum(why.values()),
        "p99_ms": _p99_ms([r[1] for r in rows]),
        "first_s_defaults": sum(1 for r in rows if r[2] is not None and r[0] < 1.0),
        "why": dict(why),
    }
    print(
        f"  total sent {out['sent']} defaults {out['defaults']} "
        f"({out['defaults'] / max(out['sent'], 1):.2%}) p99 {out['p99_ms']:.1f} ms"
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--rate", type=float, default=2300.0)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--hog", action="store_true", help="a busy loop on the frontend's CPU")
    p.add_argument("--extra", default="", help="more serve.py arguments, space-separated")
    args = p.parse_args(argv)
    os.sched_setaffinity(0, {1})
    out_dir = HERE / "results" / f"cold-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(out_dir=out_dir, cfg=Config())
    results = []
    for s in range(args.starts):
        qp, rp = free_port(), free_port()
        cmd = [
            str(HERE / "serve.py"), "--query-port", str(qp), "--rpc-port", str(rp),
            "--model", "spin", "--slo-ms", "20", "--cpus", "0", *args.extra.split(),
        ]  # fmt: skip
        with server(f"start{s}", cmd, qp, run):
            if args.hog:
                with hog(0):
                    rows = uvloop.run(poisson(qp, args.rate, args.duration, seed=s))
            else:
                rows = uvloop.run(poisson(qp, args.rate, args.duration, seed=s))
        print(f"start {s}: {args.rate:.0f}/s for {args.duration:g} s")
        results.append(report(rows))
    shares = [r["defaults"] / max(r["sent"], 1) for r in results]
    med = statistics.median(shares)
    print(f"defaults per start: {[f'{x:.2%}' for x in shares]}, median {med:.2%}")
    (out_dir / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

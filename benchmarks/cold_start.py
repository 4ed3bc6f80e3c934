"""The first seconds after a deploy: default outputs per half second of Poisson load.

    python benchmarks/cold_start.py [--starts 3] [--rate 2300] [--duration 6] [--hog]

Each start is a fresh frontend (``serve.py --model spin --cpus 0``: 1 ms of CPU per batch +
50 us per input, SLO 20 ms, cache off), loaded from the moment it says ``ready`` with Poisson
arrivals at ``--rate`` from this process on CPU 1 (every query distinct; MLPerf LoadGen's
Server scenario, ``loadgen.poisson_run``). It prints, per half second, the answers and the
default outputs among them by their explanation; then per start the totals and LoadGen's p99
and verdict. With ``--hog`` a busy loop shares CPU 0 with the frontend for the whole run.
Loopback only; every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from busy_machine import hog
from report import HERE, Config, Run, free_port, server

BUCKET_S = 0.5
SLO_MS = 20.0


def _requests(port: int, n: int = 4096) -> list[bytes]:
    """``n`` distinct predicts (no cache hit even with the cache on)."""
    url = f"http://127.0.0.1:{port}/bench/predict"
    return [
        loadgen.build_request(url, orjson.dumps({"input": [i * 1e-6] + [0.5] * 63}))
        for i in range(n)
    ]


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


def one_start(port: int, rate: float, duration_s: float) -> dict[str, Any]:
    """One LoadGen run from the frontend's first second; the answers by half second."""
    answers: list[tuple[float, str | None]] = []
    t0 = time.perf_counter()

    def is_default(body: bytes) -> bool:  # called for each answer, as it comes
        why = _why(body)
        answers.append((time.perf_counter() - t0, why))
        return why is not None

    got = loadgen.poisson_run(
        ("127.0.0.1", port), _requests(port), rate, duration_s, slo_ms=SLO_MS,
        is_default=is_default,
    )  # fmt: skip
    buckets: dict[int, list[str | None]] = collections.defaultdict(list)
    for at, why in answers:
        buckets[int(at / BUCKET_S)].append(why)
    for b in sorted(buckets):
        whys = collections.Counter(w for w in buckets[b] if w is not None)
        print(
            f"  {b * BUCKET_S:4.1f}s answered {len(buckets[b]):5d} defaults "
            f"{sum(whys.values()):4d}  {dict(whys.most_common(3))}"
        )
    whys = collections.Counter(w for _, w in answers if w is not None)
    out = {
        "answered": got.answered,
        "defaults": got.counts.defaults,
        "errors": got.counts.errors,
        "p99_ms": got.p99_ms,
        "loadgen_valid": got.loadgen_valid,
        "first_s_defaults": sum(1 for at, w in answers if w is not None and at < 1.0),
        "why": dict(whys),
    }
    print(
        f"  answered {out['answered']} defaults {out['defaults']} "
        f"({out['defaults'] / max(out['answered'], 1):.2%}) LoadGen p99 {got.p99_ms:.1f} ms "
        f"{'VALID' if got.loadgen_valid else 'INVALID ' + ', '.join(got.unmet)}"
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
            print(f"start {s}: {args.rate:.0f}/s for {args.duration:g} s")
            with hog({0}) if args.hog else contextlib.nullcontext():
                results.append(one_start(qp, args.rate, args.duration))
    shares = [r["defaults"] / max(r["answered"], 1) for r in results]
    med = statistics.median(shares)
    print(f"defaults per start: {[f'{x:.2%}' for x in shares]}, median {med:.2%}")
    (out_dir / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Two source trees side by side: the benchmarks that guard the query path, run from each tree in
turn, round after round, so that drift on a shared machine hits both alike.

    python benchmarks/trees.py --before /path/to/older/checkout [--rounds 3] [--duration 5]

Each round runs, for each tree (the order alternates between rounds), that tree's own scripts
with that tree's ``src`` on ``PYTHONPATH``:

* ``report.py --only a,b``: the bare uvloop + httptools + orjson server and clipper-serve with a
  no-op model, closed loop (wrk, 64 connections): the frontend/bare throughput ratio;
* ``issue10.py --only c1,sat --rounds 1``: one client in a closed loop on logreg (p50 with the
  default adaptive wait), and wrk at 256 connections with a 20 ms SLO (client p99, goodput,
  share shed, the server histogram over the client's mean).

It prints the median of each figure per tree and the after/before ratio of the medians, and
writes every round's numbers to ``benchmarks/results/trees-<timestamp>/results.json``. The
other tree needs nothing installed beyond this environment's packages (``git worktree add`` of
an older commit serves). Loopback only; the scripts stop every server they start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

Figure = tuple[str, Callable[[dict[str, Any]], float]]

# (name, how to read it from the scripts' results), per script.
REPORT_FIGURES: list[Figure] = [
    ("bare_rps", lambda r: r["results"]["a"]["closed"]["throughput_rps"]),
    ("noop_rps", lambda r: r["results"]["b"]["closed"]["throughput_rps"]),
    (
        "noop_over_bare",
        lambda r: (
            r["results"]["b"]["closed"]["throughput_rps"]
            / r["results"]["a"]["closed"]["throughput_rps"]
        ),
    ),
    ("noop_p50_ms", lambda r: r["results"]["b"]["closed"]["p50_us"] / 1e3),
]
ISSUE10_FIGURES: list[Figure] = [
    ("c1_p50_ms", lambda r: r["c1"]["adaptive1ms"]["p50_ms"]),
    ("c1_p50_wait0_ms", lambda r: r["c1"]["wait0"]["p50_ms"]),
    ("sat_p99_ms", lambda r: r["sat"]["shed"]["p99_ms"]),
    ("sat_goodput_rps", lambda r: r["sat"]["shed"]["goodput"]),
    ("sat_shed_share", lambda r: r["sat"]["shed"]["defaults"]),
    ("sat_hist_over_client", lambda r: r["sat"]["shed"]["server_over_client_mean"]),
]


def _run(tree: Path, script: str, args: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "src")
    cmd = [sys.executable, str(tree / "benchmarks" / script), *args, "--out", str(out)]
    print(f"$ PYTHONPATH={env['PYTHONPATH']} {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, env=env, cwd=tree, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL)
    found = sorted(out.rglob("results.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise RuntimeError(f"{script} in {tree} wrote no results.json under {out}")
    doc: dict[str, Any] = orjson.loads(found[-1].read_bytes())
    return doc


def _read(doc: dict[str, Any], figures: list[Figure]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, read in figures:
        try:
            out[name] = float(read(doc))
        except (KeyError, TypeError, ZeroDivisionError):
            out[name] = float("nan")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="the older checkout")
    p.add_argument("--after", type=Path, default=ROOT, help="the newer one (this checkout)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    args = p.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    out_dir = HERE / "results" / f"trees-{time.strftime('%Y%m%d-%H%M%S')}"
    dur = str(args.duration)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        order = list(trees) if r % 2 == 0 else list(reversed(trees))
        for name in order:
            tree, where = trees[name], out_dir / f"{name}-r{r}"
            report = _run(
                tree, "report.py", ["--only", "a,b", "--duration", dur], where / "report", 600
            )
            issue10 = _run(
                tree,
                "issue10.py",
                ["--only", "c1,sat", "--rounds", "1", "--duration", dur],
                where / "issue10",
                900,
            )
            row = _read(report, REPORT_FIGURES) | _read(issue10, ISSUE10_FIGURES)
            rows[name].append(row)
            print(f"round {r} {name}: " + ", ".join(f"{k}={v:.4g}" for k, v in row.items()))
    names = [n for n, _ in REPORT_FIGURES + ISSUE10_FIGURES]
    medians = {t: {n: statistics.median(x[n] for x in rows[t]) for n in names} for t in trees}
    print(f"\n{'figure':24} {'before':>12} {'after':>12} {'after/before':>13}")
    for n in names:
        b, a = medians["before"][n], medians["after"][n]
        ratio = a / b if b else float("nan")
        print(f"{n:24} {b:12.4g} {a:12.4g} {ratio:13.3f}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_bytes(
        orjson.dumps(
            {"trees": {k: str(v) for k, v in trees.items()}, "rounds": rows, "medians": medians},
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"\nresults in {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The promise on a busy machine: defaults and tails with another program on the frontend's core.

    python benchmarks/busy_machine.py [--rounds 2] [--duration 5] [--rates 0.5,0.7]
        [--saturation 256] [--rules backlog,nocollect,before,...] [--hogs core,machine]
        [--trace]

The frontend and its model container share CPU 0 (``serve.py --cpus 0``); the load runs from
this process, pinned to CPU 1. The model spends 1 ms of CPU per batch + 50 us per input
(``serve.py --model spin``), with a 20 ms SLO and the prediction cache off. Each variant is a
shedding rule crossed with a CPU hog off or on (``--hogs``: ``core``, a busy loop pinned to the
frontend's CPU 0, the default; ``machine``, the same loop free to run on either CPU, as another
program on the machine is placed by the kernel; rows ``hog`` and ``hog-any``):

* ``backlog``: the current settings — the loop's lateness counts only for the CPU it spent on
  its own work (:attr:`clipper.query.loop_lag.LoopLagMonitor.backlog_s`), containers at the
  frontend's priority, AIMD shrinking from the second over-target batch in a row, a queue
  past the cap sent whole when its deadlines allow;
* ``wall``: every millisecond the loop's timer is late counts, descheduled time included (the
  rule before; ``serve.py --shed-on-wall-lag``);
* ``nice5``: containers 5 nicer than the frontend (the default before 2026-12-07);
* ``aimd1``: AIMD shrinking at every over-target batch (the paper's rule, the default before);
* ``noextend``: batches never past the controller's cap (``serve.py --no-extend``);
* ``nocollect``: a deadline answers its default without first reading the replicas' answers
  waiting in the socket (``serve.py --no-collect``);
* ``before``: the last four together (the settings before 2026-12-07);
* ``noburst``: admission prices a burst at the capacity measured at the last batch, not at
  the batch its queue forms (``serve.py --no-burst-pricing``);
* ``noforget``: the latency fit keeps its whole window when batches run off it in a row
  (``serve.py --no-forget``).

For each: a closed loop of 32 connections (wrk): goodput and the share of default outputs by
reason (the server's counters), client p99; then Poisson open loops (MLCommons LoadGen's Server
scenario, ``loadgen.open_loop(poisson=True)``; p99 is LoadGen's) at fractions (``--rates``) of
that closed-loop goodput (the capacity in the same conditions, hog or not): the share of
defaults and client p99; then saturation, a closed loop of ``--saturation`` connections (256 by
default; wrk's own p99). Medians over the rounds; every round's numbers are in the results
file. Loopback only; every server and hog is stopped by PID.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from issue10 import server_latency, server_view
from report import HERE, Config, Run, free_port, server

BODY = orjson.dumps({"input": [0.5] * 64})
SLO_MS = 20.0
RULES = {
    "backlog": [],
    "wall": ["--shed-on-wall-lag"],
    "nice5": ["--container-nice", "5"],
    "aimd1": ["--backoff-after", "1"],
    "before": ["--container-nice", "5", "--backoff-after", "1", "--no-extend", "--no-collect"],
    "noextend": ["--no-extend"],
    "nocollect": ["--no-collect"],
    "noburst": ["--no-burst-pricing"],
    "noforget": ["--no-forget"],
}


@contextlib.contextmanager
def hog(cpus: set[int]) -> Iterator[None]:
    """A busy loop allowed on ``cpus``, stopped by PID."""
    code = f"import os\nos.sched_setaffinity(0, {cpus!r})\nwhile True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def measure(
    url: str, qport: int, *, rate: float | None, duration: float, conns: int = 32
) -> dict[str, Any]:
    before = server_latency(qport)
    if rate is None:
        res = loadgen.closed_loop(
            url, BODY, conns, duration_s=duration, engine="wrk", count_defaults=False
        )
    else:
        # Poisson arrivals by LoadGen, its p99 bound the server's SLO.
        res = loadgen.open_loop(url, BODY, rate, duration_s=duration, poisson=True, slo_ms=SLO_MS)
    sv = server_view(before, server_latency(qport))
    answered = max(sv["count"], 1.0)
    defaults = sum(sv["defaults"].values())
    return {
        "rps": res.throughput_rps,
        "goodput": res.throughput_rps * (1.0 - defaults / answered),
        "defaults_share": defaults / answered,
        "defaults": sv["defaults"],
        "p99_ms": res.p99_us / 1e3,
        "errors": res.errors + res.non_2xx,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rates", default="0.5,0.7", help="open-loop rates, shares of capacity")
    p.add_argument(
        "--saturation", type=int, default=256,
        help="connections of the saturating closed loop, quiet and beside the hog (0: none)",
    )  # fmt: skip
    p.add_argument("--rules", default=",".join(RULES), help="shedding rules to compare")
    p.add_argument(
        "--hogs", default="core",
        help="where the hog runs: core (pinned to the frontend's CPU 0), machine (on any CPU, "
        "placed by the kernel); comma-separated for both",
    )  # fmt: skip
    p.add_argument(
        "--trace", action="store_true",
        help="each server writes its admission state every 50 ms to <rule>.trace.jsonl",
    )  # fmt: skip
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if unknown := set(args.rules.split(",")) - set(RULES):
        p.error(
            f"--rules: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(RULES)}"
        )
    hogs = {"core": ("hog", {0}), "machine": ("hog-any", set(range(os.cpu_count() or 1)))}
    if unknown := set(args.hogs.split(",")) - set(hogs):
        p.error(f"--hogs: unknown {', '.join(sorted(unknown))}; expected core and/or machine")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs: the frontend on one, the load on the other")
    os.sched_setaffinity(0, {1})  # the load (and wrk, a child) on CPU 1
    out_dir = Path(args.out or HERE / "results" / f"busy-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(out_dir=out_dir, cfg=Config())
    shares = [float(x) for x in args.rates.split(",") if x]  # "": closed loops only
    rows: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        urls: dict[str, tuple[str, int]] = {}
        for rule in args.rules.split(","):
            extra = RULES[rule]
            qp, rp = free_port(), free_port()
            cmd = [
                str(HERE / "serve.py"), "--query-port", str(qp), "--rpc-port", str(rp),
                "--model", "spin", "--slo-ms", f"{SLO_MS:g}", "--cpus", "0", *extra,
                *(["--trace", str(out_dir / f"{rule}.trace.jsonl")] if args.trace else []),
            ]  # fmt: skip
            stack.enter_context(server(rule, cmd, qp, run))
            urls[rule] = (f"http://127.0.0.1:{qp}/bench/predict", qp)
        for url, _ in urls.values():  # warm-up
            loadgen.closed_loop(url, BODY, 32, duration_s=1.0, engine="wrk")
        for r in range(args.rounds):
            for rule, (url, qp) in urls.items():

                def one_condition(name: str, url: str = url, qp: int = qp) -> None:
                    """The closed loop (the capacity in this condition), Poisson at shares of
                    it, then saturation."""
                    capacity = measure(url, qp, rate=None, duration=args.duration)
                    rows.setdefault(f"{name}/closed", []).append(capacity)
                    for share in shares:
                        rate = share * capacity["goodput"]
                        got = measure(url, qp, rate=rate, duration=args.duration)
                        rows.setdefault(f"{name}/poisson{share:g}", []).append(got)
                    if args.saturation:
                        sat = measure(
                            url, qp, rate=None, duration=args.duration, conns=args.saturation
                        )
                        rows.setdefault(f"{name}/closed{args.saturation}", []).append(sat)

                one_condition(f"{rule}/quiet")
                for where in args.hogs.split(","):
                    label, cpus = hogs[where]
                    with hog(cpus):
                        one_condition(f"{rule}/{label}")
                run.log(f"round {r} {rule} done")
    print(f"\n{'variant':28} {'goodput/s':>10} {'defaults':>9} {'p99 ms':>8}  reasons")
    summary: dict[str, dict[str, float]] = {}
    for name, runs in rows.items():
        med = {
            k: statistics.median(x[k] for x in runs)
            for k in ("goodput", "defaults_share", "p99_ms")
        }
        summary[name] = med
        reasons: dict[str, float] = {}
        for x in runs:
            for k, v in x["defaults"].items():
                reasons[k] = reasons.get(k, 0.0) + v
        print(
            f"{name:28} {med['goodput']:10.0f} {med['defaults_share']:9.2%} "
            f"{med['p99_ms']:8.1f}  {dict(sorted(reasons.items()))}"
        )
    (out_dir / "results.json").write_bytes(
        orjson.dumps({"summary": summary, "rounds": rows}, option=orjson.OPT_INDENT_2)
    )
    print(f"\nresults in {out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

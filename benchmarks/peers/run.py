"""The side-by-side benchmark: clipper-serve against Triton, MLServer, Ray Serve, BentoML,
LitServe and TorchServe, on the same machine, the same models and the same load.

    python benchmarks/peers/run.py                       # everything, ~30 min
    python benchmarks/peers/run.py --quick               # a smoke run, 2 s per point
    python benchmarks/peers/run.py --systems clipper,triton --workloads noop

One command: it installs every system into its own virtual environment under
``benchmarks/peers/venvs/`` (skipped when already there), then for each workload starts each
system in turn on free loopback ports, warms it up, and measures:

* **closed loop** (wrk, over the system's native REST API): throughput and p50/p99 latency at
  each concurrency of ``--concurrency``;
* **open loop** (``benchmarks/loadgen.py``, native REST): the highest offered rate the system
  sustains with p99 < ``--slo-ms``, >= 95% of it answered, < 1% errors (and, for
  clipper-serve, < 1% default outputs);
* **perf_analyzer** (Triton's tool) over V2 HTTP and gRPC for the systems that speak the
  Open Inference Protocol, at ``--pa-concurrency``.

Throughput is *goodput*: 2xx answers per second that are predictions (clipper-serve's
default outputs do not count). The report (markdown, every number in ``results.json``, one PNG
per workload: throughput vs p99) goes to ``benchmarks/peers/results/<timestamp>/``, which is
not committed. Runs with the project's interpreter; servers run with their venv's.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import harness  # noqa: E402
import loadgen  # noqa: E402
from workloads import WORKLOADS, example_input  # noqa: E402

PA_VENV = harness.VENVS / "perf_analyzer"


# -- perf_analyzer -------------------------------------------------------------------------------
def install_perf_analyzer() -> tuple[Path, dict[str, str]] | None:
    """perf_analyzer from the tritonclient 2.49.0 wheel (see docs/v2-protocol.md), or None."""
    binary = PA_VENV / "bin" / "perf_analyzer"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PA_VENV)], check=True)
        subprocess.run(
            [
                str(PA_VENV / "bin" / "python"),
                *("-m", "pip", "install", "-q", "--no-deps"),
                *("tritonclient==2.49.0", "nvidia-cuda-runtime-cu12"),
            ],
            check=True,
        )
    libs = sorted(PA_VENV.glob("lib/python3*/site-packages/nvidia/*/lib"))
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(map(str, libs)))
    probe = subprocess.run(
        [str(binary), "--version"], env=env, capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        print(f"perf_analyzer unusable ({probe.stderr.strip()[:200]}); needs libb64-0d")
        return None
    return binary, env


def perf_analyzer(  # noqa: PLR0917
    pa: tuple[Path, dict[str, str]],
    model: str,
    url: str,
    protocol: str,
    dim: int,
    requests: int,
    extra: Sequence[str],
    args: Any,
) -> dict[str, Any]:
    """One perf_analyzer run of ``requests`` requests (about ``--duration`` seconds at the
    rate wrk saw): a fixed count, since its stability search fails on a noisy 2-core box."""
    binary, env = pa
    report = Path(args.out) / f"pa-{model}-{protocol}-{time.monotonic_ns()}.csv"
    cmd = [
        str(binary), "-m", model, "-u", url, "-i", protocol,
        "--concurrency-range", str(args.pa_concurrency),
        "--shape", f"input:{dim}",
        "--request-count", str(requests),
        # The same data for every system (random data holds NaN, which JSON cannot carry).
        "--input-data", "zero",
        *extra,
        "-f", str(report),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    out: dict[str, Any] = {"command": " ".join(cmd[1:]), "rc": proc.returncode}
    if proc.returncode != 0 or not report.exists():
        out["error"] = (proc.stdout + proc.stderr)[-600:]
        return out
    row = next(csv.DictReader(io.StringIO(report.read_text())))
    out.update(
        throughput_rps=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p99_us=float(row["p99 latency"]),
    )
    return out


# -- one system, one workload --------------------------------------------------------------------
@dataclass
class Measured:
    system: str
    workload: str
    closed: list[dict[str, Any]] = field(default_factory=list)
    max_rate: dict[str, Any] | None = None
    perf_analyzer: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None
    startup_s: float = 0.0


def measure(
    system: Any, workload: str, args: Any, pa: tuple[Path, dict[str, str]] | None
) -> Measured:
    """Closed-loop sweep and perf_analyzer on one server; the open-loop search on a fresh one,
    so that what the overloaded end of the sweep left behind (queues, a batcher's fitted
    latency model: BentoML's refused nearly everything after C=64) does not decide the search."""
    m = Measured(system.name, workload)
    log = Path(args.out) / f"{system.name}-{workload}.log"
    row = example_input(workload)
    req = system.native(workload, row)
    t0 = time.monotonic()
    best = 0.0
    try:
        with harness.start(system, workload, log) as r:
            m.startup_s = time.monotonic() - t0
            url = r.url(req.path)
            print(f"[{system.name}/{workload}] ready in {m.startup_s:.1f}s", flush=True)
            loadgen.run_wrk(url, req.body, 16, max(1.0, args.duration / 2))  # warm-up
            for c in args.concurrency:
                res = loadgen.run_wrk(url, req.body, c, args.duration)
                m.closed.append(res.to_dict())
                best = max(best, res.goodput_rps)
                print(f"  closed {res.summary()}", flush=True)
            if pa is not None and system.v2_model:
                dim = len(row)
                n = max(200, int(best * args.duration))
                extra = system.perf_analyzer_args
                for proto, port in (("http", r.http_port), ("grpc", r.grpc_port)):
                    if proto == "http" or system.v2_grpc:
                        m.perf_analyzer[proto] = perf_analyzer(
                            pa, system.v2_model, f"127.0.0.1:{port}", proto, dim, n, extra, args
                        )
                print(f"  perf_analyzer {m.perf_analyzer}", flush=True)
        time.sleep(1)
        with harness.start(system, workload, log) as r:
            url = r.url(req.path)
            loadgen.run_wrk(url, req.body, 4, 1.0)  # warm-up, well below saturation
            found = loadgen.max_sustainable_rate(
                url,
                req.body,
                args.slo_ms * 1000,
                start_rate=max(50.0, 0.5 * best),
                growth=1.5,
                bisect_steps=3,
                max_steps=args.max_steps,
                step_duration_s=args.open_duration,
                log=lambda s: print(s, flush=True),
            )
            m.max_rate = found.to_dict()
            print(f"  max sustainable rate {found.rate:,.0f}/s", flush=True)
    except Exception:  # one failing system must not end the run: it is reported
        m.error = traceback.format_exc(limit=3)
        print(f"[{system.name}/{workload}] FAILED\n{m.error}", flush=True)
    return m


# -- report --------------------------------------------------------------------------------------
def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.1f}"


def _rate(m: Measured) -> float:
    return float(m.max_rate["rate"]) if m.max_rate else 0.0


def render(
    results: list[Measured], systems: dict[str, Any], versions: dict[str, Any], args: Any
) -> str:
    lines = [
        "# clipper-serve vs peers: side-by-side benchmark",
        "",
        f"Run {args.started}, {args.elapsed_s / 60:.1f} min. Machine: {platform.node()}, "
        f"{os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}. "
        "Servers and load generators share the cores (no pinning, the same for every system).",
        "",
        "Command: `python benchmarks/peers/run.py "
        + " ".join(args.argv)
        + "`. Closed loop: wrk, 1 thread, "
        f"{args.duration:g} s per point. Open loop: benchmarks/loadgen.py, "
        f"{args.open_duration:g} s per step; a rate is sustained when p99 < {args.slo_ms:g} ms, "
        ">= 95% answered, < 1% errors and < 1% default outputs. "
        "Throughput is goodput (2xx predictions per second).",
        "",
        "## Systems",
    ]
    for name, s in systems.items():
        vs = ", ".join(f"{k} {v}" for k, v in versions.get(name, {}).items())
        lines += ["", f"### {s.title}", "", f"* Versions: {vs}", f"* Batching: {s.batching}"]
        lines.append(f"* Setup: {s.notes}")
    for w in args.workloads:
        rows = [m for m in results if m.workload == w]
        lines += ["", f"## Workload `{w}`", ""]
        lines += ["### Max sustainable open-loop rate (p99 < SLO)", ""]
        lines += [
            "| system | rate (req/s) | p50 ms | p99 ms | clipper-serve's rate / this |",
            "|---|---|---|---|---|",
        ]
        clip = next((_rate(m) for m in rows if m.system == "clipper"), 0.0)
        for m in sorted(rows, key=_rate, reverse=True):
            res = (m.max_rate or {}).get("result") or {}
            ratio = f"{clip / _rate(m):.1f}x" if _rate(m) and m.system != "clipper" else ""
            note = " (failed: see log)" if m.error else ""
            lines.append(
                f"| {systems[m.system].title}{note} | {_rate(m):,.0f} | "
                f"{_ms(res.get('p50_us'))} | {_ms(res.get('p99_us'))} | {ratio} |"
            )
        lines += ["", "### Closed loop (wrk): goodput req/s, p50 / p99 ms", ""]
        header = "| system | " + " | ".join(f"C={c}" for c in args.concurrency) + " |"
        lines += [header, "|---|" + "---|" * len(args.concurrency)]
        for m in rows:
            cells = [
                f"{d['goodput_rps']:,.0f} ({_ms(d['p50_us'])} / {_ms(d['p99_us'])})"
                for d in m.closed
            ]
            lines.append(f"| {systems[m.system].title} | " + " | ".join(cells) + " |")
        pa_rows = [m for m in rows if m.perf_analyzer]
        if pa_rows:
            lines += [
                "",
                f"### perf_analyzer (V2), concurrency {args.pa_concurrency}",
                "",
                "| system | protocol | infer/s | p50 ms | p99 ms |",
                "|---|---|---|---|---|",
            ]
            for m in pa_rows:
                for proto, d in m.perf_analyzer.items():
                    if "error" in d:
                        lines.append(f"| {systems[m.system].title} | {proto} | error: "
                                     f"{d['error'][-120:]!r} | | |")  # fmt: skip
                        continue
                    lines.append(
                        f"| {systems[m.system].title} | {proto} | {d['throughput_rps']:,.0f} | "
                        f"{_ms(d['p50_us'])} | {_ms(d['p99_us'])} |"
                    )
    lines += ["", "## Targets", ""]
    for w, need in (("noop", 3.0), ("logreg", 3.0), ("mlp", 1.0)):
        rows = [m for m in results if m.workload == w]
        if not rows:
            continue
        clip = next((_rate(m) for m in rows if m.system == "clipper"), 0.0)
        peers = [m for m in rows if m.system != "clipper"]
        best = max(peers, key=_rate, default=None)
        if best is None or not _rate(best):
            lines.append(f"* `{w}`: no peer result to compare")
            continue
        ratio = clip / _rate(best)
        verdict = "PASS" if ratio >= need else "FAIL"
        lines.append(
            f"* `{w}`: clipper-serve {clip:,.0f} req/s vs best peer "
            f"{systems[best.system].title} {_rate(best):,.0f} → {ratio:.2f}x "
            f"(target >= {need:g}x): **{verdict}**"
        )
    errors = [m for m in results if m.error]
    if errors:
        lines += ["", "## Failures", ""]
        for m in errors:
            lines += [f"### {m.system} / {m.workload}", "", "```", m.error.strip(), "```"]
    return "\n".join(lines) + "\n"


def plots(results: list[Measured], systems: dict[str, Any], args: Any) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = []
    for w in args.workloads:
        rows = [m for m in results if m.workload == w and m.closed]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m in rows:
            xs = [d["goodput_rps"] for d in m.closed]
            ys = [d["p99_us"] / 1000 for d in m.closed]
            ax.plot(xs, ys, marker="o", label=systems[m.system].title)
        ax.axhline(args.slo_ms, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("throughput (goodput, req/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_title(f"{w}: closed loop, C = {', '.join(map(str, args.concurrency))}")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        path = Path(args.out) / f"{w}-throughput-p99.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path.name)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--systems", default=",".join(harness.SYSTEMS))
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per closed-loop point")
    p.add_argument("--open-duration", type=float, default=3.0, help="seconds per open-loop step")
    p.add_argument("--max-steps", type=int, default=9, help="open-loop search steps")
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--pa-concurrency", type=int, default=16)
    p.add_argument("--quick", action="store_true", help="2 s points, C=1,16, 5 search steps")
    p.add_argument("--out", default=None)
    argv = sys.argv[1:]
    args = p.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running server's context manager stops it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args.argv = argv
    if args.quick:
        args.duration, args.open_duration, args.max_steps = 2.0, 2.0, 5
        args.concurrency = "1,16"
    args.systems = [s for s in args.systems.split(",") if s]
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.concurrency = [int(c) for c in str(args.concurrency).split(",")]
    args.started = datetime.now().strftime("%Y-%m-%d %H:%M")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out = args.out or str(HERE / "results" / stamp)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    systems = {name: harness.load(name) for name in args.systems}
    versions: dict[str, Any] = {}
    for name, s in systems.items():
        print(f"installing {name} ...", flush=True)
        harness.install(s, Path(args.out) / "install.log")
        versions[name] = harness.versions(s)
    pa = install_perf_analyzer()

    results: list[Measured] = []
    for w in args.workloads:
        for s in systems.values():
            results.append(measure(s, w, args, pa))
            time.sleep(2)  # let the machine settle between systems

    args.elapsed_s = time.monotonic() - t0
    doc = {"args": vars(args), "versions": versions, "results": [vars(m) for m in results]}
    (Path(args.out) / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    pngs = plots(results, systems, args)
    report = render(results, systems, versions, args)
    report += "".join(f"\n![{png}]({png})\n" for png in pngs)
    (Path(args.out) / "report.md").write_text(report)
    print(report)
    print(f"written to {args.out}")
    return 1 if any(m.error for m in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What traces cost on the no-op query path: the no-op frontend's throughput as a ratio of the
bare server's (scenarios a and b of :mod:`report`), with tracing off, on at 1% sampling and on
at 100%, each ratio measured within the same round, rounds repeated and interleaved.

    PYTHONPATH=src python benchmarks/tracing_cost.py --rounds 3 --duration 8

Tracing on means the standard variables (``OTEL_TRACES_EXPORTER=otlp``, an OTLP/HTTP endpoint)
and ``--trace-ratio``; the endpoint is a sink in this process (a thread answering every
``POST /v1/traces`` with 200 and counting the bytes), so the export's own cost (protobuf
encoding on the batch span processor's thread, one HTTP request per batch of spans) is in the
figures. The model's container inherits the variables and exports its spans too. wrk sends no
``traceparent``: the frontend's ratio sampler decides. Results go to
``benchmarks/results/tracing-<timestamp>/`` (results.json, server logs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.server
import os
import statistics
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
import report
from loadgen import LoadResult

MODES: dict[str, float | None] = {"off": None, "1%": 0.01, "100%": 1.0}
OPEN_RATE = 500.0  # queries/s of the open loop that prices a query in frontend CPU


class Sink:
    """An OTLP/HTTP endpoint that accepts and discards every export."""

    def __init__(self) -> None:
        self.exports = 0
        self.bytes = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                self.rfile.read(n)
                sink.exports += 1
                sink.bytes += n
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def goodput(res: LoadResult) -> float:
    """Model-answered responses per second (no default, no error)."""
    ok = res.requests - res.defaults - res.non_2xx
    return ok / res.duration_s if res.duration_s > 0 else 0.0


def bare(run: report.Run) -> float:
    port = report.free_port()
    with report._load_on_cpu1() as pin:
        args = [str(report.HERE / "bare_server.py"), "--port", str(port), *pin]
        with report.server("a_bare", args, port, run):
            res = report._closed(run, f"http://127.0.0.1:{port}/bench/predict", report.noop_body())
    return res.throughput_rps


def noop(run: report.Run, mode: str, sink: Sink, i: int) -> dict[str, float]:
    qp, rp = report.free_port(), report.free_port()
    ratio = MODES[mode]
    env: dict[str, str] = {}
    with report._load_on_cpu1() as pin:
        args = [*report._serve_args(qp, rp, "noop", "aimd", wait_ms=0, cfg=run.cfg), *pin]
        if ratio is not None:
            args += ["--trace-ratio", str(ratio)]
            env = {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": sink.endpoint,
            }
        name = f"b_noop_{mode.replace('%', 'pct')}_{i}"
        exports = sink.exports
        with report.server(name, args, qp, run, env=env) as proc:
            url, body, cfg = f"http://127.0.0.1:{qp}/bench/predict", report.noop_body(), run.cfg
            loadgen.closed_loop(url, body, cfg.concurrency, duration_s=cfg.warmup_s, engine="wrk")
            cpu0 = cpu_s(proc.pid)
            res = loadgen.closed_loop(
                url, body, cfg.concurrency, duration_s=cfg.duration, engine="wrk"
            )
            cpu = cpu_s(proc.pid) - cpu0
            run.log("  " + res.summary())
            # Under its capacity (an open loop at a fixed rate), every query answered by the
            # model: the frontend's CPU per query compares like with like, whatever else the
            # machine runs (the closed loop's mix of answers and shed defaults does not).
            cpu0 = cpu_s(proc.pid)
            fixed = loadgen.open_loop(url, body, OPEN_RATE, duration_s=cfg.duration)
            fixed_cpu = cpu_s(proc.pid) - cpu0
            run.log("  " + fixed.summary())
    return {
        "cpu_us_per_request": cpu / res.requests * 1e6 if res.requests else 0.0,
        "open_cpu_us_per_request": fixed_cpu / fixed.requests * 1e6 if fixed.requests else 0.0,
        "open_defaults": float(fixed.defaults),
        "open_p99_ms": fixed.p99_us / 1e3,
        "goodput_rps": goodput(res),
        "p99_ms": res.p99_us / 1e3,
        "defaults": float(res.defaults),
        "exports": float(sink.exports - exports),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=8.0, help="seconds per point")
    p.add_argument("--concurrency", type=int, default=64)
    args = p.parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = report.HERE / "results" / f"tracing-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    run = report.Run(out, report.Config(duration=args.duration, concurrency=args.concurrency))
    sink = Sink()
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.rounds):
            a = bare(run)
            row: dict[str, Any] = {"bare_rps": a}
            for mode in MODES:
                got = noop(run, mode, sink, i)
                got["ratio"] = got["goodput_rps"] / a if a else 0.0
                row[mode] = got
            rounds.append(row)
            run.log(
                f"round {i + 1}: bare {a:,.0f} req/s; "
                + "; ".join(
                    f"{m} {row[m]['goodput_rps']:,.0f} ({row[m]['ratio']:.3f})" for m in MODES
                )
            )
    finally:
        sink.stop()
    (out / "results.json").write_bytes(orjson.dumps(rounds, option=orjson.OPT_INDENT_2))
    print(
        "\n| round | bare req/s | "
        + " | ".join(f"tracing {m}: goodput (ratio)" for m in MODES)
        + " |"
    )
    print("|---|---|" + "---|" * len(MODES))
    for i, row in enumerate(rounds):
        cells = [f"{row[m]['goodput_rps']:,.0f} ({row[m]['ratio']:.3f})" for m in MODES]
        print(f"| {i + 1} | {row['bare_rps']:,.0f} | " + " | ".join(cells) + " |")
    med = [statistics.median(r[m]["ratio"] for r in rounds) for m in MODES]
    print("| **median ratio** | | " + " | ".join(f"**{x:.3f}**" for x in med) + " |")
    for key, what in (
        ("cpu_us_per_request", "closed loop"),
        ("open_cpu_us_per_request", f"open loop at {OPEN_RATE:g}/s"),
    ):
        cpu = [statistics.median(r[m][key] for r in rounds) for m in MODES]
        print(
            f"\nfrontend CPU per response ({what}), median: "
            + ", ".join(f"{m} {x:.0f} us" for m, x in zip(MODES, cpu, strict=True))
        )
    for i, row in enumerate(rounds):
        print(
            f"round {i + 1}: CPU us/response closed "
            + ", ".join(f"{m} {row[m]['cpu_us_per_request']:.0f}" for m in MODES)
            + "; open "
            + ", ".join(f"{m} {row[m]['open_cpu_us_per_request']:.0f}" for m in MODES)
            + "; closed-loop defaults "
            + ", ".join(f"{m} {row[m]['defaults']:.0f}" for m in MODES)
            + "; open-loop defaults "
            + ", ".join(f"{m} {row[m]['open_defaults']:.0f}" for m in MODES)
        )
    off = med[0]
    if off:
        print(
            "\nrelative to tracing off: "
            + ", ".join(f"{m} {x / off:.3f}" for m, x in zip(MODES, med, strict=True))
        )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

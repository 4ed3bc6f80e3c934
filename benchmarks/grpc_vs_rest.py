"""V2 gRPC vs V2 REST under Triton's perf_analyzer, same server, same model, interleaved.

    PYTHONPATH=src python benchmarks/grpc_vs_rest.py [--concurrency 16] [--window-ms 3000]
        [--rounds 3] [--perf-analyzer PATH]

Serves one application (``bench``: a row-sum model on 16 floats, batch wait 0 and 1 ms
variants are not mixed: ``--max-wait-us``) from an embedded frontend on free ports, then runs
perf_analyzer against V2 REST and V2 gRPC in turn, ``--rounds`` times each, interleaved, in fixed
time windows (its stability search fails on a noisy machine). Prints each run's
throughput and p99, and the gRPC/REST throughput ratio per round and its median.

perf_analyzer comes from the ``tritonclient==2.49.0`` wheel (see ``.ci/run``: ``.venv-perf``).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import os
import statistics
import sys
import tempfile
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent


def row_sums(xs: object) -> list[float]:
    return [float(x.sum()) for x in xs]  # type: ignore[attr-defined]


def _binary(explicit: str | None) -> tuple[Path, dict[str, str]]:
    binary = Path(explicit) if explicit else ROOT / ".venv-perf" / "bin" / "perf_analyzer"
    if not binary.exists():
        sys.exit(f"perf_analyzer not found at {binary} (see .ci/run: .venv-perf)")
    env = dict(os.environ)
    cudart = sorted((binary.parent.parent / "lib").glob("python3*/site-packages/nvidia/*/lib"))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [*map(str, cudart), *filter(None, [env.get("LD_LIBRARY_PATH")])]
    )
    return binary, env


async def _run(
    binary: Path, env: dict[str, str], protocol: str, url: str, args: argparse.Namespace
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.csv"
        proc = await asyncio.create_subprocess_exec(
            str(binary),
            "-m", "bench", "-u", url, "-i", protocol,
            "--concurrency-range", str(args.concurrency),
            # Fixed time windows, every trial accepted: its stability search never settles on
            # a noisy machine, and a request count makes it report the count as the rate.
            "--measurement-mode", "time_windows",
            "--measurement-interval", str(args.window_ms),
            "--stability-percentage", "100",
            "--max-trials", "3",
            "--shape", "input:16",
            "-f", str(report),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=300)
        if proc.returncode:
            raise RuntimeError(f"perf_analyzer {protocol} failed:\n{out.decode()[-2000:]}")
        [row] = list(csv.DictReader(io.StringIO(report.read_text())))
    return {
        "throughput": float(row["Inferences/Second"]),
        "p99_ms": float(row["p99 latency"]) / 1000,
    }


async def main(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from clipper import BatchingConfig, Clipper

    binary, env = _binary(args.perf_analyzer)
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, grpc_port=0) as c:
        await c.deploy_model(
            "sums",
            "1",
            row_sums,
            input_type="floats",
            batching=BatchingConfig(max_wait_micros=args.max_wait_us),
        )
        await c.register_application("bench", "floats", "-1.0", 1_000_000)
        await c.link_model_to_app("bench", "sums")
        assert c.grpc is not None
        urls = {"http": f"127.0.0.1:{c.query_port}", "grpc": f"127.0.0.1:{c.grpc.port}"}
        ratios = []
        print("| round | protocol | inferences/s | p99 ms |\n|---|---|---|---|")
        for i in range(args.rounds):
            got = {}
            for protocol in ("http", "grpc") if i % 2 == 0 else ("grpc", "http"):
                got[protocol] = await _run(binary, env, protocol, urls[protocol], args)
                r = got[protocol]
                print(f"| {i + 1} | {protocol} | {r['throughput']:,.0f} | {r['p99_ms']:.2f} |")
            ratios.append(got["grpc"]["throughput"] / got["http"]["throughput"])
        print(
            f"\ngRPC/REST throughput per round: {', '.join(f'{r:.2f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.2f}"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer window")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-wait-us", type=int, default=1000)
    p.add_argument("--perf-analyzer", default=None)
    uvloop.run(main(p.parse_args()))

"""V2 gRPC vs V2 REST under Triton's perf_analyzer, same server, same model, interleaved.

    PYTHONPATH=src python benchmarks/grpc_vs_rest.py [--concurrency 16] [--window-ms 3000]
        [--rounds 3] [--perf-analyzer PATH] [--grpc-transport native,grpcio]

Serves one application (``bench``: a row-sum model on 16 floats, batch wait 0 and 1 ms
variants are not mixed: ``--max-wait-us``) from an embedded frontend on free ports, then runs
perf_analyzer against V2 REST and V2 gRPC in turn, ``--rounds`` times each, interleaved, in fixed
time windows (its stability search fails on a noisy machine). ``--grpc-transport`` lists the
gRPC transports to compare (each serves its own port of the same frontend). Prints each run's
throughput and p99, and each transport's gRPC/REST throughput ratio per round and its median.

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
    from clipper.choices import GRPC_TRANSPORTS

    binary, env = _binary(args.perf_analyzer)
    transports = [GRPC_TRANSPORTS.check(t) for t in args.grpc_transport.split(",")]
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport=transports[0]
    ) as c:
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
        # The other transports serve the same services on ports of their own.
        extra = [
            GRPC_TRANSPORTS.load(t)(c.services, host="127.0.0.1", port=0) for t in transports[1:]
        ]
        for server in extra:
            await server.start()
        urls = {"http": f"127.0.0.1:{c.query_port}", transports[0]: f"127.0.0.1:{c.grpc.port}"}
        urls.update({t: f"127.0.0.1:{s.port}" for t, s in zip(transports[1:], extra, strict=True)})
        ratios: dict[str, list[float]] = {t: [] for t in transports}
        print("| round | protocol | inferences/s | p99 ms |\n|---|---|---|---|")
        try:
            for i in range(args.rounds):
                got = {}
                order = ["http", *transports]
                for name in order if i % 2 == 0 else order[::-1]:
                    protocol = "http" if name == "http" else "grpc"
                    got[name] = await _run(binary, env, protocol, urls[name], args)
                    r = got[name]
                    label = "REST" if name == "http" else f"gRPC {name}"
                    print(f"| {i + 1} | {label} | {r['throughput']:,.0f} | {r['p99_ms']:.2f} |")
                for t in transports:
                    ratios[t].append(got[t]["throughput"] / got["http"]["throughput"])
        finally:
            for server in extra:
                await server.stop()
        for t, rs in ratios.items():
            print(
                f"\ngRPC {t}/REST throughput per round: {', '.join(f'{r:.2f}' for r in rs)}; "
                f"median {statistics.median(rs):.2f}"
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer window")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-wait-us", type=int, default=1000)
    p.add_argument("--perf-analyzer", default=None)
    p.add_argument(
        "--grpc-transport",
        default="native,grpcio",
        help="comma-separated gRPC transports to compare with REST (native, grpcio)",
    )
    uvloop.run(main(p.parse_args()))

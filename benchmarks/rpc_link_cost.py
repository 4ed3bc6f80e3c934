"""The replica link's own cost: the TCP port with CURVE (every batch and answer encrypted), the TCP
port without it, and the frontend's private Unix socket (no encryption), for one batch size.

    python benchmarks/rpc_link_cost.py [--rounds 8] [--batches 400] [--size 28] [--width 784]

A mock frontend (a ZeroMQ ROUTER with the real encoders of ``clipper.rpc.wire``, as in
``wire_bench.py``) drives a real container process (``python -m clipper.container``, a no-op
model) one batch at a time, both processes pinned to CPU 0. Per link and round: the CPU time
both processes spent per batch (user + system of every thread: ZeroMQ's I/O threads do the
encryption) and batches per second. The links (``tcp``, ``tcp-plain``, ``ipc``) alternate within
each round, each with a fresh container and socket, so drift on a shared machine hits them
alike; the ratio of the medians is the figure to read. Loopback only; every container is stopped
by PID.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import cloudpickle
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tracing_cost import cpu_s
from wire_bench import Noop, _drive, _register

from clipper.rpc.auth import ensure_keys


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def one(
    link: str, model_path: Path, keys_dir: Path, *, size: int, width: int, batches: int
) -> dict[str, float]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    ipc_dir = tempfile.mkdtemp(prefix="clipper-rpc-")
    cmd = [
        sys.executable, "-m", "clipper.container", "--model-path", str(model_path),
        "--name", "m", "--version", "1", "--input-type", "doubles",
        "--parent-pid", str(os.getpid()),
    ]  # fmt: skip
    if link.startswith("tcp"):
        if link == "tcp":
            keys = ensure_keys(keys_dir)
            sock.curve_server = True
            sock.curve_secretkey = keys.secret
            cmd += ["--rpc-keys", str(keys_dir)]
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        cmd += ["--port", str(port)]
    else:
        sock.bind(f"ipc://{ipc_dir}/rpc")
        cmd += ["--ipc", f"{ipc_dir}/rpc"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ident, fast = _register(sock)
        _drive(sock, ident, fast, size, 30, width=width)  # warm-up
        ours, theirs = _own_cpu_s(), cpu_s(proc.pid)
        secs = _drive(sock, ident, fast, size, batches, width=width)
        cpu = _own_cpu_s() - ours + cpu_s(proc.pid) - theirs
    finally:
        proc.kill()  # no goodbye to wait for: this mock frontend never acknowledges one
        proc.wait(10)
        sock.close(0)
        ctx.term()
        shutil.rmtree(ipc_dir, ignore_errors=True)
    return {"batches_per_s": batches / secs, "cpu_us_per_batch": cpu / batches * 1e6}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--size", type=int, default=28, help="inputs per batch")
    p.add_argument("--width", type=int, default=784, help="doubles per input")
    args = p.parse_args(argv)
    os.sched_setaffinity(0, {0})  # the mock frontend and (inherited) the container on CPU 0
    rows: dict[str, list[dict[str, float]]] = {"tcp": [], "tcp-plain": [], "ipc": []}
    with tempfile.TemporaryDirectory() as tmp:
        model_path = Path(tmp) / "noop.pkl"
        cloudpickle.register_pickle_by_value(sys.modules["wire_bench"])
        model_path.write_bytes(cloudpickle.dumps(Noop()))
        for r in range(args.rounds):
            for link, runs in rows.items():
                row = one(
                    link, model_path, Path(tmp) / "keys",
                    size=args.size, width=args.width, batches=args.batches,
                )  # fmt: skip
                runs.append(row)
                print(
                    f"[{time.strftime('%H:%M:%S')}] round {r} {link}: "
                    f"{row['batches_per_s']:,.0f} batches/s, {row['cpu_us_per_batch']:.0f} us CPU"
                    " a batch",
                    flush=True,
                )
    med = {
        link: {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        for link, runs in rows.items()
    }
    tcp, plain, ipc = med["tcp"], med["tcp-plain"], med["ipc"]
    per_input = (tcp["cpu_us_per_batch"] - ipc["cpu_us_per_batch"]) / args.size
    print(
        f"\nbatches of {args.size} x {args.width} doubles, medians of {args.rounds} rounds:\n"
        f"  TCP + CURVE: {tcp['cpu_us_per_batch']:.0f} us CPU a batch, "
        f"{tcp['batches_per_s']:,.0f} batches/s\n"
        f"  TCP, no CURVE: {plain['cpu_us_per_batch']:.0f} us CPU a batch, "
        f"{plain['batches_per_s']:,.0f} batches/s\n"
        f"  Unix socket: {ipc['cpu_us_per_batch']:.0f} us CPU a batch, "
        f"{ipc['batches_per_s']:,.0f} batches/s\n"
        f"  Unix / TCP + CURVE: CPU {ipc['cpu_us_per_batch'] / tcp['cpu_us_per_batch']:.2f}x, "
        f"throughput {ipc['batches_per_s'] / tcp['batches_per_s']:.2f}x; "
        f"{per_input:.1f} us saved per input"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``clipper start --workers N``: closed-loop throughput and frontend CPU per request.

    PYTHONPATH=src python benchmarks/workers.py --workers 1 2 --concurrency 32 --duration 10

For each N: ``clipper start --workers N`` (N = 1 is the plain single process) on free ports with
a fresh state directory; one application ``bench`` linked to :class:`models.NoopModel` with one
replica (per worker, until replicas are shared). Its prediction cache is off, so every query
goes to a replica; with ``--cache`` it is on, and the one body wrk sends is a hit after the
first query, so only the frontends work. A warm-up, then wrk (benchmarks/loadgen.py's wrk
engine) for ``--duration`` seconds with ``--concurrency`` keep-alive connections, which the
kernel spreads over the workers. Reported per N: requests per second, latency, CPU per
request from /proc: the frontend processes' (the supervisor and its workers; utime + stime)
and the replicas', and the replicas' TCP connections (0 when every link is on a frontend's
private Unix socket, as it is for frontends on the replica's machine).

The load generator runs on the same machine and takes its share of the cores: on a machine
with few cores the ratio between N = 2 and N = 1 is bounded by what wrk leaves.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
import models
from report import free_port

from clipper.runtime.processes import container_args, containers_with

SRC = str(Path(__file__).resolve().parents[1] / "src")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    workers: int
    rps: float
    p50_us: float
    p99_us: float
    errors: int
    defaults: int
    frontend_cpu_us: float  # per request, supervisor + workers
    replica_cpu_us: float  # per request, every replica
    frontend_share: dict[int, float]  # worker index -> share of the frontend CPU
    replica_tcp: int  # the replicas' TCP connections (0: every link on a Unix socket)


def cpu_s(pid: int) -> float:
    """The process's own CPU seconds (user + system), 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def replica_pids(parents: Sequence[int], state: Path) -> list[int]:
    """This deployment's replicas: a worker's own (``--parent-pid``) or shared ones, which
    have no parent and are known by their key directory inside the deployment's state dir."""
    own = {pid for p in parents for pid in containers_with(b"--parent-pid", str(p).encode())}
    prefix = str(state).encode()
    shared = {
        pid
        for pid, argv in container_args()
        if any(f == b"--rpc-keys" and v.startswith(prefix) for f, v in itertools.pairwise(argv))
    }
    return sorted(own | shared)


def tcp_connections(pid: int) -> int:
    """The TCP sockets process ``pid`` holds (a replica's only TCP use is its links to the
    frontends: 0 means every link is on a frontend's Unix socket)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            count += sum(
                line.split()[9] in inodes for line in Path(table).read_text().splitlines()[1:]
            )
    return count


def admin(port: int, route: str, doc: Any, timeout_s: float = 120.0) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/{route}",
        data=orjson.dumps(doc),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.read()


def predict_ok(port: int, body: bytes) -> bool:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/bench/predict", data=body, headers={"Connection": "close"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return orjson.loads(resp.read()).get("default") is False
    except OSError:
        return False


def wait(condition: Any, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {limit_s} s waiting for {what}")
        time.sleep(0.1)


def frontend_pids(proc: subprocess.Popen[bytes], state: Path, n: int) -> dict[int, int]:
    """worker index -> pid (-1: the supervisor); N = 1: the process itself as worker 0."""
    if n == 1:
        return {0: proc.pid}
    doc = orjson.loads((state / "workers.json").read_bytes())
    return {-1: proc.pid, **{int(w["index"]): int(w["pid"]) for w in doc["workers"]}}


def run_one(n: int, args: argparse.Namespace, artifact: str, body: bytes) -> Row:
    query, admin_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="clipper-workers-bench-") as tmp:
        state = Path(tmp) / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
        env["PYTHONPATH"] = SRC
        log = (Path(tmp) / "frontend.log").open("wb")
        cmd = [
            sys.executable, "-m", "clipper.cli", "start", "--query-port", str(query),
            "--admin-port", str(admin_port), "--rpc-port", "0", "--grpc-port", "-1",
            "--state-dir", str(state), "--log-level", "WARNING", "--workers", str(n),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait(lambda: b"clipper-serve ready" in (Path(tmp) / "frontend.log").read_bytes(),
                 90, "the frontend to be ready")  # fmt: skip
            admin(admin_port, "add_app", {
                "name": "bench", "input_type": "doubles", "default_output": "-1",
                "latency_slo_micros": 1_000_000, "cache": args.cache,
            })  # fmt: skip
            admin(admin_port, "deploy_model", {
                "model_name": "noop", "model_version": "1", "input_type": "doubles",
                "artifact_path": artifact, "num_replicas": 1,
            })  # fmt: skip
            admin(admin_port, "add_model_links", {"app_name": "bench", "model_names": ["noop"]})
            # Every worker answers with its replica: fresh connections reach each of them.
            wait(lambda: all(predict_ok(query, body) for _ in range(10 * n)), 120,
                 "every worker to serve")  # fmt: skip
            url = f"http://127.0.0.1:{query}/bench/predict"
            loadgen.run_wrk(url, body, args.concurrency, 2.0, count_defaults=False)  # warm-up
            pids = frontend_pids(proc, state, n)
            replicas = replica_pids([p for k, p in pids.items() if k >= 0], state)
            before = {k: cpu_s(p) for k, p in pids.items()}
            rep_before = sum(cpu_s(p) for p in replicas)
            result = loadgen.run_wrk(url, body, args.concurrency, args.duration)
            after = {k: cpu_s(p) for k, p in pids.items()}
            rep_after = sum(cpu_s(p) for p in replicas)
            replica_tcp = sum(tcp_connections(p) for p in replicas)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    used = {k: after[k] - before[k] for k in pids}
    total = sum(used.values())
    requests = max(result.requests, 1)
    return Row(
        workers=n,
        rps=result.throughput_rps,
        p50_us=result.p50_us,
        p99_us=result.p99_us,
        errors=result.errors + result.non_2xx,
        defaults=result.defaults,
        frontend_cpu_us=total / requests * 1e6,
        replica_cpu_us=(rep_after - rep_before) / requests * 1e6,
        frontend_share={k: v / total if total else 0.0 for k, v in sorted(used.items())},
        replica_tcp=replica_tcp,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--input-size", type=int, default=8)
    p.add_argument(
        "--cache",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the prediction cache on: wrk's one body is a hit after the first query, so the "
        "frontends alone are measured (no replica work)",
    )
    p.add_argument("--json", action="store_true", help="one JSON document per N")
    args = p.parse_args(argv)
    models.picklable()
    import cloudpickle

    body = loadgen.make_body(args.input_size)
    with tempfile.TemporaryDirectory(prefix="clipper-noop-") as tmp:
        artifact = Path(tmp) / "noop.pkl"
        artifact.write_bytes(cloudpickle.dumps(models.NoopModel()))
        rows = [run_one(n, args, str(artifact), body) for n in args.workers]
    print(
        f"machine: {os.cpu_count()} cores; wrk -t1 -c{args.concurrency} -d{args.duration:g}s; "
        f"prediction cache {'on' if args.cache else 'off'}"
    )
    print(
        "workers   req/s   p50 ms   p99 ms  errors  frontend CPU us/req  replica CPU us/req  "
        "replica TCP links"
    )
    for r in rows:
        if args.json:
            print(orjson.dumps(r.__dict__, option=orjson.OPT_NON_STR_KEYS).decode())
            continue
        print(
            f"{r.workers:>7} {r.rps:>7,.0f} {r.p50_us / 1000:>8.2f} {r.p99_us / 1000:>8.2f} "
            f"{r.errors:>7} {r.frontend_cpu_us:>20.0f} {r.replica_cpu_us:>19.0f} "
            f"{r.replica_tcp:>18}"
        )
    base = rows[0].rps if rows else 0.0
    for r in rows[1:]:
        shares = ", ".join(f"{'sup' if k < 0 else k}: {v:.0%}" for k, v in r.frontend_share.items())
        print(f"{r.workers} workers / {rows[0].workers}: {r.rps / base:.2f}x req/s ({shares})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two frontends, one shared replica: does each frontend's AIMD batching converge to a fair share?

    python benchmarks/shared_fairness.py [--windows 8] [--window-s 2] [--connections 16]

Starts a redis-server and two ``clipper start`` frontends on it with one key pair (so they
share replicas, docs/scale-out.md), deploys one model with ``num_replicas: 1`` (a CPU-bound
model: 1 ms per batch + 50 us per input, so batching pays), then drives each frontend with its
own closed loop of ``--connections`` keep-alive connections. Frontend a runs alone for the
first two windows; from the third on both run. Each window reports each frontend's
predictions/s (defaults excluded), p99, and Jain's fairness index of the two rates
((a + b)^2 / (2 (a^2 + b^2)): 1.0 is an even split, 0.5 is one frontend getting everything).
Loopback only; every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import cloudpickle
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
import models
from report import ROOT, free_port

BODY = orjson.dumps({"input": [0.5] * 16})


def _admin(port: int, route: str, doc: Any) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/admin/{route}",
        data=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        body = resp.read()
    try:
        return json.loads(body or b"null")
    except ValueError:  # Clipper's admin routes answer some calls in plain text ("Success!")
        return body.decode(errors="replace")


def _wait(what: str, check: Any, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _pings(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/ping", timeout=2) as resp:
        return bool(resp.status == 200)


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError:
        return False


def _window(urls: list[str], conns: int, seconds: float) -> list[loadgen.LoadResult]:
    async def run() -> list[loadgen.LoadResult]:
        return list(
            await asyncio.gather(
                *(loadgen.closed_loop_async(u, BODY, conns, duration_s=seconds) for u in urls)
            )
        )

    return asyncio.run(run())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--window-s", type=float, default=2.0)
    p.add_argument("--connections", type=int, default=16)
    args = p.parse_args()
    redis = shutil.which("redis-server")
    if redis is None:
        raise SystemExit("needs redis-server (apt-get install -y redis-server)")
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(ROOT / "src"), env.get("PYTHONPATH")) if x
        )
        try:
            rport = free_port()
            procs.append(subprocess.Popen(
                [redis, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                 "--appendonly", "no"], stdout=subprocess.DEVNULL,
            ))  # fmt: skip
            keys = work / "keys"
            ports = []
            for name in ("a", "b"):
                q, a, r = free_port(), free_port(), free_port()
                ports.append((q, a))
                log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "clipper", "start", "--host", "127.0.0.1",
                     "--query-port", str(q), "--admin-port", str(a), "--rpc-port", str(r),
                     "--grpc-port", "-1", "--state-dir", str(work / name),
                     "--store", f"redis://127.0.0.1:{rport}/0", "--rpc-keys-dir", str(keys),
                     "--cache-bytes", "0"],
                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                ))  # fmt: skip
                if name == "a":  # a makes the keys; b must find them there
                    _wait("frontend a", lambda a=a: _pings(a))
            _wait("frontend b", lambda: _pings(ports[1][1]))
            models.picklable()
            artifact = work / "spin.pkl"
            artifact.write_bytes(cloudpickle.dumps(models.SpinModel(0.001, 0.00005)))
            admin = ports[0][1]
            app = {"name": "fair", "input_type": "doubles", "default_output": "-1",
                   "latency_slo_micros": 100_000}  # fmt: skip
            _admin(admin, "add_app", app)
            _admin(admin, "deploy_model", {"model_name": "spin", "model_version": "1",
                                           "input_type": "doubles", "num_replicas": 1,
                                           "artifact_path": str(artifact)})  # fmt: skip
            _admin(admin, "add_model_links", {"app_name": "fair", "model_names": ["spin"]})
            for q, _ in ports:
                _wait(f"frontend on {q} ready", lambda q=q: _ready(q))
            urls = [f"http://127.0.0.1:{q}/fair/predict" for q, _ in ports]
            print("window  a pred/s  a p99 ms  b pred/s  b p99 ms  Jain")
            for w in range(args.windows):
                active = urls[:1] if w < 2 else urls
                results = _window(active, args.connections, args.window_s)
                rates = [r.throughput_rps * (1 - r.defaults / max(r.requests, 1)) for r in results]
                p99 = [r.p99_us / 1e3 for r in results]
                if len(rates) == 1:
                    rates.append(0.0)
                    p99.append(float("nan"))
                jain = sum(rates) ** 2 / (2 * sum(x * x for x in rates)) if any(rates) else 0.0
                print(f"{w:6d}  {rates[0]:8.0f}  {p99[0]:8.1f}  {rates[1]:8.0f}  {p99[1]:8.1f}"
                      f"  {jain:4.2f}")  # fmt: skip
        finally:
            for proc in reversed(procs):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in reversed(procs):
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

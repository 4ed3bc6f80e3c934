"""Seldon MLServer serving one peer-benchmark workload (run with the mlserver venv's python).

    python serve.py --workload mlp --http-port 8080 --grpc-port 8081 --workdir /tmp/w

Writes ``settings.json`` and ``models/<model>/model-settings.json`` into the work dir, then
execs ``mlserver start <workdir>`` in the foreground (same pid, so the harness's SIGTERM
reaches MLServer, which closes its inference pool before it exits). The model is the custom
runtime ``workload_runtime.WorkloadRuntime``: input ``input`` FP32 ``[-1, d]``, output
``output`` INT64 ``[-1, 1]``, over V2 REST on the HTTP port and V2 gRPC on the gRPC port.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ports import LOOPBACK, free_port

HERE = Path(__file__).resolve().parent
PEERS = HERE.parents[1]  # benchmarks/peers, which holds workloads.py


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", required=True)
    p.add_argument("--model", default="m")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-batch-time", type=float, default=0.002, help="seconds")
    p.add_argument("--parallel-workers", type=int, default=1)
    return p.parse_args()


def server_settings(a: argparse.Namespace) -> dict[str, Any]:
    workdir = a.workdir.resolve()
    return {
        "host": LOOPBACK,
        "http_port": a.http_port,
        "grpc_port": a.grpc_port,
        "parallel_workers": a.parallel_workers,
        # debug (the default) logs every REST and gRPC request: an access log per request.
        "debug": False,
        # No metrics endpoint: no Prometheus middleware or gRPC interceptor on each request
        # and no metrics server. Its port is moved off 8082 all the same.
        "metrics_endpoint": None,
        "metrics_port": free_port(),
        "metrics_dir": str(workdir / ".metrics"),
        # Answers are a few bytes (never compressed); the middleware only costs time.
        "gzip_enabled": False,
        "environments_dir": str(workdir / ".envs"),
        "load_models_at_startup": True,
    }


def model_settings(a: argparse.Namespace, input_size: int) -> dict[str, Any]:
    return {
        "name": a.model,
        "implementation": "workload_runtime.WorkloadRuntime",
        "parameters": {"extra": {"workload": a.workload}},
        # Metadata, so that V2 clients (perf_analyzer) can learn names, shapes and types.
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, input_size]}],
        "outputs": [{"name": "output", "datatype": "INT64", "shape": [-1, 1]}],
        # Adaptive batching: a batch goes to the worker when it holds max_batch_size requests
        # or max_batch_time seconds after its first request arrived.
        "max_batch_size": a.max_batch_size,
        "max_batch_time": a.max_batch_time,
    }


def main() -> int:
    a = parse_args()
    sys.path.insert(0, str(PEERS))
    from workloads import INPUT_SIZE

    if a.workload not in INPUT_SIZE:
        raise SystemExit(f"unknown workload {a.workload!r}")
    a.workdir.mkdir(parents=True, exist_ok=True)
    (a.workdir / "settings.json").write_text(json.dumps(server_settings(a), indent=2))
    model_dir = a.workdir / "models" / a.model
    model_dir.mkdir(parents=True, exist_ok=True)
    settings = model_settings(a, INPUT_SIZE[a.workload])
    (model_dir / "model-settings.json").write_text(json.dumps(settings, indent=2))

    # The inference worker is a spawned process: it imports the runtime and workloads.py
    # through PYTHONPATH, which it inherits.
    path = [str(HERE), str(PEERS), *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    env = dict(os.environ, PYTHONPATH=":".join(dict.fromkeys(path)))
    mlserver = Path(sys.executable).parent / "mlserver"
    os.chdir(a.workdir)
    os.execve(mlserver, [str(mlserver), "start", str(a.workdir.resolve())], env)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())

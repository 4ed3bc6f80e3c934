"""Ray Serve server for one peer-benchmark workload: ``POST /predict``, ``{"input": [d floats]}``.

Run with the rayserve venv's python (the harness sets PYTHONPATH to ``benchmarks/peers``):

    python server.py --workload mlp --port 8000 --temp-dir /tmp/x --max-batch-size 64 \
        --batch-wait-ms 2

This process is the Ray driver: it starts a local one-node Ray cluster on 127.0.0.1 (GCS, raylet,
agents, and the Serve controller, proxies and one replica as Ray workers), deploys one
application with one replica and waits. By default HTTP enters through the HAProxy that
ray[serve] bundles (Serve's high-throughput mode); ``--ingress proxy`` uses Serve's classic
proxy actor instead. On SIGTERM or SIGINT it shuts the cluster down, so that no Ray process
outlives it. The answer is ``{"output": <int label>}``.
"""

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import NoReturn

import ray
import workloads
from ports import free_port
from ray import serve
from ray.serve.config import HTTPOptions, ProxyLocation
from ray.serve.schema import LoggingConfig
from starlette.requests import Request

# Set before ray.init, so that the GCS, the raylet and every worker it starts inherit them; each
# can be overridden from the environment.
BASE_ENV = {
    # The raylet puts every worker (the Serve actors) in a process group of its own; keep them
    # in ours, so that the harness's killpg reaches every process of this server.
    "RAY_process_group_cleanup_enabled": "0",
}
# --ingress haproxy (the default): Serve's high-throughput mode (Ray >= 2.55 docs, "Enable High
# Throughput on Ray Serve"): the HAProxy binary bundled with ray[serve] takes HTTP on the port
# and forwards to the replica's own HTTP server ("direct ingress"); the throughput-optimized
# set also runs user code and the router on the replica's event loop, buffers request-path
# logs, keeps Serve's logs off stderr and freezes the GC after startup. One HAProxy thread: two
# cores are shared by HAProxy, the replica and the load generator.
HAPROXY_ENV = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_HAPROXY_NBTHREAD": "1",
}
# Fixed ports of that mode (HAProxy stats 8404 and metrics 9101, the fallback proxy 8500/9500,
# direct-ingress ranges 30000-31000/40000-41000); each gets a free port instead, so that two
# servers or another program on this machine cannot collide with them.
HAPROXY_PORT_VARS = (
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)
DIRECT_INGRESS_RANGES = ("HTTP", "GRPC")
# --ingress proxy: Serve's classic path (HTTP proxy actor, then a Ray RPC to the replica) with
# the "throughput-optimized flags" its performance-tuning guide lists one by one.
PROXY_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_LOG_TO_STDERR": "0",
}


def _ray_env(ingress: str) -> dict[str, str]:
    env = dict(BASE_ENV)
    if ingress == "proxy":
        env.update(PROXY_ENV)
        return env
    env.update(HAPROXY_ENV)
    for var in HAPROXY_PORT_VARS:
        env[var] = str(free_port())
    for protocol in DIRECT_INGRESS_RANGES:
        port = free_port()  # a range of one port: the one replica takes it
        env[f"RAY_SERVE_DIRECT_INGRESS_MIN_{protocol}_PORT"] = str(port)
        env[f"RAY_SERVE_DIRECT_INGRESS_MAX_{protocol}_PORT"] = str(port + 1)
    return env


class WorkloadModel:
    """One benchmark workload as a Serve deployment class (one replica holds the model)."""

    def __init__(self, workload: str, max_batch_size: int, batch_wait_s: float) -> None:
        self.workload = workload
        self.model = workloads.make_model(workload)
        # The batch parameters come from the command line, so set them on the handler here.
        self.predict_batch.set_max_batch_size(max_batch_size)
        self.predict_batch.set_batch_wait_timeout_s(batch_wait_s)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
    async def predict_batch(self, rows: list[list[float]]) -> list[int]:
        return self.model(workloads.as_batch(rows, self.workload))

    async def __call__(self, request: Request) -> dict[str, int]:
        body = await request.json()
        return {"output": await self.predict_batch(body["input"])}


def _group_members() -> list[int]:
    """Live processes of this process group other than this one."""
    me = os.getpid()
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The fields after the ")" that ends the command name: state, ppid, pgrp, ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            if pid != me and int(fields[2]) == me and fields[0] != "Z":
                members.append(pid)
    return members


def _shut_down_ray(timeout_s: float) -> NoReturn:
    """Stop the local Ray cluster within ``timeout_s``, then exit this process.

    ``ray.shutdown()`` alone ends every process that ray.init started within about 2 s, but
    when the whole process group got SIGTERM at once (as from the harness), the GCS and raylet
    are going away under it and its driver-disconnect step can block for 10 s or more. So it
    gets ``timeout_s``; whatever of this process group is still alive then gets SIGKILL.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = threading.Thread(target=ray.shutdown, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if os.getpgrp() == os.getpid():  # only when this process leads its group (the harness's case)
        for pid in _group_members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    sys.stdout.flush()
    # Skip the atexit hooks: Ray registers ray.shutdown() there, which could block again.
    os._exit(0)


def _raise_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> NoReturn:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True, choices=workloads.WORKLOADS)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--temp-dir", required=True, help="Ray's session and log directory")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    p.add_argument("--max-ongoing-requests", type=int, default=128)
    p.add_argument("--ingress", choices=("haproxy", "proxy"), default="haproxy")
    a = p.parse_args()

    for key, value in _ray_env(a.ingress).items():
        os.environ.setdefault(key, value)
    ray.init(
        address="local",  # always a fresh cluster owned by this process, never a running one
        num_cpus=2,
        include_dashboard=False,  # no dashboard web server
        _node_ip_address="127.0.0.1",
        _temp_dir=a.temp_dir,
        object_store_memory=128 * 1024 * 1024,  # requests are small; the default takes 30% RAM
        log_to_driver=False,
    )
    # After ray.init, which installs a C++ SIGTERM handler that would end this process at once.
    # Raising unwinds from wherever the main thread is, serve.run() included (the harness may
    # stop the server as soon as a query is answered, before serve.run() has returned).
    signal.signal(signal.SIGTERM, _raise_exit)
    signal.signal(signal.SIGINT, _raise_exit)
    try:
        quiet = LoggingConfig(enable_access_log=False, log_level="WARNING")
        serve.start(
            proxy_location=ProxyLocation.HeadOnly,
            http_options=HTTPOptions(host="127.0.0.1", port=a.port),
            logging_config=quiet,
        )
        deployment = serve.deployment(
            WorkloadModel,
            name=f"{a.workload}-model",
            num_replicas=1,
            # Serve's default of 5 would cap every batch at 5 requests; allow two full batches
            # (one running, one filling).
            max_ongoing_requests=a.max_ongoing_requests,
            ray_actor_options={"num_cpus": 1},
            logging_config=quiet,
        )
        app = deployment.bind(a.workload, a.max_batch_size, a.batch_wait_ms / 1000.0)
        # Returns once the replica's __init__ (the model build) has finished.
        serve.run(app, name=a.workload, route_prefix="/predict", logging_config=quiet)
        print(f"ray serve ready on 127.0.0.1:{a.port}/predict", flush=True)
        while True:
            time.sleep(3600)
    finally:
        # No serve.shutdown() first: under the harness the Serve actors got the same SIGTERM.
        _shut_down_ray(timeout_s=3.0)


if __name__ == "__main__":
    main()

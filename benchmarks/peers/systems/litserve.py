"""LitServe: one uvicorn API-server process plus one inference-worker process."""

from __future__ import annotations

from pathlib import Path

from spec import PEERS_DIR, Launch, NativeRequest, System, input_request, script_argv

SERVER = PEERS_DIR / "servers" / "litserve" / "server.py"
MAX_BATCH_SIZE = 64
BATCH_TIMEOUT_MS = 2.0


def _launch(workload: str, py: Path, http_port: int, grpc_port: int, workdir: Path) -> Launch:
    argv = script_argv(
        py,
        SERVER,
        workload=workload,
        port=http_port,
        max_batch_size=MAX_BATCH_SIZE,
        batch_timeout_ms=BATCH_TIMEOUT_MS,
    )
    # /health answers 503 until the inference worker has run setup() (the model is built).
    return Launch(argv=argv, ready_path="/health")


def _native(workload: str, row: list[float]) -> NativeRequest:
    return input_request("/predict", row)


SYSTEM = System(
    name="litserve",
    title="LitServe",
    requirements=["litserve>=0.2.19,<0.3"],
    version_of=["litserve", "fastapi", "uvicorn"],
    launch=_launch,
    native=_native,
    batching=(
        f"LitAPI(max_batch_size={MAX_BATCH_SIZE}, batch_timeout={BATCH_TIMEOUT_MS / 1000:g}) "
        "(seconds; set on LitAPI, as LitServe 0.2.x asks, not on LitServer). The inference "
        "worker takes requests from its queue until the batch is full or the timeout has run "
        "out since it started collecting, so a lone request waits the whole 2 ms. Batch cap 64 "
        "(a power of two, far above the 16-32 concurrent requests of a closed-loop run on two "
        "cores); 2 ms is small next to the HTTP and queue overhead per request. A timeout of 0 "
        "is not an option here: the batched loop then polls the queue without blocking and "
        "keeps a core busy."
    ),
    notes=(
        "LitServer(accelerator='cpu', workers_per_device=1) run with num_api_servers=1: one "
        "uvicorn API-server process (forked) and one inference-worker process (spawned) that "
        "builds the model in setup(); LitServe also runs a multiprocessing manager process, whose "
        "queues carry every request to the worker and every answer back (two round trips through "
        "the manager per request). Bound to 127.0.0.1. uvicorn's access log off "
        "(access_log=False), log level warning, no client.py generated; request tracking "
        "(track_requests) and auth are off by default. decode_request takes the raw JSON dict "
        "(no pydantic model), answer {'output': label}. fast_queue=True (ZMQ transport) is not "
        "used: LitServe 0.2.19 passes it to TransportConfig under a wrong keyword "
        "(transport_config= instead of transport_type=), so it has no effect. SIGTERM is turned "
        "into KeyboardInterrupt, the one signal LitServer.run shuts its worker and manager down on."
    ),
)

"""TorchServe with a custom handler (``servers/torchserve/``).

Native API: ``POST /predictions/<model>`` with ``{"input": [d floats]}``, answered with
``{"output": label}``. TorchServe speaks V2 only through its KServe wrapper, not used here.
"""

from __future__ import annotations

from pathlib import Path

from spec import PEERS_DIR, Launch, NativeRequest, System, input_request, script_argv

SERVER = PEERS_DIR / "servers" / "torchserve" / "serve.py"
MODEL = "m"
BATCH_SIZE = 64
MAX_BATCH_DELAY_MS = 2
# One backend worker: TorchServe's performance guide starts CPU models at physical cores / 2,
# and 2 cores here are shared with the Java frontend and the load generator.
WORKERS = 1


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
            batch_size=BATCH_SIZE,
            max_batch_delay_ms=MAX_BATCH_DELAY_MS,
            workers=WORKERS,
        ),
        # Not /ping: it says Healthy once the worker process runs, before the model has loaded
        # (0.12). This GET reaches the handler, which answers an empty body only once loaded.
        ready_path=f"/predictions/{MODEL}",
    )


def _native(workload: str, row: list[float]) -> NativeRequest:
    del workload
    return input_request(f"/predictions/{MODEL}", row)


SYSTEM = System(
    name="torchserve",
    title="TorchServe",
    # The backend worker needs PyYAML (for model-config.yaml); Java 17 comes from the system.
    requirements=["torchserve>=0.12.0,<0.13", "torch-model-archiver>=0.12.0,<0.13", "pyyaml"],
    version_of=["torchserve", "torch-model-archiver", "pyyaml"],
    launch=_launch,
    native=_native,
    batching=(
        f"frontend batching: batch_size={BATCH_SIZE}, max_batch_delay={MAX_BATCH_DELAY_MS} ms "
        "(set at registration, config.properties 'models'); a batch leaves when full or "
        "max_batch_delay after the worker took its first request; one batch in flight per worker"
    ),
    notes=(
        f"custom handler (plain class, no BaseHandler); {WORKERS} backend worker process beside "
        "the Java frontend; async_logging=true (docs: for lightweight models), our log4j2.xml "
        "(warnings only: no access log, no per-request metric or DEBUG lines), "
        "disable_system_metrics=true; token auth off; default job_queue_size=100 (503 beyond); "
        "management, metrics and gRPC-management ports on free loopback ports, its own (non-V2) "
        "gRPC inference API on grpc_port; readiness: /ping is Healthy before the model loads, "
        'so ready_path is GET /predictions/m, which the handler answers ({"ready": 1}) only '
        "once loaded (any empty body gets that answer)"
    ),
)

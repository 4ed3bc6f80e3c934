"""NVIDIA Triton Inference Server through PyTriton (``nvidia-pytriton``), on CPU.

The server script is ``servers/triton/serve.py``; Triton speaks the V2 / Open Inference
Protocol natively, so the native request is the V2 one, on HTTP and gRPC.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from spec import PEERS_DIR, Launch, NativeRequest, System, script_argv, v2_request

SERVER = PEERS_DIR / "servers" / "triton" / "serve.py"
MODEL = "m"
MAX_BATCH_SIZE = 64
# Triton's docs: start with no delay, add one only where it buys throughput within the
# latency budget; here it bought none (see batching below).
MAX_QUEUE_DELAY_US = 0


def _libdir(venv_python: Path) -> str:
    """The lib directory of the interpreter behind ``venv_python`` (holds its libpython)."""
    code = "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"
    out = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def launch(workload: str, py: Path, http_port: int, grpc_port: int, workdir: Path) -> Launch:
    # The Python-backend stub links libpython3.11.so dynamically; without this it may pick up
    # another build's copy and fail to load ("'_thread.RLock' object has no attribute
    # '_recursion_count'"). tritonserver passes our environment on to the stub.
    ld_path = ":".join(p for p in (_libdir(py), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    argv = script_argv(
        py,
        SERVER,
        workload=workload,
        http_port=http_port,
        grpc_port=grpc_port,
        workspace=workdir / "pytriton",
        max_batch_size=MAX_BATCH_SIZE,
        max_queue_delay_us=MAX_QUEUE_DELAY_US,
    )
    return Launch(
        argv=argv,
        env={"LD_LIBRARY_PATH": ld_path},
        # Ready only once model m is loaded (the server-wide /v2/health/ready is too).
        ready_path=f"/v2/models/{MODEL}/ready",
    )


def native(workload: str, row: list[float]) -> NativeRequest:
    del workload  # the shape comes from the row
    return v2_request(MODEL, row)


SYSTEM = System(
    name="triton",
    title="NVIDIA Triton Inference Server (PyTriton)",
    requirements=["nvidia-pytriton==0.7.0"],
    version_of=["nvidia-pytriton", "tritonclient"],
    launch=launch,
    native=native,
    v2_model=MODEL,
    v2_grpc=True,
    batching=(
        f"Triton dynamic batcher: max_batch_size={MAX_BATCH_SIZE}, "
        f"max_queue_delay_microseconds={MAX_QUEUE_DELAY_US}; no preferred_batch_size (Triton's "
        "docs keep it for backends with size-specific kernels), default queue policy "
        "(unbounded, no timeouts), 1 model instance. Triton's docs start from no delay and add "
        "one only where it buys throughput inside the latency budget; measured here (logreg, "
        "gRPC, perf_analyzer): 2000 us cost ~2 ms at concurrency 1 and gained nothing clear at 8, "
        "because the one busy instance lets requests queue anyway, so the delay is 0."
    ),
    notes=(
        "tritonserver 2.51.0 as bundled in the nvidia-pytriton wheel, CPU only. Processes: the "
        "server script (model + PyTriton inference thread), tritonserver (HTTP/gRPC/metrics on "
        "127.0.0.1), one Python-backend stub (the proxy model), PyTriton's tensor-store manager "
        "and multiprocessing resource trackers; batches cross stub -> script over ZeroMQ plus a "
        "shared-memory tensor store. LD_LIBRARY_PATH points at the interpreter's LIBDIR, else the "
        "stub loads another libpython and fails ('_thread.RLock' ... '_recursion_count'). "
        "PyTriton knobs: one inference callable (= one Triton instance), strict=False (no "
        "per-call output validation), the default shared-memory tensor store (not "
        "PYTRITON_NO_TENSORSTORE's base64); the statistics API is opened (PyTriton 0.7 "
        "token-guards it by default) because perf_analyzer reads it, the other guarded APIs stay "
        "guarded. Metrics on a free loopback port named in the log; GPU/CPU metrics off; "
        "exit_timeout_secs=5. SIGTERM -> triton.stop(): tritonserver and stub exit in ~4 s; the "
        "tensor-store manager dies on the group SIGTERM first, so the stub logs a harmless "
        "ConnectionRefusedError while finalizing."
    ),
)

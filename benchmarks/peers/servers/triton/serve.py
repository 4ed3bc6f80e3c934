"""NVIDIA Triton Inference Server, through PyTriton, serving one peer-benchmark workload.

    python serve.py --workload mlp --http-port 8000 --grpc-port 8001 --workspace /tmp/w

PyTriton starts the ``tritonserver`` binary shipped in its wheel, with a Python-backend stub
process that forwards each batch (over ZeroMQ and a shared-memory tensor store) to the
``@batch`` function below, which runs in this process. Triton's dynamic batcher forms the
batches. The model is ``m``: input ``input`` FP32 ``(d,)``, output ``output`` INT64 ``(1,)``,
both with a leading batch dimension, so a V2 request carries shape ``[1, d]``.

SIGTERM or SIGINT stops Triton through PyTriton (tritonserver and its stub exit, the
workspace is removed) before this process exits.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import numpy as np
import numpy.typing as npt
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

# The harness puts benchmarks/peers on PYTHONPATH; fall back to the path for direct runs.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from ports import LOOPBACK, free_port
from workloads import INPUT_SIZE, make_model

LOG = logging.getLogger("triton-peer")
MODEL = "m"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", required=True, choices=sorted(INPUT_SIZE))
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, default=0, help="0: pick a free one")
    p.add_argument("--workspace", type=Path, required=True, help="must not exist yet")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-queue-delay-us", type=int, default=2000)
    return p.parse_args()


def main() -> int:
    a = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    predict = make_model(a.workload)

    @batch
    def infer(**inputs: npt.NDArray[np.float32]) -> dict[str, npt.NDArray[np.int64]]:
        labels = predict(inputs["input"])
        return {"output": np.asarray(labels, dtype=np.int64).reshape(-1, 1)}

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        LOG.info("signal %d: stopping Triton", signum)
        stop.set()

    # Handlers first: a SIGTERM during start-up must still stop tritonserver through PyTriton.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    metrics_port = a.metrics_port or free_port()
    config = TritonConfig(
        http_address=LOOPBACK,
        http_port=a.http_port,
        grpc_address=LOOPBACK,
        grpc_port=a.grpc_port,
        metrics_address=LOOPBACK,
        metrics_port=metrics_port,
        # No GPU here, and CPU metrics would only add a polling thread on a 2-core machine.
        allow_gpu_metrics=False,
        allow_cpu_metrics=False,
        # Keep shutdown well inside the harness's 15 s grace before SIGKILL.
        exit_timeout_secs=5,
        log_verbose=0,
    )
    model_config = ModelConfig(
        batching=True,
        max_batch_size=a.max_batch_size,
        # No preferred sizes: Triton's docs keep those for backends with size-specific kernels.
        batcher=DynamicBatcher(max_queue_delay_microseconds=a.max_queue_delay_us),
    )
    # PyTriton 0.7 guards some Triton APIs with a generated access token by default. Lift that
    # only for the read-only statistics API, which perf_analyzer reads after each window.
    security = TritonSecurityConfig(
        restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"]
    )
    with Triton(config=config, workspace=a.workspace, security_config=security) as triton:
        # One callable = one model instance (one batch at a time), like clipper-serve's single
        # model process. strict=False skips PyTriton's per-call output validation.
        triton.bind(
            model_name=MODEL,
            infer_func=infer,
            inputs=[Tensor(name="input", dtype=np.float32, shape=(INPUT_SIZE[a.workload],))],
            outputs=[Tensor(name="output", dtype=np.int64, shape=(1,))],
            config=model_config,
            strict=False,
        )
        LOG.info(
            "serving %s as model %r: http %d, grpc %d, metrics http://%s:%d/metrics",
            a.workload,
            MODEL,
            a.http_port,
            a.grpc_port,
            LOOPBACK,
            metrics_port,
        )
        while not stop.wait(1.0):
            if not triton.is_alive():
                LOG.error("tritonserver or the model proxy died")
                return 1
    LOG.info("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

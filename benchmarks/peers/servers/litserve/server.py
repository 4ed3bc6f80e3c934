"""LitServe server for one peer-benchmark workload: ``POST /predict``, ``{"input": [d floats]}``.

Run with the litserve venv's python (the harness sets PYTHONPATH to ``benchmarks/peers``):

    python server.py --workload mlp --port 8000 --max-batch-size 64 --batch-timeout-ms 2

One uvicorn API-server process and one inference-worker process (LitServe's own layout for one
CPU device). The worker builds the model in ``setup``, and ``/health`` answers 503 until that
is done. The answer is ``{"output": <int label>}``.
"""

import argparse
import os
import signal
import sys
from types import FrameType
from typing import Any

import litserve as ls
import numpy as np
import workloads


class WorkloadAPI(ls.LitAPI):
    """One benchmark workload behind LitServe's batched loop."""

    def __init__(self, workload: str, max_batch_size: int, batch_timeout_s: float) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout_s)
        self.workload = workload

    def setup(self, device: str) -> None:
        # Runs in the inference worker process (spawned), so the model lives only there.
        self.model = workloads.make_model(self.workload)

    # ``request`` is unannotated on purpose: LitServe turns this annotation into the FastAPI body
    # type, and none means the raw JSON dict, without a pydantic validation pass per request.
    def decode_request(self, request, **kwargs: Any) -> list[float]:
        return request["input"]

    def batch(self, inputs: list[list[float]]) -> np.ndarray:
        return workloads.as_batch(inputs, self.workload)

    def predict(self, x: np.ndarray, **kwargs: Any) -> list[int]:
        return self.model(x)

    def unbatch(self, output: list[int]) -> list[int]:
        return output

    def encode_response(self, output: int, **kwargs: Any) -> dict[str, int]:
        return {"output": int(output)}


MAIN_PID = os.getpid()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # LitServer.run shuts its workers and manager down on KeyboardInterrupt only. The forked
    # uvicorn process inherits this handler (uvicorn re-raises SIGTERM after its own shutdown):
    # there, just exit.
    if os.getpid() != MAIN_PID:
        raise SystemExit(0)
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True, choices=workloads.WORKLOADS)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--batch-timeout-ms", type=float, default=2.0)
    a = p.parse_args()

    api = WorkloadAPI(a.workload, a.max_batch_size, a.batch_timeout_ms / 1000.0)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    signal.signal(signal.SIGTERM, _interrupt)
    server.run(
        host="127.0.0.1",
        port=a.port,
        num_api_servers=1,
        log_level="warning",
        generate_client_file=False,
        access_log=False,  # passed on to uvicorn: no log line per request
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

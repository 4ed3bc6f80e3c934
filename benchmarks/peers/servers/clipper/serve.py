"""clipper-serve for the peer benchmark: one application ``bench`` with one model ``m``.

    python servers/clipper/serve.py --workload mlp --port 1337 --grpc-port 8001

The application takes ``floats`` (V2 datatype FP32), has a 20 ms latency SLO and the
prediction cache off: every load generator sends the same input, and no peer has a cache (a
cache would answer everything from memory). Batching is the product's default: the AIMD
controller with a 1 ms batch wait, one model process. The V2 model name is the application.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import uvloop
import workloads
from ports import free_port


class PeerModel:
    """The workload's model, rebuilt from its name in the container process when unpickled
    (so per-process settings such as torch's thread count apply there)."""

    def __init__(self, workload: str) -> None:
        self.workload = workload
        self._predict = workloads.make_model(workload)

    def __getstate__(self) -> dict[str, Any]:
        return {"workload": self.workload}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["workload"])  # type: ignore[misc]

    def predict(self, batch: np.ndarray) -> list[int]:
        return self._predict(batch)


async def run(args: argparse.Namespace) -> None:
    from clipper import BatchingConfig, Clipper

    async with Clipper(
        query_port=args.port, rpc_port=free_port(), admin_port=0, grpc_port=args.grpc_port
    ) as clipper:
        await clipper.register_application(
            "bench",
            input_type="floats",
            default_output="-1",
            latency_slo_micros=round(args.slo_ms * 1000),
            cache=False,
        )
        await clipper.deploy_model(
            "m",
            "1",
            PeerModel(args.workload),
            input_type="floats",
            batching=BatchingConfig(max_wait_micros=round(args.max_wait_ms * 1000)),
        )
        await clipper.link_model_to_app("bench", "m")
        print("ready", flush=True)
        await clipper.serve_forever()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", choices=workloads.WORKLOADS, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--max-wait-ms", type=float, default=1.0)
    args = p.parse_args()
    uvloop.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

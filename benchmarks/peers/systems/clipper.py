"""clipper-serve itself, installed from this checkout into its own venv like every peer."""

from __future__ import annotations

from pathlib import Path

from spec import PEERS_DIR, Launch, NativeRequest, System, input_request, script_argv

REPO = PEERS_DIR.parent.parent


def _launch(workload: str, python: Path, http_port: int, grpc_port: int, workdir: Path) -> Launch:
    return Launch(
        argv=script_argv(
            python,
            PEERS_DIR / "servers" / "clipper" / "serve.py",
            workload=workload,
            port=http_port,
            grpc_port=grpc_port,
        ),
        ready_path="/v2/models/bench/ready",  # 200 once a replica is connected
        ready_timeout_s=60,
    )


def _native(workload: str, row: list[float]) -> NativeRequest:
    return input_request("/bench/predict", row)


SYSTEM = System(
    name="clipper",
    title="clipper-serve",
    requirements=["-e", str(REPO)],
    version_of=["clipper-serve", "grpcio"],
    launch=_launch,
    native=_native,
    v2_model="bench",
    v2_grpc=True,
    batching="AIMD (the default controller), 1 ms batch wait, no cap; 20 ms SLO",
    notes="1 frontend process (uvloop) + 1 model container process; prediction cache off",
)

"""What the peer benchmark needs to know about one serving system (one module per system).

Each ``systems/<name>.py`` defines ``SYSTEM = System(...)``. The runner (``run.py``) installs
the system into its own virtual environment (``venvs/<name>``), starts it for one workload on
free ports, waits until it answers, drives it, and stops its whole process group.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Launch", "NativeRequest", "System", "input_request", "script_argv", "v2_request"]

PEERS_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Launch:
    """How to start the system for one workload."""

    argv: list[str]  # the server command (argv[0] usually the venv's python)
    env: dict[str, str] = field(default_factory=dict)  # added to os.environ
    cwd: str | None = None
    # GET this path on http_port until it answers 200 (then the system counts as ready) ...
    ready_path: str = "/"
    # ... and, if set, POST the native request once and require a 200 too.
    ready_timeout_s: float = 120.0


@dataclass(frozen=True)
class NativeRequest:
    """The system's own REST API for one query with one input row."""

    path: str  # e.g. "/predict"
    body: bytes  # the JSON body carrying ``example_input(workload)``


@dataclass(frozen=True)
class System:
    name: str  # short id, also the venv folder name
    title: str  # for the report, e.g. "Ray Serve"
    # pip requirement strings for the system's own venv (the runner adds numpy, scikit-learn,
    # and torch==2.13.0, the CPU build on this machine's disk, for the mlp workload).
    requirements: Sequence[str]
    # distributions whose versions go in the report
    version_of: Sequence[str]
    # launch(workload, venv_python, http_port, grpc_port, workdir) -> Launch
    launch: Callable[[str, Path, int, int, Path], Launch]
    # native(workload, input_row) -> NativeRequest
    native: Callable[[str, list[float]], NativeRequest]
    # the V2 model name when the system speaks the Open Inference Protocol, else None
    v2_model: str | None = None
    # does perf_analyzer drive it over V2 gRPC on grpc_port?
    v2_grpc: bool = False
    # extra perf_analyzer arguments the system needs (e.g. JSON tensors only)
    perf_analyzer_args: Sequence[str] = ()
    # batching settings, said in the report
    batching: str = ""
    # anything else the report must say (workers, tuning, workarounds)
    notes: str = ""
    # extra shell commands (run with bash) after the pip install, e.g. system packages
    post_install: Sequence[str] = ()


def script_argv(python: Path, server: Path, **flags: object) -> list[str]:
    """``python server --flag-name=value ...`` (underscores in flag names become dashes)."""
    return [str(python), str(server), *(f"--{k.replace('_', '-')}={v}" for k, v in flags.items())]


def input_request(path: str, row: list[float]) -> NativeRequest:
    """A request whose JSON body is ``{"input": [d floats]}``, one row."""
    return NativeRequest(path, json.dumps({"input": row}).encode())


def v2_request(model: str, row: list[float]) -> NativeRequest:
    """A V2 infer request for one row: input tensor ``input``, FP32, shape ``[1, d]``."""
    tensor = {"name": "input", "shape": [1, len(row)], "datatype": "FP32", "data": row}
    return NativeRequest(f"/v2/models/{model}/infer", json.dumps({"inputs": [tensor]}).encode())

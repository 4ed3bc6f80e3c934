"""Triton's ``perf_analyzer`` drives clipper-serve over V2 HTTP and gRPC with zero errors.

perf_analyzer is a C++ binary. The PyPI package ``perf-analyzer`` carries none; the
``tritonclient`` 2.49.0 wheel does (later wheels need glibc 2.38). ``.ci/run`` installs it in
``.venv-perf`` with the CUDA runtime library it links (``nvidia-cuda-runtime-cu12``) and
Debian's ``libb64-0d``, and sets ``CLIPPER_REQUIRE_PERF_ANALYZER=1`` so that a missing binary
fails instead of skipping. ``CLIPPER_PERF_ANALYZER`` points at another binary.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from clipper import BatchingConfig, Clipper
from clipper.choices import GRPC_TRANSPORTS
from tests.integration import models
from tests.integration.helpers import request

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-perf"


def _binary() -> tuple[Path, dict[str, str]] | None:
    explicit = os.environ.get("CLIPPER_PERF_ANALYZER")
    binary = Path(explicit) if explicit else VENV / "bin" / "perf_analyzer"
    if not binary.exists():
        return None
    env = dict(os.environ)
    cudart = sorted((binary.parent.parent / "lib").glob("python3*/site-packages/nvidia/*/lib"))
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [*map(str, cudart), *filter(None, [env.get("LD_LIBRARY_PATH")])]
    )
    return binary, env


FOUND = _binary()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(
        FOUND is None and os.environ.get("CLIPPER_REQUIRE_PERF_ANALYZER") != "1",
        reason="perf_analyzer not installed (see .ci/run: .venv-perf)",
    ),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=GRPC_TRANSPORTS.names)
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Clipper]:
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, grpc_port=0, grpc_transport=request.param
    ) as c:
        await c.deploy_model(
            "sums",
            "1",
            models.row_sums,
            input_type="floats",
            batching=BatchingConfig(max_wait_micros=1000),
        )
        await c.register_application("bench", "floats", "-1.0", 1_000_000)
        await c.link_model_to_app("bench", "sums")
        yield c


async def _perf_analyzer(
    protocol: str, url: str, tmp: Path
) -> tuple[int, str, list[dict[str, str]]]:
    assert FOUND is not None, "perf_analyzer is required here (CLIPPER_REQUIRE_PERF_ANALYZER=1)"
    binary, env = FOUND
    report = tmp / f"{protocol}.csv"
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        "-m", "bench",
        "-u", url,
        "-i", protocol,
        "--concurrency-range", "4",
        # A fixed number of requests per level: its stability search fails on a noisy box.
        "--request-count", "1000",
        "--shape", "input:16",
        "-f", str(report),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    rows = list(csv.DictReader(io.StringIO(report.read_text()))) if report.exists() else []
    return proc.returncode or 0, out.decode(errors="replace"), rows


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_perf_analyzer_completes_without_errors(
    served: Clipper, protocol: str, tmp_path: Path
) -> None:
    c = served
    assert c.grpc is not None
    port = c.query_port if protocol == "http" else c.grpc.port
    rc, out, rows = await _perf_analyzer(protocol, f"127.0.0.1:{port}", tmp_path)
    assert rc == 0, out
    assert "error" not in out.lower(), out
    assert [r["Concurrency"] for r in rows] == ["4"], out
    for r in rows:
        assert float(r["Inferences/Second"]) > 0, r
    # Every inference was answered by the model: no default outputs (random data included).
    resp = await request(f"{c.query_url}/metrics", headers={"Accept": "application/json"})
    stats = resp.json()
    assert stats['clipper_app_requests_total{app="bench"}'] > 0
    assert not [k for k, v in stats.items() if k.startswith("clipper_app_default") and v], stats

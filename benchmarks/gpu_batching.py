"""GPU replicas and adaptive batching: batch size against latency, and throughput at the SLO,
for a PyTorch model on CPU and on a GPU the local manager pins its replica to.

    python benchmarks/gpu_batching.py [--devices cpu,cuda] [--sizes 1,8,32,128] [--slo-ms 20]

One ``clipper start`` frontend (a subprocess on free ports, local manager). The model: a
PyTorch MLP (``--width`` hidden units, three layers, ``--inputs`` features) packaged with
``clipper.deployers.package``; on the GPU it is deployed with the label ``local:gpus=0``
(``CUDA_VISIBLE_DEVICES=0`` and ``CLIPPER_DEVICE=cuda`` in its container: the module and every
batch on the device). For each device, each fixed batch size in ``--sizes`` and then the AIMD
controller (the default), a new version of the model is deployed with that batching and driven
by a closed loop of ``--clients`` keep-alive connections for ``--duration`` seconds (every input
distinct, the cache off). Per run it prints the throughput, the client p50/p99, the share of
default outputs, and, from the frontend's metrics, the mean batch size the replica was sent and
the mean round trip of a batch. The fixed sizes give the batch-size/latency curve; the AIMD row
is what the controller chose against the SLO. Writes results.json under benchmarks/results/;
the frontend and its replicas are stopped by PID at the end. Runs on a CPU-only machine with
``--devices cpu`` (the default when torch sees no GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import loadgen  # noqa: E402
from tests.integration.frontend_process import FrontendProcess  # noqa: E402
from tests.integration.helpers import request  # noqa: E402


class Frontend(FrontendProcess):
    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.query}"


def _artifact(directory: Path, inputs: int, width: int) -> Path:
    import torch

    from clipper.deployers import package

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(inputs, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )  # fmt: skip
    return package(net, directory / f"mlp-{inputs}-{width}")


def _sample(text: str, name: str, version: str) -> float:
    """The sum of a metric's samples for model ``m`` at ``version`` (0 when absent)."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}\{{([^}}]*)\}} ([0-9.eE+-]+)$", re.M)
    for labels, value in pattern.findall(text):
        if 'model="m"' in labels and f'version="{version}"' in labels:
            total += float(value)
    return total


async def _metrics(fe: Frontend) -> str:
    return (await request(f"{fe.query_url}/metrics?format=prometheus", limit_s=30)).body.decode()


async def _one_run(  # noqa: PLR0917
    fe: Frontend, artifact: Path, device: str, batching: dict[str, Any], version: str,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    labels = ["local:gpus=0"] if device == "cuda" else []
    await fe.admin_ok(
        "deploy_model",
        {"model_name": "m", "model_version": version, "input_type": "floats",
         "artifact_path": str(artifact), "num_replicas": 1, "labels": labels,
         "batching": batching},
        limit_s=180,
    )  # fmt: skip
    await fe.admin_ok("set_model_version", {"model_name": "m", "model_version": version})
    if version == "1":  # the application's link, once its model exists
        await fe.admin_ok("add_model_links", {"app_name": "gpu", "model_names": ["m"]})
    body = orjson.dumps({"input": [0.5] * args.inputs})
    url = f"{fe.query_url}/gpu/predict"
    # Warm-up: the first batches (CUDA context, kernels, the controller's first steps).
    await loadgen.closed_loop_async(url, body, args.clients, duration_s=2.0)
    before = await _metrics(fe)
    got = await loadgen.closed_loop_async(url, body, args.clients, duration_s=args.duration)
    after = await _metrics(fe)

    def delta(name: str) -> float:
        return _sample(after, name, version) - _sample(before, name, version)

    batches = delta("clipper_model_batch_size_count")
    out = {
        "device": device,
        "batching": batching,
        "throughput_rps": round(got.throughput_rps, 1),
        # Answered by the model (not the default): what the batch size buys.
        "goodput_rps": round(got.throughput_rps * (1 - got.default_share), 1),
        "p50_ms": round(got.p50_us / 1e3, 2),
        "p99_ms": round(got.p99_us / 1e3, 2),
        "default_share": round(got.default_share, 4),
        "errors": got.errors,
        "mean_batch": round(delta("clipper_model_batch_size_sum") / batches, 1) if batches else 0,
        "mean_batch_rtt_ms": round(
            1e3
            * delta("clipper_replica_batch_latency_seconds_sum")
            / max(delta("clipper_replica_batch_latency_seconds_count"), 1),
            2,
        ),
    }
    name = batching.get("max_batch_size") if batching["controller"] == "fixed" else "aimd"
    print(
        f"{device:5s} {name!s:>5} {out['throughput_rps']:8.1f}/s goodput "
        f"{out['goodput_rps']:8.1f}/s p50 {out['p50_ms']:6.2f} ms "
        f"p99 {out['p99_ms']:6.2f} ms defaults {out['default_share']:6.2%} "
        f"batch {out['mean_batch']:6.1f} rtt {out['mean_batch_rtt_ms']:7.2f} ms",
        flush=True,
    )
    return out


async def _main(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="clipper-gpu-") as tmp:
        artifact = _artifact(Path(tmp), args.inputs, args.width)
        fe = Frontend(Path(tmp) / "state")
        await fe.start()
        try:
            await fe.admin_ok(
                "add_app",
                {"name": "gpu", "input_type": "floats", "default_output": "-1",
                 "latency_slo_micros": int(args.slo_ms * 1000), "cache": False},
            )  # fmt: skip
            runs = [{"controller": "fixed", "max_batch_size": b} for b in args.sizes]
            runs.append({"controller": "aimd"})
            n = 0
            for device in args.devices:
                for batching in runs:
                    n += 1
                    results.append(await _one_run(fe, artifact, device, batching, str(n), args))
        finally:
            fe.cleanup()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", default="", help="cpu,cuda (default: cuda too if torch sees one)")
    p.add_argument("--sizes", default="1,8,32,128", help="fixed batch sizes to measure")
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--inputs", type=int, default=784)
    p.add_argument("--width", type=int, default=1024)
    args = p.parse_args(argv)
    if args.devices:
        args.devices = args.devices.split(",")
    else:
        import torch

        args.devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    started = time.strftime("%Y%m%d-%H%M%S")
    results = asyncio.run(_main(args))
    out_dir = HERE / "results" / f"gpu-{started}"
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"args": {k: v for k, v in vars(args).items()}, "runs": results}
    (out_dir / "results.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    print(f"wrote {out_dir / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

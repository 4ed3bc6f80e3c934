"""Cold start from zero replicas, per deployer: from a query's request to its first prediction.

    python benchmarks/wake_from_zero.py [--wakes 3] [--frameworks sklearn,torch,onnx,xgboost,python]

One in-process frontend (local manager, free ports). Each framework's model is trained here on
a small data set, packaged (clipper.deployers.package) and deployed, then autoscaled with
``min_replicas`` 0 and a one-second idle window. Per wake: wait until the version is at zero
replicas and its container process is gone, then time one HTTP predict over loopback (SLO 60
s, so it is held until the replica answers) and read how long the wake took up to the replica
connecting (the scheduler's ``ColdStart.last_s``). It prints, per framework, the median and
range of both, and writes results.json under benchmarks/results/. Every process is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from clipper import Clipper
from clipper.deployers import package

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.integration.helpers import pid_alive, predict_ok, wait_for  # noqa: E402

SLO_US = 60_000_000


def _digits() -> tuple[Any, Any]:
    from sklearn.datasets import load_digits

    data = load_digits()
    return data.data / 16.0, data.target


def _mlp(X: Any, y: Any) -> Any:
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    xt, yt = torch.tensor(X, dtype=torch.float32), torch.tensor(y)
    for _ in range(10):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    return net.eval()


def sklearn_model(tmp: Path) -> Any:
    from sklearn.linear_model import LogisticRegression

    X, y = _digits()
    return LogisticRegression(max_iter=200).fit(X, y)


def torch_model(tmp: Path) -> Any:
    return _mlp(*_digits())


def onnx_model(tmp: Path) -> Any:
    import torch

    file = tmp / "mlp.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            _mlp(*_digits()), (torch.zeros(2, 64),), str(file), dynamo=False,
            input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
        )  # fmt: skip
    return file


def xgboost_model(tmp: Path) -> Any:
    import xgboost as xgb

    X, y = _digits()
    return xgb.XGBClassifier(n_estimators=10, max_depth=3, n_jobs=1).fit(X, y)


def weighted_sum(xs: Any) -> list[float]:
    return [float(np.dot(x, np.arange(1, len(x) + 1))) for x in xs]


def python_model(tmp: Path) -> Any:
    return weighted_sum


BUILDERS: dict[str, Callable[[Path], Any]] = {
    "sklearn": sklearn_model,
    "torch": torch_model,
    "onnx": onnx_model,
    "xgboost": xgboost_model,
    "python": python_model,
}


def _stopped(pids: list[int]) -> bool:
    return not any(pid_alive(p) for p in pids)


async def measure(c: Clipper, name: str, artifact: Path, wakes: int) -> dict[str, Any]:
    await c.register_application(name, "doubles", "-1", SLO_US)
    await c.deploy_model(name, "1", artifact=str(artifact), input_type="doubles")
    await c.link_model_to_app(name, name)
    row = {"input": [0.5] * 64}
    first = await predict_ok(c.query_url, name, row, limit_s=120)
    assert first["default"] is False, first
    await c.set_autoscale(
        name, min_replicas=0, max_replicas=1, interval_s=0.2, up_window_s=1.0,
        down_window_s=1.0, scale_to_zero_after_s=1.0,
    )  # fmt: skip
    sched = c.schedulers[name, "1"]
    request_s: list[float] = []
    connect_s: list[float] = []
    for i in range(wakes):
        row = {"input": [0.5] * 63 + [i / 100]}  # a new input: no answer from the cache
        pids = [r.pid for r in c.manager.replicas(name, "1") if r.pid is not None]
        await wait_for(
            lambda: c.registry.models[name]["1"].num_replicas == 0 and not sched.replicas,
            limit_s=60, what="scaled to zero",
        )  # fmt: skip
        await wait_for(functools.partial(_stopped, pids), limit_s=30, what="stopped")
        t0 = time.perf_counter()
        doc = await predict_ok(c.query_url, name, row, limit_s=120)
        request_s.append(time.perf_counter() - t0)
        assert doc["default"] is False, doc
        assert sched.cold is not None and sched.cold.last_s is not None
        connect_s.append(sched.cold.last_s)
    out = {
        "framework": name,
        "request_to_prediction_s": request_s,
        "wake_to_connected_s": connect_s,
        "median_s": statistics.median(request_s),
    }
    print(
        f"{name:8s} request->prediction median {statistics.median(request_s) * 1e3:6.0f} ms "
        f"({min(request_s) * 1e3:.0f}-{max(request_s) * 1e3:.0f}); wake->connected median "
        f"{statistics.median(connect_s) * 1e3:6.0f} ms", flush=True,
    )  # fmt: skip
    return out


async def run(frameworks: list[str], wakes: int) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        async with Clipper(query_port=0, rpc_port=0, admin_port=0, state_dir=root / "state") as c:
            for name in frameworks:
                artifact = package(BUILDERS[name](root), root / f"artifact-{name}")
                results.append(await measure(c, name, artifact, wakes))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wakes", type=int, default=3)
    p.add_argument("--frameworks", default=",".join(BUILDERS))
    args = p.parse_args(argv)
    names = [n for n in args.frameworks.split(",") if n]
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        p.error(f"unknown frameworks {unknown}; expected some of {sorted(BUILDERS)}")
    results = asyncio.run(run(names, args.wakes))
    out_dir = HERE / "results" / f"wake-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Framework deployers end to end: package() -> a real container process -> HTTP answers.

Each framework's model is trained here on a small sklearn data set, packaged as an artifact
directory, deployed to its own container (which loads it with clipper.deployers.load), and
queried over HTTP; every answer must come from the model (not the default output) and equal
the model's own prediction for that row. A framework that is not installed is skipped.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio

from clipper import Clipper
from clipper.deployers import package
from tests.integration.helpers import predict_ok

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SLO_US = 5_000_000  # generous: these tests are about answers, not latency
N_ROWS = 8

sklearn_datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn is not installed")


def _skip_unless(module: str, extra: str) -> Any:
    return pytest.importorskip(module, reason=f"{module} is not installed (the {extra} extra)")


def _digits() -> tuple[Any, Any]:
    data = sklearn_datasets.load_digits()
    return data.data, data.target


def _iris() -> tuple[Any, Any]:
    data = sklearn_datasets.load_iris()
    return data.data, data.target_names[data.target]


def _torch_mlp(X: Any, y: Any) -> Any:
    torch = _skip_unless("torch", "torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    xt, yt = torch.tensor(X, dtype=torch.float32), torch.tensor(y)
    for _ in range(30):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    return net.eval()


def _torch_predict(net: Any, X: Any) -> list[Any]:
    import torch

    with torch.no_grad():
        out: list[Any] = net(torch.tensor(X, dtype=torch.float32)).tolist()
    return out


# -- one builder per framework: (model to package, rows to send, expected outputs, exact?) ---


def build_sklearn(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    from sklearn.linear_model import LogisticRegression

    X, y = _iris()
    model = LogisticRegression(max_iter=500).fit(X, y)
    rows = X[::19][:N_ROWS]
    return model, rows, model.predict(rows).tolist(), True


def build_torch(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    X, y = _digits()
    X = X / 16.0
    net = _torch_mlp(X, y)
    rows = X[::97][:N_ROWS]
    return net, rows, _torch_predict(net, rows), False


def build_onnx(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    _skip_unless("onnxruntime", "onnx")
    _skip_unless("onnx", "onnx")
    X, y = _digits()
    X = X / 16.0
    net = _torch_mlp(X, y)
    import torch

    file = tmp / "mlp.onnx"
    with warnings.catch_warnings():
        # The TorchScript-based exporter (deprecated) needs no onnxscript package.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            net, (torch.zeros(2, 64),), str(file), dynamo=False,
            input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
        )  # fmt: skip
    rows = X[::97][:N_ROWS]
    return file, rows, _torch_predict(net, rows), False


def build_xgboost(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    xgb = _skip_unless("xgboost", "xgboost")
    X, y = _digits()
    model = xgb.XGBClassifier(n_estimators=10, max_depth=3, n_jobs=1).fit(X, y)
    rows = X[::97][:N_ROWS]
    return model, rows, model.predict(rows).tolist(), True


def build_lightgbm(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    lgb = _skip_unless("lightgbm", "lightgbm")
    X, y = _iris()
    model = lgb.LGBMClassifier(n_estimators=10, verbose=-1, n_jobs=1).fit(X, y)
    rows = X[::19][:N_ROWS]
    return model, rows, model.predict(rows).tolist(), True


def weighted_sum(xs: Any) -> list[float]:
    """A plain function from this (not installed) module: it travels by value."""
    return [float(np.dot(x, np.arange(1, len(x) + 1))) for x in xs]


class Thresholder:
    def __init__(self, cut: float) -> None:
        self.cut = cut

    def predict(self, xs: Any) -> list[str]:
        return ["high" if float(np.mean(x)) > self.cut else "low" for x in xs]


def build_python(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    rows = np.arange(24.0).reshape(N_ROWS, 3)
    return weighted_sum, rows, weighted_sum(rows), True


def build_python_object(tmp: Path) -> tuple[Any, Any, list[Any], bool]:
    rows = np.arange(24.0).reshape(N_ROWS, 3)
    model = Thresholder(10.0)
    return model, rows, model.predict(rows), True


BUILDERS: dict[str, Callable[[Path], tuple[Any, Any, list[Any], bool]]] = {
    "sklearn": build_sklearn,
    "torch": build_torch,
    "onnx": build_onnx,
    "xgboost": build_xgboost,
    "lightgbm": build_lightgbm,
    "python": build_python,
    "python-object": build_python_object,
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clipper() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0) as c:
        yield c


@pytest.mark.parametrize("name", list(BUILDERS))
async def test_framework_model_serves_its_own_predictions(
    clipper: Clipper, tmp_path: Path, name: str
) -> None:
    model, rows, expected, exact = BUILDERS[name](tmp_path)
    framework = name.partition("-")[0]
    # Until Clipper.deploy_model packages models itself, deploy the artifact directory.
    artifact = package(model, tmp_path / f"m-{name}")
    assert orjson.loads((artifact / "clipper-model.json").read_bytes())["framework"] == framework
    app, model_name = f"app-{name}", f"m-{name}"
    await clipper.register_application(app, "doubles", "-1", SLO_US)
    await clipper.deploy_model(model_name, "1", artifact=str(artifact), input_type="doubles")
    await clipper.link_model_to_app(app, model_name)

    doc = await predict_ok(clipper.query_url, app, {"input_batch": rows.tolist()})
    answers = doc["batch_predictions"]
    assert len(answers) == len(rows)
    for row, answer, want in zip(rows, answers, expected, strict=True):
        assert answer["default"] is False, (framework, row, answer)
        if exact:
            assert answer["output"] == want, (framework, row)
        else:
            np.testing.assert_allclose(answer["output"], want, rtol=1e-4, atol=1e-5)
    # one query on its own (a batch of one in the container) answers the same
    single = await predict_ok(clipper.query_url, app, {"input": rows[-1].tolist()})
    assert single["default"] is False, single
    if exact:
        assert single["output"] == expected[-1]
    else:
        np.testing.assert_allclose(single["output"], expected[-1], rtol=1e-4, atol=1e-5)
    # the answers are not all one value: a constant model would not pass by accident
    assert len({repr(a["output"]) for a in answers}) > 1

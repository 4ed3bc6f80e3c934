"""clipper.deployers: package() then load() in process, per framework, and the error paths.

Each round trip feeds the loaded model what the container feeds it (a read-only ``(n, d)``
float64 view) and compares with the model's own prediction on the same rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipper.container.runtime import load_model
from clipper.deployers import FRAMEWORKS, MANIFEST, detect_framework, load, package
from clipper.errors import ConfigError

sklearn_datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn is not installed")


def readonly(x: Any) -> Any:
    """As the container delivers a numeric batch: a read-only view."""
    view = np.asarray(x).view()
    view.flags.writeable = False
    return view


def manifest(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((path / MANIFEST).read_text())
    return doc


@pytest.fixture(scope="module")
def iris() -> tuple[Any, Any]:
    data = sklearn_datasets.load_iris()
    return data.data, data.target_names[data.target]  # string labels: JSON str outputs


@pytest.fixture(scope="module")
def digits() -> tuple[Any, Any]:
    data = sklearn_datasets.load_digits()
    return data.data, data.target


# -- plain Python --------------------------------------------------------------------------


def row_sums(xs: Any) -> list[float]:
    return [float(x.sum()) for x in xs]


class Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def predict(self, xs: Any) -> list[float]:
        return [float(x[0]) * self.k for x in xs]


def test_function_round_trip(tmp_path: Path) -> None:
    X = np.arange(12.0).reshape(4, 3)
    path = package(row_sums, tmp_path / "f")
    assert path == tmp_path / "f"
    assert manifest(path)["framework"] == "python"
    assert manifest(path)["format"] == 1
    assert load(path).predict(readonly(X)) == [3.0, 12.0, 21.0, 30.0]


def test_object_round_trip_keeps_the_object(tmp_path: Path) -> None:
    model = load(package(Scaler(2.5), tmp_path / "o"))
    assert isinstance(model, Scaler)  # so the container still calls its setup()
    assert model.predict(readonly([[2.0, 0.0], [4.0, 1.0]])) == [5.0, 10.0]


def test_runtime_load_model_dispatches_artifact_directories(tmp_path: Path) -> None:
    model = load_model(package(row_sums, tmp_path / "f"))
    assert model.predict(readonly([[1.0, 2.0]])) == [3.0]  # type: ignore[attr-defined]


# -- scikit-learn --------------------------------------------------------------------------


def test_sklearn_classifier_round_trip(tmp_path: Path, iris: tuple[Any, Any]) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = iris
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)
    assert detect_framework(model) == "sklearn"
    path = package(model, tmp_path / "sk")
    doc = manifest(path)
    assert doc["framework"] == "sklearn"
    assert doc["estimator"] == "sklearn.pipeline.Pipeline"
    out = load(path).predict(readonly(X))
    assert out == model.predict(X).tolist()
    assert all(type(o) is str for o in out)  # numpy str_ became plain str
    assert len(set(out)) == 3


def test_sklearn_regressor_outputs_python_floats(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    from sklearn.linear_model import Ridge

    X, y = digits
    model = Ridge().fit(X, y)
    out = load(package(model, tmp_path / "r")).predict(readonly(X[:50]))
    assert all(type(o) is float for o in out)
    np.testing.assert_allclose(out, model.predict(X[:50]))


def test_sklearn_pipeline_with_a_local_step_loads_in_a_fresh_process(
    tmp_path: Path, iris: tuple[Any, Any]
) -> None:
    # The step's class lives in this test module, which the subprocess cannot import: it
    # must have been pickled by value.
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    X, y = iris
    model = make_pipeline(Doubler(), LogisticRegression(max_iter=500)).fit(X, y)
    path = package(model, tmp_path / "local")
    np.save(tmp_path / "X.npy", X)
    code = textwrap.dedent(
        f"""
        import json, numpy as np
        from clipper.deployers import load
        print(json.dumps(load({str(path)!r}).predict(np.load({str(tmp_path / "X.npy")!r}))))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == model.predict(X).tolist()


class Doubler:
    """A minimal sklearn-style transformer defined outside any installed package."""

    def fit(self, X: Any, y: Any = None) -> Doubler:
        return self

    def transform(self, X: Any) -> Any:
        return np.asarray(X) * 2.0

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {}

    def set_params(self, **params: Any) -> Doubler:
        return self


# -- PyTorch -------------------------------------------------------------------------------


def _torch_mlp(digits: tuple[Any, Any]) -> Any:
    torch = pytest.importorskip("torch", reason="torch is not installed (the torch extra)")
    torch.manual_seed(0)
    X, y = digits
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    xt = torch.tensor(X / 16.0, dtype=torch.float32)
    yt = torch.tensor(y)
    for _ in range(30):  # enough to separate the classes a little; accuracy is not the point
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()
    return net.eval()


def _torch_out(net: Any, X: Any) -> Any:
    import torch

    with torch.no_grad():
        return net(torch.tensor(X, dtype=torch.float32)).numpy()


def test_torch_round_trip_as_torchscript(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    net = _torch_mlp(digits)
    X = digits[0][:100] / 16.0
    assert detect_framework(net) == "torch"
    path = package(net, tmp_path / "t")
    assert manifest(path)["serialization"] == "torchscript"
    out = load(path).predict(readonly(X))
    assert len(out) == 100
    assert all(len(row) == 10 for row in out)
    np.testing.assert_allclose(out, _torch_out(net, X), rtol=1e-5, atol=1e-5)
    # the classes are not all the same: the comparison above is not between constants
    assert len(set(np.argmax(out, axis=1).tolist())) > 3


def test_torch_module_that_cannot_be_scripted_is_pickled(
    tmp_path: Path, digits: tuple[Any, Any]
) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the torch extra)")
    net = _torch_mlp(digits)

    from torch import nn

    class VarArgs(nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *xs: Any) -> Any:  # TorchScript rejects *args
            return self.inner(xs[0])

    wrapped = VarArgs(net).train()  # load() must switch it to eval mode
    path = package(wrapped, tmp_path / "p")
    assert manifest(path)["serialization"] == "cloudpickle"
    X = digits[0][:20] / 16.0
    loaded = load(path)
    assert loaded.module.training is False  # type: ignore[attr-defined]
    np.testing.assert_allclose(loaded.predict(readonly(X)), _torch_out(net, X), rtol=1e-5)


def test_torch_takes_a_read_only_float32_batch(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    net = _torch_mlp(digits)
    X = (digits[0][:5] / 16.0).astype(np.float32)  # "floats": no cast, so no implicit copy
    out = load(package(net, tmp_path / "t")).predict(readonly(X))
    np.testing.assert_allclose(out, _torch_out(net, X), rtol=1e-5, atol=1e-5)


# -- ONNX ----------------------------------------------------------------------------------


def test_onnx_file_exported_from_torch(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the onnx extra)")
    pytest.importorskip("onnx", reason="onnx is not installed (the onnx extra)")
    import torch

    net = _torch_mlp(digits)
    file = tmp_path / "mlp.onnx"
    with warnings.catch_warnings():
        # The TorchScript-based exporter (deprecated) needs no onnxscript package.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            net, (torch.zeros(2, 64),), str(file), dynamo=False,
            input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "n"}, "logits": {0: "n"}},
        )  # fmt: skip
    X = digits[0][:100] / 16.0
    expected = _torch_out(net, X)
    for i, source in enumerate([str(file), file]):
        assert detect_framework(source) == "onnx"
        path = package(source, tmp_path / f"o{i}")
        doc = manifest(path)
        assert (doc["input"], doc["input_type"], doc["output"]) == ("x", "tensor(float)", "logits")
        out = load(path).predict(readonly(X))  # float64 batch cast to the declared float32
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    assert file.exists()  # copied, not moved


def test_onnx_model_proto_with_double_input(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the onnx extra)")
    onnx = pytest.importorskip("onnx", reason="onnx is not installed (the onnx extra)")
    from onnx import TensorProto, helper, numpy_helper
    from sklearn.linear_model import Ridge

    X, y = digits
    ridge = Ridge().fit(X, y)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"])],
        "ridge",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["n", 1])],
        [
            numpy_helper.from_array(ridge.coef_.reshape(64, 1), "W"),
            numpy_helper.from_array(np.array([ridge.intercept_]), "b"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    path = package(proto, tmp_path / "proto")
    assert manifest(path)["input_type"] == "tensor(double)"
    out = load(path).predict(readonly(X[:40]))
    assert np.shape(out) == (40, 1)
    np.testing.assert_allclose(np.asarray(out)[:, 0], ridge.predict(X[:40]), rtol=1e-9)


def test_onnx_broken_file_fails_at_package_time(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (the onnx extra)")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf")
    with pytest.raises(ConfigError, match="onnxruntime cannot load"):
        package(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written left behind
    with pytest.raises(ConfigError, match="no ONNX file"):
        package(tmp_path / "missing.onnx", tmp_path / "out")


# -- XGBoost -------------------------------------------------------------------------------


def test_xgboost_classifier_returns_labels(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    xgb = pytest.importorskip("xgboost", reason="xgboost is not installed (the xgboost extra)")
    X, y = digits
    model = xgb.XGBClassifier(n_estimators=10, max_depth=3, n_jobs=1).fit(X, y)
    assert detect_framework(model) == "xgboost"
    path = package(model, tmp_path / "x")
    assert manifest(path)["estimator"] == "XGBClassifier"
    out = load(path).predict(readonly(X))
    assert out == model.predict(X).tolist()
    assert all(type(o) is int for o in out)
    assert set(out) == set(range(10))


def test_xgboost_regressor_and_booster(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    xgb = pytest.importorskip("xgboost", reason="xgboost is not installed (the xgboost extra)")
    X, y = digits
    reg = xgb.XGBRegressor(n_estimators=10, max_depth=3, n_jobs=1).fit(X, y)
    out = load(package(reg, tmp_path / "reg")).predict(readonly(X[:50]))
    np.testing.assert_allclose(out, reg.predict(X[:50]), rtol=1e-6)
    booster = xgb.train(
        {"objective": "multi:softprob", "num_class": 10, "max_depth": 3},
        xgb.DMatrix(X, label=y),
        num_boost_round=5,
    )
    path = package(booster, tmp_path / "booster")
    assert manifest(path)["kind"] == "booster"
    out = load(path).predict(readonly(X[:50]))
    np.testing.assert_allclose(out, booster.predict(xgb.DMatrix(X[:50])), rtol=1e-6)
    assert np.shape(out) == (50, 10)


# -- LightGBM ------------------------------------------------------------------------------


def test_lightgbm_classifiers_return_labels(
    tmp_path: Path, iris: tuple[Any, Any], digits: tuple[Any, Any]
) -> None:
    lgb = pytest.importorskip("lightgbm", reason="lightgbm is not installed (the lightgbm extra)")
    X, y = iris
    multi = lgb.LGBMClassifier(n_estimators=10, verbose=-1, n_jobs=1).fit(X, y)
    assert detect_framework(multi) == "lightgbm"
    path = package(multi, tmp_path / "multi")
    assert manifest(path)["classes"] == ["setosa", "versicolor", "virginica"]
    out = load(path).predict(readonly(X))
    assert out == multi.predict(X).tolist()
    assert len(set(out)) == 3
    Xd, yd = digits
    labels = np.where(yd == 3, 7, 2)  # binary with labels other than 0/1
    binary = lgb.LGBMClassifier(n_estimators=10, verbose=-1, n_jobs=1).fit(Xd, labels)
    out = load(package(binary, tmp_path / "bin")).predict(readonly(Xd))
    assert out == binary.predict(Xd).tolist()
    assert set(out) == {2, 7}


def test_lightgbm_regressor_and_booster(tmp_path: Path, digits: tuple[Any, Any]) -> None:
    lgb = pytest.importorskip("lightgbm", reason="lightgbm is not installed (the lightgbm extra)")
    X, y = digits
    reg = lgb.LGBMRegressor(n_estimators=10, verbose=-1, n_jobs=1).fit(X, y)
    path = package(reg, tmp_path / "reg")
    assert manifest(path)["kind"] == "regressor"
    np.testing.assert_allclose(load(path).predict(readonly(X[:50])), reg.predict(X[:50]))
    booster = lgb.train(
        {"objective": "regression", "verbose": -1}, lgb.Dataset(X, y), num_boost_round=5
    )
    path = package(booster, tmp_path / "booster")
    assert manifest(path)["kind"] == "booster"
    np.testing.assert_allclose(load(path).predict(readonly(X[:50])), booster.predict(X[:50]))


# -- errors and detection ------------------------------------------------------------------

_EXTRA_MODULE = {
    "sklearn": "sklearn",
    "torch": "torch",
    "onnx": "onnxruntime",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
}


@pytest.mark.parametrize("framework", sorted(_EXTRA_MODULE))
def test_loading_without_the_framework_names_the_extra(
    tmp_path: Path, framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 1, "framework": framework}))
    monkeypatch.setitem(sys.modules, _EXTRA_MODULE[framework], None)  # import now fails
    with pytest.raises(ConfigError) as info:
        load(tmp_path)
    assert f"needs the {framework} extra: pip install 'clipper-serve[{framework}]'" in str(
        info.value
    )
    assert str(info.value).startswith("loading a ")


@pytest.mark.parametrize("framework", sorted(_EXTRA_MODULE))
def test_packaging_without_the_framework_names_the_extra(
    tmp_path: Path, framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, _EXTRA_MODULE[framework], None)
    with pytest.raises(ConfigError, match=rf"needs the {framework} extra") as info:
        package(Scaler(1.0), tmp_path / "m", framework=framework)
    assert str(info.value).startswith("deploying a ")
    assert not (tmp_path / "m").exists()


def test_packaging_an_onnx_file_without_onnxruntime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "m.onnx"
    file.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(
        ConfigError,
        match=r"^deploying a ONNX model needs the onnx extra: pip install 'clipper-serve\[onnx\]'",
    ):
        package(file, tmp_path / "m")


def test_detection() -> None:
    assert FRAMEWORKS == ("onnx", "torch", "xgboost", "lightgbm", "sklearn", "python")
    assert detect_framework(row_sums) == "python"
    assert detect_framework(Scaler(1.0)) == "python"
    assert detect_framework(lambda xs: xs) == "python"
    assert detect_framework("model.ONNX") == "onnx"
    with pytest.raises(ConfigError, match="cannot deploy a str"):
        detect_framework("model.pkl")
    with pytest.raises(ConfigError, match="cannot deploy a int"):
        detect_framework(3)


def test_framework_must_fit_the_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown framework 'tensorflow'"):
        package(row_sums, tmp_path / "a", framework="tensorflow")
    with pytest.raises(ConfigError, match="a int cannot be deployed as a python model"):
        package(3, tmp_path / "a", framework="python")
    assert not (tmp_path / "a").exists()
    # duck-typed estimators are welcome as sklearn when asked for
    path = package(Scaler(3.0), tmp_path / "b", framework="sklearn")
    assert manifest(path)["framework"] == "sklearn"
    assert load(path).predict(readonly([[1.0]])) == [3.0]


def test_destination_must_be_absent_or_empty(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="not an empty directory"):
        package(row_sums, tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    assert load(package(row_sums, tmp_path / "empty")).predict(readonly([[1.0, 1.0]])) == [2.0]


def test_bad_manifests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no clipper-model\.json"):
        load(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 2, "framework": "python"}))
    with pytest.raises(ConfigError, match="reads format 1"):
        load(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": 1, "framework": "caffe"}))
    with pytest.raises(ConfigError, match="unknown framework 'caffe'"):
        load(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path)


def test_packaging_a_function_imports_no_framework(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from clipper.deployers import load, package

        def f(xs):
            return [len(x) for x in xs]

        path = package(f, {str(tmp_path / "f")!r})
        assert load(path).predict([[1, 2], [3]]) == [2, 1]
        heavy = {{"torch", "sklearn", "xgboost", "lightgbm", "onnx", "onnxruntime"}}
        print(sorted(heavy & set(sys.modules)))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_packaging_in_threads_at_once_keeps_by_value_registrations_consistent(
    tmp_path: Path,
) -> None:
    """The frontend packages deploys off its event loop, so several may pickle at once; the
    by-value registry is process-wide and must not be unregistered under another's feet."""
    import concurrent.futures

    import cloudpickle

    from clipper.deployers._python import dump
    from tests.integration import models as local_models

    def one(i: int) -> float:
        path = tmp_path / f"m{i}.pkl"
        dump(local_models.row_sums, path)
        fn = cloudpickle.loads(path.read_bytes())
        return float(fn([[1.0, 2.0]])[0])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads interleave at every few bytecodes: races show
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(200))) == [3.0] * 200
    finally:
        sys.setswitchinterval(interval)

"""Models checked at deploy: the input shapes a model file declares (ONNX fixed and dynamic
batch axes, scikit-learn ``n_features_in_``, XGBoost/LightGBM feature counts, a torch
``Sequential``), the one-line refusals, and the smoke prediction."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clipper.deployers import InputSpec, check, load, package, verify
from clipper.errors import ConfigError

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

# The unmodified file onnxruntime ships: input 'float_input' [3, 2] float, output 'label' [3].
IRIS_ONNX = Path(os.path.dirname(ort.__file__)) / "datasets" / "logreg_iris.onnx"


# Rows whose labels differ (iris' own rows all answer 0 from this model): 1, 2 and 0 among them.
IRIS_ROWS = np.array(
    [[0.0, 0.0], [5.0, 0.0], [3.0, 3.0], [6.0, 0.5], [1.0, 4.0], [7.0, 0.0], [4.0, 4.0]]
)


def ort_labels(rows: np.ndarray) -> list[int]:
    """onnxruntime's own answer for each row (padded into a batch of 3 on its own)."""
    sess = ort.InferenceSession(str(IRIS_ONNX), providers=["CPUExecutionProvider"])
    out = []
    for row in rows:
        batch = np.zeros((3, 2), np.float32)
        batch[0] = row
        out.append(int(sess.run(["label"], {"float_input": batch})[0][0]))
    return out


class CountingSession:
    """An InferenceSession that counts its runs and the batch sizes it was given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def get_inputs(self) -> Any:
        return self.inner.get_inputs()

    def get_outputs(self) -> Any:
        return self.inner.get_outputs()

    def run(self, names: Any, feeds: dict[str, Any]) -> Any:
        self.sizes.append(len(next(iter(feeds.values()))))
        return self.inner.run(names, feeds)


def dynamic_onnx(path: Path, *, width: int = 3) -> np.ndarray:
    """A MatMul model with a symbolic batch axis ('n') on input and output; returns W."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.arange(width * 2, dtype=np.float32).reshape(width, 2) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return w


def test_logreg_iris_is_served_in_runs_of_its_fixed_batch_size(tmp_path: Path) -> None:
    assert IRIS_ONNX.is_file(), "onnxruntime no longer ships datasets/logreg_iris.onnx"
    art = package(IRIS_ONNX, tmp_path / "iris")
    model: Any = load(art)
    assert model.layout.batch == 3
    assert model.input_spec == InputSpec(2, "ONNX input 'float_input' [3, 2] tensor(float)")
    model.session = CountingSession(model.session)
    rows = IRIS_ROWS
    want = ort_labels(rows)
    assert len(set(want)) > 1  # the rows are not all one class: the comparison means something
    assert model.predict(rows) == want
    # ceil(7 / 3) runs, each of exactly 3 inputs; the last one's 2 padded answers dropped.
    assert model.session.sizes == [3] * math.ceil(7 / 3)
    assert model.predict(rows[:3]) == want[:3]
    assert model.predict(rows[:1]) == want[:1]
    assert model.predict(np.zeros((0, 2))) == []


def test_a_dynamic_batch_axis_runs_each_batch_once(tmp_path: Path) -> None:
    w = dynamic_onnx(tmp_path / "dyn.onnx")
    model: Any = load(package(tmp_path / "dyn.onnx", tmp_path / "art"))
    assert model.layout.batch is None
    assert model.input_spec is not None and model.input_spec.width == 3
    model.session = CountingSession(model.session)
    x = np.random.default_rng(0).random((5, 3))
    assert np.allclose(model.predict(x), x.astype(np.float32) @ w, atol=1e-6)
    assert model.session.sizes == [5]
    assert verify(tmp_path / "art", input_type="doubles") == model.input_spec


def test_the_onnx_width_is_checked_at_deploy_and_at_query(tmp_path: Path) -> None:
    art = package(IRIS_ONNX, tmp_path / "iris")
    with pytest.raises(ConfigError) as e:
        verify(art, input_type="doubles", input_size=4)
    msg = str(e.value)
    assert "\n" not in msg
    assert "[3, 2]" in msg and "declares inputs of 4" in msg
    with pytest.raises(ConfigError, match="input type strings cannot feed it"):
        verify(art, input_type="strings")
    with pytest.raises(ValueError, match=r"takes inputs of 2 values .*this input has 4"):
        load(art).predict(np.zeros((2, 4)))


def test_onnx_inputs_that_cannot_be_fed_are_refused_in_one_line(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    def save(inputs: list[Any], name: str, out: int = TensorProto.FLOAT) -> Path:
        graph = helper.make_graph(
            [helper.make_node("Identity", [inputs[0].name], ["y"])],
            name,
            inputs,
            [helper.make_tensor_value_info("y", out, None)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, str(path))
        return path

    two = save(
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 2]),
        ],
        "two",
    )
    flat = save([helper.make_tensor_value_info("v", TensorProto.FLOAT, [4])], "flat")
    text = save(
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["n", 1])],
        "text",
        TensorProto.STRING,
    )
    cases = [
        (two, "has 2 inputs ('a' [n, 3] tensor(float), 'b' [n, 2] tensor(float))"),
        (flat, "'v' [4] tensor(float) has no batch axis"),
        (text, "'s' [n, 1] tensor(string) is not numeric"),
    ]
    for path, expected in cases:
        with pytest.raises(ConfigError) as e:
            package(path, tmp_path / f"art-{path.stem}")
        assert expected in str(e.value)
        assert "\n" not in str(e.value)
        assert not (tmp_path / f"art-{path.stem}").exists()  # nothing left behind


def test_a_sklearn_model_of_another_width_is_refused_or_named_at_the_first_query(
    tmp_path: Path,
) -> None:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    x = rng.random((40, 5))
    clf = LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int))
    art = package(clf, tmp_path / "five")
    with pytest.raises(ConfigError) as e:
        verify(art, input_type="doubles", input_size=3)
    assert str(e.value) == (
        "the model takes inputs of 5 values (scikit-learn n_features_in_); "
        "the deploy declares inputs of 3"
    )
    # Without a declared size the smoke prediction uses n_features_in_ and passes ...
    assert verify(art, input_type="doubles") == InputSpec(5, "scikit-learn n_features_in_")
    # ... and the first query of another width gets an error that says which side is which.
    with pytest.raises(ValueError) as q:
        load(art).predict(np.zeros((1, 3)))
    assert str(q.value) == (
        "the model takes inputs of 5 values (scikit-learn n_features_in_); this input has 3"
    )


class Probe:
    """A loaded model with a declared width whose predict does what the test says."""

    def __init__(self, answer: Any) -> None:
        self.input_spec = InputSpec(4, "a probe")
        self.answer = answer
        self.seen: list[Any] = []

    def predict(self, inputs: Any) -> Any:
        self.seen.append(inputs)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_smoke_prediction_refuses_with_the_models_error_in_one_line() -> None:
    ok = Probe([1, 2])
    assert check(ok, input_type="floats") == InputSpec(4, "a probe")
    (batch,) = ok.seen
    assert batch.shape == (2, 4) and batch.dtype == np.float32 and not batch.flags.writeable
    with pytest.raises(ConfigError) as e:
        check(Probe(RuntimeError("weights\nmissing")), input_type="doubles")
    assert str(e.value) == (
        "the smoke prediction on 2 generated inputs of 4 zeros failed: "
        "RuntimeError: weights missing"
    )
    with pytest.raises(ConfigError, match="answered 1 outputs; expected one per input"):
        check(Probe([1]), input_type="doubles")
    # Nothing declared, nothing sized: nothing to generate, the first query is the check.
    quiet = Probe([1, 2])
    quiet.input_spec = None  # type: ignore[assignment]
    assert check(quiet, input_type="doubles") is None and quiet.seen == []
    # A size the deploy declares stands in for the file's.
    assert check(quiet, input_type="doubles", input_size=6) is None
    assert quiet.seen[0].shape == (2, 6)
    # Non-numeric input types generate nothing.
    assert check(quiet, input_type="strings", input_size=6) is None and len(quiet.seen) == 1


def test_boosted_trees_and_a_torch_sequential_declare_their_width(tmp_path: Path) -> None:
    x = np.random.default_rng(3).random((30, 6))
    y = (x[:, 0] > 0.5).astype(int)
    found: dict[str, Any] = {}
    try:
        import xgboost

        clf = xgboost.XGBClassifier(n_estimators=2, max_depth=2, n_jobs=1).fit(x, y)
        found["xgboost"] = load(package(clf, tmp_path / "xgb")).input_spec  # type: ignore[attr-defined]
    except ImportError:
        pass
    try:
        import lightgbm

        lgbm = lightgbm.LGBMClassifier(n_estimators=2, verbose=-1).fit(x, y)
        found["lightgbm"] = load(package(lgbm, tmp_path / "lgb")).input_spec  # type: ignore[attr-defined]
    except ImportError:
        pass
    try:
        import torch

        net = torch.nn.Sequential(torch.nn.Linear(6, 2))
        found["torch"] = load(package(net, tmp_path / "net")).input_spec  # type: ignore[attr-defined]
    except ImportError:
        pass
    if not found:
        pytest.skip("none of xgboost, lightgbm, torch is installed")
    for framework, spec in found.items():
        assert isinstance(spec, InputSpec) and spec.width == 6, framework
    for framework in found:
        art = tmp_path / {"xgboost": "xgb", "lightgbm": "lgb", "torch": "net"}[framework]
        with pytest.raises(ConfigError, match="declares inputs of 5"):
            verify(art, input_type="doubles", input_size=5)

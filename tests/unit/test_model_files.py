"""Model files recognised by their content (clipper.deployers.files): each framework's own save
format read back as the model, and everything else refused in one line that says what was
found and what is expected."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest

from clipper.deployers import package
from clipper.deployers.files import read_model_file, sniff
from clipper.errors import ConfigError

X = np.random.default_rng(0).random((40, 4))
Y = (X[:, 0] > 0.5).astype(int)


def _net() -> Any:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()


def _torch_rows(net: Any) -> list[Any]:
    import torch

    with torch.no_grad():
        out: list[Any] = net(torch.tensor(X[:3], dtype=torch.float32)).tolist()
    return out


def _served(model: Any, framework: str | None, tmp_path: Path) -> list[Any]:
    """What the container would answer: package, load, predict."""
    from clipper.deployers import load

    out: list[Any] = load(package(model, tmp_path / "artifact", framework=framework)).predict(X[:3])
    return out


def test_a_whole_torch_save_module_is_read(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    net, file = _net(), tmp_path / "net.pt"
    torch.save(net, file)
    assert sniff(file) == "torch"
    found = read_model_file(file)
    assert (found.framework, found.kind) == ("torch", "torch")
    assert np.allclose(_served(found.model, found.framework, tmp_path), _torch_rows(net))


def test_a_state_dict_is_refused_naming_what_it_needs(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    file = tmp_path / "weights.pt"
    torch.save(_net().state_dict(), file)
    with pytest.raises(ConfigError) as e:
        read_model_file(file)
    text = str(e.value)
    assert "state_dict" in text and "2 tensors" in text and "'0.weight'" in text
    assert "load_state_dict" in text and "\n" not in text
    torch.save({"epoch": 3, "model": _net().state_dict()}, file)  # a training checkpoint
    with pytest.raises(ConfigError, match=r"holding a dict \(keys: epoch, model\)"):
        read_model_file(file)


def test_a_torchscript_file_is_read(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    net, file = _net(), tmp_path / "net.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(net).save(str(file))
    assert sniff(file) == "torchscript"
    found = read_model_file(file)
    assert found.kind == "torchscript" and found.framework == "torch"
    assert np.allclose(_served(found.model, found.framework, tmp_path), _torch_rows(net))


@pytest.mark.parametrize("suffix", ["json", "ubj"])
def test_xgboost_models_are_read_into_their_sklearn_class(tmp_path: Path, suffix: str) -> None:
    xgb = pytest.importorskip("xgboost")
    model = xgb.XGBClassifier(n_estimators=3, max_depth=2, n_jobs=1).fit(X, Y)
    file = tmp_path / f"model.{suffix}"
    model.save_model(str(file))
    assert sniff(file) == f"xgboost-{suffix}"
    found = read_model_file(file)
    assert type(found.model).__name__ == "XGBClassifier"
    assert _served(found.model, found.framework, tmp_path) == model.predict(X[:3]).tolist()


def test_an_xgboost_booster_file_is_read_as_a_booster(tmp_path: Path) -> None:
    xgb = pytest.importorskip("xgboost")
    booster = xgb.train({"max_depth": 2}, xgb.DMatrix(X, label=Y), num_boost_round=3)
    file = tmp_path / "booster.bin"  # the name does not matter
    booster.save_model(str(file.with_suffix(".json")))
    file.write_bytes(file.with_suffix(".json").read_bytes())
    found = read_model_file(file)
    assert isinstance(found.model, xgb.Booster)
    served = _served(found.model, found.framework, tmp_path)
    assert np.allclose(served, booster.inplace_predict(X[:3]))


def test_a_lightgbm_text_model_is_read(tmp_path: Path) -> None:
    lgb = pytest.importorskip("lightgbm")
    model = lgb.LGBMRegressor(n_estimators=3, verbose=-1, n_jobs=1).fit(X, X[:, 1])
    file = tmp_path / "model.txt"
    model.booster_.save_model(str(file))
    assert sniff(file) == "lightgbm"
    found = read_model_file(file)
    assert np.allclose(_served(found.model, found.framework, tmp_path), model.predict(X[:3]))


def test_an_onnx_file_is_read_whatever_its_name(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    net, file = _net(), tmp_path / "model.bin"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net, (torch.zeros(2, 4),), str(file), dynamo=False, input_names=["x"],
            output_names=["y"], dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
        )  # fmt: skip
    assert sniff(file) == "onnx"
    found = read_model_file(file)
    assert type(found.model).__name__ == "ModelProto" and found.framework == "onnx"
    assert np.allclose(_served(found.model, found.framework, tmp_path), _torch_rows(net))


@pytest.mark.parametrize("compress", [0, 3])
def test_pickles_and_joblib_files_are_read(tmp_path: Path, compress: int) -> None:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression().fit(X, Y)
    file = tmp_path / "model.joblib"
    joblib.dump(model, file, compress=compress)
    assert sniff(file) == "pickle"
    found = read_model_file(file)
    assert found.framework is None  # detected from the object by package()
    assert found.model.predict(X[:3]).tolist() == model.predict(X[:3]).tolist()
    file.write_bytes(pickle.dumps(model, protocol=0))  # an old protocol: no PROTO opcode
    assert read_model_file(file).model.predict(X[:3]).tolist() == model.predict(X[:3]).tolist()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"hello, world\n", "not a model file clipper-serve recognises; expected a pickle"),
        (b"PK\x03\x04not really a zip", "not a model file clipper-serve recognises"),
        (b'{"learner": {"gradient_booster": ', "read as an XGBoost JSON model, but loading it"),
        (b"tree\nversion=v4\nnum_class=banana\n", "read as a LightGBM text model, but loading"),
        (b"\x80\x05\x95 truncated", "read as a pickle/joblib file, but loading it failed"),
        (b"\x08\x07\x12\x03bad", "read as an ONNX model, but loading it failed"),
    ],
)
def test_what_is_not_a_readable_model_is_one_line(
    tmp_path: Path, content: bytes, said: str
) -> None:
    file = tmp_path / "model.bin"
    file.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        read_model_file(file)
    assert said in str(e.value) and str(file) in str(e.value)
    assert "\n" not in str(e.value)


class PicklesOnce:
    """Loads, but refuses to be pickled again: packaging it fails inside cloudpickle."""

    def predict(self, xs: Any) -> Any:
        return xs

    def __getstate__(self) -> dict[str, Any]:
        if getattr(self, "loaded", False):
            raise RuntimeError("this object cannot be pickled twice")
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, loaded=True)


def test_a_model_that_fails_to_package_is_one_line_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from clipper import cli

    file = tmp_path / "once.pkl"
    file.write_bytes(pickle.dumps(PicklesOnce()))
    argv = ["model", "deploy", str(file), "--name", "m", "--version", "1", "--input-type",
            "doubles", "--admin-url", "http://127.0.0.1:1"]  # fmt: skip
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"clipper: {file}: packaging the model failed: RuntimeError: this object cannot be "
        "pickled twice\n"
    )

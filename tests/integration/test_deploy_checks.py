"""Models checked at deploy, through a real frontend and real containers: the unmodified
``logreg_iris.onnx`` (fixed input [3, 2]) answers as onnxruntime does, an ONNX model with a
dynamic batch axis is served as it is, a scikit-learn model of the wrong width is refused in
one line (or, with no size declared, named at the first query), and a container refuses a
model its version's input type cannot feed before it reports ready."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import joblib
import numpy as np
import pytest
import pytest_asyncio

from clipper import Clipper
from clipper.errors import ReplicaError
from tests.integration.helpers import predict_ok
from tests.integration.test_client_cli import clipper_cli
from tests.unit.test_deploy_checks import IRIS_ONNX, IRIS_ROWS, dynamic_onnx, ort_labels

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is not installed")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def frontend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Clipper]:
    async with Clipper(state_dir=tmp_path_factory.mktemp("state")) as c:
        yield c


async def deploy(c: Clipper, file: Path, name: str, *extra: str) -> tuple[int, str, str]:
    return await clipper_cli(
        c, "model", "deploy", str(file), "--name", name, "--version", "1",
        "--input-type", "doubles", *extra,
    )  # fmt: skip


async def test_logreg_iris_onnx_answers_as_onnxruntime_does(frontend: Clipper) -> None:
    c = frontend
    code, out, err = await deploy(c, IRIS_ONNX, "iris")
    assert code == 0, err
    assert out.strip() == "deployed iris:1: 1 replica ready, serving"
    await c.register_application("iris", "doubles", "null", 5_000_000)
    await c.link_model_to_app("iris", "iris")
    want = ort_labels(IRIS_ROWS)
    assert len(set(want)) > 1
    # One query per row, and all seven rows in one request (runs of 3, the last padded).
    for row, label in zip(IRIS_ROWS, want, strict=True):
        doc = await predict_ok(c.query_url, "iris", {"input": row.tolist()})
        assert (doc["default"], doc["output"]) == (False, label), doc
    doc = await predict_ok(c.query_url, "iris", {"input_batch": IRIS_ROWS.tolist()})
    answers = doc["batch_predictions"]
    assert [a["default"] for a in answers] == [False] * len(want), answers
    assert [a["output"] for a in answers] == want


async def test_a_dynamic_batch_axis_is_served_and_its_width_checked(
    frontend: Clipper, tmp_path: Path
) -> None:
    c = frontend
    file = tmp_path / "dyn.onnx"
    w = await asyncio.to_thread(dynamic_onnx, file)
    code, out, err = await deploy(c, file, "dyn", "--input-size", "4")
    assert code == 2 and out == ""
    assert err == (
        "clipper: dyn:1 refused: the model takes inputs of 3 values "
        "(ONNX input 'x' [n, 3] tensor(float)); the deploy declares inputs of 4\n"
    )
    assert "dyn" not in c.registry.models
    code, out, err = await deploy(c, file, "dyn", "--input-size", "3")
    assert code == 0, err
    await c.register_application("dyn", "doubles", "null", 5_000_000)
    await c.link_model_to_app("dyn", "dyn")
    x = np.random.default_rng(4).random((5, 3))
    doc = await predict_ok(c.query_url, "dyn", {"input_batch": x.tolist()})
    got = [a["output"] for a in doc["batch_predictions"]]
    assert np.allclose(got, x.astype(np.float32) @ w, atol=1e-5)


async def test_a_sklearn_model_of_the_wrong_width(frontend: Clipper, tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression

    c = frontend
    x = np.random.default_rng(5).random((40, 5))
    file = tmp_path / "five.joblib"
    clf = LogisticRegression().fit(x, (x[:, 0] > 0.5).astype(int))
    await asyncio.to_thread(joblib.dump, clf, file)
    # The application sends 3 values: declared, the deploy is refused in one line.
    code, out, err = await deploy(c, file, "five", "--input-size", "3")
    assert code == 2 and out == ""
    assert err == (
        "clipper: five:1 refused: the model takes inputs of 5 values "
        "(scikit-learn n_features_in_); the deploy declares inputs of 3\n"
    )
    assert "five" not in c.registry.models
    # Not declared: the smoke prediction (5 values) passes, and the first query of 3 values
    # gets the model's error naming both widths.
    code, out, err = await deploy(c, file, "five")
    assert code == 0, err
    await c.register_application("three", "doubles", "null", 5_000_000)
    await c.link_model_to_app("three", "five")
    doc = await predict_ok(c.query_url, "three", {"input": [0.1, 0.2, 0.3]})
    assert doc["default"] is True
    assert (
        "the model takes inputs of 5 values (scikit-learn n_features_in_); this input has 3"
        in (doc["default_explanation"])
    ), doc
    doc = await predict_ok(c.query_url, "three", {"input": x[0].tolist()})
    assert (doc["default"], doc["output"]) == (False, int(clf.predict(x[:1])[0])), doc


async def test_a_container_refuses_what_its_input_type_cannot_feed(frontend: Clipper) -> None:
    c = frontend
    # Packaged by the frontend itself, so only the container's check stands in the way.
    with pytest.raises(ReplicaError) as e:
        await c.deploy_model("text", "1", str(IRIS_ONNX), input_type="strings")
    msg = str(e.value)
    assert msg == (
        "text:1 refused by its container: the model takes numeric inputs of 2 values "
        "(ONNX input 'float_input' [3, 2] tensor(float)); input type strings cannot feed it: "
        "expected doubles, floats or integers"
    )
    assert "text" not in c.registry.models  # a failed deploy is undone

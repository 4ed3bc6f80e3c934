"""``clipper model deploy FILE`` with the files frameworks write themselves (torch.save,
TorchScript, XGBoost UBJSON, LightGBM text), served by real containers; a state_dict and a
file that is no model are refused in one line, exit 2, no traceback."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import pytest_asyncio

from clipper import Clipper
from tests.integration.test_client_cli import clipper_cli

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

torch = pytest.importorskip("torch")
xgb = pytest.importorskip("xgboost")
lgb = pytest.importorskip("lightgbm")

X = np.random.default_rng(1).random((60, 4))
Y = (X[:, 0] + X[:, 1] > 1).astype(int)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def frontend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Clipper]:
    async with Clipper(state_dir=tmp_path_factory.mktemp("state")) as c:
        await c.register_application("t", "doubles", "null", 5_000_000)
        yield c


def _net() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()


async def _deploy_and_predict(c: Clipper, file: Path, name: str) -> Any:
    code, _, err = await clipper_cli(
        c, "model", "deploy", str(file), "--name", name, "--version", "1",
        "--input-type", "doubles",
    )  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err
    await c.link_model_to_app("t", name)
    try:
        code, out, err = await clipper_cli(c, "predict", "t", orjson.dumps(X[0].tolist()).decode())
        assert code == 0, err
        answer = orjson.loads(out)
        assert answer["default"] is False, answer
        return answer["output"]
    finally:
        await c.unlink_model_from_app("t", name)


async def test_a_torch_save_module_and_a_torchscript_file_deploy(
    frontend: Clipper, tmp_path: Path
) -> None:
    net = _net()
    with torch.no_grad():
        want = net(torch.tensor(X[:1], dtype=torch.float32))[0].tolist()
    saved, scripted = tmp_path / "net.pt", tmp_path / "scripted.pt"
    torch.save(net, saved)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.script(net).save(str(scripted))
    got = await _deploy_and_predict(frontend, saved, "saved")
    assert np.allclose(got, want, atol=1e-5)
    got = await _deploy_and_predict(frontend, scripted, "scripted")
    assert np.allclose(got, want, atol=1e-5)


async def test_xgboost_ubj_and_lightgbm_text_deploy(frontend: Clipper, tmp_path: Path) -> None:
    boosted = xgb.XGBClassifier(n_estimators=4, max_depth=2, n_jobs=1).fit(X, Y)
    ubj = tmp_path / "model.ubj"
    boosted.save_model(str(ubj))
    assert await _deploy_and_predict(frontend, ubj, "xgb") == int(boosted.predict(X[:1])[0])
    light = lgb.LGBMRegressor(n_estimators=4, verbose=-1, n_jobs=1).fit(X, X[:, 2])
    text = tmp_path / "model.txt"
    light.booster_.save_model(str(text))
    got = await _deploy_and_predict(frontend, text, "lgb")
    assert np.isclose(got, light.predict(X[:1])[0])


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda f: torch.save(_net().state_dict(), f), "a PyTorch state_dict (2 tensors"),
        (lambda f: f.write_bytes(b"just text\n"), "not a model file clipper-serve recognises"),
    ],
)
async def test_what_cannot_be_deployed_is_one_line(
    frontend: Clipper, tmp_path: Path, make: Any, said: str
) -> None:
    file = tmp_path / "model.pt"
    await asyncio.to_thread(make, file)
    code, out, err = await clipper_cli(
        frontend, "model", "deploy", str(file), "--name", "bad", "--version", "1",
        "--input-type", "doubles",
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.startswith(f"clipper: {file}: ") and said in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "bad" not in frontend.registry.models

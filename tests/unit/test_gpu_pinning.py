"""The ``local:gpus`` label and what a pinned PyTorch replica does with it, without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipper.errors import ConfigError
from clipper.inputs import InputType
from clipper.managers.local_devices import replica_devices, replica_env
from clipper.registry import ModelVersion


def _mv(*labels: str) -> ModelVersion:
    return ModelVersion("m", "1", InputType.DOUBLES, labels=labels, artifact="a" * 64)


def test_the_label_lists_devices_and_slots_take_them_round_robin() -> None:
    assert replica_devices(_mv("team:x")) == () and replica_env(_mv(), 0) == {}
    mv = _mv("local:gpus=0,GPU-8a1b2c3d-aaaa-bbbb,MIG-1-2")
    assert replica_devices(mv) == ("0", "GPU-8a1b2c3d-aaaa-bbbb", "MIG-1-2")
    assert [replica_env(mv, s)["CUDA_VISIBLE_DEVICES"] for s in range(4)] == [
        "0", "GPU-8a1b2c3d-aaaa-bbbb", "MIG-1-2", "0"
    ]  # fmt: skip
    assert replica_env(mv, 0)["CLIPPER_DEVICE"] == "cuda"


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        (("local:gpus=",), "must list distinct CUDA devices"),
        (("local:gpus=0,0",), "a repeated device"),
        (("local:gpus=0;rm -rf",), "'0;rm -rf'"),
        (("local:gpus=0", "local:gpus=1"), "has 2 local:gpus=... labels"),
    ],
)
def test_a_bad_label_says_what_a_good_one_looks_like(labels: tuple[str, ...], says: str) -> None:
    with pytest.raises(ConfigError, match="local:gpus=") as e:
        replica_devices(_mv(*labels))
    assert says in str(e.value)


def test_a_pinned_torch_replica_without_a_gpu_fails_its_load_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from clipper.deployers import _torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 1))
    manifest = _torch.save(model, tmp_path)
    monkeypatch.delenv("CLIPPER_DEVICE", raising=False)
    served = _torch.load(tmp_path, manifest)
    assert served.device == "cpu" and len(served.predict([[1.0, 2.0]])) == 1
    monkeypatch.setenv("CLIPPER_DEVICE", "tpu")
    with pytest.raises(ValueError, match="must be cpu or cuda"):
        _torch.load(tmp_path, manifest)
    monkeypatch.setenv("CLIPPER_DEVICE", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"pinned to a GPU \(CUDA_VISIBLE_DEVICES='3'\)"):
        _torch.load(tmp_path, manifest)

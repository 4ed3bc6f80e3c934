"""Which GPU a local replica may use: a model version's ``local:gpus=ID[,ID...]`` label.

The local manager starts each replica with ``CUDA_VISIBLE_DEVICES`` set to one of the listed
devices (slot ``i`` gets the ``i % n``-th, so more replicas than devices share them round
robin) and ``CLIPPER_DEVICE=cuda``, which the PyTorch deployer reads to put the module and each
batch on that GPU (docs/deployers.md). A version without the label runs as before: CPU only,
the environment untouched. Pure: nothing here touches a GPU.
"""

from __future__ import annotations

import re

from clipper.errors import ConfigError
from clipper.registry import ModelVersion

__all__ = ["DEVICE_ENV", "GPUS_LABEL", "replica_devices", "replica_env"]

GPUS_LABEL = "local:gpus="
DEVICE_ENV = "CLIPPER_DEVICE"
# A CUDA device as CUDA_VISIBLE_DEVICES names one: its index, or its GPU-/MIG- UUID.
_DEVICE = re.compile(r"\d{1,3}|(?:GPU|MIG)-[0-9A-Za-z-]{1,64}")


def replica_devices(mv: ModelVersion) -> tuple[str, ...]:
    """The devices the version's label lists (``()``: no label, CPU). ConfigError for a label
    that does not list devices, or a second one."""
    found = [label for label in mv.labels if label.startswith(GPUS_LABEL)]
    if not found:
        return ()
    if len(found) > 1:
        raise ConfigError(
            f"model {mv.name}:{mv.version} has {len(found)} {GPUS_LABEL}... labels; give one, "
            "listing every device (local:gpus=0,1)"
        )
    ids = tuple(found[0].removeprefix(GPUS_LABEL).split(","))
    bad = [i for i in ids if not _DEVICE.fullmatch(i)]
    if bad or len(set(ids)) != len(ids):
        raise ConfigError(
            f"model {mv.name}:{mv.version}: label {found[0]!r} must list distinct CUDA devices "
            "by index or UUID, comma-separated (local:gpus=0 or local:gpus=0,1 or "
            f"local:gpus=GPU-...); got {', '.join(map(repr, bad)) or 'a repeated device'}"
        )
    return ids


def replica_env(mv: ModelVersion, slot: int) -> dict[str, str]:
    """What slot ``slot``'s container adds to its environment ({} for a CPU version)."""
    ids = replica_devices(mv)
    if not ids:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ids[slot % len(ids)], DEVICE_ENV: "cuda"}

"""A version labelled ``local:gpus=...``: the local manager starts each of its replicas with one
of the listed devices in ``CUDA_VISIBLE_DEVICES`` and ``CLIPPER_DEVICE=cuda`` (round robin by
slot); an unlabelled version's replicas get neither. No GPU is needed: the test reads the
containers' environments, which is all the pinning is (docs/deployers.md, "GPU replicas")."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipper import Clipper
from clipper.errors import ClipperError
from tests.integration.models import row_sums

pytestmark = pytest.mark.integration


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)


async def test_each_replica_of_a_labelled_version_is_pinned_to_one_listed_device() -> None:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await c.deploy_model(
            "g", "1", row_sums, input_type="doubles", num_replicas=3, labels=["local:gpus=3,5"]
        )
        await c.deploy_model("cpu", "1", row_sums, input_type="doubles")
        pinned = sorted(c.manager.replicas("g", "1"), key=lambda r: r.slot)
        seen = []
        for r in pinned:
            assert r.pid is not None
            env = _environ(r.pid)
            seen.append((env.get("CUDA_VISIBLE_DEVICES"), env.get("CLIPPER_DEVICE")))
        assert seen == [("3", "cuda"), ("5", "cuda"), ("3", "cuda")]  # slot 2 shares device 3
        (plain,) = c.manager.replicas("cpu", "1")
        assert plain.pid is not None
        assert "CLIPPER_DEVICE" not in _environ(plain.pid)
        with pytest.raises(ClipperError, match="must list distinct CUDA devices"):
            await c.deploy_model(
                "bad", "1", row_sums, input_type="doubles", labels=["local:gpus=0,zero"]
            )
        assert not c.manager.replicas("bad", "1")

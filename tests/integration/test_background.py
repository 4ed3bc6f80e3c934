from collections.abc import Sequence

import pytest

from clipper import ClipperThread, RequestError


def double_all(xs: Sequence[Sequence[float]]) -> list[float]:
    return [float(x[0]) * 2 for x in xs]


def test_clipper_thread_serves_from_blocking_code() -> None:
    with ClipperThread(query_port=0, rpc_port=0, admin_port=0) as c:
        c.register_application("dbl", "doubles", "-1", 1_000_000)
        c.deploy_model("d", "1", double_all, input_type="doubles")
        c.link_model_to_app("dbl", "d")
        assert c.predict("dbl", [21]) == {"query_id": 0, "output": 42.0, "default": False}
        with pytest.raises(RequestError) as info:
            c.predict("missing", [1])
        assert info.value.status == 404
        pids = [p.pid for p in c.call(c.clipper.manager.all_replicas)]
        assert all(pids)
    # stopping the frontend stopped its containers
    import os

    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

"""The supervisor's pieces: each worker's settings, their trip over stdin, the held ports."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from clipper.config import FrontendConfig
from clipper.errors import ConfigError
from clipper.runtime.ports import PortInUse
from clipper.workers import (
    RESTART_MAX_S,
    RESTART_MIN_S,
    Supervisor,
    decode_config,
    encode_config,
    reserve_port,
    restart_delay,
    worker_config,
)


def deployment(tmp_path: Path, **changes: object) -> FrontendConfig:
    settings: dict[str, object] = {
        "state_dir": tmp_path,
        "store": f"sqlite:///{tmp_path}",
        "workers": 3,
        "rpc_port": 47000,
        "admin_port": 41338,
        "query_port": 41337,
        "grpc_port": 48001,
        **changes,
    }
    return FrontendConfig(**settings)  # type: ignore[arg-type]


def test_each_worker_has_its_own_directory_rpc_and_admin_port(tmp_path: Path) -> None:
    config = deployment(tmp_path, node_id="edge")
    w0, w2 = (
        worker_config(config, k, query_port=41337, grpc_port=48001, rpc_port_given=False)
        for k in (0, 2)
    )
    assert w0.state_dir == tmp_path / "workers" / "0"
    assert w2.state_dir == tmp_path / "workers" / "2"
    # Shared: the store, the artifacts, the keys, the query and gRPC ports.
    for w in (w0, w2):
        assert w.store == config.store
        assert w.artifacts_dir == tmp_path
        assert w.rpc_keys_dir == tmp_path / "rpc-keys"
        assert (w.query_port, w.grpc_port, w.reuse_port) == (41337, 48001, True)
        assert w.rpc_port == 0  # the command line's default is not every worker's
    assert (w0.admin_port, w2.admin_port) == (41338, 0)
    assert (w0.node_id, w2.node_id) == ("edge-0", "edge-2")
    given = worker_config(config, 2, query_port=41337, grpc_port=None, rpc_port_given=True)
    assert (given.rpc_port, given.grpc_port) == (47002, None)
    assert (
        worker_config(
            deployment(tmp_path), 1, query_port=1, grpc_port=None, rpc_port_given=False
        ).node_id
        is None
    )  # kept in its own state directory


def test_settings_cross_stdin_intact(tmp_path: Path) -> None:
    config = deployment(tmp_path, admin_token="s3cret", rpc_keys_dir=tmp_path / "k")
    w = worker_config(config, 1, query_port=5, grpc_port=None, rpc_port_given=False)
    assert decode_config(encode_config(w)) == w


def test_a_memory_store_or_one_worker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="share"):
        Supervisor(deployment(tmp_path, store="memory://"))
    with pytest.raises(ConfigError, match="2 or more"):
        Supervisor(deployment(tmp_path, workers=1))
    with pytest.raises(ConfigError, match="between 1 and"):
        deployment(tmp_path, workers=0)


def test_a_held_port_is_shared_by_reuseport_listeners_and_accepts_nothing() -> None:
    port, held = reserve_port("127.0.0.1", 0, "query_port")
    listener = socket.socket()
    try:
        assert port > 0 and len(held) == 1
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        # Every connection goes to the listener (the held socket never listens).
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                conn, _ = listener.accept()
                conn.close()
        # A process binding without SO_REUSEPORT is refused.
        plain = socket.socket()
        with pytest.raises(OSError) as info:
            plain.bind(("127.0.0.1", port))
        plain.close()
        assert info.value.errno == errno.EADDRINUSE
    finally:
        listener.close()
        for sock in held:
            sock.close()


def test_a_taken_port_names_its_flag() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    try:
        with pytest.raises(PortInUse, match="--grpc-port"):
            reserve_port("127.0.0.1", taken.getsockname()[1], "grpc_port")
    finally:
        taken.close()


def test_restarts_back_off_while_they_keep_failing_fast() -> None:
    assert restart_delay(0) == restart_delay(1) == RESTART_MIN_S
    assert restart_delay(2) == 2 * RESTART_MIN_S
    assert restart_delay(50) == RESTART_MAX_S

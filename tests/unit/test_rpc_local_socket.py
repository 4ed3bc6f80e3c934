"""The RPC server's private Unix socket for local containers: made in a fresh 0700 directory
beside the CURVE-guarded TCP port, removed at stop, and skipped (TCP only) when it cannot be
bound or when authentication is off."""

from __future__ import annotations

import asyncio
import logging
import stat
import tempfile
from pathlib import Path

import pytest

from clipper.clock import FakeClock
from clipper.rpc import wire
from clipper.rpc.link import Connection
from clipper.rpc.server import RpcServer
from tests.unit.test_rpc_liveness import NoAnswers


def _server(keys_dir: Path | None) -> RpcServer[None]:
    clock = FakeClock()

    def register(msg: wire.NewContainer, identity: bytes) -> Connection[None]:
        return Connection(identity, 0, msg.fast, 3.0, clock.now())

    return RpcServer(
        host="127.0.0.1", port=0, clock=clock, registrar=register,
        on_removed=lambda r: None, sink=NoAnswers(), keys_dir=keys_dir, local_socket=True,
    )  # fmt: skip


async def test_the_socket_lives_in_a_private_directory_and_goes_at_stop(tmp_path: Path) -> None:
    rpc = _server(tmp_path / "keys")
    await rpc.start()
    try:
        assert rpc.local_address is not None and rpc.local_address.startswith("ipc://")
        path = Path(rpc.local_address.removeprefix("ipc://"))
        modes = await asyncio.to_thread(lambda: (path.stat().st_mode, path.parent.stat().st_mode))
        assert stat.S_ISSOCK(modes[0])
        assert stat.S_IMODE(modes[1]) == 0o700
        assert rpc.guard is not None  # the TCP port is still guarded
    finally:
        await rpc.stop()
    assert rpc.local_address is None and not path.parent.exists()


async def test_without_authentication_there_is_no_socket(tmp_path: Path) -> None:
    rpc = _server(None)  # the TCP port is open already: nothing to save
    await rpc.start()
    try:
        assert rpc.local_address is None
    finally:
        await rpc.stop()


async def test_a_path_too_long_for_a_socket_leaves_tcp_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    deep = tmp_path / ("d" * 120)  # Unix socket paths stop near 107 bytes
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    caplog.set_level(logging.WARNING, logger="clipper.rpc")
    rpc = _server(tmp_path / "keys")
    await rpc.start()  # starts all the same
    try:
        assert rpc.local_address is None and rpc.port > 0
        assert list(deep.iterdir()) == []  # its directory was removed again
        assert any("no private Unix socket" in r.getMessage() for r in caplog.records)
    finally:
        await rpc.stop()

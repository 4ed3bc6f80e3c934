"""A shared replica's choice of address per frontend (clipper.container.dial): a frontend's
Unix socket only when it is a socket on this machine that this process may open and that has
not been given up on; the TCP address otherwise."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from clipper.container.dial import DialPlan

TCP = "tcp://127.0.0.1:7000"


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[str]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "rpc"))
    sock.listen()
    try:
        yield f"ipc://{tmp_path}/rpc"
    finally:
        sock.close()


def test_a_socket_on_this_machine_is_dialled_instead_of_tcp(listening: str) -> None:
    plan = DialPlan()
    assert plan.dial(TCP) == TCP  # told of no socket yet
    plan.update([(TCP, listening)])
    assert plan.dial(TCP) == listening
    assert plan.dial("tcp://127.0.0.1:7001") == "tcp://127.0.0.1:7001"
    assert plan.listed_as(listening) == TCP and plan.listed_as("ipc:///other") is None
    plan.update([])  # the next message lists none: TCP again
    assert plan.dial(TCP) == TCP


def test_a_path_that_is_no_socket_here_is_not_dialled(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    plan = DialPlan()
    plan.update([(TCP, f"ipc://{tmp_path}/file"), ("tcp://h:1", f"ipc://{tmp_path}/absent")])
    assert plan.dial(TCP) == TCP
    assert plan.dial("tcp://h:1") == "tcp://h:1"


def test_a_socket_given_up_on_stays_tcp(listening: str) -> None:
    plan = DialPlan()
    plan.update([(TCP, listening)])
    plan.refuse(listening)
    plan.update([(TCP, listening)])
    assert plan.dial(TCP) == TCP

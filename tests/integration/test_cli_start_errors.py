"""``clipper start`` refused for a taken port: one line naming the flag, exit 1, no traceback."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from clipper import cli

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process listens on (here: this test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--query-port", "--admin-port", "--rpc-port", "--grpc-port"])
def test_a_taken_port_is_one_line_naming_its_flag(
    flag: str, taken_port: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = {"--query-port": "0", "--admin-port": "0", "--rpc-port": "0", "--grpc-port": "0"}
    ports[flag] = str(taken_port)
    argv = ["start", "--state-dir", str(tmp_path), "--store", "memory://"]
    for option, value in ports.items():
        argv += [option, value]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("clipper start:")]
    assert lines == [
        f"clipper start: port {taken_port} is in use ({flag}); choose another or stop the "
        "process using it"
    ], err

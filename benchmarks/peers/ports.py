"""Free loopback ports, for the harness and for the servers' own extra ports (stdlib only:
it is imported inside every peer's venv, through PYTHONPATH=benchmarks/peers)."""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "free_port"]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's pick for an ephemeral bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])

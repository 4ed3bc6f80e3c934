"""Port binding failures, said in one line that names the setting to change.

A frontend binds up to four ports (query, admin, container RPC, gRPC), through three libraries
(asyncio, ZeroMQ, grpcio) that each fail differently when the port is taken: an ``OSError``
with ``EADDRINUSE``, a ``ZMQError`` with the same errno, or grpcio's bound port 0.
:func:`binding` turns each into a :class:`PortInUse` naming the port and its setting, which
``clipper start`` prints as one line with the flag (``--query-port``) and exits 1.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

import zmq

from clipper.errors import ConfigError

__all__ = ["PortInUse", "binding"]


class PortInUse(ConfigError):
    """A port a frontend was told to bind cannot be bound (taken, or not ours to take)."""

    def __init__(self, setting: str, port: int, reason: str) -> None:
        self.setting, self.port, self.reason = setting, port, reason
        super().__init__(
            f"port {port} {reason} ({self.flag}); choose another or stop the process using it"
        )

    @property
    def flag(self) -> str:
        """The ``clipper start`` option that sets this port."""
        return "--" + self.setting.replace("_", "-")


def _reason(code: int | None) -> str | None:
    if code == errno.EADDRINUSE:
        return "is in use"
    if code == errno.EACCES:
        return "needs privileges this process does not have"
    return None


@contextlib.contextmanager
def binding(setting: str, port: int) -> Iterator[None]:
    """Run a bind of ``port`` (the value of the ``setting`` field); a taken port raises
    :class:`PortInUse`. Other failures pass through unchanged."""
    try:
        yield
    except (OSError, zmq.ZMQError) as e:  # ZMQError is no OSError; it carries the errno too
        reason = _reason(e.errno)
        if reason is None:
            raise
        raise PortInUse(setting, port, reason) from None

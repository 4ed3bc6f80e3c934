"""Which address a shared replica dials for each frontend: its private Unix socket when the
frontend is on this machine, else the TCP address listed in FRONTENDS.

Every frontend listens on a Unix socket in a fresh 0700 directory besides its TCP port
(:attr:`clipper.rpc.server.RpcServer.local_address`); a frontend of a shared deployment
announces it, and sends the live frontends' sockets (LOCAL_SOCKETS) to the replicas that
listed the ``local-sockets`` feature. The socket needs no CURVE handshake and no TCP loopback:
about half the CPU per batch of TCP with CURVE (docs/benchmarks.md). A socket path names a
file on this machine only: one that is not there (another machine's frontend), is not a
socket, or is not this user's to open is never dialled, and one that never answers within
the activity timeout is given up for the TCP address (:meth:`DialPlan.refuse`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

__all__ = ["DialPlan"]

_IPC = "ipc://"


class DialPlan:
    """The latest LOCAL_SOCKETS pairs, and the sockets given up on (main thread only)."""

    __slots__ = ("_refused", "_sockets")

    def __init__(self) -> None:
        self._sockets: dict[str, str] = {}  # listed TCP address -> ipc:///path
        self._refused: set[str] = set()

    def update(self, pairs: Iterable[tuple[str, str]]) -> None:
        """The frontends' sockets as last sent (a frontend missing from them has none)."""
        self._sockets = dict(pairs)

    def dial(self, address: str) -> str:
        """Where to dial the frontend listed as ``address``: its socket when it announced
        one that this process can open and that was not given up on, else ``address``."""
        ipc = self._sockets.get(address)
        if ipc is None or ipc in self._refused or not _openable(ipc.removeprefix(_IPC)):
            return address
        return ipc

    def listed_as(self, ipc: str) -> str | None:
        """The TCP address whose socket ``ipc`` is, or None (not a socket we were sent)."""
        for address, sock in self._sockets.items():
            if sock == ipc:
                return address
        return None

    def refuse(self, ipc: str) -> None:
        """``ipc`` never answered: its frontend is dialled over TCP from now on."""
        self._refused.add(ipc)


def _openable(path: str) -> bool:
    # A Unix socket on this machine that this user may write to. Not a connect() probe: the
    # frontend's handshake monitor would log a connection that sends no greeting.
    try:
        st = os.stat(path)
    except OSError:  # absent here (another machine's), or a directory we may not enter
        return False
    return stat.S_ISSOCK(st.st_mode) and os.access(path, os.R_OK | os.W_OK)

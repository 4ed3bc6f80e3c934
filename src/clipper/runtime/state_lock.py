"""One frontend per state directory.

The state directory holds the SQLite store, the model artifacts, the replica logs and this
frontend's identity in the store (the node id whose unfinished version changes it rolls back at
start-up). Two frontends on one directory would run two copies of every replica against one
store and roll back each other's deploys, so the second is refused at start, with the first
one's pid and ports. The lock is an ``flock`` on ``frontend.lock``: the kernel drops it when its
holder exits, however it exits, so a killed frontend never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import orjson

from clipper.errors import ConfigError

__all__ = ["StateLock"]

LOCK_FILE = "frontend.lock"


class StateLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the directory, or raise :class:`ConfigError` naming the frontend that has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise ConfigError(
                f"the state directory {self.path.parent} is in use by another frontend "
                f"({holder}): stop it, or give this one its own --state-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.describe(pid=os.getpid())

    def describe(self, **fields: object) -> None:
        """Record who holds the lock (pid, ports), for the message a second frontend gets."""
        if self._fd is None:
            return
        doc = orjson.dumps({**_read(self._fd), **fields})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, doc, 0)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def _read(fd: int) -> dict[str, object]:
    try:
        doc = orjson.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, orjson.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _describe(fd: int) -> str:
    doc = _read(fd)
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in doc.items() if v is not None]
    return ", ".join(parts) or "its pid is not recorded yet"

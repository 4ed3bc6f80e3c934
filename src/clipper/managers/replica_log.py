"""What the local manager's supervisors share: a replica's log (the child's output copied
into a file capped in size, off the event loop) and the restart back-off.

Used for every replica process and pool process it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from clipper.clock import Clock, wait_for

__all__ = [
    "BACKOFF_START",
    "LOG_MAX_BYTES",
    "RotatingLog",
    "copy_log",
    "finish_copy",
    "next_backoff",
]

log = logging.getLogger("clipper.manager")

# A replica's log (its stdout and stderr) rotates past this size, keeping one previous file
# (<log>.1): at most about twice this on disk per replica slot, however much a model prints.
LOG_MAX_BYTES = 10 * 2**20
_PIPE_CHUNK = 64 * 1024
# A process that exits is restarted after a back-off that doubles up to this, and starts again
# from the first once a run lasted long enough to count as stable.
BACKOFF_START = 0.1
_BACKOFF_MAX = 5.0
_STABLE_AFTER = 10.0


def next_backoff(backoff: float, ran_s: float) -> tuple[float, float]:
    """(the wait before this restart, the one after it) for a process that ran ``ran_s``."""
    if ran_s > _STABLE_AFTER:
        backoff = BACKOFF_START
    return backoff, min(backoff * 2, _BACKOFF_MAX)


class RotatingLog:
    """A log file capped in size: past ``max_bytes`` it becomes ``<path>.1`` (replacing the
    previous one) and a new file starts. :meth:`write` blocks on the disk: call it in a
    thread."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes

    def write(self, data: bytes) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(data) > self.max_bytes:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        with self.path.open("ab") as f:
            f.write(data)


async def copy_log(stream: asyncio.StreamReader, log_file: RotatingLog) -> None:
    """The child's output into its log until EOF; the disk writes run in a thread, so a
    replica printing fast never holds the event loop."""
    while chunk := await stream.read(_PIPE_CHUNK):
        try:
            await asyncio.to_thread(log_file.write, chunk)
        except OSError as e:  # a full disk must not stop the replica: it would block on the pipe
            log.warning("cannot write replica log %s: %s", log_file.path, e)


async def finish_copy(copier: asyncio.Task[None], clock: Clock) -> None:
    """Let the copy reach EOF (a grandchild holding the pipe open gets a second), then stop."""
    try:
        await wait_for(clock, asyncio.shield(copier), 1.0)
    except TimeoutError:
        copier.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await copier
    except asyncio.CancelledError:
        copier.cancel()  # our own task is being cancelled: stop the copy too, and go
        raise

"""The model-container processes of this machine, found by their command lines in ``/proc``.

A replica that outlives its starter (a shared replica: ``--shared``, its own session) has no
parent to ask; what it was started with (its key directory, its model name, the parent it was
told) is what identifies it. Linux only, like the local manager's adoption.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

__all__ = ["container_args", "containers_with"]

_PROC = Path("/proc")


def container_args() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, command-line arguments) of every running ``clipper.container`` process (exited
    ones not yet reaped are left out)."""
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if b"clipper.container" not in args:
                continue
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if stat[stat.rindex(b")") + 2 :][:1] in (b"Z", b"X"):
            continue
        yield int(entry.name), args


def containers_with(flag: bytes, value: bytes) -> list[int]:
    """The pids of running containers given ``flag value`` on their command line, sorted."""
    return sorted(
        pid
        for pid, args in container_args()
        if any(f == flag and v == value for f, v in itertools.pairwise(args))
    )

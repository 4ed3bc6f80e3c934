"""How many replica processes the local manager lets start at once.

A replica's first seconds are its most expensive: the interpreter starts, the framework is
imported (scikit-learn about a second of CPU, torch several), the model is loaded. Started all
at once — a frontend restarting with fifty versions, a burst of queries waking fifty versions
scaled to zero — they share the cores, and on a small machine none of them connects for as
long as all of them together take, while every query for any of them waits. Started a few at a
time, in the order they were asked for, the first ones serve within one start's time and the
total is no longer (the cores were the limit either way).

:class:`StartGate` admits at most ``limit`` starts at once, first come first served. A start
holds its place from the spawn until its replica connects to this frontend (``connected``
of its token), its process exits, or ``hold_s`` passes: a replica that is slow to connect
(an artifact still downloading, a stuck load) delays the others by at most that much, and then
starts alongside them as it would without the gate. ``limit`` 0: no gate.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from clipper.clock import Clock, wait_for

__all__ = ["START_HOLD_S", "StartGate"]

T = TypeVar("T")

# How long one start keeps its place at most (seconds).
START_HOLD_S = 10.0
# How often a holder looks whether its replica has connected (a dict lookup).
_POLL_S = 0.02


class StartGate:
    __slots__ = ("_clock", "_connected", "_sem", "hold_s", "limit", "starting", "waiting")

    def __init__(
        self,
        limit: int,
        clock: Clock,
        connected: Callable[[str], bool] | None,
        *,
        hold_s: float = START_HOLD_S,
    ) -> None:
        # Without a way to see connections a start holds its place until exit or hold_s.
        self.limit = limit
        self.hold_s = hold_s
        self._clock = clock
        self._connected = connected
        self._sem = asyncio.Semaphore(limit) if limit > 0 else None
        self.waiting = 0  # starts waiting for a place now
        self.starting = 0  # starts holding one

    async def enter(self) -> None:
        """Wait for a place (at once when one is free or there is no gate). The caller must
        :meth:`hold` or :meth:`leave` after."""
        if self._sem is None:
            return
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self.starting += 1

    async def start(
        self, spawn: Callable[[], Awaitable[T]], *, placed: Callable[[], object] | None = None
    ) -> T:
        """:meth:`enter`, then ``placed()`` (the wait is over), then ``spawn()``: the place is
        given up again if the spawn fails (or is cancelled); otherwise the caller must
        :meth:`hold` it."""
        await self.enter()
        if placed is not None:
            placed()
        try:
            return await spawn()
        except BaseException:
            self.leave()
            raise

    def leave(self) -> None:
        if self._sem is not None:
            self.starting -= 1
            self._sem.release()

    async def hold(self, token: str, exited: asyncio.Future[int]) -> None:
        """Keep the place :meth:`enter` gave until the replica with ``token`` connects, its
        process exits (``exited`` done), or ``hold_s`` passes; then give it up (also when
        cancelled)."""
        if self._sem is None:
            return
        try:
            until = self._clock.now() + self.hold_s
            connected = self._connected
            while not exited.done() and self._clock.now() < until:
                if connected is not None and connected(token):
                    return
                # The exit ends the wait at once; a connection is seen at the next look.
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._clock, asyncio.shield(exited), _POLL_S)
        finally:
            self.leave()

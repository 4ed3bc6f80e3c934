"""The local manager's waits on its clock, with fake child processes and a FakeClock: the
restart back-off, the grace between SIGTERM and SIGKILL, and the bound on a log copy that a
grandchild keeps open. No process is started and no time passes for real."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.managers.local import LocalManager
from clipper.registry import ModelVersion

MV = ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, artifact="/a")


class FakeChild:
    """What ``asyncio.create_subprocess_exec`` returns, as far as the manager uses it."""

    def __init__(self, *, exit_code: int | None, ignores_term: bool, eof: bool) -> None:
        self.pid = 4242
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.ignores_term = ignores_term
        self.stdout = asyncio.StreamReader()
        if eof:
            self.stdout.feed_eof()
        self._exited = asyncio.Event()
        if exit_code is not None:
            self.exit(exit_code)

    def exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if not self.ignores_term:
            self.exit(-sig)

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.exit(-signal.SIGKILL)


class Spawner:
    """Stands in for ``asyncio.create_subprocess_exec``: records when each child started."""

    def __init__(self, clock: FakeClock, **child: Any) -> None:
        self.clock = clock
        self.child = child
        self.started: list[float] = []
        self.children: list[FakeChild] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> FakeChild:
        self.started.append(self.clock.now())
        child = FakeChild(**self.child)
        self.children.append(child)
        return child


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=0.0)


def manager(
    tmp_path: Path,
    clock: FakeClock,
    exits: list[float] | None = None,
    *,
    starts: int = 0,
    connected: set[str] | None = None,
) -> LocalManager:
    return LocalManager(
        rpc_host=lambda: "127.0.0.1",
        rpc_port=lambda: 7000,
        state_dir=tmp_path,
        clock=clock,
        heartbeat_interval_s=0.5,
        on_exit=None if exits is None else (lambda token: exits.append(clock.now())),
        replica_starts=starts,
        connected=None if connected is None else connected.__contains__,
    )


@pytest.fixture
def spawn(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Iterator[Spawner]:
    spawner = Spawner(clock, exit_code=None, ignores_term=False, eof=True)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", spawner)
    yield spawner


async def turns(n: int = 20) -> None:
    """Let the loop run ``n`` turns (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_crashing_replica_restarts_after_a_doubling_backoff_on_the_clock(
    tmp_path: Path, clock: FakeClock, spawn: Spawner
) -> None:
    spawn.child["exit_code"] = 1  # every child exits at once
    m = manager(tmp_path, clock)
    await m.ensure(MV, 1)
    await turns()
    assert spawn.started == [0.0]
    clock.advance(0.1 - 1e-6)  # the first back-off is 0.1 s
    await turns()
    assert len(spawn.started) == 1
    clock.advance(2e-6)
    await turns()
    assert len(spawn.started) == 2
    clock.advance(0.2 - 2e-6)  # then 0.2 s, from the second exit
    await turns()
    assert len(spawn.started) == 2
    clock.advance(2e-6)
    await turns()
    assert len(spawn.started) == 3
    assert spawn.started[1:] == pytest.approx([0.1, 0.3], abs=1e-5)
    assert m.replicas("m", "1")[0].restarts == 3
    await m.stop_all()  # cancels the third back-off
    assert clock.pending() == 0


async def test_a_child_ignoring_sigterm_is_killed_when_the_grace_passes_on_the_clock(
    tmp_path: Path, clock: FakeClock, spawn: Spawner
) -> None:
    spawn.child["ignores_term"] = True
    m = manager(tmp_path, clock)
    await m.ensure(MV, 1)
    await turns()
    child = spawn.children[0]
    stopping = asyncio.create_task(m.stop_all())
    await turns()
    assert child.signals == [signal.SIGTERM]
    clock.advance(2.5)
    await turns()
    assert child.signals == [signal.SIGTERM] and not stopping.done()
    clock.advance(0.5)  # the 3 s grace
    await turns()
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    await stopping
    assert len(spawn.started) == 1  # stopped, not restarted


async def test_a_log_pipe_held_open_is_given_up_after_a_second_on_the_clock(
    tmp_path: Path, clock: FakeClock, spawn: Spawner
) -> None:
    # The child exits, but its pipe never reaches EOF (a grandchild holds it): the manager
    # waits a second for the copy, then goes on to report the exit.
    spawn.child.update(exit_code=0, eof=False)
    exits: list[float] = []
    m = manager(tmp_path, clock, exits)
    await m.ensure(MV, 1)
    await turns()
    clock.advance(0.75)
    await turns()
    assert exits == []
    clock.advance(0.25)
    await turns()
    assert exits == [1.0]
    await m.stop_all()


def gated(tmp_path: Path, clock: FakeClock, limit: int, connected: set[str]) -> LocalManager:
    return manager(tmp_path, clock, starts=limit, connected=connected)


async def test_replica_starts_wait_their_turn_until_a_start_connects_or_exits(
    tmp_path: Path, clock: FakeClock, spawn: Spawner
) -> None:
    connected: set[str] = set()
    m = gated(tmp_path, clock, 2, connected)
    await m.ensure(MV, 5)
    await turns()
    slots = m.replicas("m", "1")
    assert len(spawn.started) == 2 and [p.pid is not None for p in slots] == [1, 1, 0, 0, 0]
    assert (m.starts.starting, m.starts.waiting) == (2, 3)
    # Waiting for a place is said as such (status, get_replicas, the dashboard), not starting.
    assert [p.state for p in slots] == ["running"] * 2 + ["queued"] * 3
    connected.add(slots[0].token)  # the first replica connects: the next one starts
    clock.advance(0.02)
    await turns()
    assert len(spawn.started) == 3 and slots[2].pid is not None and slots[3].pid is None
    assert [p.state for p in slots[2:]] == ["running", "queued", "queued"]
    spawn.children[1].exit(1)  # the second one dies before connecting: its place frees too
    await turns()
    assert len(spawn.started) == 4 and slots[3].pid is not None
    # Slot 1's restart (after its back-off) queues behind slot 4, which came first.
    clock.advance(0.1)
    await turns()
    assert len(spawn.started) == 4 and m.starts.waiting == 2
    assert slots[1].state == "queued" and slots[1].restarts == 1
    await m.stop_all()
    assert not any(p.queued for p in slots)  # a stop while waiting leaves no slot queued
    assert (m.starts.starting, m.starts.waiting) == (0, 0) and clock.pending() == 0


async def test_a_start_that_never_connects_keeps_its_place_ten_seconds_at_most(
    tmp_path: Path, clock: FakeClock, spawn: Spawner
) -> None:
    m = gated(tmp_path, clock, 1, set())
    await m.ensure(MV, 3)
    await turns()
    assert spawn.started == [0.0]
    clock.advance(9.9)
    await turns()
    assert len(spawn.started) == 1
    clock.advance(0.2)
    await turns()
    assert len(spawn.started) == 2
    await m.stop_all()
    assert m.starts.starting == 0 and clock.pending() == 0


async def test_without_a_limit_every_replica_starts_at_once(
    tmp_path: Path, clock: FakeClock, spawn: Spawner
) -> None:
    m = gated(tmp_path, clock, 0, set())
    await m.ensure(MV, 6)
    await turns()
    assert len(spawn.started) == 6 and clock.pending() == 0  # nothing polls
    await m.stop_all()

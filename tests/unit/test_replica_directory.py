"""The replica directory's tokens: a process that registers again on a newer connection (a
reconnect with a new identity, or a shared replica moving from a frontend's TCP port to its
Unix socket) stays known by its token when the older connection is removed after it; the
manager's adoption watch asks exactly that (``connected``), and would otherwise start a
second process for a slot whose replica is serving."""

from __future__ import annotations

import pytest

from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import PredictionCache
from clipper.clock import FakeClock
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.registry import ModelVersion, Registry
from clipper.rpc import wire
from clipper.rpc.link import Connection
from clipper.runtime.catalog import Catalog, SchedulerTable
from clipper.runtime.replicas import ReplicaDirectory
from tests.unit.test_deadlines import Transport


def directory() -> tuple[ReplicaDirectory, ModelScheduler, list[Connection[Replica]]]:
    clock = FakeClock()
    registry = Registry()
    mv = ModelVersion("m", "1", InputType.DOUBLES)
    registry.add_model(mv)
    table = SchedulerTable()
    sched = ModelScheduler(
        mv, slo_s=0.02, cache=PredictionCache(1 << 16), clock=clock, transport=Transport(),
        metrics=Metrics(), queue_capacity=10,
    )  # fmt: skip
    table.put(mv.key, sched)
    dropped: list[Connection[Replica]] = []
    replicas = ReplicaDirectory(
        Catalog(registry, table), clock=clock, replica_timeout_s=3.0, v3_replica_timeout_s=9.0,
        disconnect=dropped.append,
    )  # fmt: skip
    return replicas, sched, dropped


def meta(token: str) -> wire.NewContainer:
    return wire.NewContainer("m", "1", InputType.DOUBLES.code, 3, True, token)


@pytest.mark.parametrize("leaving_first", [True, False])
def test_a_process_stays_known_while_any_of_its_connections_is(leaving_first: bool) -> None:
    # Either order happens: a reconnect registers the new connection after the old one; a
    # shared replica's TCP link (from --frontend) may finish registering after the link on
    # the Unix socket that replaces it (2026-12-08: the adopting owner then started a second
    # process for the slot, 6 s after the TCP link left).
    replicas, sched, dropped = directory()
    first = replicas.register(meta("m:1:0:a.1"), b"first")
    second = replicas.register(meta("m:1:0:a.1"), b"second")
    assert first is not None and second is not None
    leaving, staying = (first, second) if leaving_first else (second, first)
    replicas.removed(leaving)
    assert replicas.connected("m:1:0:a.1")
    assert [r.link for r in sched.replicas] == [staying]
    replicas.process_exited("m:1:0:a.1")  # the process's exit reaches its live connection
    assert dropped == [staying]
    replicas.removed(staying)
    assert not replicas.connected("m:1:0:a.1")


async def test_a_drain_covers_every_connection_of_the_process() -> None:
    replicas, _, dropped = directory()
    links = [replicas.register(meta("m:1:0:a.1"), i) for i in (b"one", b"two")]
    await replicas.drain("m:1:0:a.1")  # nothing in flight: both dropped at once
    assert dropped == links

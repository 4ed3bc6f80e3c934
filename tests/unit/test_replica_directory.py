"""The replica directory's tokens: a process that registers again on a newer connection (a
reconnect with a new identity, or a shared replica moving from a frontend's TCP port to its
Unix socket) stays known by its token when the older connection is removed after it; the
manager's adoption watch asks exactly that (``connected``), and would otherwise start a
second process for a slot whose replica is serving."""

from __future__ import annotations

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


class _Transport:
    def send_batch(
        self,
        link: Connection[Replica],
        itype: InputType,
        payloads: list[bytes],
        traceparent: str | None = None,
    ) -> int:
        return 0

    def collect(self) -> None:
        pass


def directory() -> tuple[ReplicaDirectory, ModelScheduler, list[Connection[Replica]]]:
    clock = FakeClock()
    registry = Registry()
    mv = ModelVersion("m", "1", InputType.DOUBLES)
    registry.add_model(mv)
    table = SchedulerTable()
    sched = ModelScheduler(
        mv, slo_s=0.02, cache=PredictionCache(1 << 16), clock=clock, transport=_Transport(),
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


def test_a_replica_registered_again_stays_known_when_its_old_connection_goes() -> None:
    replicas, sched, dropped = directory()
    old = replicas.register(meta("m:1:0:a.1"), b"tcp-identity")
    new = replicas.register(meta("m:1:0:a.1"), b"ipc-identity")
    assert old is not None and new is not None
    replicas.removed(old)  # the old connection drained (or timed out) after the new one came
    assert replicas.connected("m:1:0:a.1")
    assert [r.link for r in sched.replicas] == [new]
    replicas.process_exited("m:1:0:a.1")  # the process's exit now reaches its live connection
    assert dropped == [new]
    replicas.removed(new)
    assert not replicas.connected("m:1:0:a.1")

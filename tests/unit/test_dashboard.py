"""The dashboard's memory and sampler, on a fake clock: the fixed rings, the rates and quantiles
of one interval from the frontend's own counters, the replica states, the policy weights."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

from clipper.batching.scheduler import Replica
from clipper.clock import FakeClock
from clipper.dashboard.events import EventHub, encode_event
from clipper.dashboard.history import History
from clipper.dashboard.sampler import Sampler
from clipper.dashboard.state import PolicyWeights, policy_weights, runtime_state
from clipper.errors import ConfigError
from clipper.frontend.http import Stream
from clipper.inputs import InputType
from clipper.managers.base import ContainerManager
from clipper.managers.local import ReplicaProcess
from clipper.metrics import Metrics, histogram_quantile
from clipper.registry import Application, ModelVersion, Registry
from clipper.rollout import Rollout, Shadow
from clipper.rpc.link import Connection
from clipper.runtime.autoscaler import LastDecision
from clipper.runtime.scale_policy import Decision
from clipper.scaling import AutoscaleConfig
from clipper.selection import make_policy
from tests.catalogs import catalog_of

# -- the rings ---------------------------------------------------------------------------------


def test_history_keeps_the_last_capacity_samples_of_every_series_aligned() -> None:
    h = History(capacity=3, max_series=10)
    for i in range(5):
        h.append(float(i), {"a": float(i)})
    assert len(h) == 3
    assert h.times() == [2.0, 3.0, 4.0]
    assert h.values("a") == [2.0, 3.0, 4.0]


def test_a_new_series_starts_with_gaps_and_an_absent_one_records_a_gap() -> None:
    h = History(capacity=4, max_series=10)
    h.append(1.0, {"a": 1.0})
    h.append(2.0, {"a": 2.0, "b": 20.0})
    h.append(3.0, {"b": None})
    assert h.values("a") == [1.0, 2.0, None]
    assert h.values("b") == [None, 20.0, None]
    assert h.snapshot() == {"t": [1.0, 2.0, 3.0], "series": {"a": [1.0, 2.0, None],
                                                              "b": [None, 20.0, None]}}  # fmt: skip


def test_a_series_absent_for_a_whole_ring_is_dropped() -> None:
    h = History(capacity=3, max_series=10)
    h.append(0.0, {"gone": 1.0, "kept": 1.0})
    for t in (1.0, 2.0):
        h.append(t, {"kept": t})
    assert "gone" in h.series
    h.append(3.0, {"kept": 3.0})
    assert h.series == ["kept"]


def test_series_beyond_the_limit_are_refused_and_counted() -> None:
    h = History(capacity=3, max_series=2)
    recorded = h.append(0.0, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert recorded == {"a": 1.0, "b": 2.0}
    assert sorted(h.series) == ["a", "b"]
    assert h.refused_series == 1


def test_history_limits_are_checked() -> None:
    with pytest.raises(ConfigError):
        History(capacity=1, max_series=1)
    with pytest.raises(ConfigError):
        History(capacity=2, max_series=0)


def test_histogram_quantile_interpolates_inside_a_bucket() -> None:
    buckets = [(0.01, 50.0), (0.02, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.01)
    assert histogram_quantile(0.75, buckets) == pytest.approx(0.015)
    assert histogram_quantile(0.99, [(0.01, 0.0), (float("inf"), 10.0)]) == 0.01
    assert histogram_quantile(0.5, [(0.01, 0.0), (float("inf"), 0.0)]) is None


# -- the sampler -------------------------------------------------------------------------------


@dataclass
class FakeScheduler:
    queue: list[object] = field(default_factory=list)
    replicas: list[Replica] = field(default_factory=list)


class FakeManager:
    def __init__(self, procs: list[ReplicaProcess] | None = None) -> None:
        self.procs = procs or []

    def all_replicas(self) -> list[ReplicaProcess]:
        return self.procs


def _app(name: str, policy: str = "single", **params: Any) -> Application:
    return Application(
        name=name, input_type=InputType.DOUBLES, default_output="-1",
        latency_slo_micros=20_000, policy=policy, policy_params=params,
    )  # fmt: skip


def _replica(replica_id: int, address: str, *, draining: bool = False) -> Replica:
    r = Replica(Connection(b"id%d" % replica_id, replica_id, True, 3.0, 0.0, token=address))
    r.draining = draining
    return r


@dataclass
class World:
    clock: FakeClock
    metrics: Metrics
    registry: Registry
    schedulers: dict[tuple[str, str], FakeScheduler]
    manager: FakeManager
    sampler: Sampler


def _world(
    interval_s: float = 1.0,
    capacity: int = 60,
    decisions: dict[tuple[str, str], LastDecision] | None = None,
) -> World:
    clock, metrics, registry = FakeClock(), Metrics(), Registry()
    registry.apps["sums"] = _app("sums")
    registry.models["m"] = {"1": ModelVersion("m", "1", InputType.DOUBLES)}
    registry.current["m"] = "1"
    registry.links["sums"] = ["m"]
    schedulers = {("m", "1"): FakeScheduler()}
    manager = FakeManager()
    sampler = Sampler(
        clock=clock, metrics=metrics, catalog=catalog_of(registry, schedulers),
        manager=cast(ContainerManager, manager), selection=lambda _: None,
        history=History(capacity, 100), interval_s=interval_s,
        decisions=None if decisions is None else lambda n, v: decisions.get((n, v)),
    )  # fmt: skip
    return World(clock, metrics, registry, schedulers, manager, sampler)


def test_one_interval_of_counters_becomes_rates_quantiles_and_ratios() -> None:
    w = _world()
    m = w.metrics
    m.requests.labels(app="sums").inc(7)  # before start: the baseline, not counted
    w.sampler.start()
    seen: list[dict[str, Any]] = []
    w.sampler.on_sample = seen.append
    m.requests.labels(app="sums").inc(10)
    for latency in [0.001] * 9 + [0.04]:
        m.latency.labels(app="sums").observe(latency)
    m.defaults.labels(app="sums", reason="slo").inc(2)
    m.batch_size.labels(model="m", version="1").observe(4)
    m.batch_size.labels(model="m", version="1").observe(8)
    m.cache_hits.labels(model="m", version="1").inc(3)
    m.cache_misses.labels(model="m", version="1").inc(1)
    m.model_errors.labels(model="m", version="1").inc(1)
    w.schedulers[("m", "1")].queue.extend([object()] * 5)
    w.clock.advance(2.0)  # two samples: all of it lands in the first
    assert len(seen) == 2
    first, second = seen[0]["values"], seen[1]["values"]
    assert first["app/sums/qps"] == 10.0
    assert 0.5 <= first["app/sums/p50_ms"] <= 1.0  # in the (0.5 ms, 1 ms] bucket
    assert 30.0 <= first["app/sums/p99_ms"] <= 50.0  # in the (30 ms, 50 ms] bucket
    assert first["app/sums/slo_ms"] == 20.0
    assert first["app/sums/defaults/slo"] == 2.0
    assert first["model/m:1/batch_size"] == 6.0
    assert first["model/m:1/cache_hit_rate"] == 0.75
    assert first["model/m:1/errors"] == 1.0
    assert first["model/m:1/queue"] == 5.0
    # The next interval had nothing: zero rates, no latency or batch to show.
    assert second["app/sums/qps"] == 0.0
    assert second["app/sums/p50_ms"] is None
    assert second["app/sums/defaults/slo"] == 0.0
    assert second["model/m:1/batch_size"] is None
    assert second["model/m:1/cache_hit_rate"] is None
    assert w.sampler.history.values("app/sums/qps") == [10.0, 0.0]


def test_rates_are_per_second_of_the_actual_interval() -> None:
    w = _world(interval_s=0.5)
    w.sampler.start()
    w.metrics.requests.labels(app="sums").inc(10)
    w.clock.advance(0.5)
    assert w.sampler.history.values("app/sums/qps") == [20.0]


def test_a_counter_that_went_down_was_reset_and_counts_whole() -> None:
    w = _world()
    w.metrics.requests.labels(app="sums").inc(50)
    w.sampler.start()
    w.metrics.forget_app("sums")  # deleted and created again
    w.metrics.requests.labels(app="sums").inc(3)
    w.clock.advance(1.0)
    assert w.sampler.history.values("app/sums/qps") == [3.0]


def test_the_sampler_is_a_timer_chain_its_owner_stops() -> None:
    w = _world(interval_s=1.0, capacity=5)
    w.sampler.start()
    assert w.sampler.running
    w.clock.advance(12.0)
    assert w.sampler.samples == 12
    assert len(w.sampler.history) == 5  # bounded: the last five
    w.sampler.stop()
    assert not w.sampler.running
    assert w.clock.pending() == 0
    w.clock.advance(5.0)
    assert w.sampler.samples == 12


def test_a_failing_sample_is_logged_and_the_chain_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = _world()
    w.sampler.start()

    def broken(doc: dict[str, Any]) -> None:
        raise RuntimeError("listener bug")

    w.sampler.on_sample = broken
    with caplog.at_level(logging.ERROR, logger="clipper.dashboard"):
        w.clock.advance(3.0)
    assert w.sampler.failures == 3
    assert sum("dashboard sample failed" in r.message for r in caplog.records) == 1
    assert w.sampler.running


def test_a_deleted_application_leaves_the_samples() -> None:
    w = _world()
    w.sampler.start()
    w.clock.advance(1.0)
    del w.registry.apps["sums"]
    w.clock.advance(1.0)
    assert w.sampler.history.values("app/sums/qps") == [0.0, None]
    assert w.sampler.state["apps"] == []


def test_replicas_wanted_is_sampled_beside_replicas_connected() -> None:
    w = _world()
    w.registry.models["m"]["1"] = replace(w.registry.models["m"]["1"], num_replicas=3)
    w.schedulers[("m", "1")].replicas = [_replica(0, "tok0"), _replica(1, "tok1", draining=True)]
    w.sampler.start()
    w.clock.advance(1.0)
    assert w.sampler.history.values("model/m:1/replicas") == [1.0]
    assert w.sampler.history.values("model/m:1/replicas_wanted") == [3.0]


def _rollout_world() -> World:
    w = _world()
    for v in ("2", "3"):
        w.registry.models["m"][v] = ModelVersion("m", v, InputType.DOUBLES)
        w.schedulers[("m", v)] = FakeScheduler()
    w.registry.models["n"] = {"1": ModelVersion("n", "1", InputType.DOUBLES)}
    w.schedulers[("n", "1")] = FakeScheduler()
    w.registry.rollouts["m"] = Rollout.build(
        "m", {"1": 75, "2": 25}, sticky=True, shadow=Shadow("3", 0.5)
    )
    w.sampler.catalog = catalog_of(w.registry, w.schedulers)  # with the versions added
    return w


def test_a_split_and_a_shadow_are_sampled_per_version() -> None:
    w = _rollout_world()
    m = w.metrics
    w.sampler.start()
    m.split_requests.labels(model="m", version="1").inc(30)
    m.split_requests.labels(model="m", version="2").inc(10)
    m.split_fallbacks.labels(model="m", version="2").inc(2)
    m.shadow_agreements.labels(model="m", version="3").inc(9)
    m.shadow_disagreements.labels(model="m", version="3").inc(3)
    m.shadow_errors.labels(model="m", version="3", reason="deadline").inc(1)
    m.shadow_errors.labels(model="m", version="3", reason="model_error").inc(2)
    w.clock.advance(2.0)  # the second interval compared nothing
    h = w.sampler.history
    assert h.values("model/m:1/split_qps") == [30.0, 0.0]
    assert h.values("model/m:2/split_qps") == [10.0, 0.0]
    assert h.values("model/m:2/split_fallbacks") == [2.0, 0.0]
    assert h.values("model/m:3/shadow_compared") == [12.0, 0.0]
    assert h.values("model/m:3/shadow_agreement") == [0.75, None]
    assert h.values("model/m:3/shadow_errors") == [3.0, 0.0]
    # Only what a rollout names: no split series for the shadow, none for a model without one.
    assert "model/m:3/split_qps" not in h.series
    assert "model/m:1/shadow_agreement" not in h.series
    assert not any(k.startswith("model/n:1/s") for k in h.series)
    assert w.sampler.state["rollouts"] == [
        {"model": "m", "current": "1", "split": {"1": 0.75, "2": 0.25}, "sticky": True,
         "shadow": {"version": "3", "share": 0.5}},
    ]  # fmt: skip


def test_each_autoscaling_decision_is_sent_once_and_kept_bounded() -> None:
    decided: dict[tuple[str, str], LastDecision] = {}
    w = _world(decisions=decided)
    mv = w.registry.models["m"]["1"]
    w.registry.models["m"]["1"] = replace(
        mv, autoscale=AutoscaleConfig(min_replicas=2, max_replicas=5)
    )
    w.sampler.start()
    seen: list[dict[str, Any]] = []
    w.sampler.on_sample = seen.append
    w.clock.advance(1.0)
    assert seen[-1]["decisions"] == []
    assert w.sampler.state["models"][0]["autoscale"] == {"min": 2, "max": 5, "last": None}
    decided["m", "1"] = LastDecision(1.5, Decision(2, "min_replicas", "1 is outside [2, 5]"), 1)
    w.clock.advance(2.0)  # seen by the first sample after it, and only by that one
    first = {"t": 1.5, "model": "m", "version": "1", "from": 1, "to": 2,
             "reason": "min_replicas", "detail": "1 is outside [2, 5]", "error": None}  # fmt: skip
    assert [s["decisions"] for s in seen[-2:]] == [[first], []]
    assert w.sampler.state["models"][0]["autoscale"]["last"] == first
    decided["m", "1"] = LastDecision(3.2, Decision(3, "utilization", "busy"), 2)
    w.clock.advance(1.0)
    assert [d["to"] for d in seen[-1]["decisions"]] == [3]
    assert [d["to"] for d in w.sampler.decisions] == [2, 3]
    # Not autoscaled any more: no decision is read, none is made up.
    w.registry.models["m"]["1"] = mv
    w.clock.advance(1.0)
    assert seen[-1]["decisions"] == [] and w.sampler.state["models"][0]["autoscale"] is None
    assert w.sampler.decisions.maxlen is not None and w.sampler.decisions.maxlen <= 200


# -- state and weights -------------------------------------------------------------------------


def _proc(
    slot: int, *, pid: int | None, restarts: int = 0, stopping: bool = False, queued: bool = False
) -> ReplicaProcess:
    return ReplicaProcess(
        "m", "1", slot, Path(f"/tmp/m-1-{slot}.log"), token=f"tok{slot}", pid=pid,
        restarts=restarts, stopping=stopping, queued=queued,
    )  # fmt: skip


def test_replica_states_join_the_process_and_the_connection() -> None:
    w = _world()
    sched = w.schedulers[("m", "1")]
    sched.replicas = [_replica(0, "tok0"), _replica(3, "tok3", draining=True), _replica(9, "")]
    w.manager.procs = [
        _proc(0, pid=100),  # connected: ready
        _proc(1, pid=101),  # started, not connected yet: starting
        _proc(2, pid=None, restarts=1),  # exited, being restarted: restarting
        _proc(3, pid=103),  # connected, draining
        _proc(4, pid=104, restarts=2),  # restarted, not connected yet: still restarting
        _proc(5, pid=105, stopping=True),
        _proc(6, pid=None, queued=True),  # waiting for a start place: queued
    ]
    state = runtime_state(catalog_of(w.registry, w.schedulers), cast(ContainerManager, w.manager))
    by_slot = {r["slot"]: r for r in state["replicas"]}
    assert {s: r["state"] for s, r in by_slot.items()} == {
        0: "ready", 1: "starting", 2: "restarting", 3: "draining", 4: "restarting",
        5: "stopping", 6: "queued", None: "ready",
    }  # fmt: skip
    assert by_slot[0]["replica_id"] == 0 and by_slot[0]["pid"] == 100
    assert by_slot[None]["location"] == "external"  # dialled in: no process of ours
    assert state["models"] == [
        {"name": "m", "version": "1", "current": True, "replicas_wanted": 1,
         "replicas_ready": 2, "queue": 0, "batching": "aimd", "error_fraction": None,
         "default_fraction": None, "failing": False, "last_error": None, "autoscale": None},
    ]  # fmt: skip
    assert state["apps"][0]["name"] == "sums" and state["apps"][0]["slo_ms"] == 20.0
    # No rates given (no window), nothing answered: the columns are empty, the app ready.
    app = state["apps"][0]
    assert (app["error_fraction"], app["default_fraction"]) == (None, None)
    assert app["ready"] is True and app["reasons"] == []


def test_policy_weights_of_each_policy_from_a_fresh_state() -> None:
    models = ["a", "b"]
    for name in ("exp3", "exp4", "thompson", "epsilon_greedy"):
        policy = make_policy(name, models)
        weights = policy_weights(policy, policy.init_state())
        assert set(weights) == {"a", "b"}
        if name in ("exp3", "exp4"):
            assert weights == {"a": 0.5, "b": 0.5}
        else:
            assert sum(weights.values()) == pytest.approx(1.0)
    ucb = make_policy("ucb1", models)
    assert policy_weights(ucb, ucb.init_state()) == {"a": 1.0, "b": 0.0}  # plays a first
    split = make_policy("ab_split", models, weights={"a": 3, "b": 1})
    assert policy_weights(split, split.init_state()) == {"a": 0.75, "b": 0.25}


def test_policy_weights_follow_the_learned_state() -> None:
    policy = make_policy("exp3", ["a", "b"])
    state = policy.init_state()
    state["log_w"]["b"] = -3.0  # b lost a lot
    weights = policy_weights(policy, state)
    assert weights["a"] > 0.9
    assert weights["b"] < 0.1


def test_weights_are_sampled_per_linked_model_of_a_policy_application() -> None:
    w = _world()
    w.registry.apps["pick"] = _app("pick", "ab_split", weights={"m": 1, "n": 3})
    w.registry.links["pick"] = ["m", "n"]
    w.sampler.start()
    w.clock.advance(1.0)
    assert w.sampler.history.values("app/pick/weight/m") == [0.25]
    assert w.sampler.history.values("app/pick/weight/n") == [0.75]
    assert not any("/weight/" in k and k.startswith("app/sums/") for k in w.sampler.history.series)


def test_policy_weights_cache_is_dropped_with_the_application() -> None:
    weights = PolicyWeights(lambda _: None)
    app = _app("pick", "exp3")
    assert weights.weights(app, ["a", "b"]) == {"a": 0.5, "b": 0.5}
    assert weights.weights(_app("one"), ["a"]) is None
    weights.forget(set())
    assert weights.weights(app, []) is None


# -- the hub -----------------------------------------------------------------------------------


class FakeStream:
    def __init__(self, buffered: int = 0, closed: bool = False) -> None:
        self.buffered = buffered
        self.closed = closed
        self.written: list[bytes] = []
        self.aborted = False
        self.on_close: Any = None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        self.aborted = True


def test_the_hub_writes_each_event_once_per_client_and_drops_the_slow() -> None:
    hub = EventHub(max_clients=3, max_buffer_bytes=100)
    fast, slow, gone = FakeStream(), FakeStream(), FakeStream(closed=True)
    for s in (fast, slow, gone):
        hub.attach(cast(Stream, s), b"snap")
    assert len(hub) == 2 and gone.written == []  # left before its stream opened
    assert not hub.full
    hub.publish(b"one")
    slow.buffered = 101  # has not taken what it was sent
    hub.publish(b"two")
    assert fast.written == [b"snap", b"one", b"two"]
    assert slow.written == [b"snap", b"one"] and slow.aborted
    assert hub.dropped == 1 and len(hub) == 1
    fast.on_close()  # the connection went away
    assert len(hub) == 0


def test_a_closed_hub_cuts_its_streams_and_any_later_one() -> None:
    hub = EventHub(max_clients=1, max_buffer_bytes=100)
    first = FakeStream()
    hub.attach(cast(Stream, first), b"snap")
    assert hub.full
    hub.close_all()
    assert first.aborted and hub.closed and len(hub) == 0
    late = FakeStream()
    hub.attach(cast(Stream, late), b"snap")
    assert late.aborted and late.written == [] and len(hub) == 0
    assert encode_event("sample", {"a": [1, None]}) == b'event: sample\ndata: {"a":[1,null]}\n\n'

"""Canary splits and shadows: the rollout rules, the registry's checks, and the query-side
routing with its shadow bookkeeping (against a stand-in scheduler)."""

from __future__ import annotations

import math
import random
from typing import Any, cast

import pytest

from clipper.batching.queue import Task
from clipper.batching.scheduler import ModelScheduler
from clipper.clock import FakeClock
from clipper.errors import ModelError, OverloadedError, RegistryError
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.persistence import diff_registries
from clipper.query.traffic import MAX_SHADOW_IN_FLIGHT, Traffic
from clipper.registry import Change, Intent, ModelVersion, Registry
from clipper.rollout import Rollout, Shadow, sticky_point, with_shadow, with_split
from clipper.store.base import Delete, Put
from tests.catalogs import catalog_of

# blake2b-64 of "m\0alice" over 2**64: what every frontend, before and after a restart, computes.
STICKY_M_ALICE = 0.8669973945765952


def registry(*versions: str) -> Registry:
    r = Registry()
    for v in versions:
        r.add_model(ModelVersion("m", v, InputType.DOUBLES, artifact="/x", num_replicas=1))
    r.set_model_version("m", versions[0])
    return r


# -- the rules -----------------------------------------------------------------------------------


def test_a_split_draws_versions_by_weight() -> None:
    ro = Rollout.build("m", {"2": 20, "1": 80})
    assert ro.split == (("1", 80.0), ("2", 20.0))
    assert ro.shares() == {"1": 0.8, "2": 0.2}
    rng = random.Random(7)
    n = 20_000
    drawn = sum(ro.pick("", rng) == "2" for _ in range(n))
    # binomial: 4.5 standard deviations of n * 0.2 * 0.8
    assert abs(drawn - 0.2 * n) < 4.5 * math.sqrt(n * 0.2 * 0.8)


def test_relative_weights_give_the_same_split() -> None:
    assert (
        Rollout.build("m", {"1": 95, "2": 5}).shares()
        == Rollout.build("m", {"1": 0.95, "2": 0.05}).shares()
    )


def test_sticky_uids_always_get_the_same_version_on_any_process() -> None:
    ro = Rollout.build("m", {"1": 50, "2": 50}, sticky=True)
    again = Rollout.from_record(ro.to_record())  # another frontend, or after a restart
    rng = random.Random(1)
    for uid in (f"user-{i}" for i in range(200)):
        first = ro.pick(uid, rng)
        assert all(ro.pick(uid, rng) == first for _ in range(5))
        assert again.pick(uid, random.Random(99)) == first
    # A fixed hash (not Python's salted hash()): a stored split keeps its users everywhere.
    assert sticky_point("m", "alice") == STICKY_M_ALICE
    assert sticky_point("n", "alice") != STICKY_M_ALICE


def test_sticky_without_a_uid_draws_at_random() -> None:
    ro = Rollout.build("m", {"1": 50, "2": 50}, sticky=True)
    rng = random.Random(3)
    assert {ro.pick("", rng) for _ in range(100)} == {"1", "2"}


def test_growing_the_canary_only_moves_users_onto_it() -> None:
    small = Rollout.build("m", {"1": 95, "2": 5}, sticky=True)
    large = Rollout.build("m", {"1": 80, "2": 20}, sticky=True)
    rng = random.Random(0)
    uids = [f"u{i}" for i in range(2000)]
    before = {u: small.pick(u, rng) for u in uids}
    after = {u: large.pick(u, rng) for u in uids}
    assert all(after[u] == "2" for u in uids if before[u] == "2")
    moved = sum(before[u] != after[u] for u in uids)
    assert 0.10 * len(uids) < moved < 0.20 * len(uids)  # about 15% of users move


@pytest.mark.parametrize(
    ("weights", "problem"),
    [
        ({"1": 0}, "must be a finite number > 0"),
        ({"1": -5}, "must be a finite number > 0"),
        ({"1": float("nan")}, "must be a finite number > 0"),
        ({"1": float("inf")}, "must be a finite number > 0"),
        ({"1": "95"}, "must be a number > 0"),
        ({"1": True}, "must be a number > 0"),
        ([["1", 95]], "a split is an object"),
        ({str(i): 1 for i in range(17)}, "at most 16 versions"),
    ],
)
def test_weights_that_make_no_sense_are_refused(weights: Any, problem: str) -> None:
    with pytest.raises(RegistryError, match=problem):
        Rollout.build("m", weights)


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_a_shadow_share_is_in_zero_to_one(share: float) -> None:
    with pytest.raises(RegistryError, match=r"share must be in \[0, 1\]"):
        Rollout.build("m", None, shadow=Shadow("2", share))


def test_a_version_cannot_answer_and_shadow() -> None:
    with pytest.raises(RegistryError, match="cannot shadow queries and answer them too"):
        Rollout.build("m", {"1": 1, "2": 1}, shadow=Shadow("2", 0.5))


def test_split_and_shadow_change_independently() -> None:
    ro = with_shadow(None, "m", "3", 0.25)
    ro = with_split(ro, "m", {"1": 9, "2": 1}, sticky=True)
    assert ro.shadow == Shadow("3", 0.25) and ro.sticky and ro.weights == {"1": 9.0, "2": 1.0}
    ro = with_shadow(ro, "m", None, 0.0)
    assert ro.shadow is None and ro.weights == {"1": 9.0, "2": 1.0} and ro.sticky
    assert with_split(ro, "m", None, sticky=False).empty
    assert Rollout.from_record(ro.to_record()) == ro


# -- the registry ----------------------------------------------------------------------------------


def test_the_registry_checks_every_version_a_rollout_names() -> None:
    r = registry("1", "2")
    with pytest.raises(RegistryError, match="No model with name 'x' exists"):
        r.set_rollout("x", Rollout.build("x", {"1": 1}))
    with pytest.raises(RegistryError, match=r"model 'm' has no version '9' \(its versions: 1, 2\)"):
        r.set_rollout("m", Rollout.build("m", {"1": 1, "9": 1}))
    with pytest.raises(RegistryError, match="has no version '9'"):
        r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("9", 0.1)))
    r.set_num_replicas("m", "2", 0)
    with pytest.raises(RegistryError, match="set to 0 replicas: scale it up first"):
        r.set_rollout("m", Rollout.build("m", {"1": 1, "2": 1}))
    r.set_num_replicas("m", "2", 1)
    r.add_model(ModelVersion("m", "3", InputType.DOUBLES, artifact="/x"))
    r.begin_intent(Intent("m", "3", "1", added=True, owner="n"))
    with pytest.raises(RegistryError, match="still being deployed"):
        r.set_rollout("m", Rollout.build("m", {"1": 1, "3": 1}))
    assert r.rollouts == {}


def test_versions_in_a_rollout_run_and_cannot_be_deleted() -> None:
    r = registry("1", "2", "3")
    seen: list[Change] = []
    r.subscribe(seen.append)
    v2, v3 = r.models["m"]["2"], r.models["m"]["3"]
    assert not r.runs(v2) and not r.runs(v3)
    r.set_rollout("m", Rollout.build("m", {"1": 95, "2": 5}, shadow=Shadow("3", 0.1)))
    assert r.runs(v2) and r.runs(v3)
    assert seen == [Change("rollout", "add", "m")]
    with pytest.raises(RegistryError, match="'2' of model 'm' is in its split"):
        r.delete_model_version("m", "2")
    with pytest.raises(RegistryError, match="'3' of model 'm' shadows its queries"):
        r.delete_model_version("m", "3")
    r.set_rollout("m", None)
    assert not r.runs(v2) and not r.runs(v3) and r.rollouts == {}
    assert seen[-1] == Change("rollout", "delete", "m")
    r.delete_model_version("m", "2")


def test_a_rollout_round_trips_through_the_store_records() -> None:
    r = registry("1", "2")
    draft = r.copy()
    draft.set_rollout("m", Rollout.build("m", {"1": 80, "2": 20}, sticky=True))
    ops = diff_registries(r, draft)
    assert [op for op in ops if op.kind == "rollout"] == [
        Put("rollout", "m", draft.rollouts["m"].to_record())
    ]
    other = Registry()  # another frontend, or a restart, loading the snapshot
    seen: list[Change] = []
    other.subscribe(seen.append)
    other.apply_snapshot(draft.records())
    assert other.rollouts == draft.rollouts
    assert Change("rollout", "add", "m") in seen
    emptied = draft.copy()
    emptied.set_rollout("m", None)
    assert diff_registries(draft, emptied) == [Delete("rollout", "m")]
    other.apply_snapshot(emptied.records())
    assert other.rollouts == {} and seen[-1] == Change("rollout", "delete", "m")


# -- the query side --------------------------------------------------------------------------------


class FakeScheduler:
    def __init__(self, replicas: int = 1, refuse: bool = False) -> None:
        self.replicas = [object()] * replicas
        self.tasks: list[Task] = []
        self.refuse = refuse
        self.pumps = 0

    def submit(self, task: Task) -> None:
        if self.refuse:
            raise OverloadedError("queue is full")
        self.tasks.append(task)

    def pump(self) -> None:
        self.pumps += 1


def traffic(r: Registry, scheds: dict[tuple[str, str], Any]) -> tuple[Traffic, Metrics]:
    metrics = Metrics()
    t = Traffic(catalog_of(r, scheds), clock=FakeClock(), metrics=metrics, rng=random.Random(5))
    return t, metrics


def run_soon(t: Traffic) -> None:
    """Run the callbacks the traffic module deferred (the shadow's pump)."""
    assert isinstance(t.clock, FakeClock)
    t.clock.advance(0.0)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_drawn_version_without_replicas_hands_its_query_to_the_current_one() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", {"2": 1}))
    scheds: dict[tuple[str, str], Any] = {("m", "1"): FakeScheduler(), ("m", "2"): FakeScheduler(0)}
    t, metrics = traffic(r, scheds)
    assert t.route("m", "", 1.0) == ("1", None)
    assert value(metrics, "clipper_split_fallbacks_total", model="m", version="2") == 1
    t.catalog._table.put(("m", "2"), cast(ModelScheduler, FakeScheduler(1)))  # as the reconciler
    assert t.route("m", "", 1.0) == ("2", None)
    assert value(metrics, "clipper_split_requests_total", model="m", version="2") == 1


def test_a_copy_goes_only_after_its_real_answer_and_is_compared() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("2", 1.0)))
    shadow_sched = FakeScheduler()
    t, metrics = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): shadow_sched})
    version, copies = t.route("m", "", 0.5)
    assert version == "1" and copies is not None
    answers: list[object] = []
    waiters = [copies.wrap(p, lambda v, e: answers.append(v)) for p in (b"a", b"b", b"c", b"d")]
    waiters[0](10, None)  # a cache hit while the request is still being queued
    assert shadow_sched.tasks == [] and answers == [10]
    copies.fire()
    assert [task.payload for task in shadow_sched.tasks] == [b"a"]
    assert shadow_sched.pumps == 0  # deferred until the running callbacks return
    run_soon(t)
    assert shadow_sched.pumps == 1
    waiters[1](20, None)
    waiters[2](30, None)
    waiters[3](None, ModelError("the real version failed"))
    assert answers == [10, 20, 30, None]  # the real answers pass through untouched, first
    run_soon(t)
    assert shadow_sched.pumps == 2  # one pump for the copies that arrived together
    assert [task.payload for task in shadow_sched.tasks] == [b"a", b"b", b"c"]  # no copy of d
    now = t.clock.now()
    assert all(task.key is None and task.deadline == now + 0.5 for task in shadow_sched.tasks)
    assert t.in_flight("m", "2") == 3
    a, b, c = shadow_sched.tasks
    assert a.waiter is not None and b.waiter is not None and c.waiter is not None
    a.waiter(10, None)
    b.waiter(21, None)
    c.waiter(None, ModelError("boom"))
    assert t.in_flight("m", "2") == 0
    labels = {"model": "m", "version": "2"}
    assert value(metrics, "clipper_shadow_agreements_total", **labels) == 1
    assert value(metrics, "clipper_shadow_disagreements_total", **labels) == 1
    assert value(metrics, "clipper_shadow_errors_total", **labels, reason="model_error") == 1
    view = t.describe("m")["stats"]["shadow"]["2"]
    assert view["sent"] == 3 and view["compared"] == 2 and view["agreement_rate"] == 0.5
    assert view["errors"] == {"model_error": 1}


def test_shadow_copies_beyond_the_bound_are_dropped_and_counted() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("2", 1.0)))
    shadow_sched = FakeScheduler()
    t, metrics = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): shadow_sched})
    _, copies = t.route("m", "", 5.0)
    assert copies is not None
    waiters = [
        copies.wrap(str(i).encode(), lambda v, e: None) for i in range(MAX_SHADOW_IN_FLIGHT + 10)
    ]
    copies.fire()
    for waiter in waiters:
        waiter(1, None)
    assert len(shadow_sched.tasks) == MAX_SHADOW_IN_FLIGHT
    assert value(metrics, "clipper_shadow_dropped_total", model="m", version="2") == 10


def test_a_full_shadow_queue_is_an_error_of_the_shadow_only() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("2", 1.0)))
    t, metrics = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): FakeScheduler(refuse=True)})
    _, copies = t.route("m", "", 5.0)
    assert copies is not None
    real: list[object] = []
    waiter = copies.wrap(b"x", lambda v, e: real.append(v))
    copies.fire()
    waiter(1, None)
    assert real == [1] and t.in_flight("m", "2") == 0
    assert value(metrics, "clipper_shadow_errors_total", model="m", version="2", reason="overload")


def test_the_shadow_share_samples_queries() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("2", 0.1)))
    t, _ = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): FakeScheduler()})
    n = 5000
    shadowed = sum(t.route("m", "", 1.0)[1] is not None for _ in range(n))
    assert abs(shadowed - 0.1 * n) < 4.5 * math.sqrt(n * 0.1 * 0.9)


def test_a_query_answered_by_the_shadow_version_is_not_shadowed() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("2", 1.0)))
    r.set_model_version("m", "2")
    t, _ = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): FakeScheduler()})
    assert t.route("m", "", 1.0) == ("2", None)


def test_pick_is_the_split_rule_without_counting() -> None:
    r = registry("1", "2")
    t, metrics = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): FakeScheduler()})
    assert t.pick("m", "alice") == "1"  # no rollout: the current version
    r.set_rollout("m", Rollout.build("m", {"1": 50, "2": 50}, sticky=True))
    assert t.pick("m", "alice") == r.rollouts["m"].pick("alice", random.Random())
    assert value(metrics, "clipper_split_requests_total", model="m", version="1") == 0
    assert value(metrics, "clipper_split_requests_total", model="m", version="2") == 0


def test_no_copy_is_sent_for_an_input_the_real_version_refused() -> None:
    r = registry("1", "2")
    r.set_rollout("m", Rollout.build("m", None, shadow=Shadow("2", 1.0)))
    shadow_sched = FakeScheduler()
    t, metrics = traffic(r, {("m", "1"): FakeScheduler(), ("m", "2"): shadow_sched})
    _, copies = t.route("m", "", 5.0)
    assert copies is not None
    refused = copies.wrap(b"x", lambda v, e: None)
    kept = copies.wrap(b"y", lambda v, e: None)
    refused(None, OverloadedError("shed at admission"))  # as submit does, synchronously
    copies.fire()
    kept(3, None)
    assert [task.payload for task in shadow_sched.tasks] == [b"y"]
    assert t.in_flight("m", "2") == 1
    assert value(metrics, "clipper_shadow_requests_total", model="m", version="2") == 1

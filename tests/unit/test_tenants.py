"""Tenants on the fake clock: token buckets, quotas per application and across all, hashed
keys, the gate's refusals and their headers, the queue's order by class then deadline, and the
order in which admission sheds the classes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from typing import Any

import pytest

from clipper.batching.queue import ModelQueue, Task
from clipper.clock import FakeClock
from clipper.errors import BadInputError, OverloadedError, RegistryError, RequestError
from clipper.metrics import Metrics, counter_values
from clipper.persistence import diff_registries
from clipper.registry import Registry
from clipper.store.base import Put
from clipper.tenants import (
    ApiKey,
    BadTenantHeader,
    KeyRequired,
    PriorityClass,
    PriorityForbidden,
    Quota,
    QuotaExceeded,
    Tenant,
    TenantGate,
    TokenBucket,
    UnknownKey,
    hash_key,
    new_key,
    request_key,
)
from tests.unit import test_deadlines
from tests.unit.test_scheduler import Harness, fixed

frontends = test_deadlines.frontends  # each frontend is closed after its test

CRITICAL, STANDARD, SHEDDABLE = PriorityClass


# -- token buckets ---------------------------------------------------------------------------
def test_a_bucket_starts_full_gives_its_burst_then_refills_at_its_rate() -> None:
    clock = FakeClock()
    b = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [b.take() for _ in range(4)] == [True, True, True, False]
    assert b.wait_s() == pytest.approx(0.5)
    clock.advance(0.25)
    assert not b.take()  # half a token
    clock.advance(0.25)
    assert b.take() and not b.take()


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    clock = FakeClock()
    b = TokenBucket(rate=100.0, burst=2, clock=clock)
    clock.advance(3600.0)
    assert b.refill() == 2.0
    assert [b.take() for _ in range(3)] == [True, True, False]


# -- keys ------------------------------------------------------------------------------------
def test_keys_are_random_and_only_their_sha256_is_stored() -> None:
    key, digest = new_key()
    other, _ = new_key()
    assert key.startswith("ck_") and len(key) > 40 and key != other
    assert digest == hashlib.sha256(key.encode()).hexdigest() == hash_key(key.encode())
    record = Tenant("t", keys=(ApiKey(digest),)).to_record()
    assert key not in repr(record) and digest in repr(record)
    described = Tenant("t", keys=(ApiKey(digest),)).describe()
    assert digest not in repr(described) and described["keys"][0]["key_id"] == digest[:12]


def test_the_key_comes_from_either_header_and_ambiguity_is_refused() -> None:
    assert request_key(b"Bearer ck_a", None) == b"ck_a"
    assert request_key(b"bearer  ck_a ", None) == b"ck_a"
    assert request_key(None, b"ck_b") == b"ck_b"
    assert request_key(b"Bearer ck_a", b"ck_a") == b"ck_a"
    assert request_key(None, None) is None
    for auth, api in ((b"Basic eDp5", None), (b"Bearer ck_a", b"ck_b"), (None, b"ck_a, ck_b")):
        with pytest.raises(BadTenantHeader) as e:
            request_key(auth, api)
        assert e.value.status == 400


# -- records ---------------------------------------------------------------------------------
def test_a_tenant_record_round_trips_and_bad_ones_name_the_problem() -> None:
    t = Tenant(
        "team-a",
        CRITICAL,
        (Quota(5.0, 10), Quota(1.5, 2, "app")),
        (ApiKey("a" * 64, SHEDDABLE, 1.0),),
    )
    assert Tenant.from_record(t.to_record()) == t
    with pytest.raises(RegistryError, match="one quota per application"):
        Tenant("t", quotas=(Quota(1.0, 1), Quota(2.0, 2)))
    with pytest.raises(RegistryError, match="burst must be an integer >= 1"):
        Quota(1.0, 0)
    with pytest.raises(RegistryError, match="rate must be in"):
        Quota(0.0, 1)
    with pytest.raises(RegistryError, match="critical, standard, sheddable"):
        PriorityClass.parse("urgent")


def test_tenants_go_to_the_store_and_come_back_through_the_registry() -> None:
    before = Registry()
    after = before.copy()
    t = Tenant("t", SHEDDABLE, (Quota(1.0, 1),))
    after.set_tenant(t)
    ops = diff_registries(before, after)
    assert ops == [Put("tenant", "t", t.to_record())]
    other = Registry()
    changes = other.apply_snapshot({"tenant": {"t": t.to_record()}})
    assert other.tenants == {"t": t} and [c.kind for c in changes] == ["tenant"]
    assert other.apply_snapshot({"tenant": {}})[0].op == "delete" and not other.tenants
    with pytest.raises(RegistryError, match="application 'nope', which does not exist"):
        Registry().set_tenant(Tenant("t", quotas=(Quota(1.0, 1, "nope"),)))


# -- the gate --------------------------------------------------------------------------------
def _gate(*tenants: Tenant) -> tuple[TenantGate, FakeClock, Metrics]:
    clock = FakeClock()
    metrics = Metrics()
    return TenantGate({t.name: t for t in tenants}, clock, metrics), clock, metrics


def _tenant(name: str, *quotas: Quota, cls: PriorityClass = STANDARD, **k: Any) -> Any:
    key, digest = new_key()
    return Tenant(name, cls, quotas, (ApiKey(digest, k.get("key_cls")),)), key.encode()


def test_a_quota_for_one_app_and_one_across_all_are_both_charged() -> None:
    t, key = _tenant("t", Quota(1.0, 2), Quota(1.0, 1, "a"))
    gate, clock, metrics = _gate(t)
    assert gate.admit(key, "a", False, None) is not None  # both buckets: 1 left overall
    with pytest.raises(QuotaExceeded) as e:
        gate.admit(key, "a", False, None)  # "a"'s own bucket is empty
    assert '"app.a";q=1;w=1' in e.value.headers.decode()
    assert gate.admit(key, "b", False, None) is not None  # the overall bucket's last token
    with pytest.raises(QuotaExceeded) as e:
        gate.admit(key, "b", False, None)
    err = e.value
    assert err.status == 429 and err.retry_after_s == 1
    assert err.headers.decode().split("\r\n")[:3] == [
        "Retry-After: 1",
        'RateLimit-Policy: "all";q=2;w=2',
        'RateLimit: "all";r=0;t=1',
    ]
    assert "tenant 't' is over its quota across all applications" in err.cause
    clock.advance(1.0)
    assert gate.admit(key, "b", False, None) is not None
    assert counter_values(metrics.tenant_refused) == {("t", "quota"): 2.0}
    assert counter_values(metrics.tenant_admitted) == {("t", "standard"): 3.0}


def test_a_refused_request_takes_no_token_from_any_bucket() -> None:
    t, key = _tenant("t", Quota(1.0, 5), Quota(1.0, 1, "a"))
    gate, _, _ = _gate(t)
    gate.admit(key, "a", False, None)
    for _ in range(10):
        with contextlib.suppress(QuotaExceeded):
            gate.admit(key, "a", False, None)
    for _ in range(4):  # the overall bucket kept its 4 tokens
        gate.admit(key, "b", False, None)
    with pytest.raises(QuotaExceeded):
        gate.admit(key, "b", False, None)


def test_one_tenant_over_its_quota_leaves_another_untouched() -> None:
    a, key_a = _tenant("a", Quota(1.0, 1))
    b, key_b = _tenant("b", Quota(1.0, 1))
    gate, _, _ = _gate(a, b)
    gate.admit(key_a, "x", False, None)
    with pytest.raises(QuotaExceeded):
        gate.admit(key_a, "x", False, None)
    assert gate.admit(key_b, "x", False, None) is not None


def test_keys_required_unknown_and_anonymous() -> None:
    t, key = _tenant("t")
    gate, _, _ = _gate(t)
    assert gate.admit(None, "a", False, None) is None  # anonymous, standard
    with pytest.raises(KeyRequired) as e:
        gate.admit(None, "a", True, None)
    assert e.value.status == 401 and b"WWW-Authenticate: Bearer" in e.value.headers
    with pytest.raises(UnknownKey) as u:
        gate.admit(b"ck_nobody", "a", False, None)
    assert u.value.status == 401
    admitted = gate.admit(key, "a", True, None)
    assert admitted is not None and admitted.tenant == "t"


def test_a_request_may_lower_its_class_never_raise_it() -> None:
    t, key = _tenant("t", cls=STANDARD)
    gate, _, _ = _gate(t)
    got = gate.admit(key, "a", False, b"sheddable")
    assert got is not None and got.priority is SHEDDABLE
    with pytest.raises(PriorityForbidden) as e:
        gate.admit(key, "a", False, b"critical")
    assert e.value.status == 403 and "may only lower" in e.value.cause
    with pytest.raises(BadTenantHeader):
        gate.admit(key, "a", False, b"urgent")
    anon = gate.admit(None, "a", False, b"Sheddable")
    assert anon is not None and anon.priority is SHEDDABLE and anon.tenant == ""


def test_a_keys_own_class_overrides_its_tenants() -> None:
    t, key = _tenant("t", cls=CRITICAL, key_cls=SHEDDABLE)
    gate, _, _ = _gate(t)
    got = gate.admit(key, "a", False, None)
    assert got is not None and got.priority is SHEDDABLE
    with pytest.raises(PriorityForbidden):
        gate.admit(key, "a", False, b"standard")


def test_a_change_is_seen_at_the_next_request_and_unchanged_buckets_keep_their_tokens() -> None:
    t, key = _tenant("t", Quota(1.0, 1))
    tenants = {"t": t}
    gate = TenantGate(tenants, FakeClock())
    gate.admit(key, "a", False, None)
    new, new_digest = new_key()
    tenants["t"] = Tenant("t", STANDARD, t.quotas, (*t.keys, ApiKey(new_digest)))
    gate.changed()
    with pytest.raises(QuotaExceeded):  # same quota: still empty, whichever key
        gate.admit(new.encode(), "a", False, None)
    tenants["t"] = Tenant("t", STANDARD, (Quota(1.0, 3),), ())
    gate.changed()
    with pytest.raises(UnknownKey):  # keys revoked
        gate.admit(key, "a", False, None)


def test_every_refusal_is_a_request_error() -> None:
    for cls in (KeyRequired, UnknownKey, PriorityForbidden, BadTenantHeader, QuotaExceeded):
        assert issubclass(cls, RequestError)


# -- the queue: class, then deadline -------------------------------------------------------------
def _task(name: bytes, deadline: float, rank: int) -> Task:
    return Task(name, deadline, 0.0, None, None, rank)


def test_the_queue_serves_the_highest_class_first_and_by_deadline_within_it() -> None:
    q = ModelQueue(10)
    for name, deadline, rank in (
        (b"s1", 1.0, 2), (b"c2", 5.0, 0), (b"n1", 2.0, 1), (b"c1", 4.0, 0), (b"s2", 0.5, 2),
    ):  # fmt: skip
        assert q.push(_task(name, deadline, rank))
    assert len(q) == 5 and q.ahead(0) == 2 and q.ahead(1) == 3 and q.ahead(2) == 5
    assert q.earliest_deadline() == 0.5  # expiry still looks at every class
    assert [t.payload for t in q.pop(3)] == [b"c1", b"c2", b"n1"]
    assert [t.payload for t in q.pop(5)] == [b"s2", b"s1"]
    assert len(q) == 0


def test_expiry_drops_late_tasks_of_every_class() -> None:
    q = ModelQueue(10)
    for name, deadline, rank in ((b"c", 9.0, 0), (b"s", 1.0, 2), (b"n", 2.0, 1)):
        q.push(_task(name, deadline, rank))
    assert sorted(t.payload for t in q.drop_expired(2.0)) == [b"n", b"s"]
    assert len(q) == 1


# -- admission sheds by class ------------------------------------------------------------------
def _busy(trust: None) -> Harness:
    """A model measured at one input per 100 ms, its only replica busy."""
    h = Harness(batching=fixed(1), queue_capacity=1000)
    h.replica()
    h.submit(b"a")
    h.clock.advance(0.1)
    h.respond(0)
    h.submit(b"busy")
    return h


def _offer(h: Harness, payload: bytes, slo_s: float, rank: int) -> bool:
    now = h.clock.now()
    try:
        h.sched.submit(Task(payload, now + slo_s, now, None, h.results.waiter(payload), rank))
    except OverloadedError:
        return False
    return True


async def test_sheddable_is_shed_first_and_critical_is_priced_against_its_own_class(
    trust_one_batch: None,
) -> None:
    h = _busy(trust_one_batch)
    try:
        # Sheddable work is priced against everything queued, on 75% of the capacity: with
        # 100 ms running, a 1 s SLO admits (1 - 0.1) * 7.5 - 1 ~ 5 of them.
        admitted = [_offer(h, b"s%d" % k, 1.0, 2) for k in range(20)]
        assert 4 <= sum(admitted) <= 6 and not admitted[-1]
        # Standard waits behind no sheddable work: 100 ms running + its own 100 ms.
        assert _offer(h, b"n", 0.25, 1)
        # Critical waits behind neither: a 250 ms SLO fits next to a standard query.
        assert _offer(h, b"c", 0.25, 0)
        # Standard now waits behind the critical one as well: no longer fits 250 ms.
        assert not _offer(h, b"n2", 0.25, 1)
        h.respond(1)  # the replica frees: the critical query goes first, then standard
        assert h.transport.payloads(2) == [b"c"]
        h.respond(2)
        assert h.transport.payloads(3) == [b"n"]
    finally:
        h.sched.close(OverloadedError("test over"))


async def test_a_full_queue_makes_room_for_a_higher_class() -> None:
    h = Harness(batching=fixed(1), queue_capacity=2)
    try:
        assert _offer(h, b"s1", 1.0, 2) and _offer(h, b"s2", 2.0, 2)
        assert _offer(h, b"c", 1.0, 0)  # s1 (sheddable, due first) is shed for it
        assert isinstance(h.results.error(b"s1"), OverloadedError)
        assert "a query of a higher class took this one's place" in str(h.results.error(b"s1"))
        assert _offer(h, b"n", 1.0, 1)  # and s2 for a standard one
        assert not _offer(h, b"n2", 1.0, 1)  # nothing lower left: refused as before
        assert not _offer(h, b"s3", 1.0, 2)
        assert len(h.sched.queue) == 2
    finally:
        h.sched.close(OverloadedError("test over"))


def test_grpc_header_blocks_carry_the_calls_key_and_priority() -> None:
    """The native gRPC transport keeps the metadata the gate reads (and only that)."""
    import hpack

    from clipper.frontend.grpc.hpack_blocks import HeaderCache

    block = hpack.Encoder().encode(
        [(":path", "/inference.GRPCInferenceService/ModelInfer"),
         ("content-type", "application/grpc"), ("authorization", "Bearer ck_a"),
         ("x-priority", "sheddable"), ("user-agent", "grpc-python")]
    )  # fmt: skip
    cache = HeaderCache()
    path, ctype, meta = cache.decode_call(block)
    assert path.endswith(b"/ModelInfer") and ctype == b"application/grpc"
    assert meta == {b"authorization": b"Bearer ck_a", b"x-priority": b"sheddable"}
    gate = TenantGate({"t": _tenant("t")[0]}, FakeClock())
    with pytest.raises(UnknownKey):
        gate.judge(meta, "a", False)
    assert cache.decode(block) == (path, ctype)  # the two-field answer, as before


def test_a_deployment_without_tenants_reads_no_keys() -> None:
    gate = TenantGate({}, FakeClock())
    assert gate.judge({b"authorization": b"Basic eDp5"}, "a", False) is None
    lowered = gate.judge({b"x-priority": b"sheddable"}, "a", False)
    assert lowered is not None and lowered.priority is SHEDDABLE
    with pytest.raises(KeyRequired):
        gate.judge({}, "a", True)


def test_the_class_reaches_the_seam_for_single_and_selection_applications(
    frontends: list[Any],
) -> None:
    """The processor hands a query's class to its runner, which queues every input with it."""
    from clipper.inputs import InputType
    from clipper.registry import Application
    from tests.unit.test_deadlines import Answers, Frontend

    single = Application("one", InputType.DOUBLES, "-1", 20_000)
    f = Frontend(single, ["m"])
    frontends.append(f)
    f.registry.add_app(Application("ens", InputType.DOUBLES, "-1", 20_000, policy="exp4"))
    f.registry.link("ens", "m")
    sel = f.query.selection.selection(f.registry.apps["ens"])
    sel.states.put("", sel.policy.init_state())
    ranks: list[int] = []
    for runner in (f.query.single, f.query.selection):
        inner = runner.seam

        class Recording:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def submit(self, *args: Any) -> bool:
                ranks.append(args[5])
                return bool(self.inner.submit(*args))

            def __getattr__(self, name: str) -> Any:
                return getattr(self.inner, name)

        runner.seam = Recording(inner)
    for app, rank in (("one", SHEDDABLE), ("ens", CRITICAL)):
        application = f.registry.apps[app]
        payloads, _, uid = f.parser.parse(application, b'{"input": [1.0]}')
        f.proc.predict(
            application, payloads, None, uid, Answers(f.clock), f.clock.now(), None, rank
        )
    assert ranks == [SHEDDABLE, CRITICAL]


def test_shed_inputs_are_counted_for_the_tenant_on_every_protocol() -> None:
    from clipper.frontend.grpc.server import _Pending
    from clipper.frontend.tenant_sheds import count_answer, count_failure
    from clipper.query.prediction import DefaultReason, Prediction, QueryRejected

    t, key = _tenant("t", cls=SHEDDABLE)
    gate, _, metrics = _gate(t)
    admitted = gate.admit(key, "a", False, None)
    answers = [
        Prediction(1, "-1", DefaultReason.OVERLOAD),
        Prediction(2, "-1", DefaultReason.SLO),
        Prediction(3, 2.0),
    ]
    count_answer(gate, admitted, answers)
    count_answer(gate, None, answers)  # not past the gate: nothing to count
    count_failure(gate, admitted, BadInputError("not a shed"))
    assert counter_values(metrics.tenant_shed) == {("t", "sheddable"): 2.0}
    # A gRPC call that the application answers with 503 rather than defaults: one shed.
    loop = asyncio.new_event_loop()
    try:
        reply = _Pending(loop.create_future())
        reply.admitted, reply.gate = admitted, gate
        rejected = QueryRejected("shed under overload")
        reply.fail(rejected)
        assert reply.future.result() is rejected
    finally:
        loop.close()
    assert counter_values(metrics.tenant_shed) == {("t", "sheddable"): 3.0}

"""The deadline guarantees of the query path, on a fake clock: a query is answered with the
default output when the clock reaches its deadline and not before; a straggling model of an
ensemble is cut at the deadline and the answer uses the others. No loop, no sleeping: the
deadline timers are armed on the clock and fire inside ``clock.advance``."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from clipper.batching.queue import Task
from clipper.batching.scheduler import ModelScheduler, Replica
from clipper.cache import PredictionCache
from clipper.clock import FakeClock
from clipper.config import BatchingConfig
from clipper.errors import ReplicaError, RequestError
from clipper.frontend.clipper_rest import PredictParser
from clipper.frontend.routes import encode_predictions
from clipper.inputs import InputType
from clipper.metrics import Metrics
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.prediction import SLO_MISSED, Prediction, Reply
from clipper.query.runtime import build_query_runtime
from clipper.registry import Application, ModelVersion, Registry
from clipper.rpc.link import Connection
from clipper.runtime.catalog import Catalog, SchedulerTable

SLO_US = 20_000  # 20 ms: the answer margin is 2 ms


class Transport:
    """Records batches; the test answers them (or not) through the scheduler."""

    def __init__(self) -> None:
        self.sent: list[tuple[Connection[Replica], int, list[bytes]]] = []
        # msg id -> the tasks the batch carried (the wire sees payloads only: read from the
        # replica's in-flight record while it is there)
        self.tasks: dict[int, list[Task]] = {}
        # Answers that arrived while the loop was away: read only by collect().
        self.unread: list[Callable[[], None]] = []

    def send_batch(
        self,
        link: Connection[Replica],
        itype: InputType,
        payloads: list[bytes],
        traceparent: str | None = None,
    ) -> int:
        self.sent.append((link, len(self.sent), list(payloads)))
        return len(self.sent) - 1

    def collect(self) -> None:
        """The answers that arrived unread (:attr:`unread`) are read now."""
        unread, self.unread = self.unread, []
        for deliver in unread:
            deliver()

    def capture(self) -> None:
        for link, msg_id, _ in self.sent:
            replica = link.peer
            if msg_id not in self.tasks and replica is not None and msg_id in replica.in_flight:
                self.tasks[msg_id] = list(replica.in_flight[msg_id][0])


class Answers:
    """The answers a query got (as the Clipper REST document), with the clock's time of each."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.got: list[tuple[float, int, Any]] = []

    def answer(self, predictions: list[Prediction]) -> None:
        self.got.append((self.clock.now(), 200, orjson.loads(encode_predictions(predictions))))

    def fail(self, err: RequestError) -> None:
        self.got.append((self.clock.now(), err.status, str(err)))

    def one(self) -> tuple[float, Any]:
        [(at, status, doc)] = self.got
        assert status == 200
        return at, doc


class Frontend:
    """A query processor over fake-transport schedulers, one replica per model."""

    def __init__(
        self,
        app: Application,
        models: list[str],
        *,
        link: bool = True,
        types: dict[str, InputType] | None = None,
    ) -> None:
        self.clock = FakeClock()
        self.registry = Registry()
        self.cache = PredictionCache(1 << 20)
        self.metrics = Metrics()
        self.transport = Transport()
        self.schedulers = SchedulerTable()
        self.catalog = Catalog(self.registry, self.schedulers)
        self.replicas: dict[str, Replica] = {}
        self.registry.add_app(app)
        batching = BatchingConfig(controller="fixed", max_batch_size=8, max_wait_micros=0)
        for i, name in enumerate(models):
            itype = (types or {}).get(name, app.input_type)
            mv = ModelVersion(name=name, version="1", input_type=itype, batching=batching)
            self.registry.add_model(mv)
            self.registry.set_model_version(name, "1")
            if link:
                self.registry.link(app.name, name)
            sched = ModelScheduler(
                mv,
                slo_s=app.slo_s,
                cache=self.cache,
                clock=self.clock,
                transport=self.transport,
                metrics=self.metrics,
                queue_capacity=100,
            )
            self.schedulers.put(mv.key, sched)
            replica = Replica(Connection(name.encode(), i, True, 3.0, self.clock.now()))
            sched.add_replica(replica)
            self.replicas[name] = replica
        self.query = build_query_runtime(
            self.catalog, self.cache, clock=self.clock, metrics=self.metrics,
            rng=random.Random(0),
        )  # fmt: skip
        self.proc = self.query.processor
        self.parser = PredictParser(1000)  # the Clipper REST protocol's

    def predict(
        self, app: str, body: bytes, reply: Reply, *, t0: float | None = None,
        slo_s: float | None = None,
    ) -> None:  # fmt: skip
        """A Clipper REST predict body, parsed as the protocol does, then to the processor."""
        application = self.registry.apps[app]
        payloads, version, uid = self.parser.parse(application, body)
        arrived = self.clock.now() if t0 is None else t0
        self.proc.predict(application, payloads, version, uid, reply, arrived, slo_s)

    def lag(self, monitor: LoopLagMonitor) -> None:
        """Shed for ``monitor``'s loop lag, and add its socket wait to the histogram."""
        self.query.single.loop_lag = monitor
        self.query.split.loop_lag = monitor
        self.query.answers.loop_lag = monitor

    def answer(self, model: str, outputs: list[object]) -> None:
        """The model's replica answers its (only) batch in flight."""
        self.transport.capture()
        replica = self.replicas[model]
        [msg_id] = replica.in_flight
        sched = replica.scheduler
        assert sched is not None
        sched.on_response(replica, msg_id, outputs, None, 10)

    def close(self) -> None:
        for sched in self.schedulers.values():
            sched.close(ReplicaError("test over"))


@pytest.fixture
def frontends() -> Iterator[list[Frontend]]:
    made: list[Frontend] = []
    yield made
    for f in made:
        f.close()


def single_app(**kwargs: Any) -> Application:
    return Application("app", InputType.DOUBLES, "-1", SLO_US, **kwargs)


def test_a_query_gets_the_default_output_exactly_at_its_deadline(
    frontends: list[Frontend],
) -> None:
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    t0 = f.clock.now()
    f.predict("app", b'{"input": [1.0]}', answers)
    assert len(f.transport.sent) == 1  # the replica has it, and never answers
    answer_at = t0 + app.slo_s - app.answer_margin_s
    f.clock.advance(app.slo_s - app.answer_margin_s - 1e-6)
    assert answers.got == []  # not before
    f.clock.advance(1e-6)
    at, doc = answers.one()
    assert at == pytest.approx(answer_at, abs=1e-9)
    assert doc["default"] is True and doc["output"] == -1
    assert doc["default_explanation"] == SLO_MISSED
    f.answer("m", [5.0])  # the late answer is not a second response
    assert len(answers.got) == 1
    assert f.clock.pending() == 0


def test_an_answer_that_arrived_unread_when_the_deadline_timer_fires_is_the_answer(
    frontends: list[Frontend],
) -> None:
    """The loop was away (another program had the core) past the query's deadline timer; the
    replica's answer arrived meanwhile. The loop runs due timers before it reads its sockets:
    the timer reads the waiting answers first, and the query gets the prediction."""
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.transport.unread.append(lambda: f.answer("m", [5.0]))  # in the socket, not read yet
    f.clock.advance(0.030)  # the deadline timer (due at 18 ms) fires before any socket read
    _, doc = answers.one()
    assert doc["default"] is False and doc["output"] == 5.0
    assert f.transport.unread == []
    assert f.clock.pending() == 0
    # With nothing waiting, the timer answers the default as before.
    g = Frontend(single_app(), ["m"])
    frontends.append(g)
    late = Answers(g.clock)
    g.predict("app", b'{"input": [1.0]}', late)
    g.clock.advance(0.030)
    _, doc = late.one()
    assert doc["default"] is True and doc["default_explanation"] == SLO_MISSED


def test_an_answer_before_the_deadline_cancels_the_deadline_timer(
    frontends: list[Frontend],
) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.clock.advance(0.005)
    f.answer("m", [5.0])
    at, doc = answers.one()
    assert at == f.clock.now()
    assert doc["default"] is False and doc["output"] == 5.0
    assert f.clock.pending() == 0
    f.clock.advance(1.0)
    assert len(answers.got) == 1


def test_a_query_with_a_shorter_slo_is_answered_at_its_own_deadline(
    frontends: list[Frontend],
) -> None:
    app = single_app()
    f = Frontend(app, ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    t0 = f.clock.now()
    f.predict("app", b'{"input": [1.0]}', answers, slo_s=0.01)  # e.g. a V2 timeout
    f.clock.advance(0.01)
    at, doc = answers.one()
    assert at == pytest.approx(t0 + 0.01 - app.answer_margin_s, abs=1e-9)
    assert doc["default"] is True


def test_a_query_whose_deadline_passes_while_queued_never_reaches_the_replica(
    frontends: list[Frontend],
) -> None:
    app = single_app(cache=False)
    f = Frontend(app, ["m"])
    frontends.append(f)
    first, second = Answers(f.clock), Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', first)  # takes the only in-flight slot
    f.clock.advance(0.010)
    f.predict("app", b'{"input": [2.0]}', second, slo_s=0.005)  # queued behind it
    f.clock.advance(0.005)  # past the second one's deadline: expired in the queue
    assert len(f.schedulers["m", "1"].queue) == 0
    _, doc = second.one()
    assert doc["default"] is True and doc["default_explanation"] == SLO_MISSED
    f.answer("m", [1.5])  # the slot frees up: nothing left to send
    _, doc = first.one()
    assert doc["output"] == 1.5
    assert len(f.transport.sent) == 1  # the replica never saw the second query


def ensemble_app() -> Application:
    return Application("app", InputType.DOUBLES, "-1", SLO_US, policy="exp4")


def ensemble(frontends: list[Frontend], models: list[str]) -> Frontend:
    f = Frontend(ensemble_app(), models)
    frontends.append(f)
    runtime = f.query.selection
    app = f.registry.apps["app"]
    sel = runtime.selection(app)
    sel.states.put("", sel.policy.init_state())  # known user: no state to load, no task
    return f


def test_a_straggling_model_is_cut_at_the_deadline_and_the_others_answer(
    frontends: list[Frontend],
) -> None:
    f = ensemble(frontends, ["fast", "also-fast", "slow"])
    app = f.registry.apps["app"]
    answers = Answers(f.clock)
    t0 = f.clock.now()
    f.predict("app", b'{"input": [1.0]}', answers)
    assert {r.identity for r, _, _ in f.transport.sent} == {b"fast", b"also-fast", b"slow"}
    f.clock.advance(0.003)
    f.answer("fast", [2.5])
    f.answer("also-fast", [2.5])
    f.clock.advance(app.slo_s - app.answer_margin_s - 0.003 - 1e-6)
    assert answers.got == []  # waiting for the slow one until the deadline, not longer
    f.clock.advance(1e-6)
    at, doc = answers.one()
    assert at == pytest.approx(t0 + app.slo_s - app.answer_margin_s, abs=1e-9)
    assert doc["default"] is False
    assert doc["output"] == 2.5
    assert sorted(doc["models"]) == ["also-fast", "fast"]  # the straggler was left out
    assert doc["confidence"] < 1.0  # and its absence lowers the confidence
    f.answer("slow", [9.0])
    assert len(answers.got) == 1
    assert f.clock.pending() == 0


def test_an_ensembles_output_that_arrived_unread_at_the_deadline_counts(
    frontends: list[Frontend],
) -> None:
    f = ensemble(frontends, ["fast", "slow"])
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.answer("fast", [2.5])
    f.transport.unread.append(lambda: f.answer("slow", [2.5]))  # arrived, not read yet
    f.clock.advance(0.030)
    _, doc = answers.one()
    assert sorted(doc["models"]) == ["fast", "slow"]  # read before the ensemble was cut
    assert f.transport.unread == []


def test_an_ensemble_answers_at_once_when_every_model_has_answered(
    frontends: list[Frontend],
) -> None:
    f = ensemble(frontends, ["a", "b"])
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.clock.advance(0.001)
    f.answer("a", [3.5])
    assert answers.got == []
    f.answer("b", [3.5])
    at, doc = answers.one()
    assert at == f.clock.now()
    assert doc["default"] is False and sorted(doc["models"]) == ["a", "b"]
    assert f.clock.pending() == 0


def test_an_ensemble_where_no_model_answers_gets_the_default_at_the_deadline(
    frontends: list[Frontend],
) -> None:
    f = ensemble(frontends, ["a", "b"])
    app = f.registry.apps["app"]
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.clock.advance(app.slo_s - app.answer_margin_s)
    _, doc = answers.one()
    assert doc["default"] is True and doc["output"] == -1
    assert doc["default_explanation"] == SLO_MISSED


def restart(f: Frontend, model: str) -> Replica:
    """The model's replica fails holding its batch; a restarted one connects (and takes the
    batch again, without answering it)."""
    old = f.replicas[model]
    sched = old.scheduler
    assert sched is not None
    sched.remove_replica(old)
    new = Replica(Connection(model.encode() + b"-2", 9, True, 3.0, f.clock.now()))
    sched.add_replica(new)
    f.replicas[model] = new
    return new


def test_a_query_lost_with_its_replica_is_a_replica_failure_even_once_one_is_back(
    frontends: list[Frontend],
) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.clock.advance(0.002)
    new = restart(f, "m")
    assert len(new.in_flight) == 1  # the restarted replica holds the query again
    f.clock.advance(0.030)
    _, doc = answers.one()
    assert doc["default"] is True
    assert doc["default_explanation"] == (
        "No replica of model m:1 is alive: the replica holding this query failed or left "
        "before answering"
    )
    # A failure before a query was queued is not that query's: its miss is the SLO's.
    later = Answers(f.clock)
    f.predict("app", b'{"input": [2.0]}', later)
    f.clock.advance(0.030)
    _, doc = later.one()
    assert doc["default_explanation"] == SLO_MISSED


def test_an_ensemble_lost_with_its_replicas_is_a_replica_failure_even_once_they_are_back(
    frontends: list[Frontend],
) -> None:
    f = ensemble(frontends, ["a", "b"])
    answers = Answers(f.clock)
    f.predict("app", b'{"input": [1.0]}', answers)
    f.clock.advance(0.002)
    restart(f, "a")
    restart(f, "b")
    f.clock.advance(0.030)
    _, doc = answers.one()
    assert doc["default_explanation"] == (
        "No replica of a chosen model is alive: the replicas holding this query (a, b) failed "
        "or left before answering"
    )
    # One of them still up through the query: the deadline came first.
    g = ensemble(frontends, ["a", "b"])
    late = Answers(g.clock)
    g.predict("app", b'{"input": [1.0]}', late)
    restart(g, "a")
    g.clock.advance(0.030)
    _, doc = late.one()
    assert doc["default_explanation"] == SLO_MISSED

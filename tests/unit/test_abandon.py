"""Abandoned queries, on a fake clock over fake-transport schedulers: a query whose client went
away (the protocol calls ``client_gone`` on its reply) is not answered, and its inputs leave
the queue at dispatch without reaching a replica, unless a live query waits for the same
input; the batch slot it would have taken goes to a live query."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from clipper.config import BatchingConfig
from clipper.frontend.routes import encode_predictions
from clipper.inputs import InputType
from clipper.query.prediction import CancellableReply, Prediction
from tests.unit import test_deadlines
from tests.unit.test_deadlines import Frontend, ensemble, single_app
from tests.unit.test_pipeline_run import PipelineFrontend

frontends = test_deadlines.frontends  # each frontend is closed after its test


class Client(CancellableReply):
    """A reply whose client can leave (:meth:`leave`), as a closed connection makes it."""

    __slots__ = ("got",)

    def __init__(self) -> None:
        super().__init__()
        self.got: list[Any] = []

    def answer(self, predictions: list[Prediction]) -> None:
        self.got.append(orjson.loads(encode_predictions(predictions)))

    def fail(self, err: Any) -> None:
        self.got.append(err)

    def leave(self) -> None:
        self.client_gone()


def body(x: float) -> bytes:
    return b'{"input": [%f]}' % x


def sent_inputs(f: Frontend) -> list[bytes]:
    return [p for _, _, payloads in f.transport.sent for p in payloads]


def abandoned_inputs(f: Frontend, model: str = "m") -> float:
    v = f.metrics.abandoned_inputs.labels(model=model, version="1")._value.get()
    return float(v)


def abandoned_queries(f: Frontend, app: str = "app") -> float:
    return float(f.metrics.abandoned.labels(app=app)._value.get())


def batch_of(f: Frontend, size: int) -> None:
    sched = f.schedulers["m", "1"]
    batching = BatchingConfig(controller="fixed", max_batch_size=size, max_wait_micros=0)
    sched.reconfigure(replace(sched.mv, batching=batching))


def busy(f: Frontend) -> Client:
    """A live query that takes the replica's only in-flight slot: what follows queues."""
    first = Client()
    f.predict("app", body(0.0), first)
    assert len(f.transport.sent) == 1
    return first


def test_an_abandoned_querys_input_is_not_sent(frontends: list[Frontend]) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    first = busy(f)
    gone = Client()
    f.predict("app", body(1.0), gone)
    timers = f.clock.pending()
    gone.leave()
    assert f.clock.pending() == timers - 1  # its deadline timer went with it
    f.answer("m", [0.5])
    assert first.got[0]["output"] == 0.5
    assert len(f.transport.sent) == 1  # the replica never saw the abandoned input
    assert len(f.schedulers["m", "1"].queue) == 0
    assert gone.got == []  # nobody to answer
    assert abandoned_inputs(f) == 1 and abandoned_queries(f) == 1
    f.clock.advance(1.0)
    assert gone.got == []


def test_without_the_cache_an_abandoned_querys_input_is_not_sent(
    frontends: list[Frontend],
) -> None:
    f = Frontend(single_app(cache=False), ["m"])
    frontends.append(f)
    busy(f)
    gone = Client()
    f.predict("app", b'{"input_batch": [[1.0], [2.0]]}', gone)  # two inputs, two waiters
    gone.leave()
    f.answer("m", [0.5])
    assert len(f.transport.sent) == 1
    assert abandoned_inputs(f) == 2 and abandoned_queries(f) == 1


def test_an_input_a_live_query_joined_is_still_sent(frontends: list[Frontend]) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    busy(f)
    gone, live = Client(), Client()
    f.predict("app", body(1.0), gone)
    f.predict("app", body(1.0), live)  # the same input: joins the abandoned query's task
    gone.leave()
    f.answer("m", [0.5])
    assert len(f.transport.sent) == 2
    f.answer("m", [7.0])
    assert live.got[0]["output"] == 7.0 and live.got[0]["default"] is False
    assert gone.got == []
    assert abandoned_inputs(f) == 0 and abandoned_queries(f) == 1


def test_a_live_query_joining_after_the_abandon_keeps_the_input(
    frontends: list[Frontend],
) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    busy(f)
    gone, live = Client(), Client()
    f.predict("app", body(1.0), gone)
    gone.leave()
    f.predict("app", body(1.0), live)
    f.answer("m", [0.5])
    assert len(f.transport.sent) == 2
    f.answer("m", [7.0])
    assert live.got[0]["output"] == 7.0
    assert abandoned_inputs(f) == 0


def test_the_batch_slot_goes_to_a_live_query(frontends: list[Frontend]) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    batch_of(f, 1)
    busy(f)
    gone, live = Client(), Client()
    f.predict("app", body(1.0), gone)  # earlier deadline: first in the queue
    f.clock.advance(0.001)
    f.predict("app", body(2.0), live)
    gone.leave()
    f.answer("m", [0.5])
    [_, (_, _, payloads)] = f.transport.sent
    assert payloads == [f.transport.sent[1][2][0]] and len(payloads) == 1
    f.answer("m", [9.0])
    assert live.got[0]["output"] == 9.0
    assert abandoned_inputs(f) == 1


def test_a_burst_of_abandoned_queries_leaves_one_batch_for_the_live_one(
    frontends: list[Frontend],
) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    busy(f)
    gone = [Client() for _ in range(50)]
    for i, c in enumerate(gone):
        f.predict("app", body(float(i + 1)), c)
    live = Client()
    f.predict("app", body(100.0), live)
    for c in gone:
        c.leave()
    f.answer("m", [0.5])
    assert len(f.transport.sent) == 2
    assert len(f.transport.sent[1][2]) == 1  # only the live query's input
    f.answer("m", [3.0])
    assert live.got[0]["output"] == 3.0 and live.got[0]["default"] is False
    assert abandoned_inputs(f) == 50 and abandoned_queries(f) == 50
    assert len(sent_inputs(f)) == 2


def test_a_client_gone_before_the_query_waits_abandons_it_at_once(
    frontends: list[Frontend],
) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    busy(f)
    early = Client()
    early.leave()  # e.g. the connection closed while a selection state was loading
    f.predict("app", body(1.0), early)
    f.answer("m", [0.5])
    assert len(f.transport.sent) == 1 and early.got == []
    assert abandoned_queries(f) == 1


def test_a_client_leaving_after_its_answer_changes_nothing(frontends: list[Frontend]) -> None:
    f = Frontend(single_app(), ["m"])
    frontends.append(f)
    first = busy(f)
    f.answer("m", [0.5])
    first.leave()
    assert first.got[0]["output"] == 0.5
    assert abandoned_queries(f) == 0


def test_an_abandoned_ensemble_query_reaches_no_model(frontends: list[Frontend]) -> None:
    f = ensemble(frontends, ["a", "b"])
    warm = Client()
    f.predict("app", body(0.0), warm)  # both replicas busy
    gone = Client()
    f.predict("app", body(1.0), gone)
    gone.leave()
    f.answer("a", [0.1])
    f.answer("b", [0.2])
    assert len(f.transport.sent) == 2  # the first query's two batches only
    assert warm.got and gone.got == []
    assert abandoned_inputs(f, "a") == 1 and abandoned_inputs(f, "b") == 1
    assert abandoned_queries(f) == 1


def test_an_abandoned_pipeline_stops_and_its_stage_input_is_dropped(
    frontends: list[Frontend],
) -> None:
    f = PipelineFrontend(
        {"feat": InputType.JSON, "post": InputType.JSON},
        {"stages": [{"name": "feat", "model": "feat"}, {"name": "post", "model": "post"}]},
    )
    frontends.append(f)
    warm, gone = Client(), Client()
    f.predict("p", b'{"input": {"x": 1}}', warm)  # the feat replica is busy with it
    f.predict("p", b'{"input": {"x": 2}}', gone)
    gone.leave()
    f.answer("feat", [{"v": 1}])
    f.answer("post", [{"out": 1}])
    assert warm.got[0]["output"]["post"] == {"out": 1}
    assert len(f.transport.sent) == 2  # the live query's two stages only
    assert gone.got == []
    assert abandoned_inputs(f, "feat") == 1 and abandoned_queries(f, "p") == 1
    f.clock.advance(1.0)  # its stage timer was cancelled: nothing starts, nothing answers
    assert gone.got == [] and len(f.transport.sent) == 2

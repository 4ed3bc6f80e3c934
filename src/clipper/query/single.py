"""The single-model runner: an application that answers with one model's version (the current
one, one the query pins, or, with :class:`~clipper.query.traffic.Traffic`, the version a canary
split draws, shadow copies included).

Callback-driven: a request costs a few objects and at most one timer, no task. Results reach a
query through the submit seam (the prediction cache joins identical in-flight inputs); the
deadline timer answers whatever is missing with the application's default output and the
reason. Admission happens here too: a query the frontend's own backlog would make late is shed
at once rather than queued (:meth:`SingleRunner._behind`).
"""

from __future__ import annotations

from typing import Any

from clipper.batching.queue import STANDARD
from clipper.batching.scheduler import ModelScheduler
from clipper.cache import Abandonable
from clipper.clock import Clock, TimerHandle
from clipper.errors import DeadlineExceeded, OverloadedError
from clipper.query.answers import Answers, PendingQuery
from clipper.query.loop_lag import LoopLagMonitor
from clipper.query.prediction import (
    NO_MODELS,
    SLO_MISSED,
    CancellableReply,
    DefaultReason,
    Prediction,
    QueryProcessingError,
    QueryRejected,
    Reply,
    Waiter,
)
from clipper.query.seam import SubmitSeam
from clipper.query.traffic import ShadowCopies, Traffic
from clipper.registry import Application
from clipper.runtime.catalog import Catalog
from clipper.tracing import hooks as _trace

__all__ = ["LAG_FLOOR_S", "LATE_ARRIVAL_SHARE", "SingleRunner"]

_UNSET: Any = object()

# Loop lag below this is timer noise (uvloop rounds timers to whole milliseconds), not a backlog.
LAG_FLOOR_S = 0.002
# A query that has already spent this share of its budget before reaching the processor came
# through a backlog (socket, parser): it is priced against its deadline before being queued.
LATE_ARRIVAL_SHARE = 0.25


class _Query(Abandonable, PendingQuery):
    """One request. It is also the waiter of its first input (the common request has one: no
    closure per query); the others get an :class:`_Input` each."""

    __slots__ = (
        "deadline",
        "defaults",
        "explanations",
        "model",
        "n",
        "outputs",
        "payloads",
        "rank",
        "remaining",
        "sched",
        "shadow",
        "version",
    )
    run: SingleRunner

    def __init__(
        self, run: SingleRunner, app: Application, n: int, *, reply: Reply, t0: float, model: str
    ) -> None:
        self.run = run
        self.app = app
        self.n = n
        self.outputs: list[Any] = [_UNSET] * n
        self.defaults: list[DefaultReason | None] = [None] * n  # None: a model answered
        self.explanations: list[str] = [""] * n
        self.remaining = n
        self.reply: Reply | None = reply
        self.t0 = t0
        self.timer: TimerHandle | None = None
        self.model = model
        self.version = ""
        self.deadline = 0.0
        self.payloads: list[bytes] = []
        self.sched: ModelScheduler | None = None
        self.shadow: ShadowCopies | None = None  # until its copies are fired
        self.rank = STANDARD  # the priority class its inputs are queued with
        self.gone = False  # the client went away: nothing is answered

    def waiter(self, i: int) -> Waiter:
        return self if i == 0 else _Input(self, i)

    # the first input's waiter
    def __call__(self, value: object, err: BaseException | None, /) -> None:
        self.fill(0, value, err)

    def abandoned(self) -> bool:
        return self.gone

    def abandon(self) -> None:
        """The client went away: answer nothing, and let the schedulers drop this query's
        inputs that no live query shares (they check the waiters at dispatch)."""
        if self.drop():
            self.run.abandoned(self.app.name)

    def fill(self, i: int, value: object, err: BaseException | None) -> None:
        if self.reply is None or self.remaining == 0:
            return  # already answered (deadline) or this slot was already filled
        if err is None:
            self.outputs[i] = value
        else:
            if isinstance(err, DeadlineExceeded) and self.run.clock.now() < self.deadline:
                # The expired task belonged to an earlier identical query that this one
                # joined; this query has its own, later deadline: queue its input again.
                self.run.enqueue(self, i)
                return
            if isinstance(err, DeadlineExceeded):
                reason, why = self.late()
            else:
                reason, why = self.run.seam.explain(self.model, err)
            if reason is DefaultReason.OVERLOAD and self.app.overload == "reject":
                self.reject(str(err))
                return
            self.set_default(i, reason, why)
        self.remaining -= 1
        if self.remaining == 0:
            self.finish()

    def set_default(self, i: int, reason: DefaultReason, why: str) -> None:
        self.outputs[i] = self.app.default_value
        self.defaults[i] = reason
        self.explanations[i] = why

    def all_default(self, reason: DefaultReason, why: str) -> None:
        for i in range(self.n):
            self.set_default(i, reason, why)
        self.remaining = 0
        self.finish()

    def on_deadline(self) -> None:
        self.timer = None
        if self.reply is None:
            return
        if self.sched is not None:
            # The loop runs due timers before it reads its sockets: after a stretch without
            # the core (another program's time slice), this query's answer may have arrived
            # while its timer waited. Read it first: a prediction now beats a default now.
            self.sched.collect_answers()
            if self.reply is None:  # answered by what was read
                return
        reason, why = self.late()
        for i in range(self.n):
            if self.outputs[i] is _UNSET:
                self.set_default(i, reason, why)
        self.remaining = 0
        self.finish()

    def late(self) -> tuple[DefaultReason, str]:
        """Why an input had no answer by its deadline. The query was queued while its version
        had a replica; if none is left now, or one failed holding batches since, the replica
        failed or left with it (its batch was queued again, and nothing took it in time, or a
        restarted replica failed on it too): a replica failure, not a missed SLO."""
        sched = self.sched
        if sched is not None and sched.lost_since(self.t0):
            if not sched.replicas and sched.cold is not None:
                reason = DefaultReason.LOADING if sched.cold.loading else DefaultReason.COLD_START
                return reason, sched.cold.explain(f"{self.model}:{self.version}")
            return DefaultReason.NO_REPLICA, (
                f"No replica of model {self.model}:{self.version} is alive: the replica "
                "holding this query failed or left before answering"
            )
        return DefaultReason.SLO, SLO_MISSED

    def reject(self, cause: str) -> None:
        reply = self.reply
        assert reply is not None
        self.reply = None
        if self.timer is not None:
            self.timer.cancel()
        reply.fail(QueryRejected(cause))


class _Input(Abandonable):
    """The waiter of a request's input after the first."""

    __slots__ = ("i", "q")

    def __init__(self, q: _Query, i: int) -> None:
        self.q = q
        self.i = i

    def __call__(self, value: object, err: BaseException | None, /) -> None:
        self.q.fill(self.i, value, err)

    def abandoned(self) -> bool:
        return self.q.gone


class SingleRunner:
    """Queries of applications with one linked model. With ``traffic``, an unpinned query's
    version is the one its model's rollout picks (and its inputs are shadowed as the rollout
    says); without, the current version answers."""

    def __init__(
        self,
        seam: SubmitSeam,
        catalog: Catalog,
        answers: Answers,
        *,
        clock: Clock,
        traffic: Traffic | None = None,
        loop_lag: LoopLagMonitor | None = None,
    ) -> None:
        self.seam = seam
        self.catalog = catalog
        self.answers = answers
        self.clock = clock
        self.traffic = traffic
        # How far behind the event loop runs; None: never shed for lag (tests, embedders).
        self.loop_lag = loop_lag

    def run(  # noqa: PLR0917 (the hot path: no keyword packing)
        self,
        app: Application,
        payloads: list[bytes],
        version: str | None,
        uid: str,
        reply: Reply,
        t0: float,
        budget_s: float,
        rank: int = STANDARD,
    ) -> None:
        catalog = self.catalog
        linked = catalog.links.get(app.name)
        model = linked[0] if linked else ""
        q = _Query(self, app, len(payloads), reply=reply, t0=t0, model=model)
        if not linked:
            q.all_default(DefaultReason.NO_MODEL, NO_MODELS)
            return
        if version is None:
            started = self.clock.now() if _trace.current is not None else 0.0
            if self.traffic is not None:
                version, q.shadow = self.traffic.route(model, uid, budget_s)
                if version is not None and hasattr(reply, "version"):
                    # The V2 protocols' answers name the version: the one the split chose.
                    setattr(reply, "version", version)  # noqa: B010 (not every Reply has it)
            else:
                version = catalog.currents.get(model)
            if version is None:
                q.all_default(DefaultReason.NO_MODEL, NO_MODELS)
                return
            if _trace.current is not None:
                _selection_span(model, version, started, self.clock.now())
        elif not catalog.has_version(model, version):
            raise QueryProcessingError(
                f"Requested version: {version} does not exist for model: {model}"
            )
        sched = catalog.by_key.get((model, version))
        q.deadline = t0 + budget_s
        if sched is None or not sched.replicas:
            if sched is None or sched.cold is None:
                q.all_default(*self._unavailable(model, version, sched))
                return
            # Scaled to zero (or waking): held for the replica (clipper.batching.cold).
            left = q.deadline - app.answer_margin_s - self.clock.now()
            why = sched.cold.hold(len(sched.queue), q.n, left)
            if why is not None:
                sched.offered += q.n  # load all the same: the autoscaler's sample wakes it too
                # A pooled version loads into a pool process: "loading" (docs/density.md).
                reason = DefaultReason.LOADING if sched.cold.loading else DefaultReason.COLD_START
                q.all_default(reason, why)
                return
        cause = self._behind(t0, q.deadline - app.answer_margin_s, sched, rank)
        if cause is not None:
            # Queued, it would only be answered late by the deadline timer (itself late by the
            # loop's lag) and take a batch slot from queries that can still make it. Counted
            # for the autoscaler as offered load, and as the frontend's shedding, not demand.
            sched.offered += q.n
            sched.lag_shed += q.n
            err = OverloadedError(cause)
            for i in range(q.n):
                q.fill(i, None, err)
                if q.reply is None:
                    break
            return
        q.payloads = payloads
        q.rank = rank
        q.sched = sched
        q.version = version
        submitted = False
        for i in range(q.n):
            submitted |= self.enqueue(q, i)
            if q.reply is None:
                break  # rejected with 503
        if submitted:
            sched.pump()
        if q.shadow is not None:  # the real inputs are queued: copies follow their answers
            q.shadow.fire()
            q.shadow = None
        if q.reply is not None and q.remaining:
            q.timer = self.clock.call_later(
                max(q.deadline - app.answer_margin_s - self.clock.now(), 0.0), q.on_deadline
            )
            if isinstance(reply, CancellableReply):
                reply.watch(q)  # it waits: a client that leaves frees its inputs

    def _unavailable(
        self, model: str, version: str, sched: ModelScheduler | None
    ) -> tuple[DefaultReason, str]:
        mv = self.catalog.version(model, version)
        if mv is None or mv.num_replicas == 0 or sched is None:
            return DefaultReason.NO_MODEL, NO_MODELS
        return DefaultReason.NO_REPLICA, (
            f"No replica of model {model}:{version} is alive ({mv.num_replicas} configured); "
            + ("it is being restarted" if mv.artifact else "none is connected")
        )

    def _behind(
        self, t0: float, due: float, sched: ModelScheduler, rank: int = STANDARD
    ) -> str | None:
        """Why a query due by ``due`` cannot make it when the frontend itself is behind
        (a backlog of the loop's own work above noise, or the request arrived late into its
        budget); None to queue. Time the process was descheduled is no backlog
        (:attr:`LoopLagMonitor.backlog_s`): it is over when the query arrives.

        Its answer needs at least the loop's backlog to be written, and the wait that admission
        prices for the model's queue (the work queued ahead at the replicas' throughput and
        what is left of the batches running); when that ends past ``due`` it is shed now,
        cheaply, instead. The batch latencies behind that wait are round trips measured on
        this loop, so they already hold the loop's delay in reading answers: the two overlap
        and the longer one counts. Pricing a whole batch on top of the lag shed everything at
        256 connections, and then no batch ran to correct the estimate. A model with nothing
        queued prices at the lag alone: the query goes into the next batch."""
        now = self.clock.now()
        mon = self.loop_lag
        lag = mon.backlog_s if mon is not None else 0.0
        if lag < LAG_FLOOR_S:
            lag = 0.0
            if now - t0 < LATE_ARRIVAL_SHARE * (due - t0):
                return None
        if sched.probe(now):
            return None  # admission is measuring the model again (ModelScheduler.probe)
        finish = now + (max(lag, sched.expected_latency_s(rank)) if sched.queue else lag)
        if finish <= due:
            return None
        return (
            f"the frontend is behind (event loop {lag * 1e3:.1f} ms behind on its own work, the "
            f"request {(now - t0) * 1e3:.1f} ms old): its answer could not come within the "
            "latency SLO"
        )

    def enqueue(self, q: _Query, i: int) -> bool:
        """Input ``i`` through the seam; True when a task was queued (the caller pumps the
        scheduler once for the whole request)."""
        assert q.sched is not None
        waiter = q.waiter(i)
        if q.shadow is not None:
            waiter = q.shadow.wrap(q.payloads[i], waiter)
        return self.seam.submit(q.app, q.sched, q.payloads[i], q.deadline, waiter, q.rank)

    def predictions(self, q: _Query) -> list[Prediction]:
        """The answered query as predictions (query ids are given out here, in input order),
        counted in the application's metrics."""
        answers = self.answers
        app_name = q.app.name
        answers.answered(app_name, q.t0)
        ids = answers.ids
        out: list[Prediction] = []
        for i in range(q.n):
            reason = q.defaults[i]
            if reason is None:
                out.append(Prediction(next(ids), q.outputs[i]))
            else:
                answers.defaulted(app_name, reason)
                out.append(Prediction(next(ids), q.outputs[i], reason, q.explanations[i]))
        return out

    def abandoned(self, app: str) -> None:
        """A query of ``app`` was abandoned: counted, and the schedulers told to look."""
        self.answers.abandoned(app)
        self.seam.abandoned()

    def forget_app(self, app: str) -> None:
        """Nothing is kept per application here."""


def _selection_span(model: str, version: str, start: float, end: float) -> None:
    """A traced query's ``selection`` span: the version its model's rollout (or the current
    version) chose."""
    tracer = _trace.active
    if tracer is not None:
        attrs = {"clipper.model": model, "clipper.model_version": version}
        tracer.child(_trace.current, "selection", start, end, attrs)

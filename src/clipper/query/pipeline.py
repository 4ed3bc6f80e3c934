"""The pipeline runner: one query's stages run as their inputs become ready, each under its
deadline.

Callback-driven like the single-model runner (no task per query). A model stage goes through
the submit seam like a single-model query; an application stage is run by that application's
own runner (single model, split or selection), taken from the table of stage runners it was
built with — never through the processor. A stage that
misses its deadline or fails answers its own default (listed under ``degraded``), is dropped
(``optional``), or, when required, ends the query at once with the application's default and
the reason; no later stage starts then.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from clipper.batching.queue import STANDARD
from clipper.batching.scheduler import ModelScheduler
from clipper.cache import Abandonable
from clipper.clock import Clock, TimerHandle
from clipper.errors import BadInputError, DeadlineExceeded, OverloadedError, RequestError
from clipper.inputs import InputType, parse_input
from clipper.metrics import Metrics
from clipper.pipeline.metrics import StageMetrics
from clipper.pipeline.plan import StagePlan, critical_path, stage_deadline
from clipper.pipeline.spec import REQUEST, Pipeline, Ref, Stage, refs_in
from clipper.pipeline.values import DROPPED, decode_payload, plain, resolve
from clipper.query.answers import Answers
from clipper.query.kinds import RunnerTable
from clipper.query.prediction import (
    CancellableReply,
    DefaultReason,
    Prediction,
    QueryRejected,
    Reply,
    fail_internal,
)
from clipper.query.seam import SubmitSeam
from clipper.registry import Application
from clipper.runtime.catalog import Catalog
from clipper.tracing import hooks as _trace

__all__ = ["PipelineRunner"]

log = logging.getLogger("clipper.pipeline")

_REQUEST_REF = Ref(REQUEST, ())


class _Call(Abandonable, CancellableReply):
    """One running stage of one query: a waiter for a model's output, or the reply of an
    application stage's query (told when the pipeline's client goes away)."""

    __slots__ = (
        "deadline", "over", "payload", "run", "sched", "span", "stage", "started", "timer",
    )  # fmt: skip

    def __init__(self, run: _Run, stage: Stage, started: float, deadline: float) -> None:
        CancellableReply.__init__(self)
        self.span: Any = None  # the stage's span when its query is traced (clipper.tracing)
        self.run = run
        self.stage = stage
        self.started = started
        self.deadline = deadline
        self.over = False
        self.timer: TimerHandle | None = None
        self.sched: ModelScheduler | None = None
        self.payload = b""

    # the cache's waiter
    def __call__(self, value: object, err: BaseException | None, /) -> None:
        self.done(value, err)

    def abandoned(self) -> bool:
        return self.run.q.gone

    def done(self, value: object, err: BaseException | None) -> None:
        if self.over:
            return
        run = self.run
        if isinstance(err, DeadlineExceeded) and run.q.rt.clock.now() < self.deadline:
            run.submit(self)  # joined an earlier identical query's task that expired first
            return
        if err is None:
            run.answered(self, value)
        else:
            reason, why = run.q.rt.seam.explain(self.stage.model or "", err)
            run.missed(self, reason, why)

    # Reply, for an application stage
    def answer(self, predictions: list[Prediction]) -> None:
        if self.over:
            return
        p = predictions[0]
        if p.reason is None:
            self.run.answered(self, p.output)
        else:
            self.run.missed(self, p.reason, p.explanation)

    def fail(self, err: RequestError) -> None:
        if not self.over:
            self.run.missed(self, DefaultReason.OVERLOAD, str(err))

    def expire(self) -> None:
        self.timer = None
        if self.over:
            return
        if self.sched is not None:
            self.sched.collect_answers()  # an answer that arrived unread still counts
            if self.over:
                return
        budget = (self.deadline - self.started) * 1e3
        self.run.missed(
            self, DefaultReason.SLO, f"did not answer within its budget of {budget:.1f} ms"
        )


class _Run:
    """One input's pass through the stages."""

    __slots__ = ("advancing", "calls", "degraded", "dropped", "env", "i", "over", "payload",
                 "pending", "q", "ready")  # fmt: skip

    def __init__(self, q: _PipelineQuery, i: int, payload: bytes) -> None:
        self.q = q
        self.i = i
        self.payload = payload
        self.env: dict[str, Any] = {}
        self.pending = {name: len(s.deps) for name, s in q.pipeline.stages.items()}
        self.ready = [name for name, n in self.pending.items() if n == 0]
        self.ready.reverse()  # popped from the end: the description's order
        self.calls: dict[str, _Call] = {}
        self.degraded: list[str] = []
        self.dropped: list[str] = []
        self.over = False
        self.advancing = False

    def request_value(self) -> Any:
        value = self.env.get(REQUEST, DROPPED)
        if value is DROPPED:
            value = self.env[REQUEST] = decode_payload(self.q.app.input_type, self.payload)
        return value

    def advance(self) -> None:
        self.advancing = True
        try:
            while self.ready and not self.over:
                self.launch(self.ready.pop())
        finally:
            self.advancing = False
        if not self.over and not self.calls and not self.ready:
            self.complete()

    def launch(self, name: str) -> None:
        q = self.q
        stage = q.pipeline.stages[name]
        now = q.rt.clock.now()
        due = stage_deadline(now, q.end, q.reserves[name], q.weights[name], stage.on_miss == "fail")
        call = _Call(self, stage, now, due)
        self.calls[name] = call
        if q.span is not None:
            _begin_stage(call, q.span, now)
        if call.deadline <= now:
            left = max(q.end - now, 0.0) * 1e3
            self.missed(call, DefaultReason.SLO, f"had no time left ({left:.1f} ms to the "
                        "query's deadline, reserved for the stages after it)")  # fmt: skip
            return
        try:
            if stage.input == _REQUEST_REF and q.app.input_type is q.rt.input_type(stage):
                call.payload = self.payload  # passed through as it came
            else:
                if REQUEST not in self.env and any(
                    r.source == REQUEST for r in refs_in(stage.input)
                ):
                    self.request_value()
                call.payload = q.rt.encode(stage, plain(resolve(stage.input, self.env)))
        except BadInputError as e:
            self.missed(call, DefaultReason.ERROR, f"got no valid input: {e}")
            return
        try:
            if stage.app is not None:
                q.rt.ask_app(call, q.uid)
            else:
                q.rt.ask_model(call)
        except Exception as e:  # a bug here must not leave the query unanswered
            log.exception("pipeline %s: stage %s failed to start", q.app.name, name)
            if not call.over:
                self.missed(call, DefaultReason.ERROR, f"failed: {type(e).__name__}: {e}")
            return
        if not call.over and stage.model is not None:
            call.timer = q.rt.clock.call_later(max(call.deadline - now, 0.0), call.expire)

    def submit(self, call: _Call) -> None:
        self.q.rt.submit(call)

    def answered(self, call: _Call, value: object) -> None:
        name = call.stage.name
        elapsed = self.q.rt.clock.now() - call.started
        m = self.q.stage_metrics(name)
        m[0].observe(elapsed)
        m[2]["answered"].inc()
        self.q.plan.estimates[name].observe(elapsed)
        self.finished(call, plain(value))

    def missed(self, call: _Call, reason: DefaultReason, why: str) -> None:
        stage = call.stage
        if call.span is not None:
            _end_stage(call, f"{reason}: {why}", reason)
        m = self.q.stage_metrics(stage.name)
        if reason is DefaultReason.SLO:
            m[1].inc()
            # A miss says the stage needs at least its budget: the estimate learns that too.
            self.q.plan.estimates[stage.name].observe(call.deadline - call.started)
        if stage.on_miss == "default":
            m[2]["degraded"].inc()
            self.degraded.append(stage.name)
            self.finished(call, stage.default)
        elif stage.on_miss == "drop":
            m[2]["dropped"].inc()
            self.dropped.append(stage.name)
            self.finished(call, DROPPED)
        else:
            m[2]["failed"].inc()
            self.fail(call, reason, f"Pipeline stage '{stage.name}' ({stage.target}) {why}")

    def finished(self, call: _Call, value: Any) -> None:
        if call.span is not None:
            _end_stage(call)
        call.over = True
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        name = call.stage.name
        self.calls.pop(name, None)
        self.env[name] = value
        for succ in self.q.pipeline.succs[name]:
            self.pending[succ] -= 1
            if self.pending[succ] == 0:
                self.ready.append(succ)
        if not self.advancing:
            self.advance()

    def fail(self, failed: _Call, reason: DefaultReason, why: str) -> None:
        """A required stage failed: the query's answer is the default, now; nothing else runs."""
        self.over = True
        failed.over = True
        for call in (failed, *self.calls.values()):
            if call.span is not None:
                _end_stage(call, f"stopped: required stage '{failed.stage.name}' failed")
            call.over = True
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
        self.calls.clear()
        q = self.q
        for name in q.pipeline.stages:
            if name not in self.env and name != failed.stage.name:
                q.stage_metrics(name)[2]["skipped"].inc()
        q.item_done(self.i, Prediction(0, q.app.default_value, reason, why))

    def complete(self) -> None:
        self.over = True
        q = self.q
        try:
            output = resolve(q.pipeline.output, self.env)
        except BadInputError as e:
            pred = Prediction(0, q.app.default_value, DefaultReason.ERROR,
                              f"The pipeline's output could not be made: {e}")  # fmt: skip
        else:
            pred = Prediction(0, None if output is DROPPED else output)
        q.item_done(self.i, pred, tuple(self.degraded), tuple(self.dropped))


class _PipelineQuery:
    __slots__ = ("app", "end", "gone", "pipeline", "plan", "predictions", "remaining", "reply",
                 "reserves", "rt", "runs", "span", "t0", "uid", "weights")  # fmt: skip

    def __init__(self, rt: PipelineRunner, app: Application, n: int, reply: Reply) -> None:
        self.rt = rt
        self.app = app
        assert app.stages is not None
        self.pipeline: Pipeline = app.stages
        self.plan = rt.plan(app)
        self.reply: Reply | None = reply
        self.predictions: list[Prediction | None] = [None] * n
        self.remaining = n
        self.end = 0.0
        self.t0 = 0.0
        self.uid = ""
        self.reserves: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.runs: list[_Run] = []
        self.gone = False  # the client went away: nothing is answered, no stage starts
        self.span: Any = _trace.current  # the request's span when it is traced

    def abandon(self) -> None:
        """The client went away: no further stage starts, the running ones stop (an
        application stage's query is abandoned in turn), and the inputs no live query shares
        are dropped from their queues at dispatch."""
        if self.reply is None:
            return
        self.reply = None
        self.gone = True
        for run in self.runs:
            run.over = True
            calls = list(run.calls.values())
            run.calls.clear()
            for call in calls:
                if call.span is not None:
                    _end_stage(call, "stopped: the client went away")
                call.over = True
                if call.timer is not None:
                    call.timer.cancel()
                    call.timer = None
                call.client_gone()
        self.runs.clear()
        self.rt.answers.abandoned(self.app.name)
        self.rt.seam.abandoned()

    def stage_metrics(self, stage: str) -> tuple[Any, Any, dict[str, Any]]:
        return self.rt.metrics.stage(self.app.name, stage)

    def item_done(
        self,
        i: int,
        pred: Prediction,
        degraded: tuple[str, ...] = (),
        dropped: tuple[str, ...] = (),
    ) -> None:
        if degraded or dropped:
            pred = replace(pred, degraded=degraded, dropped=dropped)
        self.predictions[i] = pred
        self.remaining -= 1
        if self.remaining == 0 and self.reply is not None:
            reply, self.reply = self.reply, None
            self.runs.clear()  # no cycle left through the runs
            try:
                reply.answer(self.rt.answered(self))
            except Exception as e:  # runs in a replica's or a timer's callback
                fail_internal(reply, f"answering a query of pipeline '{self.app.name}'", e)


class PipelineRunner:
    """The pipelines of one frontend: their budgets (latency estimates) and their queries.
    ``stages`` runs the application stages (it has no pipeline runner: a stage never names a
    pipeline)."""

    def __init__(
        self,
        seam: SubmitSeam,
        catalog: Catalog,
        answers: Answers,
        stages: RunnerTable,
        *,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.seam = seam
        self.catalog = catalog
        self.answers = answers
        self.stages = stages
        self.clock = clock
        self.metrics = StageMetrics(metrics.registry)
        self._plans: dict[str, StagePlan] = {}

    def plan(self, app: Application) -> StagePlan:
        plan = self._plans.get(app.name)
        if plan is None or plan.pipeline is not app.stages:
            assert app.stages is not None
            if plan is not None and plan.pipeline == app.stages:
                plan.pipeline = app.stages  # another setting changed: estimates carry over
                return plan
            if plan is not None:
                self.metrics.forget(app.name)  # re-described: its stages may have changed
            plan = self._plans[app.name] = StagePlan(app.stages)
        return plan

    def forget_app(self, app_name: str) -> None:
        self._plans.pop(app_name, None)
        self.metrics.forget(app_name)

    # -- a query -------------------------------------------------------------------------------
    def run(  # noqa: PLR0917 (the query path's shape)
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
        """``rank``: stages are queued as standard whatever the class (classes order
        single-model queues)."""
        q = _PipelineQuery(self, app, len(payloads), reply)
        q.t0 = t0
        q.uid = uid
        q.end = t0 + budget_s - app.answer_margin_s
        plan = q.plan
        stages = q.pipeline.stages
        weights = plan.weights(budget_s, lambda name: self.typical_latency(stages[name]))
        q.weights = weights
        q.reserves = plan.reserves(weights)
        cause = self.admission(q)
        if cause is not None:
            self.metrics.shed.labels(app=app.name).inc()
            if app.overload == "reject":
                q.reply = None
                reply.fail(QueryRejected(cause))
                return
            for i in range(len(payloads)):
                q.item_done(i, Prediction(0, app.default_value, DefaultReason.OVERLOAD,
                                          f"Query shed under overload: {cause}"))  # fmt: skip
            return
        for i, payload in enumerate(payloads):
            if q.reply is None:
                break
            run = _Run(q, i, payload)
            q.runs.append(run)
            run.advance()
        if q.reply is not None and isinstance(reply, CancellableReply):
            reply.watch(q)  # it waits: a client that leaves stops its stages

    def admission(self, q: _PipelineQuery) -> str | None:
        """Why the query cannot make it (the required stages on a path expect to take longer
        than the time left), or None to run it. A stage with a default or an optional one does
        not count: if it would be late it is cut at its deadline, which leaves the stages
        after it their reserves, and the answer is degraded rather than the default."""
        expected = {
            name: self.expected_latency(s) if s.on_miss == "fail" else 0.0
            for name, s in q.pipeline.stages.items()
        }
        total, path = critical_path(q.pipeline, expected)
        left = q.end - self.clock.now()
        if total <= left:
            return None
        parts = ", ".join(f"{n} {expected[n] * 1e3:.1f}" for n in path)
        return (
            f"the pipeline's path {' -> '.join(path)} expects {total * 1e3:.1f} ms of queueing "
            f"and work ({parts} ms), more than the {max(left, 0.0) * 1e3:.1f} ms left"
        )

    def answered(self, q: _PipelineQuery) -> list[Prediction]:
        """The finished query's predictions, with query ids, counted in the app's metrics."""
        app = q.app.name
        answers = self.answers
        answers.answered(app, q.t0)
        out: list[Prediction] = []
        for pred in q.predictions:
            assert pred is not None
            if pred.reason is not None:
                answers.defaulted(app, pred.reason)
            out.append(replace(pred, query_id=answers.next_id()))
        return out

    # -- stages --------------------------------------------------------------------------------
    def _scheds(self, stage: Stage) -> list[ModelScheduler]:
        """The schedulers that serve a stage now (an application stage: its linked models')."""
        catalog = self.catalog
        models = [stage.model] if stage.model is not None else catalog.linked(stage.app or "")
        out = []
        for model in models:
            sched = catalog.scheduler(model)
            if sched is not None:
                out.append(sched)
        return out

    def typical_latency(self, stage: Stage) -> float:
        """How long the stage's model would take now, by its queue (0.0: idle, or not known).
        An auto budget is never below it."""
        return max((s.expected_latency_s() for s in self._scheds(stage)), default=0.0)

    def expected_latency(self, stage: Stage) -> float:
        return max((s.expected_latency_s() for s in self._scheds(stage)), default=0.0)

    def input_type(self, stage: Stage) -> InputType | None:
        if stage.app is not None:
            app = self.catalog.app(stage.app)
            return app.input_type if app is not None else None
        mv = self.catalog.version(stage.model or "")
        return mv.input_type if mv is not None else None

    def encode(self, stage: Stage, value: Any) -> bytes:
        itype = self.input_type(stage)
        if itype is None:
            return b""  # nothing serves the stage: ask_* says so
        return parse_input(itype, value)

    def ask_model(self, call: _Call) -> None:
        stage = call.stage
        model = stage.model or ""
        version = self.catalog.current(model)
        sched = self.catalog.scheduler(model, version) if version is not None else None
        if sched is None or not call.payload:
            call.run.missed(call, DefaultReason.NO_MODEL, f"has no version of model '{model}' "
                            "to run")  # fmt: skip
            return
        if not sched.replicas:
            call.run.missed(call, DefaultReason.NO_REPLICA, f"has no live replica of model "
                            f"{model}:{version}")  # fmt: skip
            return
        call.sched = sched
        self.submit(call)

    def submit(self, call: _Call) -> None:
        sched = call.sched
        assert sched is not None
        if call.span is not None:
            _in_stage(call, self.submit_traced, call, sched)
        elif self.seam.submit(call.run.q.app, sched, call.payload, call.deadline, call):
            sched.pump()

    def submit_traced(self, call: _Call, sched: ModelScheduler) -> None:
        if self.seam.submit(call.run.q.app, sched, call.payload, call.deadline, call):
            sched.pump()

    def ask_app(self, call: _Call, uid: str) -> None:
        app = self.catalog.app(call.stage.app or "")
        if app is None or app.stages is not None or not call.payload:
            call.run.missed(call, DefaultReason.NO_MODEL, "names no application with a "
                            "selection policy")  # fmt: skip
            return
        now = self.clock.now()
        budget = min(app.slo_s, call.deadline - now + app.answer_margin_s)
        runner = self.stages.pick(app, None)
        try:
            if call.span is not None:
                _in_stage(call, runner.run, app, [call.payload], None, uid, call, now, budget)
            else:
                runner.run(app, [call.payload], None, uid, call, now, budget)
        except RequestError as e:
            if not call.over:
                call.run.missed(call, DefaultReason.ERROR, f"was refused: {e}")
        except OverloadedError as e:
            if not call.over:
                call.run.missed(call, DefaultReason.OVERLOAD, str(e))


# -- traces (clipper.tracing): a traced query's stages are child spans of its request span ----
def _begin_stage(call: _Call, parent: Any, now: float) -> None:
    tracer = _trace.active
    if tracer is not None:
        stage = call.stage
        attrs = {"clipper.stage": stage.name, "clipper.stage.target": stage.target}
        call.span = tracer.child(parent, f"stage {stage.name}", now, None, attrs)


def _end_stage(call: _Call, error: str | None = None, reason: str | None = None) -> None:
    """End the stage's span (once); ``error``: why it missed (status ERROR)."""
    span, call.span = call.span, None
    tracer = _trace.active
    if tracer is not None:
        if reason is not None:
            span.set_attribute("clipper.default_reason", reason)
            span.set_attribute("clipper.stage.on_miss", call.stage.on_miss)
        tracer.end(span, tracer.clock.now(), error)


def _in_stage(call: _Call, fn: Any, *args: Any) -> None:
    """``fn(*args)`` with the stage's span current: what it queues hangs below the stage."""
    outer = _trace.current
    _trace.current = call.span
    try:
        fn(*args)
    finally:
        _trace.current = outer

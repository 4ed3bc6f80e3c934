"""The selection runner: queries and feedback of applications with a selection policy over
several models.

The policy chooses which linked models evaluate a query; each chosen model's output comes
through the prediction cache and its own batching queue, exactly as for one model. At the
deadline (or when all have answered) the policy combines the outputs that arrived: stragglers
are left out, never waited for, and lower the confidence. Feedback joins the label with the
models' cached predictions (re-requested when the cache no longer has them) and updates the
policy's state, per user when a ``uid`` is given. Under bandit feedback only the model the
query drew is joined (and evaluated again, if need be): the draw is recorded per ``(uid,
input)`` at query time (:class:`~clipper.selection.draws.Draws`).

The policy chooses among the linked models that can answer now: those whose version has a
connected replica (:meth:`SelectionRunner.available`). A model whose only replica died is thus
routed around while it restarts; the default output for "no replica" is left for a query none
of whose linked models has one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from clipper.batching.queue import STANDARD
from clipper.batching.scheduler import ModelScheduler
from clipper.cache import Abandonable
from clipper.clock import Clock, TimerHandle, wait_all
from clipper.errors import (
    BadInputError,
    ClipperError,
    ConfigError,
    DeadlineExceeded,
    ReplicaError,
    RequestError,
)
from clipper.metrics import Metrics
from clipper.query.answers import Answers, PendingQuery
from clipper.query.prediction import (
    CancellableReply,
    DefaultReason,
    FeedbackReply,
    Prediction,
    Reply,
    Waiter,
    fail_internal,
)
from clipper.query.seam import SubmitSeam
from clipper.query.traffic import Traffic
from clipper.registry import Application
from clipper.runtime.catalog import Catalog
from clipper.selection import SelectionPolicy, UserStates, make_loss, make_policy
from clipper.selection.base import Loss, State
from clipper.selection.draws import Draw, Draws
from clipper.selection.states import CAPACITY
from clipper.tracing import hooks as _trace

__all__ = [
    "EnsembleQuery",
    "FeedbackError",
    "Misconfigured",
    "NoPrediction",
    "OnFeedback",
    "Selection",
    "SelectionRunner",
    "combine_one",
]

log = logging.getLogger("clipper.selection")

STATE_CAPACITY = CAPACITY  # the same bound as the stored states' (persistence)
FEEDBACK_WAIT_S = 5.0
Persist = Callable[[str, str, State], None]  # (app, uid, state)
Fetch = Callable[[str, str], Awaitable[Any]]  # (app, uid) -> the persisted state or None
# Online learning: (app, models, input payload, label) for containers with update().
OnFeedback = Callable[[Application, list[str], bytes, Any], None]


class Misconfigured(RequestError):
    """The application's policy cannot work with its current links (e.g. an A/B split whose
    weights name no linked model): answered 503 with the reason, not a crash."""

    status = 503
    error = "Service unavailable"


class NoPrediction(RequestError):
    """No linked model answered for a feedback's input: nothing to join the label with."""

    status = 503
    error = "Service unavailable"


class FeedbackError(RequestError):
    """Feedback that failed while it was being learned from."""

    status = 400
    error = "Feedback error"


class Selection:
    """One application's policy over its linked models, and its users' states."""

    def __init__(self, app: Application, models: list[str], states: UserStates | None) -> None:
        self.app = app
        self.models = tuple(models)
        self.policy: SelectionPolicy = make_policy(app.policy, models, **app.policy_params)
        if states is None:
            states = UserStates(self.policy, capacity=STATE_CAPACITY)
        else:
            states.policy = self.policy  # links changed: states carry over (new models start fresh)
        self.states = states
        self.loss: Loss = make_loss(app.loss, scale=app.loss_scale)


class SelectionRunner:
    """The selection layer of one frontend: a :class:`Selection` per application, rebuilt
    when its links or settings change, and the persistence of user states. Each chosen
    model's version is its rollout's pick (``traffic``) or its current one."""

    def __init__(
        self,
        seam: SubmitSeam,
        catalog: Catalog,
        answers: Answers,
        *,
        clock: Clock,
        metrics: Metrics,
        traffic: Traffic | None = None,
        rng: random.Random | None = None,
        persist: Persist | None = None,
        fetch: Fetch | None = None,
        on_feedback: OnFeedback | None = None,
    ) -> None:
        self.seam = seam
        self.catalog = catalog
        self.answers = answers
        self.clock = clock
        self.metrics = metrics
        self.traffic = traffic
        self.on_feedback = on_feedback
        self.rng = rng or random.Random()
        self.persist = persist
        self.fetch = fetch  # async (app, uid) -> persisted state or None
        self._by_app: dict[str, Selection] = {}
        self._draws: dict[str, Draws] = {}  # per application, for bandit feedback
        self._tasks: set[asyncio.Task[None]] = set()

    def selection(self, app: Application) -> Selection:
        models = self.catalog.linked(app.name)
        sel = self._by_app.get(app.name)
        if sel is None or sel.app is not app or sel.models != tuple(models):
            if not models:
                raise BadInputError(
                    f"application '{app.name}' has no linked model: there is nothing to "
                    "select from or learn about"
                )
            try:
                sel = Selection(app, list(models), sel.states if sel is not None else None)
            except ConfigError as e:
                raise Misconfigured(
                    f"application '{app.name}' cannot select among its models: {e}"
                ) from None
            self._by_app[app.name] = sel
        return sel

    def forget_app(self, app_name: str) -> None:
        self._by_app.pop(app_name, None)
        self._draws.pop(app_name, None)

    def available(self, models: Sequence[str]) -> frozenset[str] | None:
        """The models that can answer now: the current version has a connected replica, or a
        version in the model's traffic split has one. None when that is every model, or none
        (the policy then chooses as if all could, and a chosen model without a replica
        answers the default with the reason)."""
        catalog = self.catalog
        by_key, currents = catalog.by_key, catalog.currents
        for model in models:  # per query: the common case, all up, in a few lookups
            sched = by_key.get((model, currents.get(model, "")))
            if sched is None or not sched.replicas:
                break
        else:
            return None
        rollouts = catalog.rollouts if self.traffic is not None else {}
        up: list[str] = []
        for model in models:
            sched = by_key.get((model, currents.get(model, "")))
            if sched is not None and sched.replicas:
                up.append(model)
                continue
            rollout = rollouts.get(model)
            if rollout is not None and any(
                (s := by_key.get((model, v))) is not None and s.replicas for v, _ in rollout.split
            ):
                up.append(model)
        if not up or len(up) == len(models):
            return None
        return frozenset(up)

    def draws(self, app_name: str) -> Draws:
        draws = self._draws.get(app_name)
        if draws is None:
            draws = self._draws[app_name] = Draws()
        return draws

    def current(self, app_name: str) -> Selection | None:
        """The application's selection as last built (None before its first query); read
        only (the dashboard shows its policy's weights)."""
        return self._by_app.get(app_name)

    async def state_for(self, sel: Selection, uid: str) -> State:
        """The user's state: in memory, else the persisted copy, else a fresh one."""
        if uid in sel.states:
            return sel.states.get(uid)
        stored = await self.fetch(sel.app.name, uid) if self.fetch is not None else None
        if uid in sel.states:  # loaded meanwhile by a concurrent request
            return sel.states.get(uid)
        state = stored if isinstance(stored, dict) else sel.policy.init_state()
        sel.states.put(uid, state)
        return state

    # -- queries -------------------------------------------------------------------------------
    def run(  # noqa: PLR0917 (called per query)
        self,
        app: Application,
        payloads: list[bytes],
        version: str | None,
        uid: str,
        reply: Reply,
        t0: float,
        slo_s: float,
        rank: int = STANDARD,
    ) -> None:
        """``version`` is None: a selection application picks each model's version itself
        (the processor refuses a pinned version when several models are linked). ``rank``:
        the query's class, which every chosen model's queue orders and sheds by."""
        sel = self.selection(app)
        if uid in sel.states:
            self._run(sel, sel.states.get(uid), payloads, uid, reply, t0, slo_s, rank)
            return
        span = _trace.current  # the request's span (traced), current again once loaded

        async def load_then_run() -> None:
            try:
                state = await self.state_for(sel, uid)
                _trace.current = span
                try:
                    self._run(sel, state, payloads, uid, reply, t0, slo_s, rank)
                finally:
                    _trace.current = None
            except Exception as e:  # a task: nobody else would answer
                fail_internal(reply, f"a query of application '{app.name}'", e)

        self.spawn(load_then_run())

    def _run(  # noqa: PLR0917 (called per query)
        self,
        sel: Selection,
        state: State,
        payloads: list[bytes],
        uid: str,
        reply: Reply,
        t0: float,
        slo_s: float,
        rank: int = STANDARD,
    ) -> None:
        app = sel.app
        started = self.clock.now() if _trace.current is not None else 0.0
        available = self.available(sel.models)
        chosen = sel.policy.select(state, self.rng, available)
        if _trace.current is not None:
            _selection_span(app, chosen, started, self.clock.now())
        if sel.policy.bandit_feedback:
            # The probability among the available models: the one it was drawn with.
            draw = Draw(chosen[0], sel.policy.draw_probability(state, chosen[0], available))
            draws = self.draws(app.name)
            for payload in payloads:
                draws.record(uid, payload, draw)
        deadline = t0 + slo_s
        q = EnsembleQuery(
            self, sel, state, chosen, len(payloads), reply=reply, t0=t0, deadline=deadline,
            available=available,
        )  # fmt: skip
        catalog, seam, traffic = self.catalog, self.seam, self.traffic
        for model in chosen:
            version, shadow = catalog.current(model), None
            if traffic is not None and catalog.rollout(model) is not None:
                version, shadow = traffic.route(model, uid, slo_s)
            sched = catalog.scheduler(model, version) if version is not None else None
            if version is None or sched is None or not sched.replicas:
                gone = ReplicaError(f"no replica of model {model}:{version} is alive")
                for i in range(q.n):
                    q.fill(i, model, None, gone)
                continue
            submitted = False
            for i, payload in enumerate(payloads):
                waiter = q.waiter(i, model)
                if shadow is not None:
                    waiter = shadow.wrap(payload, waiter)
                submitted |= seam.submit(app, sched, payload, deadline, waiter, rank)
            if submitted:
                sched.pump()
                q.sched = sched
            if shadow is not None:
                shadow.fire()
        if q.reply is not None:
            q.timer = self.clock.call_later(
                max(deadline - app.answer_margin_s - self.clock.now(), 0.0), q.on_deadline
            )
            if isinstance(reply, CancellableReply):
                reply.watch(q)  # it waits: a client that leaves frees its inputs

    # -- feedback ----------------------------------------------------------------------------
    def feedback(
        self, app: Application, payload: bytes, label: Any, uid: str, reply: FeedbackReply
    ) -> None:
        """Check now (an application with nothing to learn about is answered 400 at once);
        learn in a task."""
        sel = self.selection(app)
        self.spawn(self._learn(sel, payload, label, uid, reply))

    async def _learn(
        self,
        sel: Selection,
        payload: bytes,
        label: Any,
        uid: str,
        reply: FeedbackReply,
    ) -> None:
        app, catalog = sel.app, self.catalog
        try:
            state = await self.state_for(sel, uid)
            drawn: dict[str, float] | None = None
            models = sel.models
            if sel.policy.bandit_feedback:
                draw = self._draw_of(sel, state, uid, payload)
                models = (draw.model,)
                if draw.probability is not None:
                    drawn = {draw.model: draw.probability}
            outputs: dict[str, Any] = {}
            missing: list[tuple[str, str]] = []
            for model in models:
                # The version this user's queries go to (a non-sticky split draws again).
                version = catalog.current(model)
                if self.traffic is not None and catalog.rollout(model) is not None:
                    version = self.traffic.pick(model, uid)
                if version is None:
                    continue
                cached = self.seam.peek(model, version, payload)
                if cached is not None:
                    outputs[model] = cached
                else:
                    missing.append((model, version))
            if missing:  # evicted or never asked: ask the models again
                outputs.update(await self._ask(app, payload, missing))
            if not outputs:
                reply.fail(
                    NoPrediction(
                        "no linked model answered for this input, so the feedback "
                        "cannot be joined with a prediction; retry when replicas are up"
                    )
                )
                return
            sel.policy.observe(state, outputs, label, sel.loss, drawn=drawn)
            sel.states.put(uid, state)
            if self.persist is not None:
                self.persist(app.name, uid, state)
            if app.online_learning and self.on_feedback is not None:
                self.on_feedback(app, list(outputs), payload, label)
            reply.received()
        except ClipperError as e:
            reply.fail(FeedbackError(str(e)))
        except Exception as e:  # a task: nobody else would answer
            fail_internal(reply, f"feedback for application '{app.name}'", e)

    def _draw_of(self, sel: Selection, state: State, uid: str, payload: bytes) -> Draw:
        """The draw of the query this feedback is about; without a record of it (evicted,
        answered by another frontend, or never asked) a draw made now, as a query would."""
        draw = self.draws(sel.app.name).take(uid, payload)
        if draw is not None and draw.model in sel.models:
            return draw
        available = self.available(sel.models)
        model = sel.policy.select(state, self.rng, available)[0]
        return Draw(model, sel.policy.draw_probability(state, model, available))

    async def _ask(
        self, app: Application, payload: bytes, models: list[tuple[str, str]]
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        clock = self.clock
        deadline = clock.now() + max(app.slo_s, FEEDBACK_WAIT_S)
        futures: dict[str, asyncio.Future[Any]] = {}
        for model, version in models:
            sched = self.catalog.scheduler(model, version)
            if sched is None or not sched.replicas:
                continue
            fut: asyncio.Future[Any] = loop.create_future()

            def done(
                value: object, err: BaseException | None, f: asyncio.Future[Any] = fut
            ) -> None:
                if not f.done():
                    if err is None:
                        f.set_result(value)
                    else:
                        f.set_exception(err)

            futures[model] = fut
            if self.seam.submit(app, sched, payload, deadline, done):
                sched.pump()
        if futures:
            await wait_all(clock, futures.values(), deadline - clock.now())
        return {m: f.result() for m, f in futures.items() if f.done() and f.exception() is None}

    def predictions(self, q: EnsembleQuery) -> list[Prediction]:
        """The combined answers of a query (query ids in input order), counted in the
        application's metrics."""
        answers = self.answers
        app_name = q.app.name
        answers.answered(app_name, q.t0)
        out: list[Prediction] = []
        for i in range(q.n):
            pred = combine_one(q, i, answers.next_id())
            if pred.reason is not None:
                answers.defaulted(app_name, pred.reason)
            out.append(pred)
        return out

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


class EnsembleQuery(PendingQuery):
    """One request to a multi-model application: ``n`` inputs by the chosen models."""

    __slots__ = (
        "available",
        "chosen",
        "deadline",
        "errors",
        "n",
        "outputs",
        "remaining",
        "sched",
        "sel",
        "state",
    )
    run: SelectionRunner

    def __init__(
        self,
        run: SelectionRunner,
        sel: Selection,
        state: State,
        chosen: list[str],
        n: int,
        *,
        reply: Reply,
        t0: float,
        deadline: float,
        available: frozenset[str] | None = None,
    ) -> None:
        self.run = run
        self.sel = sel
        self.app = sel.app
        self.state = state
        self.chosen = chosen
        self.available = available  # what the policy chose among (None: every linked model)
        self.n = n
        self.outputs: list[dict[str, Any]] = [{} for _ in range(n)]
        self.errors: list[dict[str, BaseException]] = [{} for _ in range(n)]
        self.remaining = n * len(chosen)
        self.reply: Reply | None = reply
        self.t0 = t0
        self.deadline = deadline
        self.timer: TimerHandle | None = None
        self.gone = False  # the client went away: nothing is answered
        # One of the schedulers its inputs went to: they share the replicas' transport, which
        # the deadline reads before it answers (see _Query.on_deadline in single.py).
        self.sched: ModelScheduler | None = None

    def waiter(self, i: int, model: str) -> Waiter:
        return _Member(self, i, model)

    def abandon(self) -> None:
        """The client went away: answer nothing; the inputs no live query shares are dropped
        at dispatch."""
        if not self.drop():
            return
        self.run.answers.abandoned(self.app.name)
        self.run.seam.abandoned()

    def fill(self, i: int, model: str, value: object, err: BaseException | None) -> None:
        if self.reply is None:
            return
        if model in self.outputs[i] or model in self.errors[i]:
            return
        if err is None:
            self.outputs[i][model] = value
        else:
            self.errors[i][model] = err
        self.remaining -= 1
        if self.remaining == 0:
            self.finish()

    def on_deadline(self) -> None:
        self.timer = None
        if self.reply is None:
            return
        if self.sched is not None:
            self.sched.collect_answers()  # outputs that arrived unread still count
            if self.reply is None:
                return
        self.finish()


class _Member(Abandonable):
    """The waiter of one chosen model's output for one input of an :class:`EnsembleQuery`."""

    __slots__ = ("i", "model", "q")

    def __init__(self, q: EnsembleQuery, i: int, model: str) -> None:
        self.q = q
        self.i = i
        self.model = model

    def __call__(self, value: object, err: BaseException | None, /) -> None:
        self.q.fill(self.i, self.model, value, err)

    def abandoned(self) -> bool:
        return self.q.gone


def _late(q: EnsembleQuery, missing: list[str]) -> BaseException:
    """Why no chosen model answered by the deadline: each had a replica when the query was
    queued (else it was answered at once); if each of them has none now, or had one fail
    holding batches since, their replicas failed or left with the query (a replica failure),
    else the deadline came first."""
    catalog = q.run.catalog
    for model in missing:
        sched = catalog.scheduler(model)
        if sched is not None and not sched.lost_since(q.t0):
            return DeadlineExceeded("no model answered in time")
    if not missing:
        return DeadlineExceeded("no model answered in time")
    return ReplicaError(
        f"the replicas holding this query ({', '.join(missing)}) failed or left before answering"
    )


def combine_one(q: EnsembleQuery, i: int, query_id: int) -> Prediction:
    """The answer for input ``i``: combined outputs, or the default output and why."""
    app, run = q.app, q.run
    arrived = q.outputs[i]
    missing = [m for m in q.chosen if m not in arrived]
    for model in missing:
        run.metrics.missing.labels(app=app.name, model=model).inc()
    if not arrived:
        errors = q.errors[i]
        if errors:
            model, err = next(iter(errors.items()))
            reason, why = run.seam.explain(model, err)
        else:
            reason, why = run.seam.explain("", _late(q, missing))
        return Prediction(query_id, app.default_value, reason, why, (), 0.0)
    combined = q.sel.policy.combine(q.state, arrived, q.available)
    used = tuple(combined.used)
    if combined.confidence < app.min_confidence:
        why = (
            f"Confidence {combined.confidence:.2f} is below the application's minimum "
            f"{app.min_confidence:.2f} (models answering: {', '.join(used)})"
        )
        return Prediction(
            query_id,
            app.default_value,
            DefaultReason.LOW_CONFIDENCE,
            why,
            used,
            combined.confidence,
        )
    return Prediction(query_id, combined.output, None, "", used, combined.confidence)


def _selection_span(app: Application, chosen: Sequence[str], start: float, end: float) -> None:
    """A traced query's ``selection`` span: the policy and the models it chose."""
    tracer = _trace.active
    if tracer is not None:
        attrs = {"clipper.policy": app.policy, "clipper.models": ",".join(chosen)}
        tracer.child(_trace.current, "selection", start, end, attrs)

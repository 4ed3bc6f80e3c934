"""One query's path: parse, cache, queue, and an answer by the deadline, whatever happens.

Callback-driven: a request costs a few objects and at most one timer, no task. Results reach a
query through the prediction cache (which also joins identical in-flight inputs); the deadline
timer answers whatever is missing with the application's default output and the reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from clipper.batching.queue import Task
from clipper.batching.scheduler import ModelScheduler
from clipper.cache import CacheKey, Lookup, PredictionCache
from clipper.clock import Clock, TimerHandle
from clipper.errors import (
    BadInputError,
    DeadlineExceeded,
    ModelError,
    NotFoundError,
    OverloadedError,
    PayloadTooLarge,
    RegistryError,
    ReplicaError,
    RequestError,
)
from clipper.frontend.ensemble import EnsembleQuery, SelectionRuntime, combine_one, parse_uid
from clipper.frontend.fast_input import DoublesReader
from clipper.frontend.loop_lag import LoopLagMonitor
from clipper.frontend.prediction import (
    DefaultReason,
    FeedbackReply,
    Prediction,
    Reply,
    fail_internal,
)
from clipper.frontend.traffic import ShadowCopies, Traffic
from clipper.inputs import InputType, parse_input
from clipper.metrics import Metrics
from clipper.registry import Application, Registry

if TYPE_CHECKING:
    from clipper.pipeline.run import PipelineRuntime

__all__ = [
    "NO_MODELS",
    "SLO_MISSED",
    "QueryProcessor",
    "QueryRejected",
]

# The original's two explanations, kept word for word.
NO_MODELS = "No connected models found for query"
SLO_MISSED = "Failed to retrieve a prediction response within the specified latency SLO"

_UNSET: Any = object()

DEFAULT_MAX_ITEMS = 1000  # FrontendConfig.max_items_per_request's default


def too_many_items(n: int, limit: int, what: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} has {n} items; at most {limit} are accepted per request "
        "(max_items_per_request): split it into several requests"
    )


# Loop lag below this is timer noise (uvloop rounds timers to whole milliseconds), not a backlog.
LAG_FLOOR_S = 0.002
# A query that has already spent this share of its budget before reaching the processor came
# through a backlog (socket, parser): it is priced against its deadline before being queued.
LATE_ARRIVAL_SHARE = 0.25


class QueryRejected(RequestError):
    """The application asked for 503 rather than a default output under overload."""

    status = 503
    error = "Service unavailable"


class QueryProcessingError(RequestError):
    status = 400
    error = "Query processing error"


class _Query:
    __slots__ = (
        "app",
        "deadline",
        "defaults",
        "explanations",
        "model",
        "n",
        "outputs",
        "payloads",
        "proc",
        "remaining",
        "reply",
        "sched",
        "shadow",
        "single",
        "t0",
        "timer",
        "version",
    )

    def __init__(
        self,
        proc: QueryProcessor,
        app: Application,
        n: int,
        *,
        reply: Reply,
        t0: float,
        model: str,
    ) -> None:
        self.proc = proc
        self.app = app
        self.n = n
        self.outputs: list[Any] = [_UNSET] * n
        self.defaults: list[DefaultReason | None] = [None] * n  # None: a model answered
        self.explanations: list[str] = [""] * n
        self.remaining = n
        self.reply: Reply | None = reply
        self.t0 = t0
        self.timer: TimerHandle | None = None
        self.single = n == 1
        self.model = model
        self.version = ""
        self.deadline = 0.0
        self.payloads: list[bytes] = []
        self.sched: ModelScheduler | None = None
        self.shadow: ShadowCopies | None = None  # until its copies are fired

    def waiter(self, i: int) -> Callable[[object, BaseException | None], None]:
        def done(value: object, err: BaseException | None) -> None:
            self.fill(i, value, err)

        return done

    def fill(self, i: int, value: object, err: BaseException | None) -> None:
        if self.reply is None or self.remaining == 0:
            return  # already answered (deadline) or this slot was already filled
        if err is None:
            self.outputs[i] = value
        else:
            if isinstance(err, DeadlineExceeded) and self.proc.clock.now() < self.deadline:
                # The expired task belonged to an earlier identical query that this one
                # joined; this query has its own, later deadline: queue its input again.
                self.proc.enqueue(self, i)
                return
            if isinstance(err, DeadlineExceeded):
                reason, why = self.late()
            else:
                reason, why = self.proc.explain(self.model, err)
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

    def on_deadline(self) -> None:
        self.timer = None
        if self.reply is None:
            return
        reason, why = self.late()
        for i in range(self.n):
            if self.outputs[i] is _UNSET:
                self.set_default(i, reason, why)
        self.remaining = 0
        self.finish()

    def late(self) -> tuple[DefaultReason, str]:
        """Why an input had no answer by its deadline. The query was queued while its version
        had a replica; if none is left now, the replica failed or left with it (its batch was
        queued again, and nothing could take it): a replica failure, not a missed SLO."""
        sched = self.sched
        if sched is not None and not sched.replicas:
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

    def finish(self) -> None:
        reply = self.reply
        assert reply is not None
        self.reply = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        try:
            reply.answer(self.proc.predictions(self))
        except Exception as e:  # runs in a replica's or the timer's callback
            fail_internal(reply, f"answering a query of application '{self.app.name}'", e)


class QueryProcessor:
    def __init__(
        self,
        *,
        registry: Registry,
        cache: PredictionCache,
        clock: Clock,
        metrics: Metrics,
        schedulers: dict[tuple[str, str], ModelScheduler],
        max_items: int = DEFAULT_MAX_ITEMS,
        loop_lag: LoopLagMonitor | None = None,
    ) -> None:
        self.registry = registry
        # How far behind the event loop runs; None: never shed for lag (tests, embedders).
        self.loop_lag = loop_lag
        self.cache = cache
        self.clock = clock
        # Items one request may carry: its parse and enqueue hold the event loop.
        self.max_items = max_items
        self._doubles = DoublesReader()  # {"input": [numbers]} without Python floats
        self.metrics = metrics
        self.schedulers = schedulers
        self._query_ids = itertools.count()
        # The selection layer (several models per application); set by the frontend.
        self.selection: SelectionRuntime | None = None
        # Pipeline applications (docs/pipelines.md); set by the frontend.
        self.pipelines: PipelineRuntime | None = None
        # Canary splits and shadows between a model's versions; set by the frontend.
        self.traffic: Traffic | None = None
        # Online learning: (app, models, input payload, label) for containers with update().
        self.on_feedback: Callable[[Application, list[str], bytes, Any], None] | None = None
        self._app_metrics: dict[str, tuple[Any, Any]] = {}
        self._cache_metrics: dict[tuple[str, str], tuple[Any, Any]] = {}

    # -- the predict route -------------------------------------------------------------------
    def predict(
        self,
        app_name: str,
        body: bytes,
        reply: Reply,
        *,
        slo_s: float | None = None,
        t0: float | None = None,
    ) -> None:
        """Answer ``POST /{app}/predict``. Raises :class:`RequestError` for bad requests
        (nothing has been queued then); otherwise ``reply`` gets the answer exactly once.

        ``t0`` is when the request's first byte was read (this processor's clock); the
        latency SLO and the latency histogram count from it. Default: now."""
        if t0 is None:
            t0 = self.clock.now()
        app = self.registry.apps.get(app_name)
        if app is None:
            # Not the list of the others: callers on the query port need not learn them.
            raise NotFoundError(f"no application named '{app_name}'")
        itype = app.input_type
        fast = self._doubles.read(body) if itype is InputType.DOUBLES else None
        if fast is not None:
            payload, version, raw_uid = fast
            payloads, uid = [payload], parse_uid(raw_uid)
        else:
            items, version, uid = self._parse_predict(app, body)
            # Only true/false hold an "e" among JSON's non-string tokens besides exponents, and
            # a one-byte search is 20x cheaper than searching for the words; "e": scan types.
            bools = b"e" in body
            payloads = [parse_input(itype, item, may_hold_bools=bools) for item in items]
        self.predict_payloads(app, payloads, version, uid, reply, t0, slo_s)

    def predict_payloads(  # noqa: PLR0917 (the hot path: no keyword packing)
        self,
        app: Application,
        payloads: list[bytes],
        version: str | None,
        uid: str,
        reply: Reply,
        t0: float,
        slo_s: float | None = None,
    ) -> None:
        """Answer inputs already in their wire form (what :func:`parse_input` makes): the
        rest of :meth:`predict`, shared with the V2 protocol, whose tensors need no JSON."""
        if len(payloads) > self.max_items:  # the protocols check earlier, before their parse
            raise too_many_items(len(payloads), self.max_items, "the request")
        app_name = app.name
        linked = self.registry.links.get(app_name) or []
        if version is not None and len(linked) > 1:
            raise QueryProcessingError(f"Too many models linked to application {app_name}")
        budget = app.slo_s if slo_s is None else min(app.slo_s, slo_s)
        if app.stages is not None and self.pipelines is not None:
            self.pipelines.predict(app, payloads, uid, reply, t0, budget)
            return
        if app.policy != "single" and linked and self.selection is not None:
            self.selection.predict(app, payloads, uid, reply, t0, budget)
            return
        model_name = linked[0] if linked else ""
        q = _Query(self, app, len(payloads), reply=reply, t0=t0, model=model_name)
        if not linked:
            for i in range(q.n):
                q.set_default(i, DefaultReason.NO_MODEL, NO_MODELS)
            q.remaining = 0
            q.finish()
            return
        if version is None:
            version = self.registry.current.get(model_name)
            if self.traffic is not None and model_name in self.registry.rollouts:
                version, q.shadow = self.traffic.route(model_name, uid, budget)
                if version is not None and hasattr(reply, "version"):
                    # The V2 protocols' answers name the version: the one the split chose.
                    setattr(reply, "version", version)  # noqa: B010 (not every Reply has it)
            if version is None:
                for i in range(q.n):
                    q.set_default(i, DefaultReason.NO_MODEL, NO_MODELS)
                q.remaining = 0
                q.finish()
                return
        elif version not in self.registry.models.get(model_name, {}):
            raise QueryProcessingError(
                f"Requested version: {version} does not exist for model: {model_name}"
            )
        sched = self.schedulers.get((model_name, version))
        if sched is None or not sched.replicas:
            mv = self.registry.models[model_name][version]
            if mv.num_replicas == 0 or sched is None:
                reason, why = DefaultReason.NO_MODEL, NO_MODELS
            else:
                reason, why = (
                    DefaultReason.NO_REPLICA,
                    (
                        f"No replica of model {model_name}:{version} is alive "
                        f"({mv.num_replicas} configured); "
                        + ("it is being restarted" if mv.artifact else "none is connected")
                    ),
                )
            for i in range(q.n):
                q.set_default(i, reason, why)
            q.remaining = 0
            q.finish()
            return
        q.deadline = t0 + budget
        cause = self._behind(t0, q.deadline - app.answer_margin_s, sched)
        if cause is not None:
            # Queued, it would only be answered late by the deadline timer (itself late by the
            # loop's lag) and take a batch slot from queries that can still make it.
            err = OverloadedError(cause)
            for i in range(q.n):
                q.fill(i, None, err)
                if q.reply is None:
                    break
            return
        q.payloads = payloads
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
                max(q.deadline - q.app.answer_margin_s - self.clock.now(), 0.0), q.on_deadline
            )

    def socket_wait_s(self) -> float:
        """About how long a request waited in its socket before the loop read its first byte
        (one loop turn under saturation; 0 otherwise). Only the latency histogram adds it, so
        that it shows what clients see; deadlines count from the first byte, and
        :meth:`_behind` prices the loop's lag on its own."""
        mon = self.loop_lag
        return mon.socket_wait_s if mon is not None else 0.0

    def _behind(self, t0: float, due: float, sched: ModelScheduler) -> str | None:
        """Why a query due by ``due`` cannot make it when the frontend itself is behind
        (loop lag above noise, or the request arrived late into its budget); None to queue.

        Its answer needs at least the loop's lag to be written, and the wait that admission
        prices for the model's queue (the work queued ahead at the replicas' throughput and
        what is left of the batches running); when that ends past ``due`` it is shed now,
        cheaply, instead. The batch latencies behind that wait are round trips measured on
        this loop, so they already hold the loop's delay in reading answers: the two overlap
        and the longer one counts. Pricing a whole batch on top of the lag shed everything at
        256 connections, and then no batch ran to correct the estimate. A model with nothing
        queued prices at the lag alone: the query goes into the next batch."""
        now = self.clock.now()
        mon = self.loop_lag
        lag = mon.lag_s if mon is not None else 0.0
        if lag < LAG_FLOOR_S:
            lag = 0.0
            if now - t0 < LATE_ARRIVAL_SHARE * (due - t0):
                return None
        if sched.probing(now):
            return None  # admission is measuring the model again (ModelScheduler._probe)
        finish = now + (max(lag, sched.expected_latency_s()) if sched.queue else lag)
        if finish <= due:
            return None
        return (
            f"the frontend is behind (event loop {lag * 1e3:.1f} ms late, the request "
            f"{(now - t0) * 1e3:.1f} ms old): its answer could not come within the latency SLO"
        )

    def enqueue(self, q: _Query, i: int) -> bool:
        """Look input ``i`` up in the cache, or queue it; True when a task was queued (the
        caller pumps the scheduler once for the whole request)."""
        assert q.sched is not None
        waiter = q.waiter(i)
        if q.shadow is not None:
            waiter = q.shadow.wrap(q.payloads[i], waiter)
        return self.submit(q.app, q.model, q.version, q.sched, q.payloads[i], q.deadline, waiter)

    def submit(  # noqa: PLR0917 (the hot path: no keyword packing)
        self,
        app: Application,
        model: str,
        version: str,
        sched: ModelScheduler,
        payload: bytes,
        deadline: float,
        waiter: Callable[[object, BaseException | None], None],
    ) -> bool:
        """One input for one model: answered from the cache, joined to the same input in
        flight, or queued (True: the caller pumps ``sched`` once for its whole request)."""
        key: CacheKey | None = None
        if app.cache:
            key = (model, version, payload)
            status, value = self.cache.get_or_join(key, waiter)
            hits, misses = self._cache_counters(model, version)
            if status is Lookup.HIT:
                hits.inc()
                waiter(value, None)
                return False
            misses.inc()
            if status is Lookup.JOINED:
                return False
        task = Task(payload, deadline, self.clock.now(), key, None if key else waiter)
        try:
            sched.submit(task)
        except OverloadedError as e:
            if key is not None:
                self.cache.fail(key, e)
            else:
                waiter(None, e)
            return False
        return True

    def _parse_predict(self, app: Application, body: bytes) -> tuple[list[Any], str | None, str]:
        schema = app.input_type.schema()
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise BadInputError(
                f"Error parsing JSON: {e}. Expected JSON schema: {schema}"
            ) from None
        if not isinstance(doc, dict):
            raise BadInputError(
                "Error parsing JSON: the body must be a JSON object. "
                f"Expected JSON schema: {schema}"
            )
        version = doc.get("version")
        if version is not None and not isinstance(version, str):
            raise BadInputError(
                f'Error parsing JSON: "version" must be a string, got {type(version).__name__}'
            )
        if "input" in doc:
            return [doc["input"]], version, parse_uid(doc.get("uid"))
        batch = doc.get("input_batch")
        if batch is None:
            raise BadInputError(
                "Error parsing JSON: JSON object does not have required keys input or "
                f"input_batch. Expected JSON schema: {schema}"
            )
        if not isinstance(batch, list) or not batch:
            raise BadInputError(
                'Error parsing JSON: "input_batch" must be a non-empty array. '
                f"Expected JSON schema: {schema}"
            )
        if len(batch) > self.max_items:  # before any per-item work
            raise too_many_items(len(batch), self.max_items, '"input_batch"')
        return batch, version, parse_uid(doc.get("uid"))

    # -- feedback ----------------------------------------------------------------------------
    def feedback(self, app_name: str, body: bytes, reply: FeedbackReply) -> None:
        """``POST /{app}/update``: joins the label with the models' predictions for that input
        and updates the application's selection policy (per user with a ``uid``)."""
        app = self.registry.apps.get(app_name)
        if app is None:
            raise NotFoundError(f"no application named '{app_name}'")
        assert self.selection is not None
        self.selection.feedback(app, body, reply)

    # -- answers -----------------------------------------------------------------------------
    def next_query_id(self) -> int:
        return next(self._query_ids)

    def explain(self, model: str, err: BaseException) -> tuple[DefaultReason, str]:
        if isinstance(err, ModelError):
            return DefaultReason.MODEL_ERROR, f"The model {model} raised an error: {err}"
        if isinstance(err, OverloadedError):
            return DefaultReason.OVERLOAD, f"Query shed under overload: {err}"
        if isinstance(err, DeadlineExceeded):
            return DefaultReason.SLO, SLO_MISSED
        if isinstance(err, RegistryError):
            return DefaultReason.NO_MODEL, NO_MODELS
        if isinstance(err, ReplicaError):
            return DefaultReason.NO_REPLICA, f"No replica of a chosen model is alive: {err}"
        return DefaultReason.ERROR, f"{type(err).__name__}: {err}"

    def predictions(self, q: _Query) -> list[Prediction]:
        """The answered query as predictions (query ids are given out here, in input order),
        counted in the application's metrics."""
        app_name = q.app.name
        requests, latency = self._app_counters(app_name)
        requests.inc()
        latency.observe(self.clock.now() - q.t0 + self.socket_wait_s())
        ids = self._query_ids
        out: list[Prediction] = []
        for i in range(q.n):
            reason = q.defaults[i]
            if reason is None:
                out.append(Prediction(next(ids), q.outputs[i]))
            else:
                self.metrics.defaults.labels(app=app_name, reason=reason).inc()
                out.append(Prediction(next(ids), q.outputs[i], reason, q.explanations[i]))
        return out

    def ensemble_predictions(self, q: EnsembleQuery) -> list[Prediction]:
        """The combined answers of a selection-policy query, counted as :meth:`predictions`."""
        app_name = q.app.name
        requests, latency = self._app_counters(app_name)
        requests.inc()
        latency.observe(self.clock.now() - q.t0 + self.socket_wait_s())
        out: list[Prediction] = []
        for i in range(q.n):
            pred = combine_one(q, i, next(self._query_ids))
            if pred.reason is not None:
                self.metrics.defaults.labels(app=app_name, reason=pred.reason).inc()
            out.append(pred)
        return out

    def forget_app(self, app: str) -> None:
        """A deleted application: its metric series go, and the children held for them."""
        self._app_metrics.pop(app, None)
        self.metrics.forget_app(app)

    def forget_version(self, model: str, version: str) -> None:
        """A deleted model version: drop the cache-metric children held for it (their series
        were removed; a version registered again under the name gets new ones)."""
        self._cache_metrics.pop((model, version), None)
        self.metrics.forget_version(model, version)

    def _app_counters(self, app: str) -> tuple[Any, Any]:
        m = self._app_metrics.get(app)
        if m is None:
            m = self._app_metrics[app] = (
                self.metrics.requests.labels(app=app),
                self.metrics.latency.labels(app=app),
            )
        return m

    def _cache_counters(self, model: str, version: str) -> tuple[Any, Any]:
        k = (model, version)
        m = self._cache_metrics.get(k)
        if m is None:
            m = self._cache_metrics[k] = (
                self.metrics.cache_hits.labels(model=model, version=version),
                self.metrics.cache_misses.labels(model=model, version=version),
            )
        return m

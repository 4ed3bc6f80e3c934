"""The routes of the two HTTP ports: the query API (predict, feedback, metrics, health, the
frontend's readiness and one application's) and the admin API's token check in front of
:class:`AdminApi`.

The Clipper REST edge: :func:`encode_predictions` turns the processor's predictions into the
original ``POST /<app>/predict`` document, and refused queries are rendered by
:func:`clipper.frontend.http.error_body`, like every other Clipper REST error.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl

import orjson

from clipper.batching.queue import STANDARD
from clipper.errors import BadInputError, NotFoundError, RequestError
from clipper.frontend import request_trace, v2
from clipper.frontend.clipper_rest import PredictParser, parse_feedback
from clipper.frontend.http import (
    JSON,
    Refusal,
    Respond,
    error_body,
    is_owed,
    json_response,
    watch_client,
)
from clipper.frontend.model_failure import model_failure
from clipper.frontend.openapi import admin_document, document_bytes, query_document
from clipper.frontend.parse_pool import OFFLOAD_BYTES, ParsePool
from clipper.frontend.tenant_sheds import count_answer, count_failure
from clipper.query.prediction import (
    CancellableReply,
    Prediction,
    answer_failed,
)
from clipper.query.runtime import QueryServices
from clipper.registry import Application
from clipper.tenants import Admitted, TenantGate
from clipper.tracing import hooks as _trace
from clipper.tracing.tracer import Span, Tracer

if TYPE_CHECKING:
    from clipper.frontend.admin import AdminApi

__all__ = [
    "AdminRoutes",
    "QueryRoutes",
    "RestReply",
    "bearer_token_matches",
    "encode_predictions",
    "repeated_authorization",
]

_PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"
_TEXT = b"text/plain; charset=utf-8"
_NUMPY = orjson.OPT_SERIALIZE_NUMPY  # outputs decoded from replicas may be NumPy values


def _document(p: Prediction) -> dict[str, Any]:
    """One prediction as the original's JSON object (key order is part of the document); a
    pipeline's degraded and dropped stages follow when there are any."""
    doc = _original(p)
    if p.degraded:
        doc["degraded"] = p.degraded
    if p.dropped:
        doc["dropped"] = p.dropped
    return doc


def _original(p: Prediction) -> dict[str, Any]:
    if p.models is None:  # a single-model application
        if p.reason is None:
            return {"query_id": p.query_id, "output": p.output, "default": False}
        return {
            "query_id": p.query_id,
            "output": p.output,
            "default": True,
            "default_explanation": p.explanation,
        }
    if p.reason is None:
        return {
            "query_id": p.query_id,
            "output": p.output,
            "default": False,
            "models": p.models,
            "confidence": p.confidence,
        }
    return {
        "query_id": p.query_id,
        "output": p.output,
        "default": True,
        "default_explanation": p.explanation,
        "models": p.models,
        "confidence": p.confidence,
    }


def encode_predictions(predictions: list[Prediction]) -> bytes:
    """The ``POST /<app>/predict`` answer: one object for one input (``input``, or an
    ``input_batch`` of one), else ``{"batch_predictions": [...]}``."""
    if len(predictions) == 1:
        return orjson.dumps(_document(predictions[0]), option=_NUMPY)
    return orjson.dumps({"batch_predictions": [_document(p) for p in predictions]}, option=_NUMPY)


class RestReply(CancellableReply):
    """A Clipper REST request's :class:`~clipper.frontend.prediction.Reply` (predict) or
    :class:`~clipper.frontend.prediction.FeedbackReply` (update). A predict's client that
    closes or resets its connection first abandons the query (:func:`watch_client`)."""

    __slots__ = ("admitted", "app", "apps", "gate", "respond")

    def __init__(
        self, respond: Respond, apps: dict[str, Application] | None = None, app: str = ""
    ) -> None:
        self._watcher = None  # CancellableReply's, set here: one call less per request
        self.respond = respond
        self.apps = apps  # where the application's on_model_error is read, once answered
        self.app = app
        # A request past the tenant gate: its shed inputs are counted for its tenant.
        self.admitted: Admitted | None = None
        self.gate: TenantGate | None = None

    def answer(self, predictions: list[Prediction]) -> None:
        count_answer(self.gate, self.admitted, predictions)
        if self.apps is not None:
            failed = model_failure(self.apps.get(self.app), predictions, errors_by_default=False)
            if failed is not None:
                self.fail(failed)
                return
        try:
            body = encode_predictions(predictions)
        except Exception as e:  # called back by the query: must answer
            self.fail(answer_failed("encoding a Clipper REST answer", e))
            return
        self.respond(200, body, JSON)

    def received(self) -> None:
        # The original's answer, verbatim, and labelled as what it is: text, not JSON.
        self.respond(200, b"Feedback received? 1", _TEXT)

    def fail(self, err: RequestError) -> None:
        count_failure(self.gate, self.admitted, err)
        self.respond(err.status, error_body(err), JSON)


class _TracedRestReply(request_trace.TracedReply, RestReply):
    """A sampled predict's reply: its answer ends the request's server span."""

    __slots__ = ("span",)

    def __init__(self, respond: Respond, apps: dict[str, Application], app: str, span: Span):
        super().__init__(respond, apps, app)
        self.span = span


class QueryRoutes:
    """Port 1337."""

    def __init__(self, svc: QueryServices, pool: ParsePool | None = None) -> None:
        self.svc = svc
        # Bodies over OFFLOAD_BYTES are counted there, off the loop (None: on the loop).
        self.pool = pool
        # Bound once: the hot path.
        self._predict = svc.processor.predict
        self._parser = PredictParser(svc.max_items)
        self._parse = self._parser.parse
        self._now = svc.clock.now
        self._apps = svc.catalog.registry.apps
        self._gate = svc.tenants
        self._openapi: bytes | None = None  # GET /openapi.json, built on its first request

    def __call__(
        self,
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        """``t0``: when the request's first byte was read, on the processor's clock (None:
        when the processor sees it); predict latency and deadlines count from it."""
        if method == b"POST":
            app, _, verb = (path[1:-1] if path.endswith("/") else path[1:]).partition("/")
            if verb == "predict" and app:
                if t0 is None:
                    t0 = self._now()
                application = self._apps.get(app)
                if application is None:
                    # Not the list of the others: callers on the query port need not learn them.
                    raise NotFoundError(f"no application named '{app}'")
                # Judged before the parse and before anything is queued: a tenant over its
                # quota costs the others nothing (401/403/429 raised, with their headers).
                gate = self._gate
                admitted = None
                if gate is not None:
                    admitted = gate.judge(headers, app, application.require_key)
                if len(body) > OFFLOAD_BYTES and self.pool is not None:
                    self._predict_large(application, body, respond, t0, admitted)
                    return
                tracer = _trace.active
                if tracer is not None:
                    self._predict_traced(tracer, application, headers, body, respond, t0, admitted)
                    return
                payloads, version, uid = self._parse(application, body)
                reply = RestReply(respond, self._apps, app)
                watch_client(respond, reply)
                if admitted is None:
                    self._predict(application, payloads, version, uid, reply, t0)
                else:
                    reply.admitted, reply.gate = admitted, gate
                    rank = admitted.priority
                    self._predict(application, payloads, version, uid, reply, t0, None, rank)
                return
            if verb == "update" and app:
                application = self._apps.get(app)
                if application is None:
                    raise NotFoundError(f"no application named '{app}'")
                payload, label, uid = parse_feedback(application, body)
                self.svc.processor.feedback(application, payload, label, uid, RestReply(respond))
                return
        if method == b"GET":
            if path == "/metrics":
                if _metrics_as_json(headers):
                    json_response(respond, 200, self.svc.metrics.to_json())
                else:
                    respond(200, self.svc.metrics.render(), _PROMETHEUS)
                return
            if path in ("/health", "/healthz", "/health/live"):
                json_response(respond, 200, {"status": "ok"})
                return
            if path in ("/ready", "/health/ready"):
                query = headers.get(b":query")
                params = _params(query, ("app", "version", "ignore"), path) if query else {}
                if params.get("ignore", "model_errors") != "model_errors":
                    raise BadInputError(
                        f"GET {path}: parameter 'ignore' takes only 'model_errors' (got "
                        f"{params['ignore']!r})"
                    )
                if "app" in params:  # ?app=NAME[&version=V]: one application
                    self._app_ready(respond, params["app"], params.get("version"))
                    return
                if "version" in params:
                    raise BadInputError(
                        f"GET {path} takes ?app=<application>[&version=<version>] (one "
                        "application), or no parameters (the whole frontend)"
                    )
                # ?ignore=model_errors: what a load balancer in front of several frontends
                # probes. A model that fails on one frontend fails on all of them; taking
                # frontends out of rotation for it would take out every healthy app too.
                catalog = self.svc.catalog
                reasons = catalog.reasons(model_errors="ignore" not in params)
                doc = {"ready": not reasons, "models_without_replicas": catalog.unready(),
                       "failing_models": catalog.failing_models(), "reasons": reasons,
                       "draining": catalog.withdrawn is not None}  # fmt: skip
                if cold := catalog.cold():  # ready but cold: only when there are some
                    doc["scaled_to_zero"] = cold
                json_response(respond, 200 if not reasons else 503, doc)
                return
            if path.endswith(("/ready", "/ready/")):
                app, _, verb = (path[1:-1] if path.endswith("/") else path[1:]).partition("/")
                # /v2/... is the V2 API's unless an application is named v2.
                if verb == "ready" and app and (app != "v2" or app in self._apps):
                    query = headers.get(b":query")
                    params = _params(query, ("version",), path) if query else {}
                    self._app_ready(respond, app, params.get("version"))
                    return
            if path == "/openapi.json":
                if self._openapi is None:
                    self._openapi = document_bytes(query_document())
                respond(200, self._openapi, JSON)
                return
        if path == "/v2" or path.startswith("/v2/"):  # the Open Inference Protocol (V2)
            v2.handle(self.svc, method, path, headers, body, respond, t0=t0, pool=self.pool)
            return
        raise NotFoundError(
            f"no route for {method.decode()} {path}; expected POST /<app>/predict, "
            "POST /<app>/update, GET /<app>/ready, GET /metrics, GET /health, GET /ready or "
            "GET /openapi.json (the whole API, V2 included)"
        )

    def _predict_traced(  # noqa: PLR0917
        self,
        tracer: Tracer,
        application: Application,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        t0: float,
        admitted: Admitted | None,
    ) -> None:
        """A predict while tracing is on: the sampler decides (honouring a ``traceparent``)."""
        rank = STANDARD if admitted is None else admitted.priority
        attrs = {
            "http.request.method": "POST",
            "http.route": "/{app}/predict",
            "url.path": f"/{application.name}/predict",
            "clipper.app": application.name,
        }
        span = request_trace.begin(
            tracer, "POST /{app}/predict", headers.get(b"traceparent"), t0, attrs
        )
        if span is None:
            payloads, version, uid = self._parse(application, body)
            reply = RestReply(respond, self._apps, application.name)
            if admitted is not None:
                reply.admitted, reply.gate = admitted, self._gate
            watch_client(respond, reply)
            self._predict(application, payloads, version, uid, reply, t0, None, rank)
            return
        try:
            payloads, version, uid = self._parse(application, body)
            request_trace.parsed(tracer, span, t0)
            traced = _TracedRestReply(respond, self._apps, application.name, span)
            if admitted is not None:
                traced.admitted, traced.gate = admitted, self._gate
            watch_client(respond, traced)
            request_trace.run_traced(
                span, self._predict, application, payloads, version, uid, traced, t0, None, rank
            )
        except RequestError as e:
            request_trace.failed(span, e)
            raise

    def _predict_large(
        self,
        application: Application,
        body: bytes,
        respond: Respond,
        t0: float,
        admitted: Admitted | None = None,
    ) -> None:
        """Count the body's items in the parse pool; the parse and the query resume on the loop
        once the count is under the cap, unless the request is no longer owed (its client left,
        or a drain answered it). Its place in the connection's answer order is kept meanwhile,
        and a drain counts it as owed."""
        assert self.pool is not None
        parser = self._parser

        def counted(_: None, err: BaseException | None) -> None:
            if not is_owed(respond):
                return
            reply = RestReply(respond, self._apps, application.name)
            if err is None:
                try:
                    payloads, version, uid = parser.parse(application, body, counted=True)
                except Exception as e:  # answered below, never left owed
                    err = e
            if err is not None:
                reply.fail(
                    err
                    if isinstance(err, RequestError)
                    else answer_failed("parsing a large Clipper REST body", err)
                )
                return
            watch_client(respond, reply)
            if admitted is None:
                self._predict(application, payloads, version, uid, reply, t0)
                return
            reply.admitted, reply.gate = admitted, self._gate
            self._predict(application, payloads, version, uid, reply, t0, None, admitted.priority)

        self.pool.submit(lambda: parser.count(application, body), counted)

    def _app_ready(self, respond: Respond, name: str, version: str | None) -> None:
        """One application's readiness: 200 when it can answer with a prediction, else 503,
        with the reasons (the rule of :meth:`~clipper.runtime.catalog.Catalog.app_reasons`)."""
        application = self._apps.get(name)
        if application is None:
            raise NotFoundError(f"no application named '{name}'")
        reasons = self.svc.catalog.app_reasons(application, version)
        doc: dict[str, Any] = {"app": name}
        if version is not None:
            doc["version"] = version
        doc["ready"] = not reasons
        doc["reasons"] = reasons
        if cold := self.svc.catalog.cold(name):
            doc["scaled_to_zero"] = cold
        json_response(respond, 200 if not reasons else 503, doc)


def _params(query: bytes, allowed: tuple[str, ...], path: str) -> dict[str, str]:
    """A readiness route's query parameters, each at most once and none but ``allowed``."""
    out: dict[str, str] = {}
    for key, value in parse_qsl(query.decode("utf-8", "replace"), keep_blank_values=True):
        if key not in allowed:
            raise BadInputError(
                f"GET {path}: unknown parameter {key!r}; it takes {', '.join(allowed)}"
            )
        if key in out:
            raise BadInputError(f"GET {path}: parameter {key!r} is given more than once")
        if not value:
            raise BadInputError(f"GET {path}: parameter {key!r} is empty")
        out[key] = value
    return out


_UNAUTHORIZED = (
    b'{"error": "Unauthorized", "cause": "this admin API needs the header '
    b'Authorization: Bearer <token>"}'
)
_DUPLICATE_AUTH = (
    b'{"error": "Bad request", "cause": "the Authorization header was given more than once"}'
)


def bearer_token_matches(header: bytes | None, token: bytes) -> bool:
    """``Authorization: Bearer <token>``, the scheme in any case (RFC 9110: schemes are
    case-insensitive), the token compared in constant time so that the time of a refusal
    says nothing of how much of a guess was right."""
    if header is None:
        return False
    scheme, _, credentials = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credentials.strip(), token)


def repeated_authorization(header: bytes | None) -> bool:
    """A repeated header reaches the router as one value joined by commas (RFC 9110 5.3:
    how proxies and a conforming HTTP layer combine them); a token never holds a comma, so
    a comma means two credentials, and which one counts is ambiguous: refuse both."""
    return header is not None and b"," in header


# The admin API's token check, as the dashboard calls it for its data: True when authorized
# (otherwise it has answered 401).
Authorize = Callable[[Mapping[bytes, bytes], Respond], bool]


class DashboardRoutes(Protocol):
    """What the admin port needs of the dashboard (served above the protocols, it is handed in
    by the composition root)."""

    def route(
        self,
        method: bytes,
        path: str,
        headers: Mapping[bytes, bytes],
        respond: Respond,
        authorize: Authorize,
    ) -> None:
        """A request for ``/dashboard`` or below."""


_OPENAPI_PATH = "/openapi.json"


class AdminRoutes:
    """Port 1338: the bearer token, when one is configured, then the admin API; the dashboard
    (``/dashboard``), when there is one, checks the token itself for its data only.

    ``GET /openapi.json`` (the admin API's OpenAPI document) needs no token, like the
    dashboard's page: it describes the routes, which are public in the docs, and holds no
    state; every route it describes still needs the token."""

    def __init__(
        self, api: AdminApi, token: str | None, dashboard: DashboardRoutes | None = None
    ) -> None:
        self.api = api
        self.token = token
        self._token = token.encode() if token is not None else None
        self.dashboard = dashboard
        self._openapi: bytes | None = None

    def __call__(
        self,
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        respond: Respond,
        *,
        t0: float | None = None,
    ) -> None:
        if self.dashboard is not None and (path == "/dashboard" or path.startswith("/dashboard/")):
            self.dashboard.route(method, path, headers, respond, self.authorized)
            return
        if method == b"GET" and path.partition("?")[0] == _OPENAPI_PATH:
            if self._openapi is None:
                self._openapi = document_bytes(admin_document(self.api.route_names()))
            respond(200, self._openapi, JSON)
            return
        if self.authorized(headers, respond):
            if method == b"GET" and path.partition("?")[0] == "/metrics":
                # This process's series: with --workers each worker is scraped on its own admin
                # port, as the query port's /metrics answers from whichever worker it reaches.
                respond(200, self.api.metrics.render(), _PROMETHEUS)
                return
            self.api.route(method, path, headers, body, respond)

    def gate(
        self, method: bytes, path: str, headers: Mapping[bytes, bytes], has_body: bool
    ) -> bool | Refusal:
        """The token check at headers-complete (:class:`~clipper.frontend.http.Gate`), before
        the body is read: a request without the token is refused (401) unless it is one the
        dashboard serves without a token (its page and files: no body, and the dashboard
        checks its data routes itself)."""
        if self._token is None:
            return True
        auth = headers.get(b"authorization")
        if repeated_authorization(auth):
            return Refusal(400, _DUPLICATE_AUTH)
        if bearer_token_matches(auth, self._token):
            return True
        if method == b"GET" and not has_body and path.partition("?")[0] == _OPENAPI_PATH:
            return True
        if (
            self.dashboard is not None
            and not has_body
            and (path == "/dashboard" or path.startswith("/dashboard/"))
        ):
            return False
        return Refusal(401, _UNAUTHORIZED)

    def authorized(self, headers: Mapping[bytes, bytes], respond: Respond) -> bool:
        """The bearer token check; a refusal is answered here (400 or 401)."""
        if self._token is not None:
            auth = headers.get(b"authorization")
            if repeated_authorization(auth):
                respond(400, _DUPLICATE_AUTH, JSON)
                return False
            if not bearer_token_matches(auth, self._token):
                respond(401, _UNAUTHORIZED, JSON)
                return False
        return True


def _metrics_as_json(headers: dict[bytes, bytes]) -> bool:
    """``?format=json|prometheus`` decides; else Accept: JSON for a client that asks for
    application/json; Prometheus text for everyone else (scrapers send text/plain or
    OpenMetrics; curl and browsers take anything and read text). The one exception is the
    original clipper_admin's ``inspect_instance()``, which sends python-requests' ``*/*`` and
    decodes JSON: a python-requests client that takes anything gets JSON."""
    query = headers.get(b":query", b"")
    if b"format=json" in query:
        return True
    if b"format=prometheus" in query or b"format=text" in query:
        return False
    accept = headers.get(b"accept")
    if accept is None:
        return False
    if b"application/json" in accept:
        return True
    if b"text/plain" in accept or b"openmetrics" in accept:
        return False
    return accept.strip() == b"*/*" and headers.get(b"user-agent", b"").startswith(
        b"python-requests/"
    )

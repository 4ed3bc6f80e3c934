"""The query processor: the router between the protocols and the runners.

A protocol parses a request at its edge into inputs in their wire form and hands them here with
the application, the pinned version (if any), the user id, the request's first-byte time and an
optional client deadline. The processor checks what holds for every kind of application (items
per request, a version pin with several models linked), works out the latency budget, and hands
the query to the runner for the application's kind (:class:`~clipper.query.kinds.RunnerTable`).
It keeps no query state: the runner answers the :class:`~clipper.query.prediction.Reply`.
"""

from __future__ import annotations

from typing import Any

from clipper.batching.queue import STANDARD
from clipper.errors import BadInputError
from clipper.metrics import Metrics
from clipper.query.answers import Answers
from clipper.query.kinds import RunnerTable
from clipper.query.prediction import (
    FeedbackReply,
    QueryProcessingError,
    Reply,
    too_many_items,
)
from clipper.query.seam import Submitter
from clipper.query.selection import SelectionRunner
from clipper.query.traffic import Traffic
from clipper.registry import Application
from clipper.runtime.catalog import Catalog

__all__ = ["DEFAULT_MAX_ITEMS", "QueryProcessor"]

DEFAULT_MAX_ITEMS = 1000  # FrontendConfig.max_items_per_request's default


class QueryProcessor:
    def __init__(
        self,
        catalog: Catalog,
        runners: RunnerTable,
        *,
        answers: Answers,
        submitter: Submitter,
        metrics: Metrics,
        selection: SelectionRunner | None = None,
        traffic: Traffic | None = None,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        self.catalog = catalog
        self.runners = runners
        self.answers = answers
        self.submitter = submitter
        self.metrics = metrics
        self.selection = selection  # feedback goes to it
        self.traffic = traffic
        # Items one request may carry: its parse and enqueue hold the event loop.
        self.max_items = max_items
        self._pick = runners.pick  # bound once: the hot path

    def predict(  # noqa: PLR0917 (the hot path: no keyword packing)
        self,
        app: Application,
        payloads: list[bytes],
        version: str | None,
        uid: str,
        reply: Reply,
        t0: float,
        slo_s: float | None = None,
        rank: int = STANDARD,
    ) -> None:
        """Answer inputs already in their wire form (what :func:`~clipper.inputs.parse_input`
        makes). Raises :class:`~clipper.errors.RequestError` for bad requests (nothing has
        been queued then); otherwise ``reply`` gets the answer exactly once.

        ``t0`` is when the request's first byte was read (the frontend's clock); the latency
        SLO and the latency histogram count from it. ``slo_s``: the client's own deadline, which
        can only shorten the application's. ``rank``: the query's priority class (the tenant
        gate's :class:`~clipper.tenants.PriorityClass`; standard without tenants)."""
        if len(payloads) > self.max_items:  # the protocols check earlier, before their parse
            raise too_many_items(len(payloads), self.max_items, "the request")
        if version is not None and len(self.catalog.linked(app.name)) > 1:
            raise QueryProcessingError(f"Too many models linked to application {app.name}")
        budget = app.slo_s if slo_s is None else min(app.slo_s, slo_s)
        self._pick(app, version).run(app, payloads, version, uid, reply, t0, budget, rank)

    def feedback(
        self, app: Application, payload: bytes, label: Any, uid: str, reply: FeedbackReply
    ) -> None:
        """``POST /{app}/update``: joins the label with the models' predictions for that input
        and updates the application's selection policy (per user with a ``uid``)."""
        if self.selection is None:
            raise BadInputError(f"application '{app.name}' takes no feedback on this frontend")
        self.selection.feedback(app, payload, label, uid, reply)

    def forget_app(self, app: str) -> None:
        """A deleted application: every runner drops what it kept, and its metric series go."""
        for runner in self.runners.runners.values():
            runner.forget_app(app)
        self.answers.forget_app(app)

    def forget_version(self, model: str, version: str) -> None:
        """A deleted model version: drop the metric children held for it (their series are
        removed; a version registered again under the name gets new ones)."""
        self.submitter.forget_version(model, version)
        if self.traffic is not None:
            self.traffic.forget_version(model, version)
        self.metrics.forget_version(model, version)

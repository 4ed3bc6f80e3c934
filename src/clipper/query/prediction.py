"""The typed answer of a query, before any protocol has encoded it: the records that cross
the seam between the query runtime and the protocols.

A runner produces one :class:`Prediction` per input and hands the list to the request's
:class:`Reply`, or refuses the query (:class:`QueryRejected`, a :class:`RequestError`); each
protocol (Clipper REST, V2 REST, V2 gRPC) encodes either once, at its own edge, in its own form.
The explanations of default outputs (:data:`NO_MODELS`, :data:`SLO_MISSED`) are the original
Clipper's, word for word.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from clipper.errors import PayloadTooLarge, RequestError

__all__ = [
    "NO_MODELS",
    "SLO_MISSED",
    "Abandon",
    "AnswerFailed",
    "CancellableReply",
    "DefaultReason",
    "FeedbackReply",
    "Prediction",
    "QueryProcessingError",
    "QueryRejected",
    "Reply",
    "Waiter",
    "answer_failed",
    "fail_internal",
    "too_many_items",
]

log = logging.getLogger("clipper.answers")

# The original's two explanations, kept word for word.
NO_MODELS = "No connected models found for query"
SLO_MISSED = "Failed to retrieve a prediction response within the specified latency SLO"

# Where one model's output for one input goes: (value, None) or (None, the error).
Waiter = Callable[[object, BaseException | None], None]


class DefaultReason(enum.StrEnum):
    """Why the application's default output answered an input (the ``reason`` label of the
    ``defaults`` metric: the values are the label values)."""

    NO_MODEL = "no_model"
    NO_REPLICA = "no_replica"
    COLD_START = "cold_start"  # scaled to zero: its replica did not start in time
    LOADING = "loading"  # pooled and unloaded: not loaded into a pool process in time
    SLO = "slo"
    OVERLOAD = "overload"
    MODEL_ERROR = "model_error"
    LOW_CONFIDENCE = "low_confidence"
    ERROR = "error"


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, about
# 7x the cost of a plain one, once per query on the hot path. Nothing mutates a Prediction.
@dataclass(slots=True)
class Prediction:
    """One input's answer (never changed once made).

    ``reason`` is None when a model answered; otherwise ``output`` is the application's
    default and ``explanation`` says why in words. ``models`` is None for a single-model
    application; for a selection policy it names the models whose outputs were combined,
    with the policy's ``confidence``.
    """

    query_id: int
    output: Any
    reason: DefaultReason | None = None
    explanation: str = ""
    models: tuple[str, ...] | None = None
    confidence: float = 0.0
    # A pipeline's stages that answered their own default, and optional ones left out.
    degraded: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()

    @property
    def is_default(self) -> bool:
        return self.reason is not None


class Reply(Protocol):
    """Where one request's answer goes: exactly one of the two is called, once."""

    def answer(self, predictions: list[Prediction]) -> None:
        """The predictions, one per input, in input order."""

    def fail(self, err: RequestError) -> None:
        """The query was refused after it was accepted (503 under overload)."""


class Abandon(Protocol):
    """What a runner registers on a :class:`CancellableReply`: its query, told once that the
    client went away."""

    def abandon(self) -> None:
        """Stop working for the client: answer nothing, release the inputs still queued."""


class _Gone:
    """The watcher slot's mark of a client that left before a runner registered."""

    __slots__ = ()

    def abandon(self) -> None:
        pass


_GONE = _Gone()


class CancellableReply:
    """A :class:`Reply` whose protocol notices a client that goes away before the answer (a
    closed or reset HTTP connection, a reset gRPC stream) and says so (:meth:`client_gone`).
    A runner whose query waits registers it (:meth:`watch`); a reply with no such signal
    simply is not one of these, and its queries run to their answer."""

    __slots__ = ("_watcher",)

    def __init__(self) -> None:
        self._watcher: Abandon | None = None

    def watch(self, query: Abandon) -> None:
        """Tell ``query`` when the client goes away (at once if it has already)."""
        if self._watcher is _GONE:
            query.abandon()
        else:
            self._watcher = query

    def client_gone(self) -> None:
        """The protocol's signal: no answer can reach the client any more. Once; harmless
        after the answer (the runner's query ignores it then)."""
        watcher, self._watcher = self._watcher, _GONE
        if watcher is not None and watcher is not _GONE:
            watcher.abandon()


class FeedbackReply(Protocol):
    """Where one feedback request's outcome goes: exactly one of the two is called, once."""

    def received(self) -> None:
        """The label was joined with the models' predictions and learned from."""

    def fail(self, err: RequestError) -> None:
        """The feedback could not be learned from."""


class QueryRejected(RequestError):
    """The application asked for 503 rather than a default output under overload."""

    status = 503
    error = "Service unavailable"


class QueryProcessingError(RequestError):
    """A query that names what the application cannot do (a version with several models
    linked, a version that does not exist)."""

    status = 400
    error = "Query processing error"


def too_many_items(n: int, limit: int, what: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} has {n} items; at most {limit} are accepted per request "
        "(max_items_per_request): split it into several requests"
    )


class AnswerFailed(RequestError):
    """The query was accepted but its answer could not be made or encoded (a bug, or an
    output no protocol can carry): answered 500 / INTERNAL rather than never."""

    status = 500
    error = "Internal error"


def answer_failed(what: str, exc: BaseException) -> AnswerFailed:
    """Log ``exc`` with its traceback and return the error to answer with."""
    log.error("%s failed; answering 500", what, exc_info=exc)
    return AnswerFailed(f"{what} failed: {type(exc).__name__}: {exc}")


def fail_internal(reply: Reply | FeedbackReply, what: str, exc: BaseException) -> None:
    """The last resort of a callback path: an exception while answering becomes a 500 for
    the request, so that no query is left unanswered (and no pipelined request behind it
    stalls). ``reply.fail`` after a partial ``answer`` is harmless: every reply answers once."""
    try:
        reply.fail(answer_failed(what, exc))
    except Exception:  # nothing is left to answer with; keep the loop alive
        log.exception("failing %s with 500 also failed", what)

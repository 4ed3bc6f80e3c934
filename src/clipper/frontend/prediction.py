"""The typed answer of a query, before any protocol has encoded it.

The query processor produces one :class:`Prediction` per input and hands the list to the
request's :class:`Reply`; each protocol (Clipper REST, V2 REST, V2 gRPC) encodes it once, at
its own edge, and renders a refused query (a :class:`RequestError`) in its own error form.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from clipper.errors import RequestError

__all__ = [
    "AnswerFailed",
    "DefaultReason",
    "FeedbackReply",
    "Prediction",
    "Reply",
    "answer_failed",
    "fail_internal",
]

log = logging.getLogger("clipper.answers")


class DefaultReason(enum.StrEnum):
    """Why the application's default output answered an input (the ``reason`` label of the
    ``defaults`` metric: the values are the label values)."""

    NO_MODEL = "no_model"
    NO_REPLICA = "no_replica"
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


class FeedbackReply(Protocol):
    """Where one feedback request's outcome goes: exactly one of the two is called, once."""

    def received(self) -> None:
        """The label was joined with the models' predictions and learned from."""

    def fail(self, err: RequestError) -> None:
        """The feedback could not be learned from."""


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

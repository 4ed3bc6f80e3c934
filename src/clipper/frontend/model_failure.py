"""A model that raised: an error for the client, or the default output.

Clipper answers the default output (with the reason ``model_error``) when a model raises, and
its REST API keeps doing so. Open Inference Protocol clients (tritonclient, perf_analyzer,
KServe) expect an error instead: a 200 with made-up outputs looked like success to them, so a
benchmark over a failing model reported no errors at all. Each application chooses
(``on_model_error``, :data:`~clipper.choices.ON_MODEL_ERROR`): ``auto`` answers each
protocol's way (V2 REST 500 and gRPC INTERNAL, Clipper REST the default output), ``error`` and
``default`` answer every protocol alike.

A request is answered whole: when any of its inputs got ``model_error``, the whole request is
the error, carrying the model's own message.
"""

from __future__ import annotations

from clipper.errors import RequestError
from clipper.query.prediction import DefaultReason, Prediction
from clipper.registry import Application

__all__ = ["ModelFailed", "model_failure"]


class ModelFailed(RequestError):
    """A model raised on an input of the request; the message is the model's (500)."""

    status = 500
    error = "Model error"


def model_failure(
    app: Application | None, predictions: list[Prediction], *, errors_by_default: bool
) -> ModelFailed | None:
    """The error to answer instead of ``predictions``, or None to answer them.

    ``errors_by_default``: what the protocol does for an application left on ``auto`` (V2:
    True, Clipper REST: False)."""
    if app is None:
        return None
    mode = app.on_model_error
    if mode == "default" or (mode == "auto" and not errors_by_default):
        return None
    for p in predictions:
        if p.reason is DefaultReason.MODEL_ERROR:
            return ModelFailed(p.explanation)
    return None

"""The query runtime: everything between a parsed request and its typed answer.

Below the protocols (which parse at their edge and encode at their edge) and above batching,
selection policies, the cache and the read side (:class:`~clipper.runtime.catalog.Catalog`).

* :mod:`~clipper.query.processor` routes a query by its application's kind
  (:mod:`~clipper.query.kinds`) to a runner: :mod:`~clipper.query.single` (one model, or a
  canary split with :mod:`~clipper.query.traffic`), :mod:`~clipper.query.selection` (a policy
  over several models), :mod:`~clipper.query.pipeline` (stages under one deadline).
* Runners reach the models only through the submit seam (:mod:`~clipper.query.seam`) and count
  their answers through :mod:`~clipper.query.answers`; they never see the processor.
* :mod:`~clipper.query.prediction` holds the records that cross to the protocols.
* :mod:`~clipper.query.runtime` builds it all, in order, for the composition root.
"""

from clipper.query.prediction import (
    NO_MODELS,
    SLO_MISSED,
    DefaultReason,
    FeedbackReply,
    Prediction,
    QueryRejected,
    Reply,
)
from clipper.query.processor import QueryProcessor
from clipper.query.runtime import QueryRuntime, QueryServices, build_query_runtime

__all__ = [
    "NO_MODELS",
    "SLO_MISSED",
    "DefaultReason",
    "FeedbackReply",
    "Prediction",
    "QueryProcessor",
    "QueryRejected",
    "QueryRuntime",
    "QueryServices",
    "Reply",
    "build_query_runtime",
]

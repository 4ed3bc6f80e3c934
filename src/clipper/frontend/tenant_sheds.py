"""An admitted request's shed inputs, counted for its tenant (``clipper_tenant_shed_total``):
the same rule on every query protocol (Clipper REST, V2 REST, V2 gRPC)."""

from __future__ import annotations

from clipper.errors import RequestError
from clipper.query.prediction import DefaultReason, Prediction, QueryRejected
from clipper.tenants import Admitted, TenantGate

__all__ = ["SHED_REASONS", "count_answer", "count_failure"]

# Default reasons that mean a query was shed: refused at admission, or late out of its queue.
SHED_REASONS = frozenset((DefaultReason.OVERLOAD, DefaultReason.SLO))


def count_answer(
    gate: TenantGate | None, admitted: Admitted | None, predictions: list[Prediction]
) -> None:
    """Count the answer's shed inputs (their default outputs) for the request's tenant."""
    if admitted is None or gate is None:
        return
    shed = sum(1 for p in predictions if p.reason in SHED_REASONS)
    if shed:
        gate.shed(admitted, shed)


def count_failure(gate: TenantGate | None, admitted: Admitted | None, err: RequestError) -> None:
    """A 503 instead of defaults (an application that prefers it) is one shed request."""
    if admitted is not None and gate is not None and isinstance(err, QueryRejected):
        gate.shed(admitted, 1)

"""What a manager needs to run replicas that every frontend shares (docs/scale-out.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clipper.store.base import Store

__all__ = ["SharedReplicas"]


@dataclass(frozen=True, slots=True)
class SharedReplicas:
    """Replicas that serve every frontend of the deployment (docs/scale-out.md), and outlive
    the frontend that started them: what a local manager needs to run them so."""

    # Where the owner records the replicas it started, for the next owner to adopt.
    store: Store
    # The live frontends' RPC addresses (this one's included): each replica dials them all.
    frontends: Callable[[], Sequence[str]]
    # Whether a replica that presented this token is connected to this frontend.
    connected: Callable[[str], bool]
    # Tells the replica with this token to drain every link and exit; False if it is not
    # connected here (or the RPC endpoint cannot).
    retire: Callable[[str], bool]
    # An adopted replica that is not connected (or goes silent) this long is started anew.
    grace_s: float

"""The runtime: the write side (:class:`Control`), the reconciler that makes schedulers and
replicas follow the registry (:class:`Reconciler`), and the directory of connected replicas
(:class:`ReplicaDirectory`). The composition root (``clipper.server``) wires them."""

from clipper.runtime.control import Control
from clipper.runtime.reconciler import Reconciler
from clipper.runtime.replicas import ReplicaDirectory

__all__ = ["Control", "Reconciler", "ReplicaDirectory"]

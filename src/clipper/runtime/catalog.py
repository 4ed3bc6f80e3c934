"""The read side: what an application resolves to, and whether it can answer.

The query-side protocols (Clipper REST, V2 REST, V2 gRPC) ask these questions; the answers come
from one place so that ``GET /ready``, ``/v2/health/ready`` and gRPC's ``ServerReady`` apply the
same rule. :class:`QueryServices` is everything a query-side protocol may use — never the
frontend object itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clipper.registry import Application, ModelVersion, Registry

if TYPE_CHECKING:
    from clipper.batching.scheduler import ModelScheduler
    from clipper.frontend.query import QueryProcessor
    from clipper.metrics import Metrics

__all__ = ["Catalog", "QueryServices"]


class Catalog:
    def __init__(
        self, registry: Registry, schedulers: dict[tuple[str, str], ModelScheduler]
    ) -> None:
        self.registry = registry
        self.schedulers = schedulers

    def app(self, name: str) -> Application | None:
        return self.registry.apps.get(name)

    def linked(self, app: str) -> list[str]:
        return self.registry.links.get(app) or []

    def single_model(self, app: Application) -> str | None:
        """The one model a single-model application answers with, else None."""
        linked = self.linked(app.name)
        return linked[0] if len(linked) == 1 else None

    def version(self, model: str, version: str | None = None) -> ModelVersion | None:
        """``version`` of ``model``, or its current version; None when there is none."""
        v = version if version is not None else self.registry.current.get(model)
        return self.registry.models.get(model, {}).get(v) if v is not None else None

    def versions(self, model: str) -> list[str]:
        return sorted(self.registry.models.get(model, {}))

    def live(self, model: str, version: str | None) -> bool:
        """A replica of the version is connected."""
        sched = self.schedulers.get((model, version or ""))
        return sched is not None and bool(sched.replicas)

    def unready(self) -> list[str]:
        """``model:version`` of every linked model whose current version should have replicas
        and has none connected."""
        out = []
        for names in self.registry.links.values():
            for name in names:
                mv = self.version(name)
                if mv is not None and mv.num_replicas and not self.live(name, mv.version):
                    out.append(f"{name}:{mv.version}")
        return out

    def reasons(self) -> list[str]:
        """Why the frontend is not ready, one line per linked model that cannot answer its
        application: its current version has no replica connected (yet), or it has no current
        version at all (deleted with force). Empty when ready: the readiness rule of the whole
        frontend."""
        out = []
        for app, names in sorted(self.registry.links.items()):
            for name in names:
                mv = self.version(name)
                if mv is None:
                    out.append(
                        f"application '{app}': model '{name}' has no current version "
                        "(it answers only default outputs)"
                    )
                elif mv.num_replicas and not self.live(name, mv.version):
                    out.append(
                        f"application '{app}': model '{name}:{mv.version}' has no replica connected"
                    )
        return out

    def ready(self) -> bool:
        return not self.reasons()

    def app_ready(self, app: Application, version: str | None = None) -> bool:
        """A linked model (the requested version of it) has a replica connected."""
        for name in self.linked(app.name):
            v = version if version is not None else self.registry.current.get(name)
            if v is not None and self.live(name, v):
                return True
        return False


@dataclass(frozen=True, slots=True)
class QueryServices:
    """What the query-side protocols use: the read side, the query processor, the metrics."""

    catalog: Catalog
    processor: QueryProcessor
    metrics: Metrics
    queue_capacity: int

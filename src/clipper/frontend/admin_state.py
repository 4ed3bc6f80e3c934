"""Admin routes for operators: the whole served state (for ``clipper export`` and ``clipper
apply``), a model version's artifact, a replica's log from an offset, and a status with replica
states and recent rates. Documented in docs/admin-api.md; the CLI is docs/cli.md.

Reads only. Whatever touches the disk (digests, archives, logs) runs in a thread, bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clipper.artifact_digest import SOURCE_DIGEST_FILE, archive, content_digest, is_digest
from clipper.errors import ConfigError
from clipper.frontend.admin_fields import (
    FIELDS,
    SCHEMAS,
    AdminRoute,
    Field,
    FieldError,
    OperationError,
    Reply,
    int_field,
    json_reply,
    opt_str_field,
    str_field,
)
from clipper.managers.base import ContainerManager
from clipper.metrics_window import MetricsWindow
from clipper.registry import Application, ModelVersion, Registry
from clipper.runtime.artifacts import upload_dir

if TYPE_CHECKING:
    from clipper.batching.scheduler import Replica
    from clipper.clock import Clock
    from clipper.runtime.catalog import Catalog

__all__ = ["StateRoutes"]

GZIP = b"application/gzip"
_VERSION_SCHEMA = '"model_name" := string, "model_version" := string (optional: the serving one)'
# Named in the "Expected JSON schema" of a body off its route's schema (admin_fields.SCHEMAS).
SCHEMAS.update(
    {
        "export_state": "{}",
        "get_status": "{}",
        "get_artifact": "{" + _VERSION_SCHEMA + "}",
        "get_replica_logs": (
            "{" + _VERSION_SCHEMA + ', "replica" := int (optional), "offsets" := '
            '{"<replica>": int} (optional), "max_bytes" := int (optional)}'
        ),
    }
)
LOG_CHUNK_DEFAULT = 64 * 1024
LOG_CHUNK_MAX = 1 << 20
_VERSION_FIELDS = (
    Field("model_name", "string", True),
    Field("model_version", "string", nullable=True, doc="absent or null: the serving one"),
)
# What check_body checks these routes' bodies against, and the OpenAPI document says.
FIELDS.update(
    {
        "export_state": AdminRoute((), "The whole served state (clipper export)", reply="json"),
        "get_status": AdminRoute((), "Replica states and recent rates", reply="json"),
        "get_artifact": AdminRoute(
            _VERSION_FIELDS, "A model version's artifact, as a gzipped tar", reply="gzip"
        ),
        "get_replica_logs": AdminRoute(
            (
                *_VERSION_FIELDS,
                Field("replica", "int", nullable=True, doc="one replica; absent: all"),
                # Checked by the handler (offsets >= 0, with its own message).
                Field(
                    "offsets", "int_map", doc="{replica: offset}: where to read from", check=False
                ),
                Field(
                    "max_bytes", "int", doc=f"at most {LOG_CHUNK_MAX}, default {LOG_CHUNK_DEFAULT}"
                ),
            ),
            "A version's replica logs from an offset",
            reply="json",
        ),
    }
)
# A slot not connected that has exited this often is crash-looping: "failed" (the manager
# keeps restarting it with backoff; runtime/control.py gives up a deploy at the same count).
FAILED_AFTER_RESTARTS = 3


@dataclass(frozen=True, slots=True)
class _Cached:
    stamp: tuple[int, int]
    digest: str


class StateRoutes:
    def __init__(
        self,
        *,
        registry: Registry,
        catalog: Catalog,
        manager: ContainerManager,
        window: MetricsWindow,
        clock: Clock,
        state_dir: Path,
        max_artifact_bytes: int,
        owner: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        # Who runs the replicas (the owner lease, the live frontends): the status's
        # "replica_owner"; None: this frontend runs its own.
        self.owner = owner
        self.registry = registry
        self.catalog = catalog
        self.manager = manager
        self.window = window
        self.clock = clock
        self.state_dir = state_dir
        self.max_artifact_bytes = max_artifact_bytes
        # artifact path -> its digest, while the path is the same file or directory (a
        # version's artifact never changes; a version deleted and deployed again has a new one).
        self._digests: dict[str, _Cached] = {}

    def sync_routes(self) -> dict[str, Callable[[dict[str, Any]], Reply]]:
        return {"get_status": self.get_status}

    def async_routes(
        self,
    ) -> dict[str, Callable[[dict[str, Any]], Coroutine[Any, Any, Reply]]]:
        return {
            "export_state": self.export_state,
            "get_artifact": self.get_artifact,
            "get_replica_logs": self.get_replica_logs,
        }

    # -- export_state --------------------------------------------------------------------------
    async def export_state(self, doc: dict[str, Any]) -> Reply:
        reg = self.registry
        apps = [
            {**app.to_record(), "linked_models": reg.linked_models(app.name)}
            for app in sorted(reg.apps.values(), key=lambda a: a.name)
        ]
        versions = [mv for name in sorted(reg.models) for mv in reg.models[name].values()]
        digests = await asyncio.to_thread(self._version_digests, versions)
        models = []
        for name in sorted(reg.models):
            out = []
            for mv in reg.models[name].values():
                artifact_digest, source_digest = digests[mv.key]
                out.append(
                    {
                        **mv.to_record(),
                        "artifact_sha256": artifact_digest,
                        "source_sha256": source_digest,
                    }
                )
            rollout = reg.rollouts.get(name)
            models.append(
                {
                    "name": name,
                    "current": reg.current.get(name),
                    # The split and shadow (docs/rollouts.md), or null.
                    "rollout": rollout.to_record() if rollout is not None else None,
                    "versions": out,
                }
            )
        # Tenants with their class and quotas; never their keys (secrets shown once).
        tenants = [
            {k: v for k, v in t.describe().items() if k != "keys"}
            for t in sorted(reg.tenants.values(), key=lambda t: t.name)
        ]
        return json_reply({"applications": apps, "models": models, "tenants": tenants})

    def _version_digests(
        self, versions: list[ModelVersion]
    ) -> dict[tuple[str, str], tuple[str | None, str | None]]:
        out: dict[tuple[str, str], tuple[str | None, str | None]] = {}
        live = set()
        for mv in versions:
            if mv.artifact is None:
                out[mv.key] = (None, None)
                continue
            live.add(mv.artifact)
            out[mv.key] = (self._digest(Path(mv.artifact)), self._source_digest(mv))
        for gone in set(self._digests) - live:  # bounded by the versions registered
            del self._digests[gone]
        return out

    def _digest(self, path: Path) -> str | None:
        try:
            st = path.stat()
        except OSError:
            return None  # registered, but not on this machine's disk
        stamp = (st.st_ino, st.st_mtime_ns)
        cached = self._digests.get(str(path))
        if cached is not None and cached.stamp == stamp:
            return cached.digest
        try:
            digest = content_digest(path)
        except (OSError, ConfigError):
            return None
        self._digests[str(path)] = _Cached(stamp, digest)
        return digest

    def _source_digest(self, mv: ModelVersion) -> str | None:
        path = upload_dir(self.state_dir, mv.name, mv.version) / SOURCE_DIGEST_FILE
        try:
            text = path.read_text().strip()
        except OSError:
            return None
        return text if is_digest(text) else None

    # -- get_artifact --------------------------------------------------------------------------
    async def get_artifact(self, doc: dict[str, Any]) -> Reply:
        mv = self._version(doc)
        if mv.artifact is None:
            raise OperationError(
                f"model {mv.name}:{mv.version} has no artifact here: its containers are "
                "started elsewhere"
            )
        try:
            data = await asyncio.to_thread(
                archive, Path(mv.artifact), max_bytes=self.max_artifact_bytes
            )
        except ConfigError as e:
            raise OperationError(f"cannot send the artifact of {mv.name}:{mv.version}: {e}") from e
        except OSError as e:
            raise OperationError(
                f"cannot read the artifact of {mv.name}:{mv.version}: {e}"
            ) from None
        return 200, data, GZIP

    def _version(self, doc: dict[str, Any]) -> ModelVersion:
        name = str_field(doc, "model_name")
        version = opt_str_field(doc, "model_version")
        versions = self.registry.models.get(name)
        if not versions:
            known = ", ".join(sorted(self.registry.models)) or "none"
            raise OperationError(f"no model named '{name}' (models: {known})")
        if version is None:
            version = self.registry.current.get(name)
            if version is None:
                raise OperationError(f"model '{name}' has no current version: name one")
        mv = versions.get(version)
        if mv is None:
            raise OperationError(
                f"model '{name}' has no version '{version}' (versions: {', '.join(versions)})"
            )
        return mv

    # -- get_replica_logs ----------------------------------------------------------------------
    async def get_replica_logs(self, doc: dict[str, Any]) -> Reply:
        mv = self._version(doc)
        replica = doc.get("replica")
        if replica is not None and (isinstance(replica, bool) or not isinstance(replica, int)):
            raise FieldError("Type mismatch! JSON key replica expected type int")
        limit = int_field(doc, "max_bytes", LOG_CHUNK_DEFAULT)
        if not 0 <= limit <= LOG_CHUNK_MAX:
            raise OperationError(f"max_bytes must be between 0 and {LOG_CHUNK_MAX}, got {limit}")
        offsets = doc.get("offsets", {})
        if not isinstance(offsets, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets.values()
        ):
            raise FieldError(
                "Type mismatch! JSON key offsets expected an object of replica -> offset >= 0"
            )
        files = self.manager.log_files(mv.name, mv.version)
        if files is None:
            raise OperationError(
                f"the replicas of {mv.name}:{mv.version} are started outside this frontend "
                "(its container manager keeps no logs): whoever runs them has their logs"
            )
        if replica is not None:
            if replica not in files:
                have = ", ".join(map(str, sorted(files))) or "none yet"
                raise OperationError(
                    f"{mv.name}:{mv.version} has no replica {replica} (its replicas: {have})"
                )
            files = {replica: files[replica]}
        wanted = {slot: (path, offsets.get(str(slot))) for slot, path in sorted(files.items())}
        chunks = await asyncio.to_thread(_read_logs, wanted, limit)
        return json_reply({"model_name": mv.name, "model_version": mv.version, "replicas": chunks})

    # -- get_status ----------------------------------------------------------------------------
    def get_status(self, doc: dict[str, Any]) -> Reply:
        reg = self.registry
        rates = self.window.app_rates()
        idle = _no_traffic()
        apps = [
            {
                "name": app.name,
                "input_type": app.input_type.readable,
                "latency_slo_micros": app.latency_slo_micros,
                "policy": app.policy,
                "linked_models": reg.linked_models(app.name),
                # A pipeline links no model: its stages are what it answers with.
                "stages": _stages(app),
                "ready": not (why := self.catalog.app_reasons(app)),
                "reasons": why,
                **rates.get(app.name, idle),
            }
            for app in sorted(reg.apps.values(), key=lambda a: a.name)
        ]
        errors = self.window.model_error_rates()
        models = []
        for name in sorted(reg.models):
            for mv in reg.models[name].values():
                sched = self.catalog.scheduler(*mv.key)
                health = sched.health.reading() if sched is not None else None
                models.append(
                    {
                        "model_name": mv.name,
                        "model_version": mv.version,
                        "input_type": mv.input_type.readable,
                        "is_current_version": reg.current.get(name) == mv.version,
                        "num_replicas": mv.num_replicas,
                        "connected_replicas": len(sched.replicas) if sched else 0,
                        "queue_depth": len(sched.queue) if sched else 0,
                        "model_errors_per_s": errors.get(mv.key),
                        # Over the last minute, per input (None: none answered or offered).
                        "error_fraction": health.error_fraction if health else None,
                        "default_fraction": health.default_fraction if health else None,
                        "failing": health.failing if health else False,
                        "last_error": health.last_error if health else None,
                        "reason": (
                            health.reason(f"{mv.name}:{mv.version}")
                            if health is not None and health.failing
                            else None
                        ),
                    }
                )
        return json_reply(
            {
                "window_s": self.window.window_s,
                "applications": apps,
                "models": models,
                "replicas": self._replica_states(),
                "replica_owner": self.owner() if self.owner is not None else None,
            }
        )

    def _replica_states(self) -> list[dict[str, Any]]:
        now = self.clock.now()
        connected: dict[str, Replica] = {}
        others: list[Replica] = []
        for _, sched in self.catalog.schedulers():
            for each in sorted(sched.replicas, key=lambda x: x.replica_id):
                if each.address:
                    connected[each.address] = each
                else:
                    others.append(each)
        out: list[dict[str, Any]] = []
        for proc in sorted(self.manager.all_replicas(), key=lambda p: (p.model, p.version, p.slot)):
            r: Replica | None = connected.pop(proc.token, None) if proc.token else None
            if r is not None:
                state = "draining" if (r.draining or proc.state == "stopping") else "ready"
            elif proc.state == "stopping":
                state = "draining"
            elif proc.restarts >= FAILED_AFTER_RESTARTS:
                state = "failed"
            elif proc.state == "queued":
                state = "queued"  # waiting for one of the starts allowed at once
            elif proc.restarts:
                state = "restarting"
            else:
                state = "starting"
            out.append(
                {
                    "model_name": proc.model,
                    "model_version": proc.version,
                    "replica": proc.slot,
                    "state": state,
                    "restarts": proc.restarts,
                    "last_exit": proc.last_exit,
                    "pid": proc.pid,
                    "location": proc.location,
                    "log": _log_name(self.manager, proc.model, proc.version, proc.slot),
                    **_connection(r, now),
                }
            )
        # Connected replicas no manager of ours started (external containers).
        for ext in [*connected.values(), *others]:
            if ext.scheduler is None:
                continue
            mv = ext.scheduler.mv
            out.append(
                {
                    "model_name": mv.name,
                    "model_version": mv.version,
                    "replica": ext.replica_id,
                    "state": "draining" if ext.draining else "ready",
                    "restarts": None,
                    "last_exit": None,
                    "pid": None,
                    "location": "external",
                    "log": None,
                    **_connection(ext, now),
                }
            )
        return out


def _connection(r: Replica | None, now: float) -> dict[str, Any]:
    if r is None:
        return {"connected": False, "in_flight_batches": 0, "seconds_since_heard": None}
    return {
        "connected": True,
        "in_flight_batches": len(r.in_flight),
        "seconds_since_heard": round(max(now - r.last_seen, 0.0), 3),
    }


def _log_name(manager: ContainerManager, model: str, version: str, slot: int) -> str | None:
    path = (manager.log_files(model, version) or {}).get(slot)
    return path.name if path is not None else None


def _stages(app: Application) -> list[dict[str, str | None]] | None:
    """A pipeline's stages (each names a model or an application); None for other apps."""
    if app.stages is None:
        return None
    return [{"name": s.name, "model": s.model, "app": s.app} for s in app.stages.stages.values()]


def _no_traffic() -> dict[str, Any]:
    return {
        "window_s": 0.0,
        "qps": None,
        "defaults_per_s": None,
        "errors_per_s": None,
        "default_fraction": None,
        "error_fraction": None,
        "defaults_by_reason": {},
        "p50_ms": None,
        "p99_ms": None,
    }


def _read_logs(wanted: dict[int, tuple[Path, int | None]], limit: int) -> list[dict[str, Any]]:
    return [
        {"replica": slot, "file": path.name, **_read_log(path, offset, limit)}
        for slot, (path, offset) in wanted.items()
    ]


def _read_log(path: Path, offset: int | None, limit: int) -> dict[str, Any]:
    """From ``offset`` (None: the last ``limit`` bytes), at most ``limit`` bytes. An offset
    past the end means the log rotated (to ``<log>.1``) since: the rest of the rotated file
    comes first, then the new one from its start."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    rotated = b""
    if offset is None:
        start = max(size - limit, 0)
    elif offset > size:
        rotated = _read_range(path.with_name(path.name + ".1"), offset, limit)
        start = 0
    else:
        start = offset
    data = _read_range(path, start, max(limit - len(rotated), 0))
    return {
        "offset": start,
        "next_offset": start + len(data),
        "size": size,
        "rotated": offset is not None and offset > size,
        "text": (rotated + data).decode("utf-8", "replace"),
    }


def _read_range(path: Path, start: int, limit: int) -> bytes:
    if limit <= 0:
        return b""
    try:
        with path.open("rb") as f:
            f.seek(start)
            return f.read(limit)
    except OSError:
        return b""

"""The admin API (port 1338): the original Clipper management routes, and extensions.

Compatibility spec: clipper-original.md section 3. Every route but ``GET /admin/ping`` is a POST
with a JSON body. Successes are plain text or JSON as the original answers them; failures are
HTTP 400 with the message as plain text, and malformed or mistyped JSON answers
``Error parsing JSON: <msg>. Expected JSON schema: <schema>``. The extensions (deploying from an
artifact, uploads, scaling, replica details) are documented in docs/admin-api.md.

Reads are synchronous callbacks. Every change runs as an asyncio task owned by
:class:`AdminApi` (which :meth:`AdminApi.stop` cancels) and answers only once the write side has
committed it to the config store; a store that cannot take it answers 503 naming the store and
the cause, and nothing changed.

The API depends on narrow services, not on the frontend object: the registry to read, the
management operations (:class:`Operations`: each change's pre-checks and artifact placement,
then the write side, :class:`Control`) to change, the container manager for replica processes
and logs. A handler parses the request, calls one operation and encodes its answer.
"""

from __future__ import annotations

import asyncio
import logging
import tarfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson

from clipper.archives import (
    DEFAULT_MAX_UPLOAD_FILES,
    DEFAULT_MAX_UPLOAD_UNPACKED_BYTES,
    ArchiveTooLarge,
    extract_archive,
)
from clipper.artifact_digest import is_digest
from clipper.choices import ON_MODEL_ERROR, OVERLOAD, OnModelError
from clipper.config import BatchingConfig
from clipper.errors import ClipperError, NotFoundError, RegistryError
from clipper.frontend.admin_fields import (
    FIELDS,
    SCHEMAS,
    TEXT,
    FieldError,
    OperationError,
    Reply,
    artifact_field,
    batching_field,
    bool_field,
    check_body,
    check_chars,
    input_type_field,
    int_field,
    json_reply,
    num_replicas_field,
    opt_str_field,
    pipeline_field,
    schema_error,
    str_field,
    str_list_field,
    text_reply,
)
from clipper.frontend.admin_state import StateRoutes
from clipper.frontend.admin_tenants import TenantAdmin
from clipper.frontend.admin_traffic import TrafficAdmin
from clipper.frontend.http import Respond
from clipper.managers.base import ContainerManager
from clipper.metrics import Metrics, histogram_quantile, histogram_values
from clipper.metrics_window import MetricsWindow
from clipper.registry import Application, ModelVersion, Registry, check_name
from clipper.runtime.artifacts import Artifacts
from clipper.runtime.control import LiveVersionError
from clipper.runtime.operations import Operations
from clipper.store.base import StoreError

if TYPE_CHECKING:
    from clipper.batching.scheduler import Replica
    from clipper.clock import Clock
    from clipper.query.traffic import Traffic
    from clipper.runtime.autoscaler import Autoscaler
    from clipper.runtime.catalog import Catalog
    from clipper.runtime.control import Control

__all__ = ["AdminApi"]

log = logging.getLogger("clipper.admin")

_LOG_TAIL_BYTES = 1 << 20

Handler = Callable[[dict[str, Any]], Reply]
AsyncHandler = Callable[[dict[str, Any]], Coroutine[Any, Any, Reply]]


class AdminApi:
    def __init__(
        self,
        *,
        registry: Registry,
        control: Control,
        catalog: Catalog,
        manager: ContainerManager,
        metrics: Metrics,
        clock: Clock,
        state_dir: Path,
        max_upload_unpacked_bytes: int = DEFAULT_MAX_UPLOAD_UNPACKED_BYTES,
        max_upload_files: int = DEFAULT_MAX_UPLOAD_FILES,
        window: MetricsWindow | None = None,
        traffic: Traffic | None = None,
        autoscaler: Autoscaler | None = None,
        operations: Operations | None = None,
        owner: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.autoscaler = autoscaler
        self.max_upload_unpacked_bytes = max_upload_unpacked_bytes
        self.max_upload_files = max_upload_files
        self.registry = registry
        self.control = control
        self.catalog = catalog
        # Each change's pre-checks and artifact placement, then the write side.
        self.operations = operations or Operations(control, Artifacts(state_dir))
        self.manager = manager
        self.metrics = metrics
        self.clock = clock
        self.state_dir = state_dir
        self._tasks: set[asyncio.Task[None]] = set()
        self._sync: dict[str, Handler] = {
            "get_all_applications": self._get_all_applications,
            "get_application": self._get_application,
            "get_linked_models": self._get_linked_models,
            "get_all_models": self._get_all_models,
            "get_model": self._get_model,
            "get_all_containers": self._get_all_containers,
            "get_container": self._get_container,
            "get_state": self._get_state,
            "stage_model": self._stage_model,
            "get_replicas": self._get_replicas,
            "get_logs": self._get_logs,
        }
        self._async: dict[str, AsyncHandler] = {
            "add_app": self._add_app,
            "delete_app": self._delete_app,
            "update_app": self._update_app,
            "add_model_links": self._add_model_links,
            "delete_model_links": self._delete_model_links,
            "add_model": self._add_model,
            "delete_versioned_model": self._delete_versioned_model,
            "deploy_model": self._deploy_model,
            "set_num_replicas": self._set_num_replicas,
            "set_autoscale": self._set_autoscale,
            "set_model_version": self._set_model_version,
        }
        # Operators' reads: the whole state, artifacts, replica logs, status (admin_state.py).
        self.state_routes = StateRoutes(
            registry=registry, catalog=catalog, manager=manager,
            window=window or MetricsWindow(metrics, clock), clock=clock, state_dir=state_dir,
            max_artifact_bytes=max_upload_unpacked_bytes, owner=owner,
        )  # fmt: skip
        self._sync.update(self.state_routes.sync_routes())
        self._async.update(self.state_routes.async_routes())
        # Canary splits and shadows (docs/rollouts.md).
        rollouts = TrafficAdmin(registry, self.operations, traffic)
        self._sync.update(rollouts.reads)
        self._async.update(rollouts.writes)
        # Tenants, their quotas and API keys (docs/tenants.md).
        tenants = TenantAdmin(registry, control)
        self._sync.update(tenants.reads)
        self._async.update(tenants.writes)
        # Every body is checked against its route's fields (admin_fields.FIELDS), which the
        # OpenAPI document is written from: a route without them is a programming error.
        undocumented = sorted(set(self.route_names()) - set(FIELDS))
        if undocumented:
            raise TypeError(f"admin routes without fields in admin_fields.FIELDS: {undocumented}")

    def route_names(self) -> list[str]:
        """Every route under /admin/ (ping and upload_model, then the JSON routes)."""
        return ["ping", "upload_model", *self._sync, *self._async]

    # -- dispatch ------------------------------------------------------------------------------
    def route(
        self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes, respond: Respond
    ) -> None:
        path, _, query = path.partition("?")
        if not query:
            query = headers.get(b":query", b"").decode("utf-8", "replace")
        path = path.rstrip("/")
        if not path.startswith("/admin/"):
            raise NotFoundError(f"no admin route for {method.decode()} {path}")
        name = path[len("/admin/") :]
        if name == "ping":
            if method != b"GET":
                respond(405, b"use GET /admin/ping", TEXT)
                return
            respond(200, b"PONG", TEXT)
            return
        if name == "upload_model":
            if method != b"POST":
                respond(405, b"use POST /admin/upload_model", TEXT)
                return
            self._spawn(self._upload_model(query, headers, body), respond)
            return
        sync = self._sync.get(name)
        run_async = self._async.get(name)
        if sync is None and run_async is None:
            raise NotFoundError(
                f"no admin route for {method.decode()} {path}; see docs/admin-api.md"
            )
        if method != b"POST":
            respond(405, f"use POST {path} with a JSON body".encode(), TEXT)
            return
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            error_reply(respond, name, FieldError(str(e)))
            return
        if not isinstance(doc, dict):
            error_reply(respond, name, FieldError("the body must be a JSON object"))
            return
        try:
            check_body(name, doc)
        except FieldError as e:
            error_reply(respond, name, e)
            return
        if run_async is not None:
            self._spawn(run_async(doc), respond, name)
            return
        assert sync is not None
        try:
            status, data, ctype = sync(doc)
        except Exception as e:  # rendered; logged when unexpected
            error_reply(respond, name, e)
        else:
            respond(status, data, ctype)

    def _spawn(
        self, work: Coroutine[Any, Any, Reply], respond: Respond, name: str = "upload_model"
    ) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(work, respond, name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, work: Coroutine[Any, Any, Reply], respond: Respond, name: str) -> None:
        try:
            status, data, ctype = await work
        except asyncio.CancelledError as e:
            error_reply(respond, name, e)
            raise
        except Exception as e:  # rendered; logged when unexpected
            error_reply(respond, name, e)
        else:
            respond(status, data, ctype)

    async def stop(self) -> None:
        """Cancel the operations still running (deploys waiting for replicas, scaling) and wait
        for them to undo what they started. Call before the manager stops its processes."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.operations.clear_staged()

    # -- applications --------------------------------------------------------------------------
    async def _add_app(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "name")
        itype = input_type_field(str_field(doc, "input_type"))
        default_output = str_field(doc, "default_output")
        slo = int_field(doc, "latency_slo_micros")
        cache = bool_field(doc, "cache", True)
        overload = str_field(doc, "overload", "default")
        if overload not in OVERLOAD:
            raise OperationError(OVERLOAD.unknown(overload))
        app = Application(
            name=name,
            input_type=itype,
            default_output=default_output,
            latency_slo_micros=slo,
            cache=cache,
            require_key=bool_field(doc, "require_key", False),
            overload="reject" if overload == "reject" else "default",
            on_model_error=_on_model_error(doc, "auto"),
            **_selection_fields(doc),
            **pipeline_field(doc),
        )
        await self.control.add_app(app)
        return text_reply(f"Successfully added application with name '{name}'")

    async def _delete_app(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "name")
        # The registry drops the app's links and learned states with it; the query API
        # answers 404 from then on.
        await self.control.delete_app(name)
        return text_reply(f"Successfully deleted application with name '{name}'")

    async def _update_app(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "name")
        changes: dict[str, Any] = {}
        if "latency_slo_micros" in doc:
            changes["latency_slo_micros"] = int_field(doc, "latency_slo_micros")
        if "default_output" in doc:
            changes["default_output"] = str_field(doc, "default_output")
        if "cache" in doc:
            changes["cache"] = bool_field(doc, "cache")
        if "require_key" in doc:
            changes["require_key"] = bool_field(doc, "require_key")
        if "overload" in doc:
            overload = str_field(doc, "overload")
            if overload not in OVERLOAD:
                raise OperationError(OVERLOAD.unknown(overload))
            changes["overload"] = overload
        if "on_model_error" in doc:
            changes["on_model_error"] = _on_model_error(doc)
        changes.update(_selection_fields(doc))
        changes.update(pipeline_field(doc))
        unknown = sorted(set(doc) - {"name", *changes})
        if unknown:
            raise FieldError(f"unknown keys {unknown}")
        await self.control.update_app(name, **changes)
        return text_reply(f"Successfully updated application with name '{name}'")

    def _app_doc(self, app: Application) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "input_type": app.input_type.readable,
            "default_output": app.default_output,
            "latency_slo_micros": app.latency_slo_micros,
            "name": app.name,
            "linked_models": self.registry.linked_models(app.name),
        }
        if app.policy != "single":  # the original's exact document otherwise
            record = app.to_record()
            for key in ("policy", "policy_params", "min_confidence", "loss", "loss_scale"):
                doc[key] = record[key]
            doc["online_learning"] = app.online_learning
        if app.pipeline is not None:
            doc["pipeline"] = app.pipeline
        if app.on_model_error != "auto":
            doc["on_model_error"] = app.on_model_error
        if app.require_key:
            doc["require_key"] = True
        return doc

    def _get_all_applications(self, doc: dict[str, Any]) -> Reply:
        verbose = bool_field(doc, "verbose", False)
        apps = list(self.registry.apps.values())
        if verbose:
            return json_reply([self._app_doc(a) for a in apps])
        return json_reply([a.name for a in apps])

    def _get_application(self, doc: dict[str, Any]) -> Reply:
        app = self.registry.apps.get(str_field(doc, "name"))
        return json_reply(self._app_doc(app) if app is not None else {})

    def _get_linked_models(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "app_name")
        if name not in self.registry.apps:
            raise OperationError(f"No application with name '{name}' exists.")
        return json_reply(self.registry.linked_models(name))

    def _get_state(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "app_name")
        int_field(doc, "uid", 0)
        app = self.registry.apps.get(name)
        if app is None:
            raise OperationError(f"No application with name '{name}' exists.")
        return text_reply(app.default_output)

    # -- links ---------------------------------------------------------------------------------
    async def _add_model_links(self, doc: dict[str, Any]) -> Reply:
        app = str_field(doc, "app_name")
        names = str_list_field(doc, "model_names")
        await self.operations.link(app, names)
        return text_reply(
            f"Successfully linked model with name '{names[0]}' to application '{app}'"
        )

    async def _delete_model_links(self, doc: dict[str, Any]) -> Reply:
        app = str_field(doc, "app_name")
        names = str_list_field(doc, "model_names")
        await self.operations.unlink(app, names)
        return text_reply("Success!")

    # -- models --------------------------------------------------------------------------------
    async def _add_model(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        itype = input_type_field(str_field(doc, "input_type"))
        labels = str_list_field(doc, "labels", [])
        container_name = str_field(doc, "container_name", "NO_CONTAINER")
        str_field(doc, "model_data_path", "DEPRECATED")
        batch_size = int_field(doc, "batch_size", -1)
        for kind, value in (("model name", name), ("model version", version)):
            check_chars(kind, value)
        for label in labels:
            check_chars("label", label)
        if batch_size <= 0 and batch_size != -1:
            raise OperationError(
                f"Invalid batch size {batch_size}: it must be a positive integer, or -1 to "
                "let Clipper size batches adaptively"
            )
        batching = (
            BatchingConfig(controller="fixed", max_batch_size=batch_size)
            if batch_size > 0
            else None
        )
        # Registered only (its containers dial in), unless a container manager staged it.
        await self.operations.add_model(
            ModelVersion(
                name=name,
                version=version,
                input_type=itype,
                labels=tuple(labels),
                container_name=container_name,
                batching=batching or BatchingConfig(),
                num_replicas=0,
            ),
            batching=batching,
        )
        return text_reply(
            f"Successfully added model with name '{name}' and input type '{itype.readable}'"
        )

    def _model_doc(self, mv: ModelVersion) -> dict[str, Any]:
        doc = {
            "model_name": mv.name,
            "model_version": mv.version,
            "input_type": mv.input_type.readable,
            "labels": list(mv.labels),
            "container_name": mv.container_name,
            "model_data_path": mv.artifact or "DEPRECATED",
            "is_current_version": self.registry.current.get(mv.name) == mv.version,
        }
        if mv.autoscale is not None and self.autoscaler is not None:  # docs/autoscaling.md
            doc["autoscale"] = self.autoscaler.view(mv)
        if mv.pooled:  # docs/density.md; absent otherwise (the original's bodies unchanged)
            doc["pooled"] = True
            pool = getattr(self.manager, "pool_view", None)
            if callable(pool):
                doc["pool"] = pool(mv.name, mv.version)
        return doc

    def _versions(self) -> list[ModelVersion]:
        return [mv for vs in self.registry.models.values() for mv in vs.values()]

    def _get_all_models(self, doc: dict[str, Any]) -> Reply:
        verbose = bool_field(doc, "verbose", False)
        if verbose:
            return json_reply([self._model_doc(mv) for mv in self._versions()])
        return json_reply([f"{mv.name}:{mv.version}" for mv in self._versions()])

    def _get_model(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        mv = self.registry.models.get(name, {}).get(version)
        return json_reply(self._model_doc(mv) if mv is not None else {})

    async def _set_model_version(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        # The target's replicas start first (when it has an artifact), traffic switches once
        # they are connected, then the previous version drains and stops.
        await self.operations.set_version(name, version)
        return text_reply(f"Successfully set model with name '{name}' to version '{version}'")

    async def _delete_versioned_model(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        # Absent, as the original clipper_admin sends it: the original's behaviour (delete).
        # Our client and CLI always say, so the version an application is served by goes only
        # with force there (409 otherwise).
        force = bool_field(doc, "force", True)
        # The version is removed; its processes drain what they hold and stop.
        await self.operations.delete_version(name, version, force=force)
        return text_reply(f"Successfully deleted model with name '{name}' and version '{version}'")

    # -- deployment (extensions) ---------------------------------------------------------------
    async def _deploy_model(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        itype = input_type_field(str_field(doc, "input_type"))
        artifact = artifact_field(str_field(doc, "artifact_path"))
        n = num_replicas_field(doc, 1)
        batching = batching_field(doc)
        labels = str_list_field(doc, "labels", [])
        mv = ModelVersion(
            name=name,
            version=version,
            input_type=itype,
            labels=tuple(labels),
            artifact=artifact,
            batching=batching or BatchingConfig(),
            num_replicas=n,
            pooled=bool_field(doc, "pooled", False),
        )
        # A no-op when exactly this is deployed already; "already exists" when another is.
        await self.operations.deploy(mv)
        return _deployed(mv)

    async def _upload_model(self, query: str, headers: dict[bytes, bytes], body: bytes) -> Reply:
        params = dict(parse_qsl(query))

        def param(key: str, default: str | None = None) -> str:
            value = params.get(key)
            if value is None:
                header = headers.get(f"x-clipper-{key.replace('_', '-')}".encode())
                value = header.decode("utf-8", "replace") if header is not None else default
            if value is None:
                raise OperationError(
                    f"missing parameter {key}. Expected: {SCHEMAS['upload_model']} "
                    "(or the headers X-Clipper-Name, X-Clipper-Version, X-Clipper-Input-Type, "
                    "X-Clipper-Num-Replicas)"
                )
            return value

        name, version = param("name"), param("version")
        itype = input_type_field(param("input_type"))
        try:
            n = int(param("num_replicas", "1"))
        except ValueError:
            raise OperationError("num_replicas must be an integer") from None
        if n < 0:
            raise OperationError(f"num_replicas must be >= 0, got {n}")
        if not body:
            raise OperationError(
                "the request body must be the model: a cloudpickle file or a gzipped tar of "
                "an artifact directory"
            )
        batching = None
        if "batching" in params:
            try:
                spec = orjson.loads(params["batching"])
            except orjson.JSONDecodeError as e:
                raise OperationError(f"batching must be a JSON object: {e}") from None
            if not isinstance(spec, dict):
                raise OperationError("batching must be a JSON object")
            batching = batching_field({"batching": spec})
        try:
            check_name("model", name)
            check_name("version", version)
        except RegistryError as e:
            raise OperationError(str(e)) from None
        source = params.get("source_sha256")
        if source is not None and not is_digest(source):
            raise OperationError("source_sha256 must be a SHA-256 in lowercase hex")
        labels: list[str] = []
        if "labels" in params:  # a JSON list of strings, as deploy_model's labels
            try:
                labels = orjson.loads(params["labels"])
            except orjson.JSONDecodeError as e:
                raise OperationError(f"labels must be a JSON list of strings: {e}") from None
            if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
                raise OperationError('labels must be a JSON list of strings, e.g. ["a", "b"]')
            for label in labels:
                check_chars("label", label)
        pooled = params.get("pooled", "false")
        if pooled not in ("true", "false"):
            raise OperationError(f"pooled must be true or false, got {pooled!r}")
        mv = ModelVersion(
            name=name,
            version=version,
            input_type=itype,
            labels=tuple(labels),
            batching=batching or BatchingConfig(),
            num_replicas=n,
            pooled=pooled == "true",
        )
        # Placed in the state directory, then deployed; the same upload again is a no-op.
        await self.operations.deploy_upload(mv, body, unpack=self._unpack, source_sha256=source)
        return _deployed(mv)

    def _unpack(self, dest: Path, body: bytes) -> None:
        try:
            extract_archive(
                dest, body, max_bytes=self.max_upload_unpacked_bytes,
                max_files=self.max_upload_files,
            )  # fmt: skip
        except (tarfile.TarError, OSError, ArchiveTooLarge) as e:
            raise OperationError(f"the uploaded archive cannot be unpacked: {e}") from None

    def _stage_model(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        itype = input_type_field(str_field(doc, "input_type"))
        artifact = artifact_field(str_field(doc, "artifact_path"))
        n = num_replicas_field(doc, 1)
        batching = batching_field(doc)
        self.operations.stage(
            name, version, input_type=itype, artifact=artifact, num_replicas=n, batching=batching
        )
        return text_reply(
            f"Successfully staged model with name '{name}' and version '{version}': "
            f"add_model will start {n} replicas of {artifact}"
        )

    async def _set_num_replicas(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = opt_str_field(doc, "model_version")
        n = num_replicas_field(doc)
        artifact = opt_str_field(doc, "artifact_path")
        mv = await self.operations.run_replicas(name, n, version, artifact=artifact)
        return text_reply(
            f"Successfully set the number of replicas of model with name '{name}' and version "
            f"'{mv.version}' to {n}"
        )

    async def _set_autoscale(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = opt_str_field(doc, "model_version")
        settings = {k: v for k, v in doc.items() if k not in ("model_name", "model_version")}
        mv = await self.operations.set_autoscale(name, version, settings)
        return json_reply(self._model_doc(mv))

    # -- containers and replicas ---------------------------------------------------------------
    def _replicas(self, name: str | None = None, version: str | None = None) -> list[Replica]:
        out: list[Replica] = []
        for (n, v), sched in self.catalog.schedulers():
            if (name is None or n == name) and (version is None or v == version):
                out.extend(sorted(sched.replicas, key=lambda r: r.replica_id))
        return out

    @staticmethod
    def _container_doc(r: Replica) -> dict[str, Any]:
        assert r.scheduler is not None
        mv = r.scheduler.mv
        return {
            "model_id": f"{mv.name}:{mv.version}",
            "model_name": mv.name,
            "model_version": mv.version,
            "model_replica_id": r.replica_id,
            "input_type": mv.input_type.readable,
        }

    def _get_all_containers(self, doc: dict[str, Any]) -> Reply:
        verbose = bool_field(doc, "verbose", False)
        replicas = [r for r in self._replicas() if r.scheduler is not None]
        if verbose:
            return json_reply([self._container_doc(r) for r in replicas])
        return json_reply(
            [f"{d['model_id']}:{d['model_replica_id']}" for d in map(self._container_doc, replicas)]
        )

    def _get_container(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "model_name")
        version = str_field(doc, "model_version")
        replica_id = int_field(doc, "replica_id")
        for r in self._replicas(name, version):
            if r.replica_id == replica_id and r.scheduler is not None:
                return json_reply(self._container_doc(r))
        return json_reply({})

    def _get_replicas(self, doc: dict[str, Any]) -> Reply:
        name = opt_str_field(doc, "model_name")
        version = opt_str_field(doc, "model_version")
        p50 = self._latency_p50s()
        now = self.clock.now()
        out = []
        for r in self._replicas(name, version):
            sched = r.scheduler
            if sched is None:
                continue
            mv = sched.mv
            procs = self.manager.replicas(mv.name, mv.version) if r.address else []
            proc = next((p for p in procs if p.token == r.address), None)
            median = p50.get((mv.name, mv.version, str(r.replica_id)))
            out.append(
                {
                    "model_name": mv.name,
                    "model_version": mv.version,
                    "replica_id": r.replica_id,
                    "framing": "fast" if r.fast else "v3",
                    "in_flight_batches": len(r.in_flight),
                    "seconds_since_heard": round(max(now - r.last_seen, 0.0), 3),
                    "batch_latency_p50_ms": None if median is None else round(median * 1e3, 3),
                    "max_batch_size": r.controller.max_batch_size() if r.controller else None,
                    "draining": r.draining,
                    "pid": proc.pid if proc is not None else None,
                    "restarts": proc.restarts if proc is not None else None,
                    "state": proc.state if proc is not None else "connected",
                    "location": proc.location if proc is not None else None,
                    # The process slot: the replica's log is <model>-<version>-<slot>.log
                    # (replica_id counts connections, so it moves on at every restart).
                    "slot": proc.slot if proc is not None else None,
                    "log": _log_name(proc),
                }
            )
        if bool_field(doc, "unconnected", False):
            out.extend(self._unconnected_slots(name, version, {d["pid"] for d in out}))
        return json_reply(out)

    def _unconnected_slots(
        self, name: str | None, version: str | None, listed_pids: set[Any]
    ) -> list[dict[str, Any]]:
        """The manager's slots with no connected replica (starting, restarting, placed
        nowhere yet): ``replica_id`` null, their state, location and restarts."""
        connected = {r.address for r in self._replicas(name, version) if r.address}
        return [
            {"model_name": p.model, "model_version": p.version, "replica_id": None,
             "framing": None, "in_flight_batches": 0, "seconds_since_heard": None,
             "batch_latency_p50_ms": None, "max_batch_size": None, "draining": False,
             "pid": p.pid, "restarts": p.restarts, "state": p.state, "location": p.location}
            for p in self.manager.all_replicas()
            if (name is None or p.model == name) and (version is None or p.version == version)
            and p.token not in connected and (p.pid is None or p.pid not in listed_pids)
        ]  # fmt: skip

    def _latency_p50s(self) -> dict[tuple[str, str, str], float]:
        """Per replica, the median batch round trip from its latency histogram."""
        out = {}
        for (model, version, replica), h in histogram_values(self.metrics.replica_latency).items():
            median = histogram_quantile(0.5, h.buckets)
            if median is not None:
                out[(model, version, replica)] = median
        return out

    def _get_logs(self, doc: dict[str, Any]) -> Reply:
        limit = int_field(doc, "max_bytes", _LOG_TAIL_BYTES)
        if limit < 0:
            raise OperationError(f"max_bytes must be >= 0, got {limit}")
        return json_reply([{"file": name, "text": text} for name, text in self.manager.logs(limit)])


def error_reply(respond: Respond, route: str, err: BaseException) -> None:
    """The admin API's error answer: every admin failure is rendered here, as plain text like
    the original's. A body off the route's schema gets the original's schema message."""
    if isinstance(err, FieldError):
        respond(400, schema_error(route, str(err)), TEXT)
    elif isinstance(err, StoreError):
        # Nothing was changed: the registry moves only after the store took the change.
        respond(503, f"the change was not made: the config store failed: {err}".encode(), TEXT)
    elif isinstance(err, asyncio.CancelledError):
        respond(503, b"the frontend is shutting down", TEXT)
    elif isinstance(err, LiveVersionError):
        respond(409, str(err).encode(), TEXT)
    elif isinstance(err, OperationError | ClipperError):
        respond(400, str(err).encode(), TEXT)
    else:
        log.error("unexpected error in admin operation %s", route, exc_info=err)
        respond(500, b"An unexpected error occurred!", TEXT)


def _log_name(proc: Any) -> str | None:
    """The file name of a local replica's log (in <state dir>/logs), else None."""
    path = getattr(proc, "log_path", None)
    return path.name if isinstance(path, Path) else None


def _on_model_error(doc: dict[str, Any], default: str | None = None) -> OnModelError:
    value = str_field(doc, "on_model_error", default)
    if value not in ON_MODEL_ERROR:
        raise OperationError(ON_MODEL_ERROR.unknown(value))
    return value  # type: ignore[return-value]  # one of the Literal's names, checked above


def _selection_fields(doc: dict[str, Any]) -> dict[str, Any]:
    """The optional selection-layer settings of an application (docs/selection.md)."""
    out: dict[str, Any] = {}
    if "policy" in doc:
        out["policy"] = str_field(doc, "policy")
    if "policy_params" in doc:
        params = doc["policy_params"]
        if not isinstance(params, dict):
            raise FieldError("Type mismatch! JSON key policy_params expected type object")
        out["policy_params"] = params
    if "min_confidence" in doc:
        value = doc["min_confidence"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FieldError("Type mismatch! JSON key min_confidence expected type number")
        out["min_confidence"] = float(value)
    if "loss" in doc:
        out["loss"] = str_field(doc, "loss")
    if "loss_scale" in doc:
        value = doc["loss_scale"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FieldError("Type mismatch! JSON key loss_scale expected type number")
        out["loss_scale"] = float(value)
    if "online_learning" in doc:
        out["online_learning"] = bool_field(doc, "online_learning")
    return out


def _deployed(mv: ModelVersion) -> Reply:
    return json_reply(
        {"model_name": mv.name, "model_version": mv.version, "num_replicas": mv.num_replicas}
    )

"""Keeps the registry and the config store in step.

Local changes (the admin API, the Python API) are written through to the store in order by one
owned writer task; changes that other frontends wrote to a shared store arrive as store events
and are applied to the registry without being written back. On start, the store's snapshot
becomes the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from clipper.errors import ClipperError
from clipper.registry import Application, Change, ModelVersion, Registry
from clipper.store.base import Store, StoreEvent

__all__ = ["StoreSync"]

log = logging.getLogger("clipper.store")

_QUEUE_LIMIT = 100_000
_Op = tuple[str, str, str, Any]  # ("put" | "delete", kind, key, value)


class StoreSync:
    def __init__(
        self,
        registry: Registry,
        store: Store,
        *,
        on_remote: Callable[[Change], None] | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.on_remote = on_remote
        self._queue: asyncio.Queue[_Op] = asyncio.Queue(_QUEUE_LIMIT)
        self._writer: asyncio.Task[None] | None = None
        self._applying = False

    async def start(self) -> None:
        """Load the store into the (empty) registry, then follow both directions."""
        snapshot = await self.store.load()
        self._applying = True
        try:
            r = self.registry
            for record in snapshot["app"].values():
                self._guard(lambda: r.add_app(Application.from_record(record)))  # noqa: B023
            for record in snapshot["model"].values():
                self._guard(lambda: r.add_model(ModelVersion.from_record(record)))  # noqa: B023
            for name, version in snapshot["current"].items():
                self._guard(lambda: r.set_model_version(name, version))  # noqa: B023
            for app, models in snapshot["links"].items():
                for model in models:
                    self._guard(lambda: r.link(app, model))  # noqa: B023
        finally:
            self._applying = False
        self.registry.subscribe(self._on_change)
        self.store.watch(self._on_event)
        self._writer = asyncio.create_task(self._write(), name="clipper-store-writer")

    async def stop(self) -> None:
        """Write what is queued, then stop the writer."""
        if self._writer is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), 10.0)
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        self._writer = None

    def _guard(self, action: Callable[[], None]) -> None:
        """Apply one record; a bad one is logged and skipped, never fatal (the lambdas are
        called at once, so their loop variables are the current ones)."""
        try:
            action()
        except (ClipperError, KeyError, TypeError, ValueError) as e:
            log.warning("store record not applied: %s", e)

    # local change -> store
    def _on_change(self, change: Change) -> None:
        if self._applying:
            return  # it came from the store
        r = self.registry
        ops: list[_Op] = []
        if change.kind == "app":
            if change.op == "delete":
                ops += [
                    ("delete", "app", change.name, None),
                    ("delete", "links", change.name, None),
                ]
            else:
                ops.append(("put", "app", change.name, r.apps[change.name].to_record()))
                ops.append(("put", "links", change.name, r.linked_models(change.name)))
        elif change.kind in ("model", "replicas"):
            assert change.version is not None
            key = f"{change.name}:{change.version}"
            if change.op == "delete":
                ops.append(("delete", "model", key, None))
                if change.name not in r.current:
                    ops.append(("delete", "current", change.name, None))
            else:
                mv = r.models[change.name][change.version]
                ops.append(("put", "model", key, mv.to_record()))
        elif change.kind == "version":
            ops.append(("put", "current", change.name, r.current[change.name]))
        elif change.kind == "link":
            ops.append(("put", "links", change.name, r.linked_models(change.name)))
        for op in ops:
            try:
                self._queue.put_nowait(op)
            except asyncio.QueueFull:
                log.warning("the store writer is %d changes behind; dropping %s", _QUEUE_LIMIT, op)

    def write(self, kind: str, key: str, value: Any) -> None:
        """Queue a write that is not a registry change (selection-policy state)."""
        try:
            self._queue.put_nowait(("put", kind, key, value))
        except asyncio.QueueFull:
            log.warning(
                "the store writer is %d changes behind; dropping %s/%s", _QUEUE_LIMIT, kind, key
            )

    async def _write(self) -> None:
        while True:
            verb, kind, key, value = await self._queue.get()
            try:
                if verb == "put":
                    await self.store.put(kind, key, value)  # type: ignore[arg-type]
                else:
                    await self.store.delete(kind, key)  # type: ignore[arg-type]
            except Exception:
                log.exception("writing %s %s/%s to the store failed", verb, kind, key)
            finally:
                self._queue.task_done()

    # store event (another frontend) -> registry
    def _on_event(self, event: StoreEvent) -> None:
        seen: list[Change] = []
        self.registry.subscribe(seen.append)
        self._applying = True
        try:
            self._guard(lambda: self._apply(event))
        finally:
            self._applying = False
            self.registry.unsubscribe(seen.append)
        if self.on_remote is not None:
            for change in seen:
                self.on_remote(change)

    def _apply(self, event: StoreEvent) -> None:
        r, kind, key, value = self.registry, event.kind, event.key, event.value
        if kind == "app":
            if value is None:
                if key in r.apps:
                    r.delete_app(key)
                return
            app = Application.from_record(value)
            if key in r.apps:
                fields = app.to_record()
                del fields["name"], fields["input_type"]
                if r.apps[key].to_record() != app.to_record():
                    r.update_app(key, **fields)
            else:
                r.add_app(app)
        elif kind == "model":
            name, _, version = key.partition(":")
            exists = version in r.models.get(name, {})
            if value is None:
                if exists:
                    r.delete_model_version(name, version)
                return
            mv = ModelVersion.from_record(value)
            if not exists:
                r.add_model(mv)
            elif r.models[name][version].to_record() != mv.to_record():
                r.replace_model(mv)
        elif kind == "current":
            if value is None:
                r.current.pop(key, None)
            elif r.current.get(key) != value:
                r.set_model_version(key, value)
        elif kind == "links":
            wanted = list(value or [])
            for model in r.linked_models(key):
                if model not in wanted:
                    r.unlink(key, model)
            for model in wanted:
                if model not in r.linked_models(key):
                    r.link(key, model)

"""Admin routes of canary splits and shadows (docs/rollouts.md): ``set_traffic_split``,
``set_shadow`` and ``get_traffic``. The changes go through the write side
(:meth:`Operations.set_split`, :meth:`Operations.set_shadow`); a refused one is a 400 naming the
problem, and nothing changed."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from clipper.frontend.admin_fields import (
    FieldError,
    Reply,
    bool_field,
    json_reply,
    str_field,
)
from clipper.registry import Registry

if TYPE_CHECKING:
    from clipper.query.traffic import Traffic
    from clipper.runtime.operations import Operations

__all__ = ["TrafficAdmin"]

Handler = Callable[[dict[str, Any]], Reply]
AsyncHandler = Callable[[dict[str, Any]], Coroutine[Any, Any, Reply]]


class TrafficAdmin:
    def __init__(self, registry: Registry, operations: Operations, traffic: Traffic | None) -> None:
        self.registry = registry
        self.operations = operations
        self.traffic = traffic

    @property
    def reads(self) -> dict[str, Handler]:
        return {"get_traffic": self._get_traffic}

    @property
    def writes(self) -> dict[str, AsyncHandler]:
        return {"set_traffic_split": self._set_split, "set_shadow": self._set_shadow}

    def _model(self, doc: dict[str, Any]) -> str:
        # Checked before the rest of the body is read (a missing model is what it answers).
        return self.operations.require_model(str_field(doc, "model_name"))

    async def _set_split(self, doc: dict[str, Any]) -> Reply:
        _known(doc, "model_name", "split", "sticky")
        name = self._model(doc)
        weights = _nullable(doc, "split", dict, "object")
        sticky = bool_field(doc, "sticky", False)
        await self.operations.set_split(name, weights, sticky=sticky)
        return self._view(name)

    async def _set_shadow(self, doc: dict[str, Any]) -> Reply:
        _known(doc, "model_name", "version", "share")
        name = self._model(doc)
        version = _nullable(doc, "version", str, "string")
        share = doc.get("share", 1.0)
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise FieldError("Type mismatch! JSON key share expected type number")
        await self.operations.set_shadow(name, version, float(share))
        return self._view(name)

    def _get_traffic(self, doc: dict[str, Any]) -> Reply:
        _known(doc, "model_name")
        return self._view(self._model(doc))

    def _view(self, name: str) -> Reply:
        if self.traffic is not None:
            return json_reply(self.traffic.describe(name))
        rollout = self.registry.rollouts.get(name)
        return json_reply(rollout.to_record() if rollout is not None else {"name": name})


def _known(doc: dict[str, Any], *keys: str) -> None:
    unknown = sorted(set(doc) - set(keys))
    if unknown:
        raise FieldError(f"unknown keys {unknown}")


def _nullable(doc: dict[str, Any], key: str, kind: type, kind_name: str) -> Any:
    """A required key whose value is ``kind`` or null."""
    if key not in doc:
        raise FieldError(f"JSON object does not have required key: {key}")
    value = doc[key]
    if value is not None and not isinstance(value, kind):
        raise FieldError(f"Type mismatch! JSON key {key} expected type {kind_name} or null")
    return value

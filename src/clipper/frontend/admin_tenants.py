"""Admin routes of tenants and their API keys (docs/tenants.md): ``add_tenant``,
``update_tenant``, ``delete_tenant``, ``get_tenants``, ``create_key`` and ``delete_key``.

Changes go through the write side (:meth:`Control.change_tenant`): committed to the config store
before they are answered, so every frontend of the deployment knows the same keys. A key is
answered once, by ``create_key``; what is stored and listed is its SHA-256 and an id."""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from clipper.errors import RegistryError
from clipper.frontend.admin_fields import Reply, json_reply, str_field, text_reply
from clipper.registry import Registry
from clipper.tenants import ApiKey, PriorityClass, Tenant, new_key, quotas_from_doc

if TYPE_CHECKING:
    from clipper.runtime.control import Control

__all__ = ["TenantAdmin"]

Handler = Callable[[dict[str, Any]], Reply]
AsyncHandler = Callable[[dict[str, Any]], Coroutine[Any, Any, Reply]]


def _priority(doc: Mapping[str, Any], default: PriorityClass | None) -> PriorityClass | None:
    if "priority" not in doc:
        return default
    return PriorityClass.parse(str_field(dict(doc), "priority"))


class TenantAdmin:
    def __init__(self, registry: Registry, control: Control) -> None:
        self.registry = registry
        self.control = control

    @property
    def reads(self) -> dict[str, Handler]:
        return {"get_tenants": self._get_tenants}

    @property
    def writes(self) -> dict[str, AsyncHandler]:
        return {
            "add_tenant": self._add_tenant,
            "update_tenant": self._update_tenant,
            "delete_tenant": self._delete_tenant,
            "create_key": self._create_key,
            "delete_key": self._delete_key,
        }

    async def _add_tenant(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "name")
        priority = _priority(doc, PriorityClass.STANDARD)
        assert priority is not None
        quotas = quotas_from_doc(doc.get("quotas", {}))

        def add(old: Tenant | None) -> Tenant:
            if old is not None:
                raise RegistryError(f"tenant '{name}' already exists")
            return Tenant(name, priority, quotas)

        tenant = await self.control.change_tenant(name, add)
        assert tenant is not None
        return json_reply(tenant.describe())

    async def _update_tenant(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "name")
        priority = _priority(doc, None)
        quotas = quotas_from_doc(doc["quotas"]) if "quotas" in doc else None

        def update(old: Tenant | None) -> Tenant:
            if old is None:
                raise RegistryError(f"Tenant '{name}' does not exist")
            return replace(
                old,
                priority=old.priority if priority is None else priority,
                quotas=old.quotas if quotas is None else quotas,
            )

        tenant = await self.control.change_tenant(name, update)
        assert tenant is not None
        return json_reply(tenant.describe())

    async def _delete_tenant(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "name")

        def delete(old: Tenant | None) -> None:
            if old is None:
                raise RegistryError(f"Tenant '{name}' does not exist")

        await self.control.change_tenant(name, delete)
        return text_reply(f"Successfully deleted tenant '{name}' and its keys")

    def _get_tenants(self, doc: dict[str, Any]) -> Reply:
        if "name" in doc:
            return json_reply(self.registry.get_tenant(str_field(doc, "name")).describe())
        return json_reply([t.describe() for t in self.registry.tenants.values()])

    async def _create_key(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "tenant")
        priority = _priority(doc, None)
        key, digest = new_key()
        stored = ApiKey(digest, priority, round(time.time(), 3))

        def add(old: Tenant | None) -> Tenant:
            if old is None:
                raise RegistryError(f"Tenant '{name}' does not exist")
            if priority is not None and priority < old.priority:
                raise RegistryError(
                    f"a key of tenant '{name}' ({old.priority.label}) cannot be "
                    f"{priority.label}: a key may lower its tenant's class, never raise it"
                )
            return replace(old, keys=(*old.keys, stored))

        await self.control.change_tenant(name, add)
        return json_reply(
            {
                "tenant": name,
                "key_id": stored.key_id,
                "key": key,
                "priority": None if priority is None else priority.label,
                "note": "the key is shown only now: the deployment keeps its SHA-256",
            }
        )

    async def _delete_key(self, doc: dict[str, Any]) -> Reply:
        name = str_field(doc, "tenant")
        key_id = str_field(doc, "key_id")

        def drop(old: Tenant | None) -> Tenant:
            if old is None:
                raise RegistryError(f"Tenant '{name}' does not exist")
            kept = tuple(k for k in old.keys if k.key_id != key_id)
            if len(kept) == len(old.keys):
                raise RegistryError(f"tenant '{name}' has no key with id '{key_id}'")
            return replace(old, keys=kept)

        await self.control.change_tenant(name, drop)
        return text_reply(f"Successfully revoked key '{key_id}' of tenant '{name}'")

"""The management operations both front doors call: each one's pre-checks, the placement of
its artifact, then the write side (:class:`Control`) that commits it.

The embedded API (``clipper.server.Clipper``) and the admin API (``clipper.frontend.admin``)
only build the arguments, call one method here and return or encode its answer, so a rule (a
refusal and its message, how partial autoscale settings combine, where an upload goes) is
written once. Refusals are :class:`RegistryError` with the admin API's wording (answered 400
there); nothing is written before they are made.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from clipper.config import BatchingConfig
from clipper.errors import RegistryError
from clipper.inputs import InputType
from clipper.registry import ModelVersion, Registry, check_name
from clipper.rollout import Rollout, with_shadow, with_split
from clipper.runtime.artifacts import Artifacts, Unpack, resolve_artifact
from clipper.runtime.control import Control
from clipper.scaling import AutoscaleConfig

__all__ = ["Operations", "parse_input_type"]


def parse_input_type(t: str | InputType) -> InputType:
    """An input type from its name or one of its aliases (``"doubles"``, ``"d"``)."""
    if isinstance(t, InputType):
        return t
    try:
        return InputType.parse(t)
    except ValueError as e:
        raise RegistryError(str(e)) from None


@dataclass(frozen=True, slots=True)
class _Staged:
    """A deployment announced by a container manager before its ``add_model`` arrives."""

    input_type: InputType
    artifact: str
    num_replicas: int
    batching: BatchingConfig | None


class Operations:
    def __init__(self, control: Control, artifacts: Artifacts) -> None:
        self.control = control
        self.artifacts = artifacts
        # Deployments a container manager announced before their add_model (stage_model).
        self._staged: dict[tuple[str, str], _Staged] = {}

    @property
    def registry(self) -> Registry:
        return self.control.registry

    # -- pre-checks ------------------------------------------------------------------------------
    def check_new_version(self, name: str, version: str) -> None:
        """Refuse a version that is registered already (before anything is written for it:
        the running version's artifact must stay as it is)."""
        if version in self.registry.models.get(name, {}):
            raise RegistryError(f"model with name '{name}' and version '{version}' already exists")

    def require_model(self, name: str) -> str:
        if name not in self.registry.models:
            raise RegistryError(f"No model with name '{name}' exists.")
        return name

    def _require_app(self, name: str) -> None:
        if name not in self.registry.apps:
            raise RegistryError(f"No app with name '{name}' exists.")

    # -- links -------------------------------------------------------------------------------
    async def link(self, app: str, models: Sequence[str]) -> None:
        """Link one model to ``app`` (the original links one per call)."""
        self._require_app(app)
        if len(models) != 1:
            raise RegistryError(
                "Applications must be linked with at most one model. "
                f"Attempted to link {len(models)} models to application '{app}'."
            )
        await self.control.link(app, models[0])

    async def unlink(self, app: str, models: Sequence[str]) -> None:
        self._require_app(app)
        linked = self.registry.linked_models(app)
        missing = [n for n in models if n not in linked]
        if missing:
            raise RegistryError(f"Model '{missing[0]}' is not linked to '{app}'")
        await self.control.unlink(app, list(models))

    # -- deploying ---------------------------------------------------------------------------
    async def deploy(
        self,
        mv: ModelVersion,
        *,
        set_current: bool = True,
        retire_previous: bool = True,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> ModelVersion:
        """Deploy ``mv`` (its artifact in place): a no-op when exactly this is deployed
        already, "already exists" when another version of that name is (both Control's)."""
        return await self.control.deploy(
            mv,
            set_current=set_current,
            retire_previous=retire_previous,
            wait=wait,
            ready_timeout_s=ready_timeout_s,
        )

    async def deploy_object(
        self,
        mv: ModelVersion,
        model: Any,
        *,
        set_current: bool = True,
        retire_previous: bool = True,
        wait: bool = True,
        ready_timeout_s: float = 60.0,
    ) -> ModelVersion:
        """Package the Python ``model`` as ``mv``'s artifact, then deploy it."""
        self.check_new_version(mv.name, mv.version)
        path = await asyncio.to_thread(self.artifacts.package, mv.name, mv.version, model)
        return await self.deploy(
            replace(mv, artifact=str(path)),
            set_current=set_current,
            retire_previous=retire_previous,
            wait=wait,
            ready_timeout_s=ready_timeout_s,
        )

    async def deploy_upload(
        self, mv: ModelVersion, body: bytes, *, unpack: Unpack, source_sha256: str | None = None
    ) -> ModelVersion:
        """Place an uploaded model (the request body) as ``mv``'s artifact, then deploy it.
        The same upload again (a retry whose answer was lost) is a no-op; a failed deploy
        leaves nothing behind (cancelled ones too)."""
        name, version = mv.name, mv.version
        digest = hashlib.sha256(body).hexdigest()
        have = self.registry.models.get(name, {}).get(version)
        if have is not None:
            same = await asyncio.to_thread(self.artifacts.upload_digest, name, version) == digest
            if same and have.input_type is mv.input_type and have.num_replicas == mv.num_replicas:
                return have
            self.check_new_version(name, version)
        try:
            path = await asyncio.to_thread(
                lambda: self.artifacts.place_upload(
                    name, version, body, digest=digest, unpack=unpack, source_sha256=source_sha256
                )
            )
            return await self.deploy(replace(mv, artifact=str(path)))
        except BaseException:
            # Unless the version got into the registry after all, its upload directory goes.
            if version not in self.registry.models.get(name, {}):
                await asyncio.shield(asyncio.to_thread(self.artifacts.remove_upload, name, version))
            raise

    def stage(
        self,
        name: str,
        version: str,
        *,
        input_type: InputType,
        artifact: str,
        num_replicas: int,
        batching: BatchingConfig | None,
    ) -> None:
        """Remember a deployment for the ``add_model`` of the same version that a container
        manager sends next (clipper_admin's deploy_model)."""
        check_name("model", name)
        check_name("version", version)
        self.check_new_version(name, version)
        self._staged[(name, version)] = _Staged(input_type, artifact, num_replicas, batching)

    def clear_staged(self) -> None:
        self._staged.clear()

    async def add_model(self, mv: ModelVersion, *, batching: BatchingConfig | None) -> None:
        """The original add_model: ``mv`` registered only (its containers are started
        elsewhere and dial in; the original only points the model at this version), or, when
        it was staged, the staged deployment started, answering once its replicas are
        connected (``batching``, the one add_model gave, unless it was staged with one)."""
        self.check_new_version(mv.name, mv.version)
        staged = self._staged.pop(mv.key, None)
        if staged is None:
            await self.control.register_model(mv)
            return
        if staged.input_type is not mv.input_type:
            raise RegistryError(
                f"model '{mv.name}' version '{mv.version}' was staged with input type "
                f"{staged.input_type.readable}, but add_model says {mv.input_type.readable}"
            )
        await self.control.deploy(
            ModelVersion(
                name=mv.name,
                version=mv.version,
                input_type=mv.input_type,
                labels=mv.labels,
                artifact=staged.artifact,
                batching=staged.batching or batching or BatchingConfig(),
                num_replicas=staged.num_replicas,
            )
        )

    # -- versions ----------------------------------------------------------------------------
    async def set_version(
        self,
        name: str,
        version: str,
        *,
        ready_timeout_s: float = 60.0,
        retire_previous: bool = True,
    ) -> None:
        versions = self.registry.models.get(name)
        if not versions:
            raise RegistryError(f"Cannot set version for nonexistent model '{name}'")
        if version not in versions:
            raise RegistryError(f"Cannot set non-existent version '{version}' for model '{name}'")
        await self.control.set_version(
            name, version, ready_timeout_s=ready_timeout_s, retire_previous=retire_previous
        )

    async def delete_version(self, name: str, version: str, *, force: bool = True) -> None:
        if version not in self.registry.models.get(name, {}):
            raise RegistryError(f"Model with name '{name}' and version '{version}' does not exist")
        await self.control.delete_version(name, version, force=force)

    # -- replicas ----------------------------------------------------------------------------
    async def run_replicas(
        self, name: str, num_replicas: int, version: str | None, *, artifact: str | None
    ) -> ModelVersion:
        """The admin API's ``set_num_replicas``: ``num_replicas`` of a version that this
        frontend runs. One registered without an artifact (add_model) gets ``artifact`` (a path
        on this machine) first, so the local manager can run it; without one it can only be
        scaled to 0. (The embedded ``set_num_replicas`` records any count, for containers
        started elsewhere too: :meth:`Control.scale`.)"""
        mv = self.registry.get_model(name, version)
        if mv.artifact is None and artifact is not None and num_replicas > 0:
            mv = replace(mv, artifact=resolve_artifact(artifact))
            await self.control.replace_model(mv)
        if mv.artifact is None and num_replicas > 0:
            raise RegistryError(
                f"model {name}:{mv.version} has no artifact for clipper-serve to run (its "
                "containers are started elsewhere): pass artifact_path, or deploy it with "
                "/admin/deploy_model"
            )
        return await self.control.scale(name, num_replicas, mv.version)

    async def set_autoscale(
        self, name: str, version: str | None, settings: Mapping[str, Any]
    ) -> ModelVersion:
        """A version's autoscaling: its settings with those in ``settings`` changed, driven by
        this frontend."""
        mv = self.registry.get_model(name, version)
        config = AutoscaleConfig.configure(mv.autoscale, dict(settings), owner=self.control.node_id)
        return await self.control.set_autoscale(name, mv.version, config)

    # -- canary splits and shadows -------------------------------------------------------------
    async def set_split(
        self,
        name: str,
        weights: Mapping[str, Any] | None,
        *,
        sticky: bool = False,
        ready_timeout_s: float = 60.0,
    ) -> Rollout | None:
        self.require_model(name)
        return await self.control.set_rollout(
            name, lambda r: with_split(r, name, weights, sticky=sticky),
            ready_timeout_s=ready_timeout_s,
        )  # fmt: skip

    async def set_shadow(
        self, name: str, version: str | None, share: float = 1.0, *, ready_timeout_s: float = 60.0
    ) -> Rollout | None:
        self.require_model(name)
        return await self.control.set_rollout(
            name, lambda r: with_shadow(r, name, version, share), ready_timeout_s=ready_timeout_s
        )

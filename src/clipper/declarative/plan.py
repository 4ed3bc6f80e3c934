"""The difference between a desired-state file and what a frontend serves, as an ordered list
of steps: what ``clipper apply`` shows, and then runs.

Every field the file carries is compared with the frontend's (the ``export_state`` answer), so
``no changes`` means the two are equal, and a change made by hand since (drift) is a step that
puts it back. The order keeps every step valid on the frontend: applications are created first
(without their pipeline), model versions are deployed (the version that should serve last, so
traffic ends on it), scaled and autoscaled, links are removed before an application's policy
changes and added after it, then each model's split and shadow are set, then pipelines (whose
stages name the models and applications made before), then tenants (whose quotas name
applications), and only then, with ``--prune``, what the
file does not mention is deleted. Anything the frontend would refuse
(an immutable field changed, a link to an unknown model, input types that do not match) is a
problem found here, before the first change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clipper.artifact_digest import content_digest
from clipper.config import BatchingConfig
from clipper.declarative.document import DocumentError, PathKey
from clipper.declarative.spec import (
    APP_DEFAULTS,
    APP_REQUIRED,
    AUTOSCALE_DEFAULTS,
    AppSpec,
    DesiredState,
    ModelSpec,
    TenantSpec,
    VersionSpec,
)
from clipper.rollout import Rollout
from clipper.tenants import quotas_to_doc

__all__ = ["Plan", "Step", "make_plan"]

# update_app takes every record field but these, which do not change.
_FIXED_APP_FIELDS = ("name", "input_type")


@dataclass(frozen=True, slots=True)
class Step:
    """One call to the admin API. ``op`` names it (see :mod:`clipper.declarative.apply`);
    ``sign`` is ``+`` (create), ``~`` (change) or ``-`` (delete)."""

    op: str
    sign: str
    text: str
    args: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "action": {"+": "create", "~": "change", "-": "delete"}[self.sign],
            "what": self.text,
            **{k: v for k, v in self.args.items() if k not in ("spec", "app")},
        }


@dataclass(slots=True)
class Plan:
    steps: list[Step] = field(default_factory=list)
    # Not changed, said once: what --prune would delete, artifacts the frontend cannot read.
    notes: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.steps

    def counts(self) -> dict[str, int]:
        out = {"create": 0, "change": 0, "delete": 0}
        for s in self.steps:
            out[{"+": "create", "~": "change", "-": "delete"}[s.sign]] += 1
        return out

    def render(self) -> str:
        lines = [f"{s.sign} {s.text}" for s in self.steps]
        lines += [f"  ({note})" for note in self.notes]
        c = self.counts()
        lines.append(
            "no changes" if self.empty
            else f"{c['create']} to create, {c['change']} to change, {c['delete']} to delete"
        )  # fmt: skip
        return "\n".join(lines)


def artifact_identity(path: Path) -> str:
    """What ``clipper apply`` compares with the frontend's digests: a file's bytes (the
    frontend keeps the digest of the file a version was made from), or the content of an
    artifact directory (the frontend digests the directory it runs)."""
    return content_digest(path)


class _Planner:
    def __init__(self, desired: DesiredState, current: dict[str, Any], prune: bool) -> None:
        self.desired = desired
        self.prune = prune
        self.plan = Plan()
        self.problems: list[str] = []
        self.apps: dict[str, dict[str, Any]] = {a["name"]: a for a in current["applications"]}
        self.models: dict[str, dict[str, Any]] = {m["name"]: m for m in current["models"]}
        self.versions: dict[str, dict[str, dict[str, Any]]] = {
            m["name"]: {v["version"]: v for v in m["versions"]} for m in current["models"]
        }
        # Absent from a frontend older than tenants.
        self.tenants: dict[str, dict[str, Any]] = {t["name"]: t for t in current.get("tenants", [])}

    def fail(self, path: PathKey, message: str) -> None:
        self.problems.append(self.desired.located.problem(path, message))

    def add(self, op: str, sign: str, text: str, **args: Any) -> None:
        self.plan.steps.append(Step(op, sign, text, args))

    # -- the phases, in the order they run -----------------------------------------------------
    def run(self) -> Plan:
        d = self.desired
        for spec in d.apps:
            if spec.name not in self.apps:
                self._create_app(spec)
        for model in d.models:
            self._model(model)
        updates = [(spec, self._app_changes(spec)) for spec in d.apps if spec.name in self.apps]
        links = [(spec, self._link_changes(spec)) for spec in d.apps]
        for spec, (_, remove) in links:
            for m in remove:
                self.add("unlink", "-", f"link {spec.name} -> {m}", app=spec.name, model=m)
        for spec, changes in updates:
            if changes:
                described = ", ".join(
                    f"{APP_REQUIRED.get(k, k)} {_show(self.apps[spec.name].get(k))} -> {_show(v)}"
                    for k, v in changes.items()
                )
                self.add(
                    "update_app", "~", f"application {spec.name}: {described}",
                    name=spec.name, changes=changes,
                )  # fmt: skip
        for spec, (add, _) in links:
            for m in add:
                self.add("link", "+", f"link {spec.name} -> {m}", app=spec.name, model=m)
        for model in d.models:
            self._traffic(model)
        for spec in d.apps:
            self._pipeline(spec)
        for t in d.tenants:  # after the applications their quotas name
            self._tenant(t)
        self._leftovers()
        if self.problems:
            raise DocumentError(self.problems)
        return self.plan

    # -- applications --------------------------------------------------------------------------
    def _create_app(self, spec: AppSpec) -> None:
        a = spec.app
        self.add(
            "add_app", "+",
            f"application {a.name} ({a.input_type.readable}, slo {a.latency_slo_micros} us, "
            f"default output {a.default_output}, policy {a.policy})",
            name=a.name, record={k: v for k, v in a.to_record().items() if k != "pipeline"},
        )  # fmt: skip

    def _app_changes(self, spec: AppSpec) -> dict[str, Any]:
        have = self.apps[spec.name]
        # A record holds require_key only when it is set: compared with its default as well.
        want = {"require_key": False, **spec.app.to_record()}
        if have["input_type"] != want["input_type"]:
            self.fail(
                (*spec.path, "input_type"),
                f"application {spec.name} takes {have['input_type']}; an input type does not "
                "change: delete the application (or apply with --prune after renaming it)",
            )
            return {}
        changes = {
            k: v
            for k, v in want.items()
            if k not in _FIXED_APP_FIELDS
            and k != "pipeline"
            and have.get(k, APP_DEFAULTS.get(k)) != v
        }
        if want.get("pipeline") is None and have.get("pipeline") is not None:
            changes["pipeline"] = None  # removed before links are added (set ones come last)
        return changes

    def _pipeline(self, spec: AppSpec) -> None:
        want = spec.app.pipeline
        have = self.apps.get(spec.name, {}).get("pipeline")
        if want is not None and want != have:
            self.add(
                "update_app", "~" if spec.name in self.apps else "+",
                f"application {spec.name}: pipeline of {len(want.get('stages', []))} stages"
                + ("" if have is None else " (changed)"),
                name=spec.name, changes={"pipeline": want},
            )  # fmt: skip

    def _link_changes(self, spec: AppSpec) -> tuple[list[str], list[str]]:
        if spec.links is None:
            return [], []
        have = list(self.apps.get(spec.name, {}).get("linked_models", []))
        for i, m in enumerate(spec.links):
            itype = self._model_input_type(m)
            if itype is None:
                self.fail(
                    (*spec.path, "models", i),
                    f"no model {m!r}: the file does not declare it and the frontend has none",
                )
            elif itype != spec.app.input_type.readable:
                self.fail(
                    (*spec.path, "models", i),
                    f"model {m} takes {itype} but application {spec.name} takes "
                    f"{spec.app.input_type.readable}",
                )
        return (
            [m for m in spec.links if m not in have],
            [m for m in have if m not in spec.links],
        )

    def _model_input_type(self, name: str) -> str | None:
        """The input type of the version of ``name`` that will serve."""
        for model in self.desired.models:
            if model.name == name:
                v = next(v for v in model.versions if v.version == model.current)
                return v.input_type.readable
        if name in self.models and not self.prune:
            current = self.models[name]["current"]
            version = self.versions[name].get(current or "")
            return str(version["input_type"]) if version else None
        return None

    # -- models --------------------------------------------------------------------------------
    def _model(self, model: ModelSpec) -> None:
        have = self.versions.get(model.name, {})
        new = [v for v in model.versions if v.version not in have]
        # The version that should serve is deployed last: traffic ends on it.
        new.sort(key=lambda v: v.version == model.current)
        current = self.models.get(model.name, {}).get("current")
        for v in model.versions:
            if v.version in have:
                self._existing(v, have[v.version])
        for v in new:
            if current is not None and v.version != model.current:
                self.plan.notes.append(
                    f"{model.name}:{v.version} is not the version the file serves: deploying it "
                    f"switches traffic to it until {model.name}:{model.current} is set back"
                )
            self._deploy(v)
            current = v.version
        if current != model.current:
            self.add(
                "set_version", "~", f"model {model.name}: serve {current} -> {model.current}",
                name=model.name, version=model.current,
            )  # fmt: skip

    def _deploy(self, v: VersionSpec) -> None:
        where = (
            f"artifact {self._shown(v.artifact)}"
            if v.artifact
            else (f"container {v.container_name}")
        )
        if v.artifact is None:
            fixed = v.batching.controller == "fixed"
            if v.batching != BatchingConfig() and not (
                fixed and v.batching == BatchingConfig("fixed", v.batching.max_batch_size)
            ):
                self.fail(
                    (*v.path, "batching"),
                    "a version without an artifact takes the default batching or "
                    "{controller: fixed, max_batch_size: N} only",
                )
        else:
            self._identity(v)
        self.add(
            "deploy", "+",
            f"model {v.model}:{v.version} ({v.input_type.readable}, {where}, "
            f"{v.replicas} replicas)",
            spec=v,
        )  # fmt: skip
        self._autoscale(v, None)

    def _autoscale(self, v: VersionSpec, have: dict[str, Any] | None) -> None:
        """Autoscaling as the file gives it: settings compared one by one (the frontend that
        applies them drives the version); none in the file turns it off where it is on."""
        theirs = None if have is None else {k: val for k, val in have.items() if k != "owner"}
        if v.autoscale is None:
            if theirs is not None and theirs.get("enabled", True):
                self.add(
                    "autoscale", "~", f"model {v.model}:{v.version}: autoscaling on -> off",
                    name=v.model, version=v.version, settings={"enabled": False},
                )  # fmt: skip
            return
        mine = {k: val for k, val in v.autoscale.to_record().items() if k != "owner"}
        if mine == theirs:
            return
        shown = {k: val for k, val in mine.items() if val != AUTOSCALE_DEFAULTS[k]}
        was = "off" if theirs is None else _differences(theirs, mine)
        self.add(
            "autoscale", "~",
            f"model {v.model}:{v.version}: autoscaling {was} -> {shown or 'defaults'}",
            name=v.model, version=v.version, settings=mine,
        )  # fmt: skip

    def _traffic(self, model: ModelSpec) -> None:
        """The model's split and shadow; a shadow that the new split names goes first (a
        version in the split cannot shadow)."""
        record = self.models.get(model.name, {}).get("rollout")
        have = Rollout.from_record(record) if record else Rollout(model.name)
        want = model.rollout or Rollout(model.name)
        shadow = have.shadow
        if have.split != want.split or have.sticky != want.sticky:
            if shadow is not None and shadow.version in want.weights:
                self.add(
                    "shadow", "-",
                    f"model {model.name}: shadow {shadow.version} (before the split)",
                    name=model.name, version=None, share=1.0,
                )  # fmt: skip
                shadow = None
            self.add(
                "split", "~",
                f"model {model.name}: split {_split(have)} -> {_split(want)}",
                name=model.name, weights=want.weights or None, sticky=want.sticky,
            )  # fmt: skip
        if shadow != want.shadow:
            s = want.shadow
            self.add(
                "shadow", "~" if s is not None else "-",
                f"model {model.name}: shadow "
                + ("none" if shadow is None else f"{shadow.version} ({shadow.share:g})") + " -> "
                + ("none" if s is None else f"{s.version} ({s.share:g})"),
                name=model.name, version=None if s is None else s.version,
                share=1.0 if s is None else s.share,
            )  # fmt: skip

    def _shown(self, path: Path) -> str:
        """An artifact's path as the file writes it: relative to the file's directory."""
        return os.path.relpath(path, self.desired.source.resolve().parent)

    def _identity(self, v: VersionSpec) -> str | None:
        assert v.artifact is not None
        try:
            return artifact_identity(v.artifact)
        except OSError as e:
            self.fail((*v.path, "artifact"), f"cannot read {v.artifact}: {e}")
            return None

    def _existing(self, v: VersionSpec, have: dict[str, Any]) -> None:
        differs = []
        if have["input_type"] != v.input_type.readable:
            differs.append(f"input_type {have['input_type']} -> {v.input_type.readable}")
        if list(have.get("labels", [])) != list(v.labels):
            differs.append(f"labels {have.get('labels')} -> {list(v.labels)}")
        if have.get("batching") != v.batching.to_dict():
            differs.append("batching")
        if bool(have.get("pooled", False)) != v.pooled:
            differs.append(f"pooled {bool(have.get('pooled', False))} -> {v.pooled}")
        if (have.get("artifact") is None) != (v.artifact is None):
            differs.append("artifact" if v.artifact else "container (no artifact)")
        elif v.artifact is not None:
            mine = self._identity(v)
            theirs = {have.get("artifact_sha256"), have.get("source_sha256")} - {None}
            if not theirs:
                self.plan.notes.append(
                    f"{v.model}:{v.version}: the frontend cannot read its artifact to compare "
                    "it; left as it is"
                )
            elif mine is not None and mine not in theirs:
                differs.append(f"artifact ({self._shown(v.artifact)} is not what runs)")
        elif have.get("container_name") != v.container_name:
            differs.append(f"container_name {have.get('container_name')} -> {v.container_name}")
        if differs:
            self.fail(
                v.path,
                f"{v.model}:{v.version} is deployed with a different {', '.join(differs)}: a "
                "version does not change once deployed; deploy the change as a new version",
            )
            return
        autoscaled = v.autoscale is not None and v.autoscale.enabled
        self._autoscale(v, have.get("autoscale"))
        if v.artifact is not None and not autoscaled and have.get("num_replicas") != v.replicas:
            self.add(
                "scale", "~",
                f"model {v.model}:{v.version}: replicas {have.get('num_replicas')} -> "
                f"{v.replicas}",
                name=v.model, version=v.version, replicas=v.replicas,
            )  # fmt: skip

    # -- tenants -------------------------------------------------------------------------------
    def _tenant(self, spec: TenantSpec) -> None:
        t = spec.tenant
        want = {"priority": t.priority.label, "quotas": quotas_to_doc(t.quotas)}
        have = self.tenants.get(t.name)
        if have is None:
            self.add(
                "add_tenant", "+", f"tenant {t.name} ({want['priority']}, quotas "
                f"{_show(want['quotas'])})", name=t.name, **want,
            )  # fmt: skip
            return
        changes = {k: v for k, v in want.items() if have.get(k) != v}
        if changes:
            said = ", ".join(f"{k} {_show(have.get(k))} -> {_show(v)}" for k, v in changes.items())
            self.add("update_tenant", "~", f"tenant {t.name}: {said}", name=t.name, **changes)

    # -- what the file does not mention --------------------------------------------------------
    def _leftovers(self) -> None:
        named_apps = {a.name for a in self.desired.apps}
        listed = {m.name: {v.version for v in m.versions} for m in self.desired.models}
        extra_apps = [a for a in self.apps if a not in named_apps]
        named_tenants = {t.tenant.name for t in self.desired.tenants}
        extra_tenants = [t for t in self.tenants if t not in named_tenants]
        extra_versions = [
            (name, version)
            for name, versions in self.versions.items()
            for version in versions
            if version not in listed.get(name, set())
        ]
        if not self.prune:
            if extra_apps or extra_versions or extra_tenants:
                things = (
                    [f"application {a}" for a in extra_apps]
                    + [f"model {n}:{v}" for n, v in extra_versions]
                    + [f"tenant {t}" for t in extra_tenants]
                )
                self.plan.notes.append(
                    f"not in the file, kept (--prune deletes them): {', '.join(things)}"
                )
            return
        for t in extra_tenants:  # before the applications their quotas may name
            self.add("delete_tenant", "-", f"tenant {t} and its keys", name=t)
        for a in extra_apps:
            self.add("delete_app", "-", f"application {a}", name=a)
        gone_models = {n for n, _ in extra_versions if n not in listed}
        for spec in self.desired.apps:
            if spec.links is not None:
                continue  # its links were handled, and checked, above
            for m in self.apps.get(spec.name, {}).get("linked_models", []):
                if m in gone_models:
                    self.add("unlink", "-", f"link {spec.name} -> {m}", app=spec.name, model=m)
        # The serving version of a model that goes entirely is deleted last.
        extra_versions.sort(key=lambda nv: self.models[nv[0]].get("current") == nv[1])
        for name, version in extra_versions:
            self.add("delete_version", "-", f"model {name}:{version}", name=name, version=version)


def _split(r: Rollout) -> str:
    if not r.split:
        return "none" + (" (sticky)" if r.sticky else "")
    text = ", ".join(f"{v}={w:g}" for v, w in r.split)
    return text + (" (sticky)" if r.sticky else "")


def _differences(have: dict[str, Any], want: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k} {have.get(k)}" for k in want if have.get(k) != want[k]) + "}"


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def make_plan(desired: DesiredState, current: dict[str, Any], *, prune: bool = False) -> Plan:
    """The steps from ``current`` (the ``export_state`` answer) to ``desired``."""
    return _Planner(desired, current, prune).run()

"""``clipper export``: what a frontend serves, as a desired-state file that ``clipper apply``
takes, with each version's artifact downloaded beside it (``artifacts/<model>/<version>/``).

The file carries everything an operator sets through the CLI or the admin API: applications
(every setting, pipelines included), model versions (artifact, replicas, labels, batching,
autoscaling), the serving version, links, and each model's traffic split and shadow. A state the
file cannot express (a version kept running outside traffic by the Python API, replicas of a
container started elsewhere) is refused with a message naming it, never dropped.

The order is canonical, so two frontends with the same state export byte-identical files:
applications and models by name, versions by :func:`version_key` (numbers numerically, then the
other names lexically), keys in a fixed order, free-form objects (policy parameters, pipelines,
batching parameters) with their keys sorted. Values equal to their defaults are left out, so the
file reads like one written by hand.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from clipper.archives import ArchiveTooLarge, extract_archive
from clipper.client import Client
from clipper.config import BatchingConfig
from clipper.declarative.spec import APP_DEFAULTS, AUTOSCALE_DEFAULTS, EXTERNAL_CONTAINER
from clipper.errors import ConfigError

__all__ = ["STATE_FILE", "ExportRefused", "canonical", "export_state", "to_document", "version_key"]

STATE_FILE = "clipper.yaml"
_BATCHING_DEFAULTS = BatchingConfig().to_dict()


class ExportRefused(ConfigError):
    """The frontend holds a state the file cannot express: each one named."""


def version_key(version: str) -> tuple[int, int, str]:
    """The order of versions in a file: numeric names by their number (2 before 10), then
    the others lexically."""
    if version.isdigit():
        return (0, int(version), version)
    return (1, 0, version)


def canonical(value: Any) -> Any:
    """``value`` with every object's keys sorted (lists keep their order)."""
    if isinstance(value, dict):
        return {str(k): canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def _number(value: float) -> int | float:
    """A weight as it reads best: 90 rather than 90.0 (the same value)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def to_document(state: dict[str, Any]) -> dict[str, Any]:
    """The ``export_state`` answer as the file's document (artifacts under ``artifacts/``);
    :class:`ExportRefused` names every state the file cannot express."""
    refused: list[str] = []
    apps = []
    for a in sorted(state["applications"], key=lambda a: a["name"]):
        doc: dict[str, Any] = {
            "name": a["name"],
            "input_type": a["input_type"],
            "default_output": a["default_output"],
            "slo_micros": a["latency_slo_micros"],
        }
        for key, default in APP_DEFAULTS.items():
            if key in a and a[key] != default:
                doc[key] = canonical(a[key])
        if a.get("pipeline") is not None:
            doc["pipeline"] = canonical(a["pipeline"])
        doc["models"] = list(a["linked_models"])
        apps.append(doc)
    models = []
    for m in sorted(state["models"], key=lambda m: m["name"]):
        ordered = sorted(m["versions"], key=lambda v: version_key(v["version"]))
        types = {v["input_type"] for v in ordered}
        shared = types.pop() if len(types) == 1 else None
        versions = [_version(m["name"], v, shared is None, refused) for v in ordered]
        doc = {"name": m["name"]}
        if m["current"] is None:
            refused.append(
                f"model {m['name']} has versions but none serves (its serving version was "
                "deleted): make one serve (clipper model version), or delete the model"
            )
        if shared is not None:
            doc["input_type"] = shared
        if m["current"] is not None:
            doc["current"] = m["current"]
        doc.update(_rollout(m.get("rollout")))
        doc["versions"] = versions
        models.append(doc)
    if refused:
        raise ExportRefused(
            "the frontend holds state the file cannot express, so nothing was written:\n"
            + "\n".join(f"  {r}" for r in refused)
        )
    document: dict[str, Any] = {"applications": apps, "models": models}
    tenants = [
        {"name": t["name"], "priority": t["priority"], "quotas": canonical(t["quotas"])}
        for t in sorted(state.get("tenants", []), key=lambda t: t["name"])
    ]
    if tenants:  # the keys stay where they are: secrets, never in a file
        document["tenants"] = tenants
    return document


def _version(model: str, v: dict[str, Any], typed: bool, refused: list[str]) -> dict[str, Any]:
    name = f"{model}:{v['version']}"
    out: dict[str, Any] = {"version": v["version"]}
    if typed:
        out["input_type"] = v["input_type"]
    autoscale = v.get("autoscale")
    if v.get("keep"):
        refused.append(
            f"{name} is kept running outside traffic (deployed with set_current=False or "
            "switched from with retire_previous=False, by the Python API): make it the serving "
            "version, put it in a split or a shadow, or delete it"
        )
    if v["artifact"] is not None:
        out["artifact"] = f"artifacts/{model}/{v['version']}"
        # An autoscaled version's count is the autoscaler's: it starts at min_replicas.
        if autoscale is None or not autoscale.get("enabled", True):
            out["replicas"] = v["num_replicas"]
        source = v.get("source_sha256")
        if source is not None and source != v.get("artifact_sha256"):
            out["source_sha256"] = source
    else:
        out["replicas"] = 0
        if v["num_replicas"]:
            refused.append(
                f"{name} has no artifact here but records {v['num_replicas']} replicas (set by "
                "the Python API for containers started elsewhere): set it to 0, or give it an "
                "artifact (set_num_replicas with artifact_path)"
            )
        if v["container_name"] != EXTERNAL_CONTAINER:
            out["container_name"] = v["container_name"]
    if v.get("labels"):
        out["labels"] = list(v["labels"])
    if v.get("pooled"):
        out["pooled"] = True
    batching = {
        k: canonical(val) for k, val in v["batching"].items() if val != _BATCHING_DEFAULTS.get(k)
    }
    if batching:
        out["batching"] = batching
    if autoscale is not None:
        out["autoscale"] = {
            k: val for k, val in autoscale.items() if k != "owner" and val != AUTOSCALE_DEFAULTS[k]
        }
    return out


def _rollout(rollout: dict[str, Any] | None) -> dict[str, Any]:
    if rollout is None:
        return {}
    out: dict[str, Any] = {}
    split = rollout.get("split") or {}
    if split:
        out["split"] = {v: _number(split[v]) for v in sorted(split, key=version_key)}
    if rollout.get("sticky"):
        out["sticky"] = True
    shadow = rollout.get("shadow")
    if shadow is not None:
        out["shadow"] = {"version": shadow["version"], "share": _number(shadow["share"])}
    return out


def _no_aliases_dumper() -> Any:
    import yaml

    def ignore_aliases(self: Any, data: Any) -> bool:
        return True

    return type("NoAliases", (yaml.SafeDumper,), {"ignore_aliases": ignore_aliases})


def dump(document: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n"
    import yaml

    header = "# clipper-serve desired state: apply with `clipper apply -f <this file>`\n"
    # No anchors for values that happen to be one object: `clipper apply` refuses aliases.
    text: str = yaml.dump(
        document, Dumper=_no_aliases_dumper(), sort_keys=False, default_flow_style=False
    )
    return header + text


def export_state(
    client: Client,
    out_dir: Path,
    *,
    fmt: str = "yaml",
    max_unpacked_bytes: int = 2 * 2**30,
    echo: Callable[[str], None] = lambda _: None,
) -> Path:
    """Write ``out_dir/clipper.yaml`` (or ``.json``) and the artifacts; the file's path."""
    state = client.admin("export_state", {})
    document = to_document(state)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"{out_dir} is not empty: export into a new directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    for m in state["models"]:
        for v in m["versions"]:
            if v["artifact"] is None:
                continue
            dest = out_dir / "artifacts" / m["name"] / v["version"]
            data = client.download_artifact(m["name"], v["version"])
            try:
                extract_archive(dest, data, max_bytes=max_unpacked_bytes)
            except (ArchiveTooLarge, OSError) as e:
                shutil.rmtree(dest, ignore_errors=True)
                raise ConfigError(f"cannot unpack {m['name']}:{v['version']}: {e}") from None
            echo(f"wrote {dest}")
    path = out_dir / (STATE_FILE if fmt == "yaml" else "clipper.json")
    path.write_text(dump(document, fmt))
    return path

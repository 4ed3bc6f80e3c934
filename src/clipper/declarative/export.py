"""``clipper export``: what a frontend serves, as a desired-state file that ``clipper apply``
takes, with each version's artifact downloaded beside it (``artifacts/<model>/<version>/``).

Applying the export to the same frontend changes nothing; applying it to a fresh frontend
reproduces the applications, versions (the serving one included), replica counts, batching and
links. Values equal to their defaults are left out, so the file reads like one written by hand.
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
from clipper.declarative.spec import APP_DEFAULTS, EXTERNAL_CONTAINER
from clipper.errors import ConfigError

__all__ = ["STATE_FILE", "export_state", "to_document"]

STATE_FILE = "clipper.yaml"
_BATCHING_DEFAULTS = BatchingConfig().to_dict()


def to_document(state: dict[str, Any]) -> dict[str, Any]:
    """The ``export_state`` answer as the file's document (artifacts under ``artifacts/``)."""
    apps = []
    for a in state["applications"]:
        doc: dict[str, Any] = {
            "name": a["name"],
            "input_type": a["input_type"],
            "default_output": a["default_output"],
            "slo_micros": a["latency_slo_micros"],
        }
        for key, default in APP_DEFAULTS.items():
            if key in a and a[key] != default:
                doc[key] = a[key]
        doc["models"] = list(a["linked_models"])
        apps.append(doc)
    models = []
    for m in state["models"]:
        types = {v["input_type"] for v in m["versions"]}
        shared = types.pop() if len(types) == 1 else None
        versions = []
        for v in m["versions"]:
            out: dict[str, Any] = {"version": v["version"]}
            if shared is None:
                out["input_type"] = v["input_type"]
            if v["artifact"] is not None:
                out["artifact"] = f"artifacts/{m['name']}/{v['version']}"
                out["replicas"] = v["num_replicas"]
                source = v.get("source_sha256")
                if source is not None and source != v.get("artifact_sha256"):
                    out["source_sha256"] = source
            else:
                out["replicas"] = 0
                if v["container_name"] != EXTERNAL_CONTAINER:
                    out["container_name"] = v["container_name"]
                if v["labels"]:
                    out["labels"] = list(v["labels"])
            batching = {
                k: val for k, val in v["batching"].items() if val != _BATCHING_DEFAULTS.get(k)
            }
            if batching:
                out["batching"] = batching
            versions.append(out)
        doc = {"name": m["name"]}
        if shared is not None:
            doc["input_type"] = shared
        if m["current"] is not None:
            doc["current"] = m["current"]
        doc["versions"] = versions
        models.append(doc)
    return {"applications": apps, "models": models}


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

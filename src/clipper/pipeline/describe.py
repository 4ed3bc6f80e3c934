"""The CLI's declarative pipeline file: one JSON or YAML document
with the pipeline (``stages``, ``output``) and, optionally, the application's settings.

::

    {"input_type": "doubles", "default_output": "-1", "latency_slo_micros": 50000,
     "stages": [{"name": "feat", "model": "featurize"}, ...], "output": "$post"}

Applied by :func:`apply_description`: the application is registered with the pipeline when it
does not exist (then ``input_type`` and ``latency_slo_micros`` are required), else updated in
one change (its pipeline and any settings given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import orjson

from clipper.errors import ConfigError
from clipper.untrusted import load_json, load_yaml, read_text

__all__ = ["APP_KEYS", "apply_description", "load_description"]

# Application settings a description may carry besides the pipeline's own keys.
APP_KEYS = ("input_type", "default_output", "latency_slo_micros", "cache", "overload")
_PIPELINE_KEYS = ("stages", "output")


class _Client(Protocol):
    def get_application(self, name: str) -> dict[str, Any] | None: ...

    def register_application(
        self, name: str, input_type: str, default_output: str, latency_slo_micros: int,
        **settings: Any,
    ) -> None: ...  # fmt: skip

    def update_application(self, name: str, **changes: Any) -> None: ...


def load_description(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(application settings, pipeline) from a description file: untrusted input, read with
    the limits of :mod:`clipper.untrusted` (size, no YAML aliases, depth), refused in one line."""
    text = read_text(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        parsed = load_yaml(text, str(path))
        if parsed.duplicates:
            raise ConfigError(parsed.duplicates[0])
        doc = parsed.value
    else:
        doc = load_json(text, str(path))
    if not isinstance(doc, dict) or "stages" not in doc:
        raise ConfigError(f"{path} must hold an object with 'stages' (docs/pipelines.md)")
    unknown = sorted(set(doc) - {*APP_KEYS, *_PIPELINE_KEYS})
    if unknown:
        raise ConfigError(
            f"{path} has unknown keys {unknown}: expected {list(_PIPELINE_KEYS)} and the "
            f"application settings {list(APP_KEYS)}"
        )
    settings = {k: doc[k] for k in APP_KEYS if k in doc}
    if "default_output" in settings and not isinstance(settings["default_output"], str):
        settings["default_output"] = orjson.dumps(settings["default_output"]).decode()
    return settings, {k: doc[k] for k in _PIPELINE_KEYS if k in doc}


def apply_description(client: _Client, name: str, path: Path) -> str:
    """Register or update application ``name`` from the file; what was done, in words."""
    settings, pipeline = load_description(path)
    if client.get_application(name) is None:
        missing = [k for k in ("input_type", "latency_slo_micros") if k not in settings]
        if missing:
            raise ConfigError(
                f"application {name} does not exist: the file must give {missing} to create it"
            )
        client.register_application(
            name,
            settings.pop("input_type"),
            settings.pop("default_output", "null"),
            settings.pop("latency_slo_micros"),
            pipeline=pipeline,
            **settings,
        )
        return f"registered pipeline application {name} ({len(pipeline['stages'])} stages)"
    if "input_type" in settings:
        settings.pop("input_type")  # an existing application's input type never changes
    client.update_application(name, pipeline=pipeline, **settings)
    return f"updated the pipeline of application {name} ({len(pipeline['stages'])} stages)"

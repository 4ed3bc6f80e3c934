"""The CLI's pipeline description file: what it reads, and what it refuses before any request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from clipper.errors import ConfigError
from clipper.pipeline.describe import apply_description, load_description

STAGES = [{"name": "a", "model": "m"}]


class FakeClient:
    def __init__(self, existing: bool) -> None:
        self.existing = existing
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def get_application(self, name: str) -> dict[str, Any] | None:
        return {"name": name} if self.existing else None

    def register_application(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("register", args, kwargs))

    def update_application(self, name: str, **changes: Any) -> None:
        self.calls.append(("update", (name,), changes))


def write(tmp_path: Path, doc: Any, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_bytes(orjson.dumps(doc))
    return path


def test_settings_and_pipeline_are_split_and_a_default_value_becomes_json_text(
    tmp_path: Path,
) -> None:
    doc = {"input_type": "json", "default_output": {"k": 1}, "latency_slo_micros": 5000}
    path = write(tmp_path, {**doc, "stages": STAGES, "output": "$a"})
    settings, pipeline = load_description(path)
    assert settings == {
        "input_type": "json",
        "default_output": '{"k":1}',
        "latency_slo_micros": 5000,
    }
    assert pipeline == {"stages": STAGES, "output": "$a"}


def test_a_new_application_is_registered_and_an_existing_one_updated(tmp_path: Path) -> None:
    path = write(tmp_path, {"input_type": "json", "latency_slo_micros": 5000, "stages": STAGES})
    new = FakeClient(existing=False)
    assert apply_description(new, "p", path) == "registered pipeline application p (1 stages)"
    assert new.calls == [
        ("register", ("p", "json", "null", 5000), {"pipeline": {"stages": STAGES}})
    ]
    old = FakeClient(existing=True)
    apply_description(old, "p", path)
    # an existing application's input type never changes: not sent
    assert old.calls == [
        ("update", ("p",), {"pipeline": {"stages": STAGES}, "latency_slo_micros": 5000})
    ]


def test_bad_files_are_refused_before_any_request(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"absent\.json: no such file"):
        load_description(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match=r"bad\.json:1:2: invalid JSON"):
        load_description(bad)
    with pytest.raises(ConfigError, match="must hold an object with 'stages'"):
        load_description(write(tmp_path, [1]))
    with pytest.raises(ConfigError, match=r"unknown keys \['stagse'\]"):
        load_description(write(tmp_path, {"stages": STAGES, "stagse": []}))
    client = FakeClient(existing=False)
    with pytest.raises(ConfigError, match=r"must give \['input_type', 'latency_slo_micros'\]"):
        apply_description(client, "p", write(tmp_path, {"stages": STAGES}))
    assert client.calls == []


def test_a_yaml_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "p.yml"
    path.write_text("latency_slo_micros: 5000\nstages:\n  - name: a\n    model: m\n")
    assert load_description(path) == ({"latency_slo_micros": 5000}, {"stages": STAGES})
    path.write_text("stages: [\n")
    with pytest.raises(ConfigError, match=r"p\.yml:2:1: invalid YAML"):
        load_description(path)


def test_a_description_is_untrusted_input(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("stages: &s [*s]\n")  # an alias would expand before anything is checked
    with pytest.raises(ConfigError, match=r"p\.yaml:1:9: a YAML anchor \(&s\) is not accepted"):
        load_description(path)
    path.write_text("stages: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:1:72: nested deeper than 64 levels"):
        load_description(path)

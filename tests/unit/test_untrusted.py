"""Untrusted YAML and JSON files: refused early, in one line with the file, line and column, by
size before they are read, and by anchors, aliases, depth, node count and tags before anything
is expanded or built; what is accepted reads as PyYAML's safe loader reads it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from clipper.errors import ConfigError
from clipper.untrusted import MAX_DEPTH, load_json, load_yaml, read_text

SAMPLE = """\
applications:
  - name: sums
    default_output: -1
    slo_micros: 20_000
    cache: yes
    ratio: 0.5
    since: 2024-05-01
    note: "quoted: text"
    none: ~
    tags: [a, 'b', 3]
models: {adder: {versions: [{version: "1", replicas: 2}]}}
"""


def _refusal(text: str, **limits: int) -> str:
    with pytest.raises(ConfigError) as e:
        load_yaml(text, "f.yaml", **limits)
    message = str(e.value)
    assert "\n" not in message  # one line
    return message


def test_accepted_documents_read_as_the_safe_loader_reads_them() -> None:
    parsed = load_yaml(SAMPLE, "f.yaml")
    assert parsed.value == yaml.safe_load(SAMPLE)
    assert parsed.where[("applications", 0, "slo_micros")] == (4, 17)
    assert parsed.where[("models", "adder", "versions", 0, "replicas")] == (11, 54)
    assert parsed.duplicates == []
    assert load_yaml("", "f.yaml").value is None
    assert load_yaml("# only a comment\n", "f.yaml").value is None


def test_billion_laughs_is_refused_at_its_first_anchor() -> None:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    message = _refusal("\n".join(lines) + "\napplications: *a9\n")
    assert message.startswith("f.yaml:1:5: a YAML anchor (&a0) is not accepted")


def test_aliases_and_self_references_are_refused() -> None:
    assert _refusal("applications: &x [*x]\n").startswith("f.yaml:1:15: a YAML anchor (&x)")
    message = _refusal("a: 1\nb: *a\n")
    assert message.startswith("f.yaml:2:4: a YAML alias (*a) is not accepted")
    assert "expected the value written out" in message


def test_the_depth_limit_counts_every_mapping_and_list() -> None:
    ok = "applications: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    assert load_yaml(ok, "f.yaml").value is not None  # the mapping and 63 lists: 64 levels
    deep = "applications: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n"
    message = _refusal(deep)
    assert message == (
        f"f.yaml:1:{15 + MAX_DEPTH - 1}: nested deeper than 64 levels: expected mappings and "
        "lists at most that deep"
    )
    block = "".join(f"{'  ' * i}- \n" for i in range(70))  # block style, one level a line
    assert _refusal(block).startswith("f.yaml:65:")


def test_a_50000_deep_list_is_refused_where_level_65_starts() -> None:
    # libyaml stops at its own 1,000 levels while scanning ahead; the place named is ours.
    text = "applications: " + "[" * 50_000 + "]" * 50_000 + "\n"
    assert _refusal(text).startswith("f.yaml:1:78: nested deeper than 64 levels")


def test_node_count_limit() -> None:
    text = "[" + ", ".join(["1"] * 50) + "]\n"
    assert len(load_yaml(text, "f.yaml", max_nodes=51).value) == 50
    assert _refusal(text, max_nodes=50).startswith("f.yaml:1:149: more than 50 values")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: !!python/object/apply:os.system [echo]\n", "the tag tag:yaml.org,2002:python/object"),
        ("a: !!set {x}\n", "the tag tag:yaml.org,2002:set is not accepted: expected a plain map"),
        ("a: !custom 1\n", "the tag !custom is not accepted"),
        ("a:\n  <<: {b: 1}\n", "the merge key << is not accepted"),
        ("a: 2024-13-45\n", "'2024-13-45' is not a valid timestamp"),
        ("? [a, b]\n: 1\n", "a key must be a plain value"),
        ("a: 1\n---\nb: 2\n", "a second YAML document (---): expected one"),
        ("a: [1, 2\n", "invalid YAML"),
    ],
)
def test_other_refusals_are_one_line_with_a_place(text: str, expected: str) -> None:
    message = _refusal(text)
    assert message.startswith("f.yaml:") and message.split(":")[1].isdigit()
    assert expected in message


def test_keys_given_twice_are_listed_with_both_lines() -> None:
    parsed = load_yaml("a:\n  b: 1\n  b: 2\n", "f.yaml")
    assert parsed.duplicates == ["f.yaml:3:3: a.b: given twice (first on line 2)"]


def test_json_depth_and_size_are_checked_before_parsing() -> None:
    doc = {"applications": [{"name": "a", "tags": ["x,y", "[{"], "n": 1.5}], "models": []}
    assert load_json(json.dumps(doc), "f.json") == doc
    deep = '{"a":\n' + "[" * 50_000 + "]" * 50_000 + "}"
    with pytest.raises(ConfigError) as e:
        load_json(deep, "f.json")
    assert str(e.value) == (
        "f.json:2:64: nested deeper than 64 levels: expected objects and arrays at most 64 deep"
    )
    with pytest.raises(ConfigError, match=r"^f\.json: more than 10 values"):
        load_json("[" + ",".join(["1"] * 20) + "]", "f.json", max_nodes=10)
    with pytest.raises(ConfigError, match=r"^f\.json:1:6: invalid JSON"):
        load_json('{"a" 1}', "f.json")


def test_a_large_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(100 * 2**20)  # sparse: the size is what is judged
    with pytest.raises(ConfigError) as e:
        read_text(big, limit="--max-file-bytes")
    assert str(e.value) == (
        f"{big}: 104,857,600 bytes is over the limit of 4,194,304 (--max-file-bytes): "
        "expected a small text file; nothing of it was read"
    )
    if os.path.exists("/dev/zero"):  # says it is empty, and never ends: read only so far
        with pytest.raises(ConfigError, match="more than the limit of 1,024 bytes"):
            read_text(Path("/dev/zero"), 1024)
    small = tmp_path / "s.yaml"
    small.write_text("a: 1\n")
    assert read_text(small, 5) == "a: 1\n"


def test_unreadable_files_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"a: 1\nname: caf\xe9\n")
    with pytest.raises(ConfigError, match=r":2:10: not UTF-8 text \(byte 0xe9\)"):
        read_text(bad)
    with pytest.raises(ConfigError, match="no such file"):
        read_text(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        read_text(tmp_path)

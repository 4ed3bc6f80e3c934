"""Desired-state files: parsing with line numbers, the schema's checks, and the plan (the diff
against a frontend's exported state), with no frontend: the state is a plain document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clipper.artifact_digest import archive, content_digest, served_path
from clipper.config import BatchingConfig
from clipper.declarative.document import DocumentError
from clipper.declarative.export import ExportRefused, dump, to_document
from clipper.declarative.plan import make_plan
from clipper.declarative.spec import read_desired_state
from clipper.inputs import InputType
from clipper.registry import Application

GOOD = """\
applications:
  - name: sums
    input_type: doubles
    default_output: -1
    slo_micros: 20000
    models: [adder]
models:
  - name: adder
    input_type: doubles
    versions:
      - version: 1
        artifact: adder
        replicas: 2
"""


def _write(tmp_path: Path, text: str, name: str = "state.yaml") -> Path:
    art = tmp_path / "adder"
    art.mkdir(exist_ok=True)
    (art / "clipper-model.json").write_text('{"format": 1, "framework": "python"}')
    (art / "model.pkl").write_bytes(b"not really a pickle")
    path = tmp_path / name
    path.write_text(text)
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(DocumentError) as e:
        read_desired_state(path)
    return e.value.problems


def _empty_state() -> dict[str, Any]:
    return {"applications": [], "models": []}


def _state_of(path: Path) -> dict[str, Any]:
    """What a frontend that applied ``path`` exports (as the export_state route answers)."""
    d = read_desired_state(path)
    apps = [{**a.app.to_record(), "linked_models": a.links or []} for a in d.apps]
    models = []
    for m in d.models:
        versions = []
        for v in m.versions:
            assert v.artifact is not None
            versions.append(
                {
                    "name": v.model,
                    "version": v.version,
                    "input_type": v.input_type.readable,
                    "labels": [],
                    "artifact": str(v.artifact),
                    "container_name": "clipper-serve/python",
                    "batching": v.batching.to_dict(),
                    "num_replicas": v.replicas,
                    "keep": False,
                    "artifact_sha256": content_digest(v.artifact),
                    "source_sha256": None,
                }
            )
        models.append({"name": m.name, "current": m.current, "versions": versions})
    return {"applications": apps, "models": models}


def test_a_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "applications:\n  - name: a\n    slo_micros: [1, 2\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:4:1: invalid YAML")  # the flow list never closes


def test_schema_errors_name_the_path_and_line_and_all_are_reported(tmp_path: Path) -> None:
    text = GOOD.replace("slo_micros: 20000", "slo_micros: fast").replace(
        "replicas: 2", "replicas: -1\n        colour: red"
    )
    problems = _problems(_write(tmp_path, text))
    assert len(problems) == 3, problems
    assert any(":5: applications[0].slo_micros: expected a positive 32-bit integer" in p
               for p in problems)  # fmt: skip
    assert any(":13: models[0].versions[0].replicas: expected an integer >= 0" in p
               for p in problems)  # fmt: skip
    assert any(":14: models[0].versions[0].colour: unknown key" in p for p in problems)


def test_a_key_given_twice_is_an_error_not_the_last_one_wins(tmp_path: Path) -> None:
    text = GOOD.replace("slo_micros: 20000", "slo_micros: 20000\n    slo_micros: 30000")
    (problem,) = _problems(_write(tmp_path, text))
    assert ":6:5: applications[0].slo_micros: given twice (first on line 5)" in problem


def test_the_frontends_own_rules_apply_with_the_path(tmp_path: Path) -> None:
    text = GOOD.replace("name: sums", "name: 'bad name'").replace(
        "version: 1", "version: 1.10"
    ).replace("artifact: adder", "artifact: missing.pkl")  # fmt: skip
    problems = _problems(_write(tmp_path, text))
    assert any("applications[0].name: invalid application name" in p for p in problems)
    assert any("models[0].versions[0].version: expected a string" in p and "quote it" in p
               for p in problems)  # fmt: skip
    assert any("models[0].versions[0].artifact:" in p and "no such file" in p for p in problems)


def test_json_files_are_read_with_line_numbers(tmp_path: Path) -> None:
    text = '{"applications": [{"name": "a",\n "input_type": "doubles"}]}'
    path = _write(tmp_path, text, "s.json")
    problems = _problems(path)
    assert any(p.startswith(f"{path}:1:") and "default_output is required" in p for p in problems)
    bad = _write(tmp_path, '{"applications": [}', "bad.json")
    (problem,) = _problems(bad)
    assert problem.startswith(f"{bad}:1:19: invalid JSON")
    twice = _write(tmp_path, '{"models": [], "models": []}', "twice.json")
    (problem,) = _problems(twice)
    assert "the key 'models' is given twice" in problem


def test_a_fresh_frontend_gets_everything_created_in_a_valid_order(tmp_path: Path) -> None:
    plan = make_plan(read_desired_state(_write(tmp_path, GOOD)), _empty_state())
    assert [s.op for s in plan.steps] == ["add_app", "deploy", "link"]
    assert plan.counts() == {"create": 3, "change": 0, "delete": 0}
    assert plan.render().splitlines()[-1] == "3 to create, 0 to change, 0 to delete"


def test_the_same_state_is_an_empty_plan_and_changes_are_steps(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    state = _state_of(path)
    assert make_plan(read_desired_state(path), state).empty
    changed = _write(tmp_path, GOOD.replace("20000", "30000").replace("replicas: 2", "replicas: 3"))
    plan = make_plan(read_desired_state(changed), state)
    assert [(s.op, s.sign) for s in plan.steps] == [("scale", "~"), ("update_app", "~")]
    assert plan.steps[1].args["changes"] == {"latency_slo_micros": 30000}


def test_a_changed_artifact_of_a_deployed_version_is_refused_before_anything(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, GOOD)
    state = _state_of(path)
    (tmp_path / "adder" / "model.pkl").write_bytes(b"other bytes")
    with pytest.raises(DocumentError) as e:
        make_plan(read_desired_state(path), state)
    assert "models[0].versions[0]: adder:1 is deployed with a different artifact" in str(e.value)


def test_prune_deletes_only_when_asked(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    state = _state_of(path)
    state["applications"].append({**state["applications"][0], "name": "old", "linked_models": []})
    plan = make_plan(read_desired_state(path), state)
    assert plan.empty and "--prune deletes them): application old" in plan.notes[0]
    pruned = make_plan(read_desired_state(path), state, prune=True)
    assert [(s.op, s.args["name"]) for s in pruned.steps] == [("delete_app", "old")]


def test_links_to_unknown_models_and_mismatched_types_are_problems(tmp_path: Path) -> None:
    text = GOOD.replace("models: [adder]", "models: [nobody]")
    with pytest.raises(DocumentError) as e:
        make_plan(read_desired_state(_write(tmp_path, text)), _empty_state())
    assert "applications[0].models[0]: no model 'nobody'" in str(e.value)
    text = GOOD.replace("doubles\n    versions", "ints\n    versions")
    with pytest.raises(DocumentError) as e:
        make_plan(read_desired_state(_write(tmp_path, text)), _empty_state())
    assert "model adder takes integers but application sums takes doubles" in str(e.value)


def test_the_serving_version_is_deployed_last(tmp_path: Path) -> None:
    text = GOOD.replace(
        "        replicas: 2\n",
        "        replicas: 2\n      - version: 2\n        artifact: adder\n    current: '1'\n",
    )
    plan = make_plan(read_desired_state(_write(tmp_path, text)), _empty_state())
    deploys = [s.args["spec"].version for s in plan.steps if s.op == "deploy"]
    assert deploys == ["2", "1"]
    assert not any(s.op == "set_version" for s in plan.steps)


def test_export_document_reads_back_as_the_same_state(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    state = _state_of(path)
    doc = to_document(state)
    assert doc["applications"][0] == {
        "name": "sums", "input_type": "doubles", "default_output": "-1", "slo_micros": 20000,
        "models": ["adder"],
    }  # fmt: skip
    assert doc["models"][0]["versions"][0]["artifact"] == "artifacts/adder/1"


def test_digests_ignore_times_and_pycache_and_archives_are_reproducible(tmp_path: Path) -> None:
    art = tmp_path / "a"
    (art / "modules" / "__pycache__").mkdir(parents=True)
    (art / "func.pkl").write_bytes(b"x")
    before = content_digest(art)
    (art / "modules" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"compiled")
    assert content_digest(art) == before
    one = archive(art, max_bytes=1000)
    (art / "func.pkl").touch()
    assert archive(art, max_bytes=1000) == one
    (art / "func.pkl").write_bytes(b"y")
    assert content_digest(art) != before
    single = tmp_path / "s"
    single.mkdir()
    (single / "model.pkl").write_bytes(b"pickle")
    assert served_path(single) == single / "model.pkl"
    assert content_digest(single) == content_digest(single / "model.pkl")


def test_a_new_version_that_does_not_serve_is_deployed_then_traffic_goes_back(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, GOOD)
    state = _state_of(path)
    text = GOOD.replace(
        "        replicas: 2\n",
        "        replicas: 2\n      - version: 2\n        artifact: adder\n    current: '1'\n",
    )
    plan = make_plan(read_desired_state(_write(tmp_path, text)), state)
    assert [(s.op, s.args.get("version")) for s in plan.steps] == [
        ("deploy", None),
        ("set_version", "1"),
    ]
    assert any("switches traffic to it until adder:1 is set back" in n for n in plan.notes)


def test_the_example_in_the_docs_is_a_valid_file(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    example = docs.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "models" / "logreg-2").mkdir(parents=True)
    for name in ("logreg-1.joblib", "forest.pkl", "logreg-2/model.pkl"):
        (tmp_path / "models" / name).write_bytes(b"x")
    path = tmp_path / "clipper.yaml"
    path.write_text(example)
    plan = make_plan(read_desired_state(path), _empty_state())
    assert plan.counts() == {"create": 8, "change": 0, "delete": 0}, plan.render()


def test_an_export_never_writes_aliases_that_apply_refuses(tmp_path: Path) -> None:
    from clipper.declarative.export import dump

    shared = {"min": 1, "max": 3}  # one object in two places: safe_dump would anchor it
    doc = {"applications": [], "models": [{"name": "a", "autoscale": shared},
                                          {"name": "b", "autoscale": shared}]}  # fmt: skip
    text = dump(doc, "yaml")
    assert "&" not in text and "*" not in text
    path = tmp_path / "exported.yaml"
    path.write_text(text)
    from clipper.declarative.document import load_document

    assert load_document(path)[0] == doc


def test_hostile_files_are_one_line_refusals_naming_the_place(tmp_path: Path) -> None:
    laughs = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    cases = {
        "laughs.yaml": ("\n".join(laughs) + "\n", ":1:5: a YAML anchor (&a0) is not accepted"),
        "self.yaml": ("applications: &x [*x]\n", ":1:15: a YAML anchor (&x) is not accepted"),
        "deep.yaml": ("applications: " + "[" * 50_000 + "]" * 50_000 + "\n", ":1:78: nested"),
        "deep.json": ('{"applications": ' + "[" * 50_000 + "]" * 50_000 + "}", ":1:81: nested"),
    }
    for name, (text, expected) in cases.items():
        (problem,) = _problems(_write(tmp_path, text, name))
        assert problem.startswith(f"{tmp_path / name}{expected}"), problem
    big = tmp_path / "big.yaml"
    big.write_text(GOOD)
    with pytest.raises(DocumentError) as e:
        read_desired_state(big, max_bytes=100)
    assert e.value.problems == [
        f"{big}: {len(GOOD):,} bytes is over the limit of 100 (--max-file-bytes): expected a "
        "small text file; nothing of it was read"
    ]


def _version_record(name: str, version: str, **changes: Any) -> dict[str, Any]:
    return {
        "name": name, "version": version, "input_type": "doubles", "labels": [],
        "artifact": f"/state/{name}/{version}", "container_name": "clipper-serve/python",
        "batching": {**BatchingConfig().to_dict(), "params": {"b": 1, "a": 2}},
        "num_replicas": 1, "keep": False, "artifact_sha256": None, "source_sha256": None,
        **changes,
    }  # fmt: skip


def test_the_same_state_in_any_order_is_the_same_document() -> None:
    def state(versions: list[str], params: dict[str, Any]) -> dict[str, Any]:
        app = {**Application("a", InputType.DOUBLES, "-1", 1000, policy="exp3").to_record()}
        app |= {"policy_params": params, "linked_models": []}
        rollout = {"name": "m", "split": {"10": 10.0, "2": 90.0}, "sticky": False, "shadow": None}
        return {
            "applications": [app],
            "models": [{"name": "m", "current": "2", "rollout": rollout,
                        "versions": [_version_record("m", v) for v in versions]}],
        }  # fmt: skip

    one = to_document(state(["10", "2", "b", "1"], {"eta": 0.1, "gamma": 0.2}))
    other = to_document(state(["b", "1", "2", "10"], {"gamma": 0.2, "eta": 0.1}))
    assert dump(one, "yaml") == dump(other, "yaml")
    (model,) = one["models"]
    assert [v["version"] for v in model["versions"]] == ["1", "2", "10", "b"]
    assert list(model["split"]) == ["2", "10"] and model["split"]["2"] == 90
    assert list(one["applications"][0]["policy_params"]) == ["eta", "gamma"]
    assert list(model["versions"][0]["batching"]["params"]) == ["a", "b"]


def test_export_refuses_what_the_file_cannot_express() -> None:
    state = {
        "applications": [],
        "models": [
            {"name": "m", "current": "1", "rollout": None,
             "versions": [_version_record("m", "1"), _version_record("m", "2", keep=True)]},
            {"name": "gone", "current": None, "rollout": None,
             "versions": [_version_record("gone", "1")]},
        ],
    }  # fmt: skip
    with pytest.raises(ExportRefused) as e:
        to_document(state)
    assert "m:2 is kept running outside traffic" in str(e.value)
    assert "model gone has versions but none serves" in str(e.value)


def test_a_shadow_the_new_split_names_is_removed_before_the_split(tmp_path: Path) -> None:
    text = GOOD.replace(
        "    versions:\n",
        "    split: {'1': 1, '2': 1}\n    shadow: {version: '3', share: 0.5}\n    versions:\n",
    ).replace(
        "        replicas: 2\n",
        "        replicas: 2\n"
        + "".join(f"      - version: {v}\n        artifact: adder\n" for v in (2, 3))
        + "    current: '1'\n",
    )
    path = _write(tmp_path, text)
    state = _state_of(path)
    state["models"][0]["rollout"] = {
        "name": "adder", "split": {"1": 1.0, "3": 1.0}, "sticky": False,
        "shadow": {"version": "2", "share": 1.0},
    }  # fmt: skip
    plan = make_plan(read_desired_state(path), state)
    assert [(s.op, s.args.get("version"), s.args.get("weights")) for s in plan.steps] == [
        ("shadow", None, None),
        ("split", None, {"1": 1.0, "2": 1.0}),
        ("shadow", "3", None),
    ]
    state["models"][0]["rollout"] = {
        "name": "adder", "split": {"1": 1.0, "2": 1.0}, "sticky": False,
        "shadow": {"version": "3", "share": 0.5},
    }  # fmt: skip
    assert make_plan(read_desired_state(path), state).empty


def test_the_second_example_in_the_docs_is_a_valid_file(tmp_path: Path) -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
    example = docs.read_text().split("```yaml\n")[2].split("```", 1)[0]
    (tmp_path / "models").mkdir()
    for v in (1, 2, 3):
        (tmp_path / "models" / f"summer-{v}.pkl").write_bytes(b"x")
    path = tmp_path / "clipper.yaml"
    path.write_text(example)
    d = read_desired_state(path)
    (model,) = d.models
    assert model.rollout is not None and model.rollout.sticky
    assert d.apps[0].app.pipeline is not None and model.versions[0].autoscale is not None


TENANTS = (
    GOOD.replace("    slo_micros: 20000\n", "    slo_micros: 20000\n    require_key: true\n")
    + """\
tenants:
  - name: gold
    priority: critical
    quotas: {"*": {rate: 100, burst: 200}, sums: {rate: 10, burst: 20}}
  - name: bulk
"""
)


def test_tenants_and_require_key_are_planned_exported_and_pruned(tmp_path: Path) -> None:
    path = _write(tmp_path, TENANTS)
    plan = make_plan(read_desired_state(path), _empty_state())
    adds = [s for s in plan.steps if s.op == "add_tenant"]
    assert [s.args["name"] for s in adds] == ["gold", "bulk"]
    assert adds[0].args["quotas"] == {
        "*": {"rate": 100, "burst": 200},
        "sums": {"rate": 10, "burst": 20},
    }
    assert adds[1].args == {"name": "bulk", "priority": "standard", "quotas": {}}
    assert plan.steps.index(adds[0]) > max(
        i for i, s in enumerate(plan.steps) if s.op in ("add_app", "link")
    )  # after the application its quota names
    assert next(s for s in plan.steps if s.op == "add_app").args["record"]["require_key"] is True
    state = _state_of(path)
    state["tenants"] = [
        {"name": "gold", "priority": "critical",
         "quotas": {"*": {"rate": 100, "burst": 200}, "sums": {"rate": 10, "burst": 20}}},
        {"name": "bulk", "priority": "sheddable", "quotas": {}},
        {"name": "old", "priority": "standard", "quotas": {}},
    ]  # fmt: skip
    plan = make_plan(read_desired_state(path), state)
    assert [(s.op, s.args) for s in plan.steps] == [
        ("update_tenant", {"name": "bulk", "priority": "standard"})
    ]
    assert "tenant old" in " ".join(plan.notes)
    pruned = make_plan(read_desired_state(path), state, prune=True)
    assert ("delete_tenant", {"name": "old"}) in [(s.op, s.args) for s in pruned.steps]
    doc = to_document(state)
    assert doc["applications"][0]["require_key"] is True
    assert [t["name"] for t in doc["tenants"]] == ["bulk", "gold", "old"]
    assert all("keys" not in t for t in doc["tenants"])
    # Turning require_key off is a change too (records hold it only when set).
    off = _write(tmp_path, TENANTS.replace("    require_key: true\n", ""), "off.yaml")
    changes = [
        s.args for s in make_plan(read_desired_state(off), state).steps if s.op == "update_app"
    ]
    assert changes == [{"name": "sums", "changes": {"require_key": False}}]


def test_a_bad_tenant_is_a_problem_with_its_path(tmp_path: Path) -> None:
    text = GOOD + (
        "tenants:\n  - name: t\n    priority: urgent\n"
        "  - {name: u, quotas: {'*': {rate: 0, burst: 1}}}\n"
    )
    problems = _problems(_write(tmp_path, text))
    assert any("tenants[0]" in p and "critical, standard, sheddable" in p for p in problems)
    assert any("tenants[1]" in p and "rate must be in" in p for p in problems), problems


def test_a_pooled_version_reads_with_its_autoscaling_and_exports_back(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("        replicas: 2\n", "        pooled: true\n"))
    (model,) = read_desired_state(path).models
    (v,) = model.versions
    assert v.pooled and v.replicas == 0  # unloaded until its first query
    assert v.autoscale is not None and (v.autoscale.min_replicas, v.autoscale.max_replicas) == (
        0,
        1,
    )
    state = _state_of(path)
    state["models"][0]["versions"][0]["pooled"] = True
    state["models"][0]["versions"][0]["autoscale"] = v.autoscale.to_record()
    plan = make_plan(read_desired_state(path), state, prune=False)
    assert plan.steps == []  # what the frontend made of it is what the file says
    doc = to_document(state)
    (exported,) = doc["models"][0]["versions"]
    assert exported["pooled"] is True
    assert exported["autoscale"] == {"min_replicas": 0, "max_replicas": 1}
    state["models"][0]["versions"][0]["pooled"] = False
    with pytest.raises(DocumentError) as e:
        make_plan(read_desired_state(path), state, prune=False)
    assert any("pooled False -> True" in p for p in e.value.problems), e.value.problems


def test_a_pooled_version_needs_an_artifact(tmp_path: Path) -> None:
    text = GOOD.replace("        artifact: adder\n        replicas: 2\n", "        pooled: true\n")
    path = _write(tmp_path, text.replace("        replicas: 2\n", "        replicas: 0\n"))
    assert any("pool process loads the model from its artifact" in p for p in _problems(path))

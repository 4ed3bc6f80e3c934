"""Pipeline descriptions: what parses, and each refusal naming its problem; the budget plan
(critical path, reserves, latency estimates) against hand-computed values."""

from __future__ import annotations

from typing import Any

import pytest

from clipper.errors import RegistryError
from clipper.inputs import InputType
from clipper.pipeline.plan import LatencyEstimate, StagePlan, critical_path, stage_deadline
from clipper.pipeline.spec import Const, Ref, check_against, parse_pipeline
from clipper.registry import Application, ModelVersion, Registry


def chain(*shares: Any) -> dict[str, Any]:
    stages: list[dict[str, Any]] = []
    prev = "$request"
    for i, share in enumerate(shares):
        name = "abcdefgh"[i]
        stages.append({"name": name, "model": f"m{name}", "input": prev, "budget": share})
        prev = f"${name}"
    return {"stages": stages}


def refused(doc: Any, *words: str) -> None:
    with pytest.raises(RegistryError) as e:
        parse_pipeline(doc)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_a_chain_parses_in_order_with_references_and_the_last_stage_as_output() -> None:
    p = parse_pipeline(
        {
            "stages": [
                {"name": "post", "model": "p", "input": {"s": "$score.value", "raw": "$request"}},
                {"name": "feat", "model": "f"},
                {"name": "score", "model": "s", "input": ["$feat", "$$lit", 3, None]},
            ]
        }
    )
    assert list(p.stages) == ["feat", "score", "post"]  # each after what it reads
    assert p.stages["feat"].input == Ref("request", ())
    assert p.stages["score"].input == [Ref("feat", ()), Const("$lit"), Const(3), Const(None)]
    assert p.stages["post"].deps == ("score",)
    assert p.sinks == ("post",) and p.output == Ref("post", ())
    assert p.succs == {"feat": ("score",), "score": ("post",), "post": ()}
    assert p.stages["feat"].on_miss == "fail" and p.stages["feat"].share is None


def test_several_last_stages_answer_an_object_by_stage_name() -> None:
    p = parse_pipeline({"stages": [{"name": "a", "model": "x"}, {"name": "b", "model": "y"}]})
    assert p.output == {"a": Ref("a", ()), "b": Ref("b", ())}


def test_miss_policies() -> None:
    p = parse_pipeline(
        {
            "stages": [
                {"name": "a", "model": "x", "default": {"v": 0}},
                {"name": "b", "model": "y", "optional": True},
                {"name": "c", "model": "z"},
            ]
        }
    )
    assert [s.on_miss for s in p.stages.values()] == ["default", "drop", "fail"]
    assert p.stages["a"].default == {"v": 0}
    refused(
        {"stages": [{"name": "a", "model": "x", "default": 1, "optional": True}]},
        "both 'default' and 'optional'",
    )


def test_duplicate_stage_names_are_refused() -> None:
    refused(
        {"stages": [{"name": "a", "model": "x"}, {"name": "a", "model": "y"}]},
        "duplicate stage name 'a'",
    )


def test_a_cycle_is_refused_and_named() -> None:
    refused(
        {
            "stages": [
                {"name": "a", "model": "x", "input": "$c"},
                {"name": "b", "model": "y", "input": "$a"},
                {"name": "c", "model": "z", "input": "$b"},
            ]
        },
        "cycle: a -> c -> b -> a",
    )
    refused({"stages": [{"name": "a", "model": "x", "input": "$a.f"}]}, "cycle: a -> a")


def test_references_to_unknown_stages_or_undeclared_fields_are_refused() -> None:
    refused({"stages": [{"name": "a", "model": "x", "input": "$nope"}]}, "no stage 'nope'")
    refused(
        {"stages": [{"name": "a", "model": "x"}], "output": {"k": ["$b"]}},
        "output refers to $b",
    )
    refused(
        {
            "stages": [
                {"name": "a", "model": "x", "fields": ["score"]},
                {"name": "b", "model": "y", "input": "$a.label"},
            ]
        },
        "$a.label",
        "declares only the fields ['score']",
    )
    refused({"stages": [{"name": "a", "model": "x", "input": "$a..b"}]}, "malformed")


def test_static_shares_over_one_on_a_path_are_refused() -> None:
    parse_pipeline(chain(0.2, 0.5, 0.3))  # exactly the whole SLO
    refused(chain(0.5, "auto", 0.6), "do not add up", "a -> b -> c", "sum to 1.1")
    # parallel branches each take their share of the same time
    parse_pipeline(
        {
            "stages": [
                {"name": "a", "model": "x", "budget": 0.7},
                {"name": "b", "model": "y", "budget": 0.7},
                {"name": "c", "model": "z", "input": ["$a", "$b"], "budget": 0.3},
            ]
        }
    )
    refused({"stages": [{"name": "a", "model": "x", "budget": 0}]}, "budget must be")
    refused({"stages": [{"name": "a", "model": "x", "budget": "fast"}]}, "budget must be")


def test_shape_errors_name_what_was_expected() -> None:
    refused([], "an object with 'stages'")
    refused({"stages": []}, "non-empty list")
    refused({"stages": [{"name": "a", "model": "x"}], "extra": 1}, "unknown keys ['extra']")
    refused({"stages": [{"name": "a", "model": "x", "modle": "y"}]}, "unknown keys ['modle']")
    refused({"stages": [{"name": "a"}]}, "exactly one of 'model'")
    refused({"stages": [{"name": "a", "model": "x", "app": "y"}]}, "exactly one of 'model'")
    refused({"stages": [{"name": "request", "model": "x"}]}, "not 'request'")
    refused({"stages": [{"name": "a.b", "model": "x"}]}, "stage #1 has name 'a.b'")


def registry_with(*models: str) -> Registry:
    r = Registry()
    for m in models:
        r.add_model(ModelVersion(m, "1", InputType.DOUBLES))
        r.set_model_version(m, "1")
    return r


def pipeline_app(name: str, doc: dict[str, Any]) -> Application:
    return Application(name, InputType.DOUBLES, "-1", 50_000, pipeline=doc)


def test_stages_must_name_models_and_selection_applications_that_exist() -> None:
    r = registry_with("ma", "mb")
    doc = chain("auto", "auto", "auto")
    with pytest.raises(RegistryError, match="names model 'mc', which does not exist"):
        r.add_app(pipeline_app("p", doc))
    assert "p" not in r.apps
    r.add_model(ModelVersion("mc", "1", InputType.DOUBLES))
    r.add_app(pipeline_app("p", doc))
    with pytest.raises(RegistryError, match="is a pipeline"):
        r.add_app(pipeline_app("q", {"stages": [{"name": "a", "app": "p"}]}))
    with pytest.raises(RegistryError, match="application 'zz', which does not exist"):
        r.add_app(pipeline_app("q", {"stages": [{"name": "a", "app": "zz"}]}))
    with pytest.raises(RegistryError, match="its stages name its models"):
        r.link("p", "ma")
    plain = Application("plain", InputType.DOUBLES, "-1", 50_000)
    r.add_app(plain)
    r.link("plain", "ma")
    with pytest.raises(RegistryError, match="unlink them first"):
        r.update_app("plain", pipeline=doc)
    assert r.apps["plain"].pipeline is None
    with pytest.raises(RegistryError, match="policy single"):
        Application("e", InputType.DOUBLES, "-1", 50_000, policy="exp4", pipeline=doc)
    p = r.apps["p"]
    assert p.stages is not None
    check_against("p", p.stages, r)


def test_a_pipeline_round_trips_through_the_store_records() -> None:
    r = registry_with("ma", "mb", "mc")
    r.add_app(pipeline_app("p", chain(0.2, "auto", 0.3)))
    records = r.records()
    assert records["app"]["p"]["pipeline"] == chain(0.2, "auto", 0.3)
    other = Registry()
    changes = other.apply_snapshot(records)
    assert any(c.kind == "app" and c.name == "p" for c in changes)
    got = other.apps["p"]
    assert got == r.apps["p"] and got.stages is not None
    assert list(got.stages.stages) == ["a", "b", "c"]
    assert other.records() == records
    # a plain application's record has no pipeline key (records written before are unchanged)
    other.add_app(Application("plain", InputType.DOUBLES, "-1", 50_000))
    assert "pipeline" not in other.records()["app"]["plain"]
    # taking the pipeline away is an update like any other
    r2 = r.copy()
    r2.update_app("p", pipeline=None)
    assert other.apply_snapshot(r2.records())[0].op == "update"
    assert other.apps["p"].stages is None


# -- the plan ---------------------------------------------------------------------------------


def test_latency_estimate_is_an_ewma_of_mean_and_deviation() -> None:
    e = LatencyEstimate(alpha=0.5)
    assert e.p90() == 0.0
    e.observe(0.010)
    assert e.mean == 0.010 and e.dev == 0.0
    e.observe(0.020)  # diff 0.010: mean 0.015, dev 0.005
    assert e.mean == pytest.approx(0.015) and e.dev == pytest.approx(0.005)
    e.observe(0.015)  # diff 0: mean stays, dev halves
    assert e.mean == pytest.approx(0.015) and e.dev == pytest.approx(0.0025)
    assert e.p90() == pytest.approx(0.015 + 1.2816 * 1.2533 * 0.0025)


def test_static_reserves_on_a_chain() -> None:
    p = parse_pipeline(chain(0.2, 0.5, 0.3))
    plan = StagePlan(p)
    w = plan.weights(0.050, lambda _: 0.0)
    assert w == pytest.approx({"a": 0.010, "b": 0.025, "c": 0.015})
    # each stage's deadline is the query's minus what the stages after it reserve
    assert plan.reserves(w) == pytest.approx({"a": 0.040, "b": 0.015, "c": 0.0})


def test_auto_weights_come_from_estimates_or_the_queue_then_an_even_share() -> None:
    p = parse_pipeline(chain("auto", "auto", 0.5))
    plan = StagePlan(p)
    hints = {"a": 0.004, "b": 0.0}
    w = plan.weights(0.060, lambda n: hints.get(n, 0.0))
    # a: its hint and 1 ms; b: not known, 60 ms / 3 stages; c: its static half
    assert w == pytest.approx({"a": 0.005, "b": 0.020, "c": 0.030})
    plan.estimates["b"].observe(0.008)
    plan.estimates["a"].observe(0.001)  # faster than its queue says now: the queue wins
    w = plan.weights(0.060, lambda n: hints.get(n, 0.0))
    assert w["b"] == pytest.approx(0.009) and w["a"] == pytest.approx(0.005)
    assert plan.reserves(w) == pytest.approx({"a": 0.039, "b": 0.030, "c": 0.0})
    plan.estimates["b"].mean = 0.0001  # fast now: the floor, 5% of the budget, stays reserved
    assert plan.weights(0.060, lambda _: 0.0)["b"] == pytest.approx(0.003)


def test_a_required_stage_gets_at_least_its_weight_and_never_past_the_query_deadline() -> None:
    end = 100.050
    assert stage_deadline(100.0, end, 0.020, 0.010, True) == pytest.approx(100.030)
    # reserves of slow stages after it would leave it 5 ms: a required stage gets its 10 ms
    assert stage_deadline(100.0, end, 0.045, 0.010, True) == pytest.approx(100.010)
    assert stage_deadline(100.045, end, 0.0, 0.010, True) == pytest.approx(end)  # capped
    # one that may degrade never takes the reserves of the stages after it
    assert stage_deadline(100.0, end, 0.045, 0.010, False) == pytest.approx(100.005)
    assert stage_deadline(100.020, end, 0.045, 0.010, False) < 100.020  # missed at once


def test_a_required_stage_may_take_the_reserve_of_a_stage_that_can_degrade() -> None:
    doc = chain(0.2, 0.5, 0.3)
    doc["stages"][1]["default"] = None  # b degrades when it misses
    plan = StagePlan(parse_pipeline(doc))
    w = plan.weights(0.050, lambda _: 0.0)
    # a: only c (required) is reserved after it; b still leaves c its 15 ms
    assert plan.reserves(w) == pytest.approx({"a": 0.015, "b": 0.015, "c": 0.0})


def test_critical_path_of_a_diamond() -> None:
    p = parse_pipeline(
        {
            "stages": [
                {"name": "src", "model": "x"},
                {"name": "fast", "model": "y", "input": "$src"},
                {"name": "slow", "model": "z", "input": "$src"},
                {"name": "join", "model": "w", "input": ["$fast", "$slow"]},
            ]
        }
    )
    weights = {"src": 0.001, "fast": 0.002, "slow": 0.010, "join": 0.003}
    total, path = critical_path(p, weights)
    assert path == ["src", "slow", "join"] and total == pytest.approx(0.014)
    plan = StagePlan(p)
    assert plan.reserves(weights) == pytest.approx(
        {"src": 0.013, "fast": 0.003, "slow": 0.003, "join": 0.0}
    )

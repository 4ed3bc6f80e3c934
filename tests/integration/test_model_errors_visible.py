"""A failing model is visible: a console warning (rate-limited), errors for V2 clients (REST 500,
gRPC INTERNAL with the model's message) unless the application asks for default outputs, and a
crashed replica reported as a replica failure, not a missed SLO."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from clipper import Clipper
from tests.integration import models
from tests.integration.helpers import post_json, predict_ok
from tests.integration.test_failures import metrics_json

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

SLO_US = 2_000_000
BOOM = "The model fragile raised an error: ValueError: boom: negative input"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[Clipper]:
    async with Clipper(grpc_port=0) as c:
        await c.deploy_model("fragile", "1", models.fragile_sums, input_type="doubles")
        for app in ("auto", "errors", "defaults"):
            await c.register_application(app, "doubles", "-1.0", SLO_US)
            await c.link_model_to_app(app, "fragile")
        await c.update_application("errors", on_model_error="error")
        await c.update_application("defaults", on_model_error="default")
        yield c


async def _v2(c: Clipper, app: str, rows: list[list[float]]) -> tuple[int, Any]:
    tensor = {"name": "input", "datatype": "FP64", "shape": [len(rows), len(rows[0])],
              "data": [v for r in rows for v in r]}  # fmt: skip
    resp = await post_json(f"{c.query_url}/v2/models/{app}/infer", {"inputs": [tensor]})
    return resp.status, resp.json()


async def test_v2_rest_answers_a_model_error_as_500_with_its_message(served: Clipper) -> None:
    status, doc = await _v2(served, "auto", [[1.0, 2.0], [-1.0, 2.0]])
    assert (status, doc) == (500, {"error": BOOM})
    status, doc = await _v2(served, "auto", [[1.0, 2.0]])
    assert status == 200 and doc["outputs"][0]["data"] == [3.0]
    # The application that asks for default outputs gets them, with the reason.
    status, doc = await _v2(served, "defaults", [[-1.0, 2.0]])
    assert status == 200 and doc["outputs"][0]["data"] == [-1.0]
    assert doc["parameters"] == {"default": True, "default_explanations": [BOOM]}


async def test_clipper_rest_keeps_the_default_output_unless_the_app_says_error(
    served: Clipper,
) -> None:
    doc = await predict_ok(served.query_url, "auto", {"input": [-1.0, 2.0]})
    assert doc["default"] is True and doc["default_explanation"] == BOOM
    resp = await post_json(f"{served.query_url}/errors/predict", {"input": [-1.0, 2.0]})
    assert resp.status == 500
    assert resp.json() == {"error": "Model error", "cause": BOOM}
    ok = await predict_ok(served.query_url, "errors", {"input": [1.0, 2.0]})
    assert ok["output"] == 3.0 and ok["default"] is False


@pytest.mark.skipif(
    importlib.util.find_spec("tritonclient") is None, reason="tritonclient is not installed"
)
async def test_grpc_answers_a_model_error_as_internal_with_its_message(served: Clipper) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    assert served.grpc is not None
    url = f"127.0.0.1:{served.grpc.port}"

    def infer(app: str, x: np.ndarray) -> Any:
        client = grpcclient.InferenceServerClient(url=url)
        try:
            inp = grpcclient.InferInput("input", list(x.shape), "FP64")
            inp.set_data_from_numpy(x)
            return client.infer(app, [inp]).as_numpy("output").tolist()
        except InferenceServerException as e:
            return e.status(), e.message()
        finally:
            client.close()

    bad = np.array([[-1.0, 2.0]])
    assert await asyncio.to_thread(infer, "auto", bad) == ("StatusCode.INTERNAL", BOOM)
    assert await asyncio.to_thread(infer, "defaults", bad) == [-1.0]
    assert await asyncio.to_thread(infer, "auto", np.array([[1.0, 2.0]])) == [3.0]


async def test_a_model_that_keeps_raising_warns_once_per_interval(
    served: Clipper, caplog: pytest.LogCaptureFixture
) -> None:
    """The first error of a version is said at once; a burst after it adds no line (the
    interval and the counts are tests/unit/test_model_error_log.py's)."""
    await served.deploy_model("brittle", "1", models.fragile_sums, input_type="doubles")
    await served.register_application("burst", "doubles", "-1.0", SLO_US)
    await served.link_model_to_app("burst", "brittle")
    with caplog.at_level(logging.WARNING, logger="clipper.models"):
        for i in range(5):
            doc = await predict_ok(served.query_url, "burst", {"input": [-1.0, float(i)]})
            assert doc["default"] is True
    lines = [r.getMessage() for r in caplog.records if r.name == "clipper.models"]
    assert lines == [
        "model brittle:1 raised an error (a batch of 1 answered with errors or defaults): "
        "ValueError: boom: negative input"
    ]
    metrics = await metrics_json(served)
    assert metrics['clipper_model_errors_total{model="brittle",version="1"}'] == 5


async def test_a_crashed_replica_is_a_replica_failure_not_a_missed_slo() -> None:
    async with Clipper() as c:
        await c.deploy_model("dying", "1", models.dies_on_negative, input_type="doubles")
        await c.register_application("app", "doubles", "-1.0", 500_000)
        await c.link_model_to_app("app", "dying")
        doc = await predict_ok(c.query_url, "app", {"input": [-1.0]})
        assert doc["default"] is True
        assert doc["default_explanation"] == (
            "No replica of model dying:1 is alive: the replica holding this query failed or "
            "left before answering"
        )
        # A selection policy's query, whose chosen models' replicas all crash with it.
        await asyncio.gather(
            c.deploy_model("d1", "1", models.dies_on_negative, input_type="doubles"),
            c.deploy_model("d2", "1", models.dies_on_negative, input_type="doubles"),
        )
        await c.register_application("pair", "doubles", "-1.0", 500_000, policy="exp4")
        await c.link_model_to_app("pair", "d1")
        await c.link_model_to_app("pair", "d2")
        doc = await predict_ok(c.query_url, "pair", {"input": [-1.0]})
        assert doc["default"] is True
        assert doc["default_explanation"] == (
            "No replica of a chosen model is alive: the replicas holding this query (d1, d2) "
            "failed or left before answering"
        )
        stats = await metrics_json(c)
        for app in ("app", "pair"):
            assert (
                stats[f'clipper_app_default_outputs_total{{app="{app}",reason="no_replica"}}'] == 1
            )
            assert f'clipper_app_default_outputs_total{{app="{app}",reason="slo"}}' not in stats


def _unservable(model: str, why: str) -> str:
    return f"The model {model} returned an output that cannot be served: {why}"


NOT_A_NUMBER = "output contains {} (JSON has no such number)"


async def test_outputs_that_cannot_be_served_are_model_errors_of_their_own_input(
    tmp_path: Any,
) -> None:
    """NaN, infinity, an object that is not JSON, an output over the size limit: each answers
    its own input with the default and the reason (never ``null`` or a repr), the other
    inputs of the batch are served, and a pipeline's next stage never sees such an output."""
    from tests.integration.pipeline_models import StageModel

    calls = tmp_path / "post-calls"
    async with Clipper(max_output_bytes=10_000) as c:
        await asyncio.gather(
            c.deploy_model("hostile", "1", models.hostile_outputs, input_type="doubles"),
            c.deploy_model("nanfeat", "1", models.nan_features, input_type="json"),
            c.deploy_model("post", "1", StageModel("post", calls=str(calls)), input_type="json"),
        )
        await c.register_application("outs", "doubles", "-1.0", SLO_US)
        await c.link_model_to_app("outs", "hostile")
        cases = {
            0.0: NOT_A_NUMBER.format("NaN"),
            1.0: NOT_A_NUMBER.format("Infinity"),
            2.0: "output is not JSON: Type is not JSON serializable: _Opaque",
            4.0: NOT_A_NUMBER.format("NaN"),
        }
        for first, why in cases.items():
            resp = await post_json(f"{c.query_url}/outs/predict", {"input": [first, 0.0]})
            assert (
                resp.status == 200 and b"0x" not in resp.body and b"_Opaque object" not in resp.body
            )
            doc = resp.json()
            assert doc["output"] == -1.0 and doc["default"] is True, doc
            assert doc["default_explanation"] == _unservable("hostile", why)
        doc = await predict_ok(c.query_url, "outs", {"input": [3.0, 20_000.0]})
        assert doc["default"] is True and doc["default_explanation"] == _unservable(
            "hostile",
            "output is 20002 bytes, over the limit of 10000 bytes per output (max_output_bytes)",
        )
        doc = await predict_ok(c.query_url, "outs", {"input": [3.0, 9_000.0]})
        assert doc["default"] is False and doc["output"] == "x" * 9_000
        # One bad input in a request does not take the others with it.
        doc = await predict_ok(
            c.query_url, "outs", {"input_batch": [[0.0, 0.0], [5.0, 1.0], [2.0, 0.0]]}
        )
        got = [(p["output"], p["default"]) for p in doc["batch_predictions"]]
        assert got == [(-1.0, True), (6.0, False), (-1.0, True)]
        metrics = await metrics_json(c)
        assert metrics['clipper_model_errors_total{model="hostile",version="1"}'] >= 6

        spec = {"stages": [
            {"name": "feat", "model": "nanfeat"},
            {"name": "post", "model": "post",
             "input": {"name": "$request.name", "score": "$feat.vec"}},
        ]}  # fmt: skip
        await c.register_application("chain", "json", '"none"', SLO_US, pipeline=spec)
        doc = await predict_ok(c.query_url, "chain", {"input": {"x": [-1.0], "name": "a"}})
        assert doc["output"] == "none" and doc["default"] is True, doc
        assert "nanfeat" in doc["default_explanation"]
        assert NOT_A_NUMBER.format("NaN") in doc["default_explanation"]
        assert not calls.exists()  # the next stage never received it
        doc = await predict_ok(c.query_url, "chain", {"input": {"x": [1.0], "name": "b"}})
        assert doc["output"] == "b:[2.0]" and doc["default"] is False
        assert calls.read_text().splitlines() == ["call"]

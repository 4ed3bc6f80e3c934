"""The query REST API end to end: HTTP -> parse -> cache -> scheduler -> real containers.

One frontend serves every test of this module (containers take a while to start); each test
uses its own application or inputs, so the tests do not depend on one another's order.
Compatibility spec: clipper-original.md section 2.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import pytest_asyncio

from clipper import BatchingConfig, Clipper
from clipper.query.prediction import NO_MODELS
from tests.integration import models
from tests.integration.helpers import predict, predict_ok, request

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MAX_BODY = 4096
SLO_US = 2_000_000  # generous: these tests are about answers, not latency

# app -> (input type, model name, model)
DEPLOYED: dict[str, tuple[str, str, Any]] = {
    "dbl": ("doubles", "describe-d", models.describe_numeric),
    "flt": ("floats", "describe-f", models.describe_numeric),
    "int": ("integers", "describe-i", models.describe_numeric),
    "str": ("strings", "shout", models.shout),
    "byt": ("bytes", "bytes-info", models.bytes_info),
    "jsn": ("json", "json-echo", models.JsonEcho()),
    "nonce": ("doubles", "nonce", models.with_nonce),
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clipper() -> AsyncIterator[Clipper]:
    async with Clipper(query_port=0, rpc_port=0, admin_port=0, max_body_bytes=MAX_BODY) as c:
        batching = BatchingConfig(max_wait_micros=2000)
        await asyncio.gather(
            *(
                c.deploy_model(name, "1", model, input_type=itype, batching=batching)
                for itype, name, model in DEPLOYED.values()
            ),
            c.deploy_model("versioned", "1", models.version_one, input_type="doubles"),
        )
        for app, (itype, name, _) in DEPLOYED.items():
            await c.register_application(app, itype, "-1.0", SLO_US)
            await c.link_model_to_app(app, name)
        await c.register_application("nonce-uncached", "doubles", "-1.0", SLO_US, cache=False)
        await c.link_model_to_app("nonce-uncached", "nonce")
        await c.register_application("ver", "doubles", "-1.0", SLO_US)
        await c.link_model_to_app("ver", "versioned")
        # v2 becomes current once its replica is connected.
        await c.deploy_model(
            "versioned", "2", models.version_two, input_type="doubles", retire_previous=False
        )
        await c.register_application("lonely", "doubles", "-1.0", SLO_US)
        await c.register_application("lonely-obj", "doubles", '{"label": "none"}', SLO_US)
        await c.register_application("lonely-str", "strings", "not available", SLO_US)
        yield c


def assert_single(doc: Any, output: Any) -> None:
    """A model-answered single response: exactly these keys, in the original's shape."""
    assert set(doc) == {"query_id", "output", "default"}, doc
    assert type(doc["query_id"]) is int
    assert doc["default"] is False
    assert doc["output"] == output


async def metrics_json(c: Clipper) -> dict[str, float]:
    resp = await request(f"{c.query_url}/metrics", headers={"Accept": "application/json"})
    assert resp.status == 200
    doc: dict[str, float] = resp.json()
    return doc


# -- predict: single and batch ------------------------------------------------------------------


async def test_single_predict_response_shape(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "dbl", {"input": [1.5, 2.5, -3.0]})
    assert_single(doc, {"dtype": "float64", "values": [1.5, 2.5, -3.0]})


async def test_query_ids_increase(clipper: Clipper) -> None:
    first = await predict_ok(clipper.query_url, "dbl", {"input": [10.0]})
    second = await predict_ok(clipper.query_url, "dbl", {"input": [11.0]})
    assert second["query_id"] > first["query_id"] >= 0


async def test_batch_predictions_in_input_order(clipper: Clipper) -> None:
    rows = [[float(i), float(i) / 4] for i in range(7)] + [[1.0], [2.0, 3.0, 4.0]]  # ragged too
    doc = await predict_ok(clipper.query_url, "dbl", {"input_batch": rows})
    assert set(doc) == {"batch_predictions"}
    preds = doc["batch_predictions"]
    assert len(preds) == len(rows)
    for pred, row in zip(preds, rows, strict=True):
        assert_single(pred, {"dtype": "float64", "values": row})
    ids = [p["query_id"] for p in preds]
    assert len(set(ids)) == len(ids)


async def test_one_element_batch_returns_the_bare_object(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "dbl", {"input_batch": [[7.25, 8.0]]})
    assert_single(doc, {"dtype": "float64", "values": [7.25, 8.0]})


async def test_trailing_slash_and_query_string_are_accepted(clipper: Clipper) -> None:
    for path in ("/dbl/predict/", "/dbl/predict?trace=1"):
        resp = await request(f"{clipper.query_url}{path}", "POST", b'{"input": [0.75]}')
        assert resp.status == 200, (path, resp.body)
        assert_single(resp.json(), {"dtype": "float64", "values": [0.75]})


async def test_input_wins_over_input_batch(clipper: Clipper) -> None:
    doc = await predict_ok(
        clipper.query_url, "dbl", {"input": [42.0], "input_batch": [[1.0], [2.0]]}
    )
    assert_single(doc, {"dtype": "float64", "values": [42.0]})


# -- each input type through a real container -----------------------------------------------


async def test_doubles_accept_integer_literals(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "dbl", {"input": [1, 2, 3]})
    assert_single(doc, {"dtype": "float64", "values": [1.0, 2.0, 3.0]})


async def test_floats(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "flt", {"input_batch": [[0.5, 0.25], [3, -1.5]]})
    preds = doc["batch_predictions"]
    assert_single(preds[0], {"dtype": "float32", "values": [0.5, 0.25]})
    assert_single(preds[1], {"dtype": "float32", "values": [3.0, -1.5]})


async def test_integers(clipper: Clipper) -> None:
    big = 2**31 - 1
    doc = await predict_ok(clipper.query_url, "int", {"input": [1, -2, big]})
    assert_single(doc, {"dtype": "int32", "values": [1, -2, big]})


async def test_strings(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "str", {"input_batch": ["héllo wörld", "", "ok"]})
    outs = [p["output"] for p in doc["batch_predictions"]]
    assert outs == [
        {"type": "str", "upper": "HÉLLO WÖRLD", "len": 11},
        {"type": "str", "upper": "", "len": 0},
        {"type": "str", "upper": "OK", "len": 2},
    ]


async def test_bytes_arrive_raw(clipper: Clipper) -> None:
    raw = bytes([0, 1, 2, 254, 255]) + b"\x00tail"
    doc = await predict_ok(clipper.query_url, "byt", {"input": base64.b64encode(raw).decode()})
    assert_single(doc, {"type": "bytes", "len": len(raw), "hex": raw.hex()})


async def test_json_inputs_arrive_as_python_values(clipper: Clipper) -> None:
    values: list[Any] = [{"a": [1, 2], "b": None}, [1, "x", True], "text", 3.5, 7, None, False]
    doc = await predict_ok(clipper.query_url, "jsn", {"input_batch": values})
    outs = [p["output"] for p in doc["batch_predictions"]]
    expected_types = ["dict", "list", "str", "float", "int", "NoneType", "bool"]
    assert outs == [{"type": t, "value": v} for t, v in zip(expected_types, values, strict=True)]


async def test_model_outputs_are_embedded_as_json(clipper: Clipper) -> None:
    resp = await predict(clipper.query_url, "dbl", {"input": [0.125]})
    # The output is a JSON object inside the response, not a string holding JSON.
    assert b'"output":{"dtype":"float64","values":[0.125]}' in resp.body


# -- defaults --------------------------------------------------------------------------------


async def test_no_linked_model_answers_the_default(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "lonely", {"input": [1.0]})
    assert set(doc) == {"query_id", "output", "default", "default_explanation"}
    assert doc["default"] is True
    assert doc["default_explanation"] == NO_MODELS == "No connected models found for query"
    # default_output "-1.0" is embedded as the JSON number -1.0.
    assert doc["output"] == -1.0
    assert type(doc["output"]) is float


async def test_default_outputs_are_embedded_as_json_or_kept_as_strings(clipper: Clipper) -> None:
    obj = await predict_ok(clipper.query_url, "lonely-obj", {"input_batch": [[1.0], [2.0]]})
    for pred in obj["batch_predictions"]:
        assert pred["default"] is True
        assert pred["output"] == {"label": "none"}
    text = await predict_ok(clipper.query_url, "lonely-str", {"input": "hi"})
    assert text["output"] == "not available"
    assert text["default"] is True


# -- bad requests ----------------------------------------------------------------------------

BAD_REQUESTS = [
    # (app, body, expected error, substrings of the cause)
    pytest.param(
        "dbl",
        b'{"input": [1.0, 2.0',
        "Json error",
        ["Error parsing JSON", "Expected JSON schema", '{"input": [number, ...]}'],
        id="malformed-json",
    ),
    pytest.param(
        "dbl",
        b"[1.0, 2.0]",
        "Json error",
        ["must be a JSON object", "Expected JSON schema"],
        id="not-an-object",
    ),
    pytest.param(
        "dbl",
        b'{"input": "1.0, 2.0"}',
        "Json error",
        ["array of numbers", "got a string", "input type doubles"],
        id="string-for-doubles",
    ),
    pytest.param(
        "dbl",
        b'{"input": [1.0, "2.0"]}',
        "Json error",
        ["array element a string is not of type numbers", "input type doubles"],
        id="string-element-for-doubles",
    ),
    pytest.param(
        "dbl",
        b'{"input": [[1.0], [2.0]]}',
        "Json error",
        ["array element an array is not of type numbers"],
        id="nested-array-for-doubles",
    ),
    pytest.param("dbl", b'{"input": []}', "Json error", ["input array is empty"], id="empty-array"),
    pytest.param(
        "int",
        b'{"input": [1, 2.5]}',
        "Json error",
        ["array element number 2.5 is not of type integers", "input type integers"],
        id="float-for-integers",
    ),
    pytest.param(
        "int",
        b'{"input": [4294967296]}',
        "Json error",
        ["out of range for 32-bit integers"],
        id="integer-overflow",
    ),
    pytest.param(
        "int",
        b'{"input": [1, true]}',
        "Json error",
        ["is not of type integers", "input type integers"],
        id="boolean-for-integers",
    ),
    pytest.param(
        "dbl",
        b'{"input": [false, 1.0]}',
        "Json error",
        ["is not of type numbers", "input type doubles"],
        id="boolean-for-doubles",
    ),
    pytest.param(
        "str",
        b'{"input": ["a", "b"]}',
        "Json error",
        ["input must be a string, got an array", "input type strings"],
        id="array-for-strings",
    ),
    pytest.param(
        "byt",
        b'{"input": "not base64!"}',
        "Json error",
        ["not valid base64", "input type bytes"],
        id="bad-base64",
    ),
    pytest.param(
        "dbl",
        b'{"inputs": [1.0]}',
        "Json error",
        ["does not have required keys input or input_batch", "Expected JSON schema"],
        id="missing-keys",
    ),
    pytest.param(
        "dbl",
        b'{"input_batch": []}',
        "Json error",
        ['"input_batch" must be a non-empty array'],
        id="empty-input-batch",
    ),
    pytest.param(
        "dbl",
        b'{"input_batch": [[1.0], "x"]}',
        "Json error",
        ["got a string"],
        id="bad-batch-item",
    ),
    pytest.param(
        "dbl",
        b'{"input": [1.0], "version": 1}',
        "Json error",
        ['"version" must be a string'],
        id="version-not-a-string",
    ),
]


@pytest.mark.parametrize(("app", "body", "error", "cause_parts"), BAD_REQUESTS)
async def test_bad_requests_get_400_with_a_cause(
    clipper: Clipper, app: str, body: bytes, error: str, cause_parts: list[str]
) -> None:
    resp = await request(f"{clipper.query_url}/{app}/predict", "POST", body)
    assert resp.status == 400, resp.body
    assert resp.headers["content-type"] == "application/json"
    doc = resp.json()
    assert set(doc) == {"error", "cause"}
    assert doc["error"] == error
    for part in cause_parts:
        assert part in doc["cause"], (part, doc["cause"])


async def test_bad_request_does_not_break_the_app(clipper: Clipper) -> None:
    bad = await request(f"{clipper.query_url}/dbl/predict", "POST", b"{oops")
    assert bad.status == 400
    doc = await predict_ok(clipper.query_url, "dbl", {"input": [5.5]})
    assert_single(doc, {"dtype": "float64", "values": [5.5]})


async def test_unknown_app_is_404(clipper: Clipper) -> None:
    resp = await predict(clipper.query_url, "no-such-app", {"input": [1.0]})
    assert resp.status == 404
    doc = resp.json()
    assert doc["error"] == "Not found"
    assert "no-such-app" in doc["cause"]
    assert "dbl" not in doc["cause"]  # the query port does not list the other applications


async def test_unknown_route_is_404(clipper: Clipper) -> None:
    resp = await request(f"{clipper.query_url}/dbl/explode", "POST", b"{}")
    assert resp.status == 404
    assert "expected POST /<app>/predict" in resp.json()["cause"]


async def test_oversized_body_is_413(clipper: Clipper) -> None:
    big = orjson.dumps({"input": [0.5] * (MAX_BODY // 2)})
    assert len(big) > MAX_BODY
    resp = await request(f"{clipper.query_url}/dbl/predict", "POST", big)
    assert resp.status == 413
    doc = resp.json()
    assert doc["error"] == "Payload too large"
    assert f"exceeds the limit of {MAX_BODY} bytes" in doc["cause"]
    # Just under the limit is served.
    ok = orjson.dumps({"input": [0.5] * 100})
    assert len(ok) < MAX_BODY
    doc = await predict_ok(clipper.query_url, "dbl", orjson.loads(ok))
    assert doc["output"]["values"] == [0.5] * 100


# -- versions --------------------------------------------------------------------------------


async def test_current_version_answers_by_default(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "ver", {"input": [1.0, 2.0]})
    assert_single(doc, {"version": 2, "sum": 3.0})


async def test_version_pinning(clipper: Clipper) -> None:
    v1 = await predict_ok(clipper.query_url, "ver", {"input": [1.0, 2.0], "version": "1"})
    assert_single(v1, {"version": 1, "sum": 3.0})
    batch = await predict_ok(
        clipper.query_url, "ver", {"input_batch": [[1.0], [4.0]], "version": "1"}
    )
    assert [p["output"] for p in batch["batch_predictions"]] == [
        {"version": 1, "sum": 1.0},
        {"version": 1, "sum": 4.0},
    ]
    v2 = await predict_ok(clipper.query_url, "ver", {"input": [1.0, 2.0], "version": "2"})
    assert_single(v2, {"version": 2, "sum": 3.0})


async def test_unknown_version_is_400(clipper: Clipper) -> None:
    resp = await predict(clipper.query_url, "ver", {"input": [1.0], "version": "9"})
    assert resp.status == 400
    assert resp.json() == {
        "error": "Query processing error",
        "cause": "Requested version: 9 does not exist for model: versioned",
    }


# -- cache -----------------------------------------------------------------------------------


async def test_cache_answers_a_repeated_input(clipper: Clipper) -> None:
    before = clipper.cache.stats.hits
    metric = 'clipper_cache_hits_total{model="nonce",version="1"}'
    hits_before = (await metrics_json(clipper)).get(metric, 0.0)
    first = await predict_ok(clipper.query_url, "nonce", {"input": [3.0, 0.5]})
    second = await predict_ok(clipper.query_url, "nonce", {"input": [3.0, 0.5]})
    assert first["default"] is False
    assert first["output"]["sum"] == 3.5
    assert second["output"] == first["output"]  # same nonce: not evaluated again
    assert second["query_id"] != first["query_id"]
    assert clipper.cache.stats.hits == before + 1
    assert (await metrics_json(clipper))[metric] == hits_before + 1


async def test_cache_off_evaluates_every_time(clipper: Clipper) -> None:
    first = await predict_ok(clipper.query_url, "nonce-uncached", {"input": [9.0]})
    second = await predict_ok(clipper.query_url, "nonce-uncached", {"input": [9.0]})
    assert first["output"]["sum"] == second["output"]["sum"] == 9.0
    assert first["output"]["nonce"] != second["output"]["nonce"]


async def test_identical_inputs_in_one_batch_share_one_evaluation(clipper: Clipper) -> None:
    doc = await predict_ok(clipper.query_url, "nonce", {"input_batch": [[6.0], [6.0], [7.0]]})
    a, b, c = (p["output"] for p in doc["batch_predictions"])
    assert a == b
    assert a["sum"] == 6.0
    assert c["sum"] == 7.0
    assert c["nonce"] != a["nonce"]


# -- health and metrics ----------------------------------------------------------------------


async def test_health(clipper: Clipper) -> None:
    resp = await request(f"{clipper.query_url}/health")
    assert resp.status == 200
    assert resp.json() == {"status": "ok"}


async def test_metrics_prometheus_text(clipper: Clipper) -> None:
    await predict_ok(clipper.query_url, "dbl", {"input": [123.0]})
    resp = await request(f"{clipper.query_url}/metrics")
    assert resp.status == 200
    assert resp.headers["content-type"].startswith("text/plain")
    text = resp.body.decode()
    assert "# TYPE clipper_app_requests_total counter" in text
    assert 'clipper_app_requests_total{app="dbl"}' in text
    assert "# TYPE clipper_model_batch_size histogram" in text
    assert 'clipper_model_batch_size_count{model="describe-d",version="1"}' in text


async def test_metrics_json(clipper: Clipper) -> None:
    await predict_ok(clipper.query_url, "lonely", {"input": [1.0]})
    resp = await request(f"{clipper.query_url}/metrics", headers={"Accept": "application/json"})
    assert resp.status == 200
    assert resp.headers["content-type"] == "application/json"
    doc = resp.json()
    assert doc['clipper_app_requests_total{app="lonely"}'] >= 1
    assert doc['clipper_app_default_outputs_total{app="lonely",reason="no_model"}'] >= 1
    assert any(k.startswith("clipper_model_batch_size_count{") for k in doc)

"""Seeded fuzzing of the query port: malformed request lines, headers, bodies and JSON shapes
against Clipper predict and V2 infer, with good queries interleaved.

Every malformed request gets one 4xx with a JSON body, or (framing errors the parser cannot
read past) a closed connection; never a 5xx, never a hang. The server stays up and the good
queries keep their correct answers. Bounded: CASES cases from a fixed seed, each on its own
connection with a read limit, well under 30 s in all.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import pytest

from clipper.config import BatchingConfig
from clipper.server import Clipper
from tests.integration import models
from tests.integration.helpers import predict, request

pytestmark = pytest.mark.timeout(90)

SEED = 20240610
CASES = 300
GOOD_EVERY = 10
LIMIT_S = 5.0
APP = "sums"


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    data: bytes
    may_pass: bool = False  # a mutation may happen to stay valid: 200 is then fine too


def _req(method: bytes, path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"%s %s HTTP/1.1\r\nHost: fuzz\r\nContent-Length: %d\r\n%s\r\n%s" % (
        method,
        path,
        len(body),
        extra,
        body,
    )


def _junk(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def _request_line(rng: random.Random) -> Case:
    lines = [
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"G\x00T / HTTP/1.1\r\n\r\n",
        b"GET /he alth HTTP/1.1\r\n\r\n",
        b" / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\n\r\n",
        b"GET /\x7f\x01 HTTP/1.1\r\n\r\n",
        _junk(rng, rng.randrange(1, 80)) + b"\r\n\r\n",
        b"POST /%s/predict HTTP/1.0\r\n\r\n" % _junk(rng, 5).hex().encode(),
    ]
    return Case("request line", rng.choice(lines))


def _headers(rng: random.Random) -> Case:
    body = b'{"input": [1.0, 2.0]}'
    bad = [
        b"NoColonHere\r\n",
        b"Bad Name: x\r\n",
        b"X-Ctl: a\x00b\r\n",
        b"Content-Length: abc\r\n",
        b"Content-Length: -1\r\n",
        b"Content-Length: 5\r\nContent-Length: 7\r\n",
        b"Transfer-Encoding: gzip, chunked, identity\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b": empty-name\r\n",
        _junk(rng, rng.randrange(1, 40)).replace(b"\r", b"").replace(b"\n", b"") + b"\r\n",
    ]
    head = b"POST /%s/predict HTTP/1.1\r\nHost: fuzz\r\n" % APP.encode()
    return Case(
        "headers", head + rng.choice(bad) + b"Content-Length: %d\r\n\r\n" % len(body) + body
    )


def _bodies(rng: random.Random) -> Case:
    path = rng.choice([b"/sums/predict", b"/v2/models/sums/infer"])
    chunked = b"POST %s HTTP/1.1\r\nHost: fuzz\r\nTransfer-Encoding: chunked\r\n\r\n" % path
    cases = [
        chunked + b"zz\r\nhello\r\n0\r\n\r\n",
        chunked + b"5\r\nhelloXX0\r\n\r\n",
        chunked + b"-1\r\n\r\n",
        _req(b"POST", path, _junk(rng, rng.randrange(0, 200))),
        _req(b"POST", path, b""),
        _req(b"POST", path, b"\xff\xfe" + b"{}"),
        _req(b"POST", path, b"{}" * 3),
    ]
    return Case("body", rng.choice(cases))


def _json_value(rng: random.Random, depth: int = 0) -> object:
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.choice([0, -1, 2**63, -(2**63), rng.randrange(-1000, 1000)])
    if kind == "float":
        return rng.choice([0.5, -1e308, 1e-300, rng.random()])
    if kind == "str":
        return rng.choice(["", "x", "\u2603", "1.0", "[1]"])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(["input", "inputs", "x", "shape"]): _json_value(rng, depth + 1)}


def _predict_json(rng: random.Random) -> Case:
    invalid: list[object] = [
        _json_value(rng) if rng.random() < 0.5 else [1, 2],
        {},
        {"input": rng.choice(["text", None, {"a": 1}, [[1.0], 2.0], [], ["1.0"]])},
        {"input_batch": rng.choice([[], "x", [[1.0], "y"], [None], {"a": 1}])},
        {"input": [1.0], "version": rng.choice([1, [], {}])},
        {"input_batch": [[1.0]] * 5000},  # over the fuzz frontend's max_items_per_request
        {"inputs": [{"name": "x"}]},
    ]
    doc = rng.choice(invalid)
    if doc == [1, 2] or not isinstance(doc, dict) or not doc:
        doc = doc if not isinstance(doc, dict) else {"nope": doc}
    return Case("predict json", _req(b"POST", b"/sums/predict", orjson.dumps(doc)))


def _v2_json(rng: random.Random) -> Case:
    tensor: dict[str, object] = {
        "name": "x",
        "shape": [1, 2],
        "datatype": "FP64",
        "data": [1.0, 2.0],
    }
    mutation = rng.choice(["shape", "datatype", "data", "name", "inputs", "outputs", "params"])
    if mutation == "shape":
        tensor["shape"] = rng.choice([[], [0, 2], [-1, 2], [2, 2], "1,2", [1.5, 2], [10**6, 1]])
    elif mutation == "datatype":
        tensor["datatype"] = rng.choice(["FP65", "BYTES", 7, None, "fp64"])
    elif mutation == "data":
        tensor["data"] = rng.choice([[1.0], [1.0, "a"], "12", None, [[1.0, 2.0, 3.0]], [True, 1]])
    elif mutation == "name":
        tensor["name"] = rng.choice([None, 5, ["x"]])
    elif mutation == "params":
        tensor["parameters"] = rng.choice([{"binary_data_size": 99}, {"binary_data_size": -1}, "p"])
    doc: dict[str, object] = {"inputs": [tensor]}
    if mutation == "inputs":
        doc = rng.choice([{"inputs": []}, {"inputs": [tensor, tensor]}, {"inputs": "x"}, {}])
    elif mutation == "outputs":
        doc["outputs"] = rng.choice([[{"name": "nope"}], "x", [{"name": 5}]])
    extra = b""
    if rng.random() < 0.15:
        extra = b"Inference-Header-Content-Length: %s\r\n" % rng.choice([b"abc", b"99999", b"-3"])
    return Case("v2 json", _req(b"POST", b"/v2/models/sums/infer", orjson.dumps(doc), extra))


def _mutated(rng: random.Random) -> Case:
    body = bytearray(orjson.dumps({"input": [1.0, 2.0]}))
    for _ in range(rng.randrange(1, 4)):
        body[rng.randrange(len(body))] = rng.randrange(256)
    path = rng.choice([b"/sums/predict", b"/nosuchapp/predict", b"/v2/models/sums/infer"])
    return Case("mutated body", _req(b"POST", path, bytes(body)), may_pass=True)


GENERATORS: list[Callable[[random.Random], Case]] = [
    _request_line, _headers, _bodies, _predict_json, _v2_json, _mutated,
]  # fmt: skip


async def _send(port: int, case: Case) -> tuple[int | None, bytes]:
    """(status, body) of the first response, or (None, b"") when the server closed first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(case.data)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), LIMIT_S)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return None, b""
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r")[0])
        body = await asyncio.wait_for(reader.readexactly(length), LIMIT_S)
        return int(head.split(b" ")[1]), body
    finally:
        writer.close()


async def test_fuzzed_requests_get_4xx_json_and_good_queries_stay_correct() -> None:
    rng = random.Random(SEED)
    async with Clipper(
        query_port=0, rpc_port=0, admin_port=0, max_items_per_request=1000,
        body_timeout_s=0.5, header_timeout_s=0.5,
    ) as c:  # fmt: skip
        await c.deploy_model(
            APP, "1", models.row_sums, input_type="doubles",
            batching=BatchingConfig(max_wait_micros=0),
        )  # fmt: skip
        await c.register_application(APP, "doubles", "-1.0", 1_000_000, cache=False)
        await c.link_model_to_app(APP, APP)
        t0 = time.monotonic()
        seen: dict[str, int] = {}
        for i in range(CASES):
            case = rng.choice(GENERATORS)(rng)
            status, body = await _send(c.http.port, case)
            key = f"{case.kind}: {status}"
            seen[key] = seen.get(key, 0) + 1
            if status is not None:
                ok = 400 <= status < 500 or (case.may_pass and status == 200)
                assert ok, (case, status, body)
                assert isinstance(orjson.loads(body), dict), (case, body)
            if i % GOOD_EVERY == 0:
                x = float(i)
                good = await predict(c.query_url, APP, {"input": [x, 0.5]}, limit_s=LIMIT_S)
                doc = good.json()
                assert (good.status, doc["default"], doc["output"]) == (200, False, x + 0.5), doc
        health = await request(c.query_url + "/health", limit_s=LIMIT_S)
        assert health.status == 200
        assert time.monotonic() - t0 < 30.0, seen

"""The doubles fast path (simdjson straight to the wire's doubles) against the general path
(orjson, then struct): for every body, valid or not, the same payloads reach the replica and
the same answers or errors reach the client."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from clipper.errors import RequestError
from clipper.frontend.fast_input import DoublesReader
from tests.unit.test_deadlines import Answers, Frontend, frontends, single_app  # noqa: F401

pytestmark = pytest.mark.skipif(not DoublesReader().available, reason="simdjson not installed")

BODIES = [
    b'{"input": [1.5, 2, -3e-2, 0]}',
    b'{"input":[9007199254740993, 1e308, -0.0]}',
    b'{"input": [1.0], "uid": 7, "version": "1"}',
    b'{"uid": "u", "input": [4.25]}',
    # taken by the general path, which has the exact errors
    b'{"input": [1, [2], 3]}',
    b'{"input": [[1, 2], 3]}',
    b'{"input": [1, "a"]}',
    b'{"input": [1, true]}',
    b'{"input": []}',
    b'{"input": [1e400]}',
    b'{"input": [1], "input": [2]}',
    b'{"input": [1], "extra": {"a": 1}}',
    b'{"input": [1], "uid": true}',
    b'{"input": [1], "uid": {"a": 1}}',
    b'{"input": [1], "version": 3}',
    b'{"input": "[1, 2]"}',
    b'{"input": {"a": [1]}}',
    b'{"input": [1, 2]',
    b"[1, 2]",
    b'{"input_batch": [[1], [2]]}',
    b'{"input": [1, 2]} trailing',
]


def test_the_reader_takes_only_the_plain_one_input_shape() -> None:
    r = DoublesReader()
    assert r.read(b'{"input": [1, 2.5]}') == (struct.pack("<2d", 1.0, 2.5), None, None)
    assert r.read(b'{"input": [1], "uid": 7, "version": "v"}') == (struct.pack("<d", 1.0), "v", 7)
    for body in BODIES[4:]:
        assert r.read(body) is None, body


def _run(f: Frontend, body: bytes) -> tuple[Any, ...]:
    answers = Answers(f.clock)
    try:
        f.predict("app", body, answers)
    except RequestError as e:
        return ("error", e.status, str(e))
    sent = [p for _, _, payloads in f.transport.sent for p in payloads]
    f.transport.sent.clear()
    f.replicas["m"].in_flight.clear()
    return ("sent", sent)


def test_both_paths_send_the_same_payloads_and_raise_the_same_errors(
    frontends: list[Frontend],  # noqa: F811
) -> None:
    fast, general = Frontend(single_app(), ["m"]), Frontend(single_app(), ["m"])
    frontends += [fast, general]
    general.parser._doubles = DoublesReader.__new__(DoublesReader)
    general.parser._doubles._parser = None  # as without simdjson
    assert not general.parser._doubles.available
    for body in BODIES:
        assert _run(fast, body) == _run(general, body), body


def test_the_item_counter_reads_batch_lengths_from_the_tape() -> None:
    from clipper.frontend.fast_input import ItemCounter

    counter = ItemCounter()
    assert counter.batch_items(b'{"input_batch": [[1], [2], [3]], "uid": 1}') == 3
    assert counter.batch_items(b'{"input": [1.0]}') is None
    assert counter.batch_items(b"[1, 2]") is None
    with pytest.raises(ValueError, match="more than once"):
        counter.batch_items(b'{"input_batch": [1], "input_batch": [1, 2]}')
    with pytest.raises(ValueError):
        counter.batch_items(b'{"input_batch": [1, ')
    doc = b'{"inputs": [{"name": "x", "shape": [5000, 2], "data": []}]}'
    assert counter.v2_rows(doc) == ("x", 5000)
    assert counter.v2_rows(b'{"inputs": [{"name": "x", "shape": "no"}]}') is None

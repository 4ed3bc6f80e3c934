"""Traces without processes: the W3C ``traceparent`` parse, the ``OTEL_*`` settings, the
sampling decisions (a sampled parent is traced at any ratio, an unsampled one never, a request
without one at the ratio), the batch spans the scheduler makes (on the fake clock), the
traceparent in the FAST predict meta, and the container's predict span. Spans go to the SDK's
in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from clipper.clock import FakeClock
from clipper.container.predict_trace import PredictTraces
from clipper.errors import ConfigError
from clipper.inputs import InputType
from clipper.rpc import wire
from clipper.tracing import (
    TraceParent,
    Tracer,
    TraceSettings,
    format_traceparent,
    hooks,
    parse_traceparent,
)
from clipper.tracing.context import sampled
from tests.unit.test_scheduler import Harness, fixed

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = f"00-{TRACE}-{PARENT}-01"
UNSAMPLED = f"00-{TRACE}-{PARENT}-00"


# -- traceparent -----------------------------------------------------------------------------
def test_a_valid_traceparent_gives_its_ids_and_flags() -> None:
    tp = parse_traceparent(SAMPLED)
    assert tp == TraceParent(int(TRACE, 16), int(PARENT, 16), 1)
    assert tp.sampled
    unsampled = parse_traceparent(UNSAMPLED.encode())  # header bytes, as the HTTP server has them
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        SAMPLED.upper(),  # hex is lowercase
        f"00-{'0' * 32}-{PARENT}-01",  # an all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # an all-zero parent id
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE[:-1]}-{PARENT}-01",
        f"00-{TRACE}-{PARENT}-1",
        f"00-{TRACE}-{PARENT}-zz",
        b"\xff\xfe",
    ],
)
def test_a_malformed_traceparent_is_ignored(value: str | bytes | None) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_may_append_fields() -> None:
    tp = parse_traceparent(f"01-{TRACE}-{PARENT}-01-whatever")
    assert tp is not None and tp.trace_id == int(TRACE, 16)


def test_format_is_the_inverse_of_parse() -> None:
    assert format_traceparent(int(TRACE, 16), int(PARENT, 16), True) == SAMPLED
    assert format_traceparent(int(TRACE, 16), int(PARENT, 16), False) == UNSAMPLED


# -- settings --------------------------------------------------------------------------------
def test_tracing_is_off_unless_the_environment_names_an_exporter_or_endpoint() -> None:
    assert not TraceSettings.from_env({}).enabled
    assert not TraceSettings.from_env({}, ratio=0.5).enabled  # --trace-ratio alone: off
    assert TraceSettings.from_env({"OTEL_TRACES_EXPORTER": "otlp"}).enabled
    assert TraceSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).enabled
    traces_only = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}
    assert TraceSettings.from_env(traces_only).enabled
    off = {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert not TraceSettings.from_env(off).enabled
    disabled = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}
    assert not TraceSettings.from_env(disabled).enabled


def test_the_ratio_comes_from_the_sampler_arg_unless_the_flag_gives_one() -> None:
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    s = TraceSettings.from_env(env)
    assert (s.sampler, s.ratio, s.service_name) == ("parentbased_traceidratio", 0.25, "clipper")
    assert TraceSettings.from_env(env, ratio=0.01).ratio == 0.01
    assert TraceSettings.from_env({"OTEL_TRACES_EXPORTER": "otlp"}).ratio == 1.0
    named = TraceSettings.from_env({"OTEL_SERVICE_NAME": "edge", "OTEL_TRACES_EXPORTER": "otlp"})
    assert named.service_name == "edge"
    # The flag asks for a ratio: a sampler without one becomes the parent-based ratio sampler.
    always = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "always_on"}
    assert TraceSettings.from_env(always, ratio=0.1).sampler == "parentbased_traceidratio"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
        ({"OTEL_TRACES_SAMPLER_ARG": "half"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER_ARG": "2"}, "between 0 and 1"),
    ],
)
def test_a_bad_setting_is_a_config_error_naming_it(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        TraceSettings.from_env(env)


# -- sampling --------------------------------------------------------------------------------
def _settings(sampler: str, ratio: float = 0.5) -> TraceSettings:
    return TraceSettings(True, sampler=sampler, ratio=ratio)


@pytest.mark.parametrize("ratio", [0.0, 0.5, 1.0])
def test_parentbased_follows_the_parents_flag_at_any_ratio(ratio: float) -> None:
    s = _settings("parentbased_traceidratio", ratio)
    assert sampled(s, parse_traceparent(SAMPLED), lambda: 0.99)
    assert not sampled(s, parse_traceparent(UNSAMPLED), lambda: 0.0)


def test_without_a_parent_the_ratio_decides_on_the_draw() -> None:
    s = _settings("parentbased_traceidratio", 0.01)
    assert sampled(s, None, lambda: 0.009)
    assert not sampled(s, None, lambda: 0.01)
    assert not sampled(_settings("parentbased_traceidratio", 0.0), None, lambda: 0.0)


def test_traceidratio_without_parentbased_decides_on_the_callers_trace_id() -> None:
    s = _settings("traceidratio", 0.5)
    low = parse_traceparent(f"00-{'0' * 17}{'1' * 15}-{PARENT}-00")  # low 64 bits small
    high = parse_traceparent(f"00-{'0' * 16}f{'0' * 15}-{PARENT}-01")  # low 64 bits >= half
    assert sampled(s, low) and not sampled(s, high)  # the flag is not what decides


def test_the_always_samplers() -> None:
    tp = parse_traceparent(UNSAMPLED)
    assert sampled(_settings("always_on"), tp) and not sampled(_settings("always_off"), None)
    assert sampled(_settings("parentbased_always_on"), None)
    assert not sampled(_settings("parentbased_always_off"), None)
    assert sampled(_settings("parentbased_always_off"), parse_traceparent(SAMPLED))


class Spans:
    """A started tracer on a fake clock, exporting to memory."""

    def __init__(self, ratio: float, sampler: str = "parentbased_traceidratio") -> None:
        self.clock = FakeClock()
        self.exporter = InMemorySpanExporter()
        settings = TraceSettings(True, sampler=sampler, ratio=ratio)
        self.tracer = Tracer(settings, self.clock, exporter=self.exporter)
        self.tracer.start()

    def finished(self) -> list[Any]:
        assert self.tracer.flush()
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> Any:
        (span,) = [s for s in self.finished() if s.name == name]
        return span


@pytest.fixture
def spans() -> Iterator[Any]:
    made: list[Spans] = []

    def make(ratio: float = 1.0, sampler: str = "parentbased_traceidratio") -> Spans:
        s = Spans(ratio, sampler)
        made.append(s)
        return s

    yield make
    for s in made:
        hooks.deactivate(s.tracer)
        s.tracer.stop()


def test_a_sampled_parent_is_traced_even_at_ratio_zero(spans: Any) -> None:
    s = spans(ratio=0.0)
    span = s.tracer.request("r", SAMPLED, s.clock.now(), {})
    assert span is not None
    ctx = span.get_span_context()
    assert f"{ctx.trace_id:032x}" == TRACE and ctx.trace_flags.sampled
    assert f"{span.parent.span_id:016x}" == PARENT


def test_an_unsampled_parent_is_not_traced_even_at_ratio_one(spans: Any) -> None:
    s = spans(ratio=1.0)
    assert s.tracer.request("r", UNSAMPLED, s.clock.now(), {}) is None


def test_without_a_parent_the_ratio_decides(spans: Any) -> None:
    none, every = spans(ratio=0.0), spans(ratio=1.0)
    assert all(none.tracer.request("r", None, 0.0, {}) is None for _ in range(50))
    started = [every.tracer.request("r", None, 0.0, {}) for _ in range(50)]
    assert all(span is not None and span.parent is None for span in started)
    half = spans(ratio=0.5)
    traced = sum(half.tracer.request("r", None, 0.0, {}) is not None for _ in range(2000))
    assert 800 < traced < 1200  # trace-id ratio: about half of random trace ids


def test_a_malformed_parent_starts_a_trace_of_its_own(spans: Any) -> None:
    s = spans(ratio=1.0)
    span = s.tracer.request("r", "00-nonsense", 0.0, {})
    assert span is not None and span.parent is None


def test_spans_take_their_times_from_the_injected_clock(spans: Any) -> None:
    s = spans()
    root = s.tracer.request("r", None, s.clock.now(), {})
    s.tracer.child(root, "c", s.clock.now(), s.clock.now() + 0.25)
    s.clock.advance(1.0)
    s.tracer.end(root, s.clock.now())
    child, req = s.named("c"), s.named("r")
    assert child.end_time - child.start_time == 250_000_000
    assert req.end_time - req.start_time == 1_000_000_000


# -- the scheduler's batch spans -------------------------------------------------------------
def test_one_batch_span_links_every_traced_query_and_its_context_goes_out(spans: Any) -> None:
    s = spans()
    hooks.activate(s.tracer)
    h = Harness(fixed(3))
    h.clock = s.clock  # the spans' times and the scheduler's share one fake clock
    h.sched.clock = s.clock
    h.replica()
    queries = [s.tracer.request(f"q{i}", None, s.clock.now(), {}) for i in range(2)]
    for i, q in enumerate(queries):
        t = h.task(b"x%d" % i)
        t.span = q
        h.sched.submit(t)
    h.sched.submit(h.task(b"untraced"))
    s.clock.advance(0.004)
    h.sched.pump()
    (traceparent,) = h.transport.traceparents
    assert traceparent is not None
    s.clock.advance(0.010)
    h.respond(0)
    batch, rpc = s.named("batch"), s.named("rpc predict")
    assert batch.attributes["clipper.batch.size"] == 3
    assert batch.attributes["clipper.batch.traced_queries"] == 2
    assert {link.context.span_id for link in batch.links} == {
        q.get_span_context().span_id for q in queries
    }
    assert rpc.parent.span_id == batch.context.span_id
    assert parse_traceparent(traceparent) == TraceParent(
        rpc.context.trace_id, rpc.context.span_id, 1
    )
    assert rpc.end_time - rpc.start_time == 10_000_000
    waits = [x for x in s.finished() if x.name == "queue wait"]
    assert len(waits) == 2 and all(w.end_time - w.start_time == 4_000_000 for w in waits)
    h.sched.close(ConfigError("test over"))


def test_untraced_batches_carry_no_context_and_make_no_spans(spans: Any) -> None:
    s = spans()
    hooks.activate(s.tracer)
    h = Harness(fixed(2))
    h.replica()
    h.submit(b"a", b"b")
    assert h.transport.traceparents == [None]
    h.respond(0)
    assert s.finished() == []
    h.sched.close(ConfigError("test over"))


def test_a_failed_batch_and_a_lost_replica_end_their_spans_as_errors(spans: Any) -> None:
    s = spans()
    hooks.activate(s.tracer)
    h = Harness(fixed(1))
    r = h.replica()
    for payload in (b"a", b"b"):
        t = h.task(payload)
        t.span = s.tracer.request("q", None, h.clock.now(), {})
        h.sched.submit(t)
    h.sched.pump()
    h.respond(0, error="ValueError: bad input")
    failed = [x for x in s.finished() if x.name == "batch"]
    assert [x.status.status_code for x in failed] == [StatusCode.ERROR]
    assert failed[0].status.description == "ValueError: bad input"
    h.sched.remove_replica(r)  # the second batch was in flight on it
    lost = [x for x in s.finished() if x.name == "batch"][1]
    assert lost.status.status_code is StatusCode.ERROR
    assert "removed" in (lost.status.description or "")
    h.sched.close(ConfigError("test over"))


# -- the wire and the container --------------------------------------------------------------
def test_the_fast_predict_meta_carries_the_traceparent_only_when_given() -> None:
    items = [b"\x00" * 16, b"\x01" * 16]
    plain = wire.decode_frontend_message(wire.encode_predict_fast(7, InputType.DOUBLES, items))
    traced = wire.decode_frontend_message(
        wire.encode_predict_fast(7, InputType.DOUBLES, items, SAMPLED)
    )
    assert isinstance(plain, wire.PredictRequest) and isinstance(traced, wire.PredictRequest)
    assert plain.fast_meta is not None and "traceparent" not in plain.fast_meta
    assert traced.fast_meta is not None and traced.fast_meta["traceparent"] == SAMPLED
    assert traced.shape == plain.shape == (2, 2)  # the rest of the meta is unchanged


def test_the_container_spans_a_traced_batch_as_a_child_of_the_round_trip(spans: Any) -> None:
    s = spans(ratio=0.0)
    traces = PredictTraces(s.tracer, "m", "1", InputType.DOUBLES)
    items = [b"\x00" * 8] * 3
    req = wire.decode_frontend_message(
        wire.encode_predict_fast(9, InputType.DOUBLES, items, SAMPLED)
    )
    assert isinstance(req, wire.PredictRequest)
    ok = [b"", b"", b"", b"\x00\x00\x00\x00", b"[1,2,3]"]
    assert traces.run(req, lambda r: ok) is ok
    span = s.named("predict")
    assert span.attributes["clipper.batch.size"] == 3
    assert f"{span.parent.span_id:016x}" == PARENT and f"{span.context.trace_id:032x}" == TRACE
    bad = wire.encode_predict_error_fast(req.msg_id_bytes, "ZeroDivisionError: boom")
    traces.run(req, lambda r: bad)
    failed = [x for x in s.finished() if x.name == "predict"][1]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ZeroDivisionError: boom"
    plain = wire.decode_frontend_message(wire.encode_predict_fast(10, InputType.DOUBLES, items))
    assert isinstance(plain, wire.PredictRequest)
    traces.run(plain, lambda r: ok)
    assert len(s.finished()) == 2  # no traceparent: no span

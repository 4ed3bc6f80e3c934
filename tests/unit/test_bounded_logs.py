"""Logs stay bounded: the manager's size-rotated replica log file, the container's
one-traceback-per-kind error logging, and the frontend's rate-limited protocol-error lines."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from clipper.clock import FakeClock
from clipper.container.runtime import RepeatedErrors
from clipper.logs import LogLimiter
from clipper.managers.local import RotatingLog


def _fail(n: int) -> None:
    raise ValueError(f"bad shape {n}")  # one raise site: one kind, whatever the message


def _raise(n: int) -> BaseException:
    try:
        _fail(n)
    except ValueError as e:
        return e
    raise AssertionError("unreachable")


def test_repeated_tracebacks_are_summed_up(caplog: pytest.LogCaptureFixture) -> None:
    t = [0.0]
    log = logging.getLogger("test.repeats")
    rep = RepeatedErrors(log, window_s=60.0, now=lambda: t[0])
    with caplog.at_level(logging.ERROR, logger="test.repeats"):
        for i in range(4212):
            rep.exception(_raise(i), "predict raised on a batch of %d", 1)
            t[0] += 0.001
        other = KeyError("x")
        try:
            raise other
        except KeyError:
            rep.exception(other, "predict raised on a batch of %d", 2)  # another kind: logged
        assert [r.exc_info is not None for r in caplog.records] == [True, True]
        t[0] += 60.0
        rep.exception(_raise(0), "predict raised on a batch of %d", 1)  # a new window
        rep.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[2].startswith("... and 4,211 more like it (ValueError at ")
    assert messages[3] == "predict raised on a batch of 1"  # the new window's traceback
    assert len(messages) == 4  # flush: nothing repeated since, so no further summary
    assert sum(r.exc_info is not None for r in caplog.records) == 3


def test_rotating_log_keeps_at_most_two_files_of_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "m-1-0.log"
    log = RotatingLog(path, 1000)
    for i in range(500):
        log.write(b"line %04d of a chatty model\n" % i)
    rotated = path.with_name("m-1-0.log.1")
    assert path.stat().st_size <= 1000 and rotated.stat().st_size <= 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-1-0.log", "m-1-0.log.1"]
    assert path.read_bytes().endswith(b"line 0499 of a chatty model\n")  # the newest kept


def test_log_limiter_writes_the_first_line_then_one_count_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limiter = LogLimiter(10.0)
    log = logging.getLogger("test.limiter")
    with caplog.at_level(logging.INFO, logger="test.limiter"):
        written = [
            limiter.info(log, clock, "gRPC connection error %d: %s", 1, f"bad preface {i}")
            for i in range(200)
        ]
        assert written.count(True) == 1  # a burst inside one interval: its first line only
        limiter.warning(log, clock, "another kind: %s", "x")  # a kind of its own: written
        clock.advance(10.0)
        limiter.info(log, clock, "gRPC connection error %d: %s", 1, "bad preface 200")
        limiter.info(log, clock, "gRPC connection error %d: %s", 1, "bad preface 201")
        limiter.flush(clock)
        limiter.flush(clock)  # nothing counted since: nothing more
        clock.advance(30.0)
        limiter.info(log, clock, "gRPC connection error %d: %s", 1, "quiet since")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "gRPC connection error 1: bad preface 0",
        "another kind: x",
        # the 199 counted repeats and the one that ended the interval
        "... and 200 more like it in 10 s; the latest: gRPC connection error 1: bad preface 200",
        "... and 1 more like it in 0 s; the latest: gRPC connection error 1: bad preface 201",
        "gRPC connection error 1: quiet since",  # a quiet interval: the line itself again
    ]
    assert [r.levelno for r in caplog.records][:3] == [logging.INFO, logging.WARNING, logging.INFO]


def test_log_limiter_keeps_one_traceback_and_a_bounded_number_of_kinds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limiter = LogLimiter(10.0, max_kinds=4)
    log = logging.getLogger("test.limiter.kinds")
    with caplog.at_level(logging.ERROR, logger="test.limiter.kinds"):
        for i in range(50):
            try:
                _fail(i)
            except ValueError:
                limiter.exception(log, clock, "unexpected error serving %s", f"/p/{i}")
        for k in range(6):  # six kinds through a memory of four: the oldest summed up first
            limiter.error(log, clock, f"kind {k}")
        limiter.flush()
    records = caplog.records
    assert sum(r.exc_info is not None for r in records) == 1
    # The fifth kind evicts the first, whose repeats are summed up before it is forgotten.
    assert [r.getMessage() for r in records[3:6]] == [
        "kind 2",
        "... and 49 more like it in 0 s; the latest: unexpected error serving /p/49",
        "kind 3",
    ]
    assert len(limiter._kinds) == 4
    assert len(records) == 8  # 1 + its count at eviction + 6 kinds


def test_log_limiter_counts_nothing_at_a_level_that_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    limiter = LogLimiter(10.0)
    log = logging.getLogger("test.limiter.off")
    with caplog.at_level(logging.WARNING, logger="test.limiter.off"):
        assert not any(limiter.info(log, clock, "chatty %d", i) for i in range(10))
        limiter.flush(clock)
    assert caplog.records == [] and limiter._kinds == {}

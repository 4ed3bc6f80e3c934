"""Replica logs stay bounded: the manager's size-rotated log file, and the container's
one-traceback-per-kind error logging."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from clipper.container.runtime import RepeatedErrors
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

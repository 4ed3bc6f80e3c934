"""The console warning of a model that keeps raising (at once, then once per interval with the
count of failed batches it stands for), and the application's choice of error or default output
when a model raises."""

from __future__ import annotations

import logging

import pytest

from clipper.batching.model_errors import ModelErrorLog
from clipper.clock import FakeClock
from tests.inprocess import InProcessFrontend


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "clipper.models"]


def test_the_first_error_is_said_at_once_and_a_storm_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    log = ModelErrorLog("m:1", clock, interval_s=10.0)
    with caplog.at_level(logging.WARNING, logger="clipper.models"):
        log.failed("ValueError: bad\ninput", 4)
        assert _lines(caplog) == [
            "model m:1 raised an error (a batch of 4 answered with errors or defaults): "
            "ValueError: bad input"
        ]
        for _ in range(999):  # a storm inside the interval: counted, not said
            clock.advance(0.005)
            log.failed("ValueError: bad", 1)
        assert len(_lines(caplog)) == 1
        clock.advance(10.0)
        log.failed("KeyError: 'x'", 2)
        assert _lines(caplog)[1] == (
            "model m:1 keeps raising: 1000 failed batches in the last 15 s; latest: KeyError: 'x'"
        )
        clock.advance(1.0)
        log.failed("KeyError: 'x'", 2)
        assert len(_lines(caplog)) == 2


def test_a_long_message_is_cut_to_one_short_line(caplog: pytest.LogCaptureFixture) -> None:
    log = ModelErrorLog("m:1", FakeClock())
    with caplog.at_level(logging.WARNING, logger="clipper.models"):
        log.failed("Traceback:\n" + "x" * 5000, 1)
    (line,) = _lines(caplog)
    assert "\n" not in line and line.endswith("...") and len(line) < 450


# -- the application's on_model_error: validated, stored, shown ---------------------------------


def test_on_model_error_round_trips_through_the_store_records() -> None:
    from clipper.errors import RegistryError
    from clipper.inputs import InputType
    from clipper.registry import Application, Registry

    app = Application("a", InputType.DOUBLES, "-1", 1000, on_model_error="default")
    assert app.to_record()["on_model_error"] == "default"
    assert Application.from_record(app.to_record()) == app
    old = app.to_record()
    del old["on_model_error"]  # a record written before the field existed
    assert Application.from_record(old).on_model_error == "auto"
    with pytest.raises(RegistryError, match="unknown model error answer 'ignore'; expected"):
        Application("a", InputType.DOUBLES, "-1", 1000, on_model_error="ignore")  # type: ignore[arg-type]
    # Through a snapshot, as a second frontend or a restart reads it.
    first, second = Registry(), Registry()
    first.add_app(app)
    second.apply_snapshot(first.records())
    assert second.apps["a"].on_model_error == "default"


async def test_the_admin_api_and_the_cli_set_on_model_error(
    inproc_frontend: InProcessFrontend, monkeypatch: pytest.MonkeyPatch
) -> None:
    fe = inproc_frontend
    body = {"name": "a", "input_type": "doubles", "default_output": "-1",
            "latency_slo_micros": 1000, "on_model_error": "error"}  # fmt: skip
    assert (await fe.admin.post("/admin/add_app", json=body)).status == 200
    doc = (await fe.admin.post("/admin/get_application", json={"name": "a"})).json()
    assert doc["on_model_error"] == "error"
    bad = await fe.admin.post(
        "/admin/update_app", json={"name": "a", "on_model_error": "sometimes"}
    )
    assert bad.status == 400
    assert bad.body.decode() == (
        "unknown model error answer 'sometimes'; expected one of auto, error, default"
    )
    ok = await fe.admin.post("/admin/update_app", json={"name": "a", "on_model_error": "auto"})
    assert ok.status == 200, ok.body
    plain = (await fe.admin.post("/admin/get_application", json={"name": "a"})).json()
    assert "on_model_error" not in plain  # "auto": the original's document, unchanged
    from clipper.cli import _env_defaults, _parser

    parser = _parser()
    _env_defaults(parser)
    args = parser.parse_args(["app", "update", "a", "--on-model-error", "default"])
    assert args.on_model_error == "default"
    args = parser.parse_args(["app", "register", "b", "--input-type", "doubles"])
    assert args.on_model_error == "auto"

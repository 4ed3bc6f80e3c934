"""The shared-replica flags of ``python -m clipper.container``: each by flag or environment
variable, and bad values refused before anything loads."""

from __future__ import annotations

import pytest

from clipper.container.options import build_parser, frontends_from
from clipper.container.runtime import main

BASE = ["--model-path", "m.pkl", "--name", "m"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CLIPPER_FRONTENDS", "CLIPPER_SHARED", "CLIPPER_ORPHAN_TIMEOUT_S", "CLIPPER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_one_frontend_not_shared() -> None:
    args = build_parser().parse_args(BASE)
    assert (args.frontend, args.shared, args.orphan_timeout_s, args.port) == (None, False, 60, None)
    assert frontends_from(args.frontend) == []


def test_frontends_by_flag_or_comma_separated_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    args = build_parser().parse_args(
        [*BASE, "--frontend", "tcp://a:1", "--frontend", "tcp://b:2", "--shared",
         "--orphan-timeout-s", "1.5"]
    )  # fmt: skip
    assert frontends_from(args.frontend) == ["tcp://a:1", "tcp://b:2"]
    assert args.shared is True and args.orphan_timeout_s == 1.5
    monkeypatch.setenv("CLIPPER_FRONTENDS", "tcp://c:3, tcp://d:4,")
    monkeypatch.setenv("CLIPPER_SHARED", "1")
    monkeypatch.setenv("CLIPPER_ORPHAN_TIMEOUT_S", "7")
    args = build_parser().parse_args(BASE)
    assert frontends_from(args.frontend) == ["tcp://c:3", "tcp://d:4"]
    assert args.shared is True and args.orphan_timeout_s == 7.0
    # A flag wins over the variable.
    assert frontends_from(["tcp://e:5"]) == ["tcp://e:5"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--frontend", "a:1"], "--frontend 'a:1': expected tcp://HOST:PORT"),
        (["--frontend", "tcp://a"], "expected tcp://HOST:PORT"),
        (["--orphan-timeout-s", "0"], "--orphan-timeout-s must be positive"),
    ],
)
def test_bad_values_are_refused(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*BASE, *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err

"""Environment variables of the ``clipper`` subcommands do not leak between them, and ``--help``
shows every option's default, choices and variable."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from clipper.cli import _env_defaults, _parser


def _parse(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str]) -> Any:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = _parser()
    _env_defaults(parser)
    return parser.parse_args(argv)


DEPLOY = ["model", "deploy", "m.pkl", "--name", "m", "--input-type", "doubles"]


def test_a_variable_for_one_command_does_not_change_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # CLIPPER_VERSION once pinned `predict` and `model scale` after a deploy exported it.
    env = {"CLIPPER_VERSION": "7", "CLIPPER_MODEL_DEPLOY_VERSION": "3", "CLIPPER_UID": "u"}
    deploy = _parse(monkeypatch, env, DEPLOY)
    assert deploy.version == "3"
    predict = _parse(monkeypatch, env, ["predict", "app", "[1.0]"])
    assert predict.version is None and predict.uid is None
    scale = _parse(monkeypatch, env, ["model", "scale", "m", "2"])
    assert scale.version is None
    monkeypatch.setenv("CLIPPER_PREDICT_VERSION", "2")
    assert _parse(monkeypatch, {}, ["predict", "app", "[1.0]"]).version == "2"
    assert _parse(monkeypatch, {}, ["model", "scale", "m", "2"]).version is None


def test_a_commands_variable_satisfies_its_required_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"CLIPPER_MODEL_DEPLOY_VERSION": "4", "CLIPPER_MODEL_DEPLOY_REPLICAS": "3"}
    args = _parse(monkeypatch, env, DEPLOY)
    assert (args.version, args.replicas) == ("4", 3)
    monkeypatch.delenv("CLIPPER_MODEL_DEPLOY_VERSION")
    with pytest.raises(SystemExit):  # without it, --version is required again
        _parse(monkeypatch, {"CLIPPER_VERSION": "4"}, DEPLOY)


def test_start_and_the_connection_options_keep_their_shared_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"CLIPPER_QUERY_PORT": "9", "CLIPPER_ADMIN_URL": "http://h:1", "CLIPPER_JSON": "1"}
    assert _parse(monkeypatch, env, ["start"]).query_port == 9
    status = _parse(monkeypatch, env, ["status"])
    assert status.admin_url == "http://h:1" and status.json


def _help(monkeypatch: pytest.MonkeyPatch, argv: list[str], capsys: Any) -> str:
    with pytest.raises(SystemExit):
        _parse(monkeypatch, {}, [*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # unwrapped


def test_help_shows_defaults_choices_and_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deploy = _help(monkeypatch, ["model", "deploy"], capsys)
    assert "--controller {aimd,quantile,fixed}" in deploy
    assert "[CLIPPER_MODEL_DEPLOY_CONTROLLER] (default: aimd)" in deploy
    assert "[CLIPPER_MODEL_DEPLOY_REPLICAS] (default: 1)" in deploy
    assert "(default: None)" not in deploy
    start = _help(monkeypatch, ["start"], capsys)
    assert "--cache-policy {clock,lru}" in start and "(default: 1337)" in start
    assert "--log-level {DEBUG,INFO,WARNING,ERROR,CRITICAL}" in start
    assert start.count("(default: 1337)") == 1  # not repeated by the formatter
    register = _help(monkeypatch, ["app", "register"], capsys)
    assert "(default: 100000)" in register


def test_every_subcommand_option_has_a_variable_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser = _parser()
    _env_defaults(parser)
    seen: dict[str, str] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}".strip())
                continue
            for word in (action.help or "").split():
                if word.startswith("[CLIPPER_"):
                    var = word.strip("[]")
                    # The one secret both sides hold: start's --admin-token, the clients' --token.
                    same = {seen.get(var), action.dest} <= {"admin_token", "token", None}
                    if var in seen and seen[var] != action.dest and not same:
                        pytest.fail(f"{var} read by {seen[var]} and {action.dest} ({path})")
                    seen[var] = action.dest

    walk(parser, "")
    assert "CLIPPER_MODEL_DEPLOY_VERSION" in seen and "CLIPPER_PREDICT_VERSION" in seen

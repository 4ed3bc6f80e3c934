"""``clipper start``: one flag and one CLIPPER_* variable per FrontendConfig field, generated."""

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Literal

import pytest

from clipper.choices import CACHE_POLICIES
from clipper.cli import _env_defaults, _parser, add_config_options, config_from_args
from clipper.config import FrontendConfig, cli
from clipper.errors import ConfigError


def _start_parser(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> argparse.ArgumentParser:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = _parser()
    _env_defaults(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    start: argparse.ArgumentParser = sub.choices["start"]
    return start


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def test_every_field_has_a_flag_and_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    options = _options(_start_parser(monkeypatch, {}))
    for f in dataclasses.fields(FrontendConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in options, flag
        assert f"[CLIPPER_{f.name.upper()}]" in (options[flag].help or ""), flag


def test_the_documented_flags_keep_working(monkeypatch: pytest.MonkeyPatch) -> None:
    start = _start_parser(monkeypatch, {})
    args = start.parse_args(
        ["--host", "0.0.0.0", "--query-port", "0", "--rpc-port", "0", "--admin-port", "0",
         "--admin-token", "t", "--grpc-port", "-1", "--state-dir", "/tmp/x", "--cache-bytes", "0",
         "--cache-policy", "lru", "--max-body-bytes", "1024", "--queue-capacity", "7",
         "--store", "memory://", "--rpc-host", "::1", "--admin-host", "0.0.0.0", "--demo",
         "--log-level", "debug"]
    )  # fmt: skip
    config = config_from_args(args, FrontendConfig)
    assert config.host == "0.0.0.0" and config.query_port == 0 and config.grpc_port is None
    assert config.state_dir == Path("/tmp/x") and config.cache_policy == "lru"
    assert config.queue_capacity == 7 and config.store == "memory://" and config.admin_token == "t"
    assert args.demo and args.log_level == "DEBUG"  # any case; normalised


def test_defaults_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _start_parser(monkeypatch, {}).parse_args([])
    assert args.grpc_port == 8001  # served by `clipper start`, off when embedded
    assert args.state_dir == Path.home() / ".clipper"
    assert args.store is None  # _start puts it in the state directory
    assert args.cache_policy == "clock" and args.query_port == 1337


def test_variables_set_every_kind_of_field(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "CLIPPER_QUERY_PORT": "9",
        "CLIPPER_HEARTBEAT_INTERVAL_S": "0.25",
        "CLIPPER_CACHE_POLICY": "lru",
        "CLIPPER_GRPC_PORT": "-1",
        "CLIPPER_PYTHON": "/usr/bin/python3",
        "CLIPPER_STATE_DIR": "~/elsewhere",
        "CLIPPER_STORE": "redis://h:6379/0",
    }
    args = _start_parser(monkeypatch, env).parse_args([])
    assert args.query_port == 9 and args.heartbeat_interval_s == 0.25
    assert args.cache_policy == "lru" and args.grpc_port is None
    assert args.python == "/usr/bin/python3" and args.store == "redis://h:6379/0"
    assert args.state_dir == Path.home() / "elsewhere"
    # a flag beats its variable
    args = _start_parser(monkeypatch, env).parse_args(["--query-port", "10"])
    assert args.query_port == 10


def test_the_choices_come_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    action = _options(_start_parser(monkeypatch, {}))["--cache-policy"]
    assert tuple(action.choices or ()) == CACHE_POLICIES.names


def test_a_new_field_gets_its_flag_and_variable_with_no_cli_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What another engineer adding e.g. `manager: str = "local://"` to FrontendConfig gets.
    @dataclasses.dataclass(frozen=True)
    class Grown:
        host: str = "127.0.0.1"
        manager: str = "local://"
        retries: int = dataclasses.field(default=3, metadata=cli("how often"))
        ratio: float | None = None
        mode: Literal["a", "b"] = "a"
        verbose: bool = False

    def build(argv: list[str]) -> Grown:
        parser = argparse.ArgumentParser()
        add_config_options(parser, Grown)
        _env_defaults(parser)
        return config_from_args(parser.parse_args(argv), Grown)

    assert build([]) == Grown()
    got = build(["--manager", "k8s://", "--retries", "5", "--ratio", "0.5", "--mode", "b",
                 "--verbose"])  # fmt: skip
    assert got == Grown(manager="k8s://", retries=5, ratio=0.5, mode="b", verbose=True)
    monkeypatch.setenv("CLIPPER_MANAGER", "docker://")
    monkeypatch.setenv("CLIPPER_VERBOSE", "true")
    monkeypatch.setenv("CLIPPER_RATIO", "none")
    assert build([]) == Grown(manager="docker://", verbose=True)
    with pytest.raises(SystemExit):
        build(["--mode", "c"])


def test_a_field_without_a_default_is_a_required_option(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True)
    class Needs:
        name: str
        tags: list[str] = dataclasses.field(default_factory=list)

    parser = argparse.ArgumentParser()
    add_config_options(parser, Needs)
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert config_from_args(parser.parse_args(["--name", "n"]), Needs) == Needs("n")
    monkeypatch.setenv("CLIPPER_NAME", "from-env")
    parser = argparse.ArgumentParser()
    add_config_options(parser, Needs)
    _env_defaults(parser)
    assert config_from_args(parser.parse_args([]), Needs).name == "from-env"


async def test_an_embedded_frontend_binds_no_well_known_port_unless_asked() -> None:
    """Tests and notebooks run beside a `clipper start` on 1337/1338/7000/8001: an embedded
    frontend takes free ports by default, the command line keeps the well-known ones."""
    from clipper import Clipper

    assert (FrontendConfig().query_port, FrontendConfig().admin_port) == (0, 0)
    assert FrontendConfig().rpc_port == 0 and FrontendConfig().grpc_port is None
    async with Clipper() as c:
        bound = {c.http.port, c.admin_http.port, c.rpc.port}
        assert not bound & {1337, 1338, 7000, 8001}
        assert 0 not in bound


def test_version_and_a_bad_log_level_are_one_line_answers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from clipper import cli as cli_module

    with pytest.raises(SystemExit) as done:
        cli_module.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("clipper-serve ")
    with pytest.raises(SystemExit) as done:
        cli_module.main(["start", "--log-level", "verbose"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'VERBOSE'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("raised", "code", "said"),
    [(KeyboardInterrupt, 130, "clipper: interrupted\n"), (BrokenPipeError, 141, "")],
)
def test_ctrl_c_and_a_closed_pipe_end_a_command_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: type[BaseException],
    code: int,
    said: str,
) -> None:
    from clipper import cli as cli_module

    def interrupted(args: argparse.Namespace) -> int:
        raise raised

    monkeypatch.setattr(cli_module, "run_command", interrupted)
    assert cli_module.main(["status"]) == code
    assert capsys.readouterr().err == said


def test_pool_flags_and_their_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    start = _start_parser(monkeypatch, {})
    args = start.parse_args(["--pool-processes", "4", "--pool-memory-mb", "256"])
    config = config_from_args(args, FrontendConfig)
    assert config.pool_processes == 4 and config.pool_memory_mb == 256
    with pytest.raises(ConfigError, match="pool_memory_mb must be >= 1"):
        FrontendConfig(pool_processes=1, pool_memory_mb=0)
    with pytest.raises(ConfigError, match="pool_processes must be between 0 and 256"):
        FrontendConfig(pool_processes=-1)
    with pytest.raises(ConfigError, match="pooled models need the local manager"):
        FrontendConfig(pool_processes=2, manager="external://")
    with pytest.raises(ConfigError, match="cannot be combined with shared replicas"):
        FrontendConfig(pool_processes=2, workers=2)


def test_replica_starts_default_to_the_cores_and_zero_lifts_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5})
    assert FrontendConfig().replica_starts == 3
    start = _start_parser(monkeypatch, {"CLIPPER_REPLICA_STARTS": "0"})
    assert config_from_args(start.parse_args([]), FrontendConfig).replica_starts == 0
    args = start.parse_args(["--replica-starts", "8"])
    assert config_from_args(args, FrontendConfig).replica_starts == 8
    with pytest.raises(ConfigError, match=r"replica_starts must be >= 0 \(0: no limit\), got -1"):
        FrontendConfig(replica_starts=-1)

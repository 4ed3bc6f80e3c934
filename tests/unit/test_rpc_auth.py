"""RPC authentication settings and key files: the loopback guard, the keys made on the first
start (0600 secrets in a 0700 directory), what a container reads, and what the local manager puts
on a container's command line (a path, never key text)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from clipper.cli import _env_defaults, _parser, config_from_args
from clipper.clock import FakeClock
from clipper.config import FrontendConfig
from clipper.container.options import build_parser as container_parser
from clipper.errors import ConfigError
from clipper.inputs import InputType
from clipper.managers.local import LocalManager, ReplicaProcess
from clipper.registry import ModelVersion
from clipper.rpc.auth import ensure_keys, load_client_keys


def _start_args(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str]) -> object:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    parser = _parser()
    _env_defaults(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["start"].parse_args(argv)


def test_rpc_beyond_loopback_without_auth_refuses_to_start() -> None:
    with pytest.raises(ConfigError, match=r"'0\.0\.0\.0'.*--no-rpc-auth.*127\.0\.0\.1"):
        FrontendConfig(rpc_host="0.0.0.0", rpc_auth=False)
    FrontendConfig(rpc_host="0.0.0.0")  # authenticated: allowed
    for host in ("127.0.0.1", "localhost", "::1"):
        FrontendConfig(rpc_host=host, rpc_auth=False)  # the original rpc.py, on loopback


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--rpc-host", "0.0.0.0", "--no-rpc-auth"], {}),
        (["--rpc-host", "0.0.0.0"], {"CLIPPER_RPC_AUTH": "0"}),
        ([], {"CLIPPER_RPC_HOST": "0.0.0.0", "CLIPPER_RPC_AUTH": "false"}),
    ],
)
def test_clipper_start_refuses_an_open_rpc_port_beyond_loopback(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str]
) -> None:
    args = _start_args(monkeypatch, argv, env)
    with pytest.raises(ConfigError, match="rpc_auth"):
        config_from_args(args, FrontendConfig)  # type: ignore[arg-type]


def test_rpc_auth_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_from_args(_start_args(monkeypatch, [], {}), FrontendConfig)  # type: ignore[arg-type]
    assert config.rpc_auth is True and config.rpc_keys_dir is None
    assert FrontendConfig().rpc_auth is True


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_keys_are_made_once_private_and_read_by_containers(tmp_path: Path) -> None:
    d = tmp_path / "rpc-keys"
    keys = ensure_keys(d)
    assert _mode(d) == 0o700
    names = sorted(p.name for p in d.iterdir())
    assert names == ["client.key", "client.key_secret", "server.key", "server.key_secret"]
    assert _mode(d / "server.key_secret") == _mode(d / "client.key_secret") == 0o600
    assert "secret-key" not in (d / "server.key").read_text()  # what may be handed out
    again = ensure_keys(d)
    assert again == keys  # a restart keeps the deployment's keys

    client = load_client_keys(d)
    assert client.server_public == keys.public
    assert client.public in keys.clients
    # A container on another machine needs only these two files.
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("server.key", "client.key_secret"):
        (copy / name).write_bytes((d / name).read_bytes())
        os.chmod(copy / name, 0o600)
    assert load_client_keys(copy) == client


def test_a_secret_readable_by_others_is_refused(tmp_path: Path) -> None:
    ensure_keys(tmp_path)
    os.chmod(tmp_path / "client.key_secret", 0o644)
    with pytest.raises(ConfigError, match=r"client\.key_secret.*chmod 600"):
        load_client_keys(tmp_path)
    with pytest.raises(ConfigError, match="readable by others"):
        ensure_keys(tmp_path)


def test_a_secret_handed_over_through_a_group_is_accepted() -> None:
    """A Kubernetes Secret in a non-root pod: root-owned, group fsGroup, mode 0440."""
    from clipper.rpc.auth import _private

    def st(mode: int, uid: int) -> os.stat_result:
        return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, 10001, 40, 0, 0, 0))

    me, other = os.geteuid(), os.geteuid() + 1
    assert _private(st(0o400, me)) and _private(st(0o600, me))
    assert not _private(st(0o440, me))  # ours, so we could have kept it private
    assert _private(st(0o440, other)) and _private(st(0o400, other))
    assert not _private(st(0o460, other))  # the group may write it
    assert not _private(st(0o444, other))  # anyone may read it


def test_missing_keys_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.key"):
        load_client_keys(tmp_path)


def test_container_takes_the_key_directory_by_flag_or_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = ["--model-path", "m.pkl", "--name", "m"]
    assert container_parser().parse_args(base).rpc_keys is None
    assert container_parser().parse_args([*base, "--rpc-keys", "/k"]).rpc_keys == "/k"
    monkeypatch.setenv("CLIPPER_RPC_KEYS", "/from/env")
    assert container_parser().parse_args(base).rpc_keys == "/from/env"


def test_local_manager_passes_the_key_directory_never_the_keys(tmp_path: Path) -> None:
    keys = ensure_keys(tmp_path / "rpc-keys")
    manager = LocalManager(
        rpc_host=lambda: "127.0.0.1",
        rpc_port=lambda: 7000,
        state_dir=tmp_path,
        clock=FakeClock(),
        heartbeat_interval_s=0.5,
        rpc_keys=keys.directory,
    )
    mv = ModelVersion(name="m", version="1", input_type=InputType.DOUBLES, artifact="/a")
    cmd = manager._command(mv, ReplicaProcess("m", "1", 0, tmp_path / "log"))
    assert cmd[cmd.index("--rpc-keys") + 1] == str(keys.directory)
    text = " ".join(cmd)
    secrets = [keys.secret, load_client_keys(keys.directory).secret]
    assert all(s.decode() not in text for s in secrets)

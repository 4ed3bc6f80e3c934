"""The ``clipper`` command. Every flag also reads an environment variable (CLIPPER_*)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clipper.commands import add_commands, run_command
from clipper.config import FrontendConfig
from clipper.errors import ClipperError

__all__ = ["main"]


def _env(name: str, default: Any) -> Any:
    return os.environ.get(f"CLIPPER_{name}", default)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clipper", description="clipper-serve: prediction serving")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("start", help="run a frontend with the local container manager")
    s.add_argument(
        "--host", default=_env("HOST", "127.0.0.1"), help="query API address [CLIPPER_HOST]"
    )
    s.add_argument(
        "--query-port", type=int, default=int(_env("QUERY_PORT", 1337)), help="[CLIPPER_QUERY_PORT]"
    )
    s.add_argument(
        "--rpc-host",
        default=_env("RPC_HOST", "127.0.0.1"),
        help="container RPC address [CLIPPER_RPC_HOST]",
    )
    s.add_argument(
        "--rpc-port", type=int, default=int(_env("RPC_PORT", 7000)), help="[CLIPPER_RPC_PORT]"
    )
    s.add_argument(
        "--admin-host",
        default=_env("ADMIN_HOST", "127.0.0.1"),
        help="admin API address; beyond loopback it needs --admin-token [CLIPPER_ADMIN_HOST]",
    )
    s.add_argument(
        "--admin-port", type=int, default=int(_env("ADMIN_PORT", 1338)), help="[CLIPPER_ADMIN_PORT]"
    )
    s.add_argument(
        "--grpc-port",
        type=int,
        default=int(_env("GRPC_PORT", 8001)),
        help="Open Inference Protocol gRPC port; -1 turns it off [CLIPPER_GRPC_PORT]",
    )
    s.add_argument(
        "--admin-token",
        default=_env("ADMIN_TOKEN", None),
        help="bearer token the admin API requires [CLIPPER_ADMIN_TOKEN]",
    )
    s.add_argument(
        "--state-dir",
        default=_env("STATE_DIR", str(Path.home() / ".clipper")),
        help="models, logs and the sqlite store (default: ~/.clipper) [CLIPPER_STATE_DIR]",
    )
    s.add_argument(
        "--store",
        default=_env("STORE", None),
        help="config store: sqlite:///PATH (default: in the state directory), "
        "redis://HOST:PORT/DB (shared by several frontends) or memory:// [CLIPPER_STORE]",
    )
    s.add_argument(
        "--cache-bytes",
        type=int,
        default=int(_env("CACHE_BYTES", 32 * 2**20)),
        help="prediction cache size; 0 disables storing [CLIPPER_CACHE_BYTES]",
    )
    s.add_argument(
        "--cache-policy",
        choices=("clock", "lru"),
        default=_env("CACHE_POLICY", "clock"),
        help="[CLIPPER_CACHE_POLICY]",
    )
    s.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(_env("MAX_BODY_BYTES", 10 * 2**20)),
        help="larger request bodies get 413 [CLIPPER_MAX_BODY_BYTES]",
    )
    s.add_argument(
        "--queue-capacity",
        type=int,
        default=int(_env("QUEUE_CAPACITY", 50_000)),
        help="per model version [CLIPPER_QUEUE_CAPACITY]",
    )
    s.add_argument(
        "--demo",
        action="store_true",
        default=_env("DEMO", "") in ("1", "true"),
        help="deploy the demo applications [CLIPPER_DEMO]",
    )
    s.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="[CLIPPER_LOG_LEVEL]")

    add_commands(sub, _env)
    return p  # fmt: skip


def _env_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option also reads CLIPPER_<OPTION> (``--input-type`` is CLIPPER_INPUT_TYPE),
    unless it names its variable in its help already; a set variable also satisfies a
    required option."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _env_defaults(child)
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or longs[0] == "--help" or "[CLIPPER_" in (action.help or ""):
            continue
        var = "CLIPPER_" + longs[0][2:].upper().replace("-", "_")
        action.help = f"{action.help or ''} [{var}]".strip()
        value = os.environ.get(var)
        if value is None:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            action.default = value.lower() in ("1", "true", "yes", "on")
        else:
            action.default = value  # argparse applies the option's type to string defaults
            action.required = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    _env_defaults(parser)
    args = parser.parse_args(argv)
    if args.command == "start":
        return _start(args)
    return run_command(args)


def _start(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = FrontendConfig(
            host=args.host,
            query_port=args.query_port,
            rpc_host=args.rpc_host,
            rpc_port=args.rpc_port,
            admin_host=args.admin_host,
            admin_port=args.admin_port,
            admin_token=args.admin_token,
            grpc_port=None if args.grpc_port < 0 else args.grpc_port,
            state_dir=Path(args.state_dir).expanduser(),
            store=args.store or f"sqlite:///{Path(args.state_dir).expanduser()}",
            cache_bytes=args.cache_bytes,
            cache_policy=args.cache_policy,
            max_body_bytes=args.max_body_bytes,
            queue_capacity=args.queue_capacity,
        )
    except ClipperError as e:
        print(f"clipper: {e}", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(_serve(config, args.demo))
    except ClipperError as e:
        print(f"clipper: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"clipper: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


async def _serve(config: FrontendConfig, demo: bool) -> None:
    from clipper.server import Clipper

    async with Clipper(config) as clipper:
        if demo:
            from clipper.demo import deploy_demo

            for line in await deploy_demo(clipper):
                print(line, flush=True)
        print(f"clipper-serve ready: query API at {clipper.query_url}", flush=True)
        await clipper.serve_forever()


if __name__ == "__main__":
    sys.exit(main())

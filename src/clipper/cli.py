"""The ``clipper`` command. Every flag also reads an environment variable: CLIPPER_<OPTION> for
``clipper start`` and the connection options, CLIPPER_<COMMAND>_<OPTION> for the rest."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from clipper.choices import Choice
from clipper.commands import add_commands, run_command
from clipper.config import SAME, FrontendConfig
from clipper.errors import ClipperError
from clipper.kube.render import add_render_command, render_command
from clipper.logs import PROTOCOL_LOG

__all__ = ["add_config_options", "config_from_args", "main"]

T = TypeVar("T")


def _env(name: str, default: Any) -> Any:
    return os.environ.get(f"CLIPPER_{name}", default)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clipper", description="clipper-serve: prediction serving")
    p.add_argument("--version", action="version", version=f"clipper-serve {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("start", help="run a frontend with the local container manager")
    add_config_options(s, FrontendConfig)
    s.add_argument(
        "--demo",
        action="store_true",
        default=_env("DEMO", "") in ("1", "true"),
        help="deploy the demo applications [CLIPPER_DEMO]",
    )
    s.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "INFO"),
        type=str.upper,
        choices=_LOG_LEVELS,
        help="[CLIPPER_LOG_LEVEL]",
    )

    add_commands(sub, _env)
    add_render_command(sub)
    for parser in _parsers(p):
        parser.formatter_class = _HelpFormatter
    return p


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subcommand's parser under it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found += _parsers(child)
    return found


class _HelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default (choices show in the option's own syntax)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and default not in (None, False, argparse.SUPPRESS)
            and "(default" not in text
            and not isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            text = f"{text} (default: {default})".strip()
        return text.replace("%", "%%") if "%(" not in text else text


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional(convert: Callable[[str], Any], negative_is_none: bool) -> Callable[[str], Any]:
    """Parse ``X | None``: "none"/"off"/"" is None, and so is a negative number for an optional
    int (``--grpc-port -1`` turns the service off)."""

    def parse(text: str) -> Any:
        if text.strip().lower() in ("", "none", "off"):
            return None
        value = convert(text)
        return None if negative_is_none and value < 0 else value

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse names it in errors
    return parse


def _converter(hint: Any) -> tuple[Callable[[str], Any] | None, tuple[str, ...] | None]:
    """The argparse ``type`` and ``choices`` for a field's type."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal:
        return str, tuple(args)
    if type(None) in args:  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        convert, choices = _converter(inner)
        return _optional(convert or str, inner is int), choices
    if hint is Path:
        return lambda text: Path(text).expanduser(), None
    if hint in (int, float, str):
        return typing.cast("Callable[[str], Any]", hint), None
    return None, None  # bool: a --flag/--no-flag pair; other types get the text as given


def add_config_options(parser: argparse.ArgumentParser, config: type[Any]) -> None:
    """One ``--flag`` per field of the dataclass ``config`` (``query_port`` is ``--query-port``;
    :func:`_env_defaults` adds CLIPPER_QUERY_PORT), typed from its annotation, with the
    help and command-line default of its :func:`~clipper.config.cli` metadata.

    Generated rather than written out so a new field has its flag and variable at once."""
    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        meta = f.metadata
        cli_default = meta.get("cli_default", SAME)
        required = False
        if cli_default is not SAME:
            default = cli_default() if callable(cli_default) else cli_default
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:  # a field without a default is a required option
            default, required = None, True
        choice: Choice | None = meta.get("choice")
        text = meta.get("help", "")
        if choice is not None:
            text = f"{text}: {choice.help()}" if text else choice.help()
        text = text or f.name.replace("_", " ")
        if default is not None and not isinstance(default, bool):
            text = f"{text} (default: {default})"
        hint = hints[f.name]
        if hint is bool or hint == bool | None:
            # bool | None: --flag / --no-flag, or neither (None: the frontend decides).
            parser.add_argument(
                _flag(f.name), action=argparse.BooleanOptionalAction, default=default,
                required=required, help=text,
            )  # fmt: skip
            continue
        convert, choices = _converter(hint)
        if choice is not None:
            choices = choice.names
        kwargs: dict[str, Any] = {"type": convert} if convert is not None else {}
        if choices is None:
            kwargs["metavar"] = f.name.upper()
        parser.add_argument(
            _flag(f.name), choices=choices, default=default, required=required, help=text,
            dest=f.name, **kwargs,
        )  # fmt: skip


def config_from_args(args: argparse.Namespace, config: type[T]) -> T:
    """The ``config`` dataclass built from the options :func:`add_config_options` added."""
    names = [f.name for f in dataclasses.fields(config)]  # type: ignore[arg-type]
    return config(**{n: getattr(args, n) for n in names})


def _env_defaults(parser: argparse.ArgumentParser, prefix: str = "CLIPPER_") -> None:
    """Every option also reads an environment variable, unless it names its variable in its help
    already; a set variable also satisfies a required option.

    ``clipper start``'s options (the frontend's settings) read CLIPPER_<OPTION> (``--query-port``
    is CLIPPER_QUERY_PORT). Every other subcommand's own options carry the command in the name
    (``model deploy --version`` is CLIPPER_MODEL_DEPLOY_VERSION, ``predict --version``
    CLIPPER_PREDICT_VERSION), so a variable exported for one command never changes another:
    CLIPPER_VERSION set for a deploy once pinned every later ``predict`` to that version."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                own = prefix if name == "start" else f"{prefix}{_var(name)}_"
                _env_defaults(child, own)
            continue
        longs = [o for o in action.option_strings if o.startswith("--")]
        if (
            not longs
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
            or "[CLIPPER_" in (action.help or "")
        ):
            continue
        var = prefix + _var(longs[0][2:])
        action.help = f"{action.help or ''} [{var}]".strip()
        value = os.environ.get(var)
        if value is None:
            continue
        if isinstance(action, argparse._StoreTrueAction | argparse.BooleanOptionalAction):
            action.default = value.lower() in ("1", "true", "yes", "on")
        else:
            action.default = value  # argparse applies the option's type to string defaults
            action.required = False


def _var(name: str) -> str:
    return name.upper().replace("-", "_")


_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clipper-serve")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def _k8s_delete_replicas(args: argparse.Namespace) -> int:
    from clipper.kube.manifests import KubeSettings
    from clipper.managers.kubernetes import delete_replicas

    conn = {k: v for k, v in (("api", args.api), ("context", args.context)) if v}
    try:
        names = delete_replicas(KubeSettings(namespace=args.namespace), conn)
    except ClipperError as e:
        print(f"clipper k8s delete-replicas: {e}", file=sys.stderr)
        return 2
    listed = ", ".join(names) or "none"
    print(f"deleted {len(names)} replica Deployment(s) in {args.namespace}: {listed}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    _env_defaults(parser)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            return _start(args, sys.argv[1:] if argv is None else list(argv))
        if args.command == "k8s":
            if args.action == "delete-replicas":
                return _k8s_delete_replicas(args)
            return render_command(args)
        return run_command(args)
    except KeyboardInterrupt:
        # Ctrl-C: no traceback. A change the server was already making goes on there (see
        # `clipper status`); a deploy cut short by a stopping frontend is rolled back.
        print("clipper: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `clipper status | head`: the reader left; say nothing more.
        # Python's own flush of stdout at exit would fail again: point it at /dev/null.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 141


def _start(args: argparse.Namespace, argv: Sequence[str]) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # The one default that depends on another option: the store lives in the state directory.
    if args.store is None:
        args.store = f"sqlite:///{args.state_dir}"
    try:
        config = config_from_args(args, FrontendConfig)
    except ClipperError as e:
        print(f"clipper start: {e}", file=sys.stderr)
        return 2
    if config.workers > 1:
        return _supervise(config, args, argv)
    import uvloop

    try:
        uvloop.run(_serve(config, args.demo))
    except ClipperError as e:  # a taken port (runtime/ports.py), a locked state directory
        print(f"clipper start: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"clipper start: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


def _supervise(config: FrontendConfig, args: argparse.Namespace, argv: Sequence[str]) -> int:
    """``--workers N``: this process supervises N frontend processes (clipper.workers)."""
    import asyncio

    from clipper.workers import Supervisor

    # Each worker's RPC port is ephemeral unless one was asked for (then worker k's is it + k):
    # the command line's default 7000 cannot be every worker's.
    given = "CLIPPER_RPC_PORT" in os.environ or any(
        a == "--rpc-port" or a.startswith("--rpc-port=") for a in argv
    )
    try:
        supervisor = Supervisor(
            config, demo=args.demo, log_level=args.log_level, rpc_port_given=given
        )
        return asyncio.run(supervisor.run())
    except ClipperError as e:  # a taken port, a locked state directory, a memory:// store
        print(f"clipper start: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"clipper start: cannot start: {e}", file=sys.stderr)
        return 1


async def _serve(config: FrontendConfig, demo: bool) -> None:
    from clipper.server import Clipper

    try:
        async with Clipper(config) as clipper:
            if demo:
                from clipper.demo import deploy_demo

                for line in await deploy_demo(clipper):
                    print(line, flush=True)
            clipper.freeze_heap()
            print(f"clipper-serve ready: query API at {clipper.query_url}", flush=True)
            await clipper.serve_forever()
    finally:
        # The protocol-error lines counted since their kind was last written: "... and N more".
        PROTOCOL_LOG.flush()


if __name__ == "__main__":
    sys.exit(main())

"""The container's command line: every flag with its ``CLIPPER_*`` environment variable
(``python -m clipper.container --help`` lists them; docs/containers.md explains them)."""

from __future__ import annotations

import argparse
import os

__all__ = ["build_parser", "frontends_from"]


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _flag(name: str) -> bool:
    return (_env(name, "") or "").lower() in ("1", "true", "yes")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m clipper.container",
        description="Serve a cloudpickled model to a clipper-serve (or Clipper) frontend.",
    )
    name = _env("CLIPPER_MODEL_NAME")
    p.add_argument(
        "--model-path",
        default=_env("CLIPPER_MODEL_PATH"),
        help="cloudpickle file, or a directory holding func.pkl; or --fetch-artifact "
        "[CLIPPER_MODEL_PATH]",
    )
    p.add_argument(
        "--fetch-artifact",
        action="store_true",
        default=_flag("CLIPPER_FETCH_ARTIFACT"),
        help="fetch the model version's artifact from the frontend (checksummed, cached in "
        "--cache-dir) instead of reading --model-path [CLIPPER_FETCH_ARTIFACT]",
    )
    p.add_argument(
        "--cache-dir",
        default=_env("CLIPPER_CACHE_DIR"),
        help="where fetched artifacts are kept, by checksum (default: "
        "~/.cache/clipper-serve/artifacts) [CLIPPER_CACHE_DIR]",
    )
    p.add_argument(
        "--ready-file",
        default=_env("CLIPPER_READY_FILE"),
        help="exists while the model is loaded and the container registered with the "
        "frontend (a readiness probe: test -f) [CLIPPER_READY_FILE]",
    )
    p.add_argument(
        "--ready-port",
        type=int,
        default=int(_env("CLIPPER_READY_PORT", "0") or 0) or None,
        help="serve GET /ready (200 or 503) and GET /live on this port [CLIPPER_READY_PORT]",
    )
    p.add_argument(
        "--ready-host",
        default=_env("CLIPPER_READY_HOST", "0.0.0.0"),
        help="address of --ready-port (default 0.0.0.0) [CLIPPER_READY_HOST]",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=float(_env("CLIPPER_DRAIN_TIMEOUT", "10") or 10),
        help="on SIGTERM, answer the batches held for at most this many seconds, then exit "
        "[CLIPPER_DRAIN_TIMEOUT]",
    )
    p.add_argument("--name", default=name, required=name is None, help="[CLIPPER_MODEL_NAME]")
    p.add_argument(
        "--version", default=_env("CLIPPER_MODEL_VERSION", "1"), help="[CLIPPER_MODEL_VERSION]"
    )
    p.add_argument(
        "--input-type",
        default=_env("CLIPPER_INPUT_TYPE", "doubles"),
        help="bytes, integers, floats, doubles, strings or json [CLIPPER_INPUT_TYPE]",
    )
    p.add_argument(
        "--ip",
        default=_env("CLIPPER_IP", "127.0.0.1"),
        help="the frontend's RPC host (default 127.0.0.1) [CLIPPER_IP]",
    )
    port = _env("CLIPPER_PORT")
    p.add_argument(
        "--port",
        type=int,
        default=int(port) if port else None,
        help="the frontend's RPC port (default 7000; with --frontend, dialled only when given) "
        "[CLIPPER_PORT]",
    )
    p.add_argument(
        "--ipc",
        default=None,
        metavar="PATH",
        help="the frontend's Unix socket on this machine, instead of --ip/--port: no CURVE on it "
        "(its directory admits only the frontend's user); what the local manager passes",
    )
    p.add_argument(
        "--frontend",
        action="append",
        default=None,
        metavar="tcp://HOST:PORT",
        help="another frontend to serve (repeatable) [CLIPPER_FRONTENDS, comma-separated]",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        default=_flag("CLIPPER_SHARED"),
        help="a replica of the whole deployment: serve every frontend its FRONTENDS lists "
        "name, do not exit with --parent-pid, exit once no frontend was heard from for "
        "--orphan-timeout-s [CLIPPER_SHARED]",
    )
    p.add_argument(
        "--orphan-timeout-s",
        type=float,
        default=float(_env("CLIPPER_ORPHAN_TIMEOUT_S", "60") or 60),
        help="with --shared: exit after this many seconds without a message from any "
        "frontend (default 60) [CLIPPER_ORPHAN_TIMEOUT_S]",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=float(_env("CLIPPER_HEARTBEAT_INTERVAL", "1.0") or 1.0),
        help="seconds between heartbeats [CLIPPER_HEARTBEAT_INTERVAL]",
    )
    p.add_argument(
        "--activity-timeout",
        type=float,
        default=float(_env("CLIPPER_ACTIVITY_TIMEOUT", "10") or 10),
        help="reconnect after this many seconds without a message [CLIPPER_ACTIVITY_TIMEOUT]",
    )
    p.add_argument(
        "--v3-only",
        action="store_true",
        default=_flag("CLIPPER_V3_ONLY"),
        help="do not advertise the FAST framing [CLIPPER_V3_ONLY]",
    )
    parent = _env("CLIPPER_PARENT_PID")
    p.add_argument(
        "--parent-pid",
        type=int,
        default=int(parent) if parent else None,
        help="exit when this process is gone (not with --shared) [CLIPPER_PARENT_PID]",
    )
    p.add_argument(
        "--replica-token",
        default=_env("CLIPPER_REPLICA_TOKEN", "") or "",
        help="opaque slot token sent with the metadata (set by the local manager) "
        "[CLIPPER_REPLICA_TOKEN]",
    )
    p.add_argument(
        "--rpc-keys",
        default=_env("CLIPPER_RPC_KEYS"),
        help="directory with the frontend's server.key and client.key_secret (its "
        "<state dir>/rpc-keys); needed unless the frontend runs --no-rpc-auth [CLIPPER_RPC_KEYS]",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=int(_env("CLIPPER_NICE", "0") or 0),
        help="lower this process's CPU priority by this much [CLIPPER_NICE]",
    )
    return p


def frontends_from(flags: list[str] | None) -> list[str]:
    """``--frontend`` flags, else ``CLIPPER_FRONTENDS`` (comma-separated)."""
    if flags:
        return flags
    return [a.strip() for a in (_env("CLIPPER_FRONTENDS", "") or "").split(",") if a.strip()]

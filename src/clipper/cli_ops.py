"""The operator commands of ``clipper``: ``apply``, ``export``, ``logs``, ``status`` and
``stop`` (docs/cli.md). Exit codes as the other client commands: 0 done, 1 refused by the
server (or nothing was stopped in time), 2 bad usage or a bad file, 3 server unreachable.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from clipper.client import Client
from clipper.errors import ConfigError
from clipper.tables import autoscale_rows, table
from clipper.untrusted import MAX_FILE_BYTES

__all__ = ["OPERATOR_COMMANDS", "add_operator_commands", "run_operator_command"]

OPERATOR_COMMANDS = frozenset({"apply", "export", "logs", "status", "stop"})
EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
_FOLLOW_POLL_S = 0.5
_STOP_POLL_S = 0.1


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of bytes above 0, got {text!r}")
    return n


def add_operator_commands(
    sub: Any, common: argparse.ArgumentParser, env: Callable[[str, Any], Any]
) -> None:
    a = sub.add_parser(
        "apply",
        parents=[common],
        help="make the frontend serve what a YAML (or JSON) file describes",
        description="Show what will be created, changed and deleted, then do it. Applying the "
        "same file again changes nothing.",
    )
    a.add_argument("-f", "--file", required=True, type=Path, help="the desired-state file")
    a.add_argument("--dry-run", action="store_true", help="show the changes, make none")
    a.add_argument(
        "--max-file-bytes", type=_positive_int, default=MAX_FILE_BYTES, metavar="BYTES",
        help=f"refuse a larger file without reading it (default: {MAX_FILE_BYTES:,})",
    )  # fmt: skip
    a.add_argument(
        "--prune",
        action="store_true",
        help="also delete applications and model versions the file does not mention",
    )
    e = sub.add_parser(
        "export",
        parents=[common],
        help="write what the frontend serves as a file for `clipper apply`, with its artifacts",
    )
    e.add_argument(
        "-o", "--output", required=True, type=Path,
        help="a new directory: gets clipper.yaml and artifacts/<model>/<version>/",
    )  # fmt: skip
    e.add_argument("--format", choices=("yaml", "json"), default="yaml", help="(default: yaml)")
    lg = sub.add_parser("logs", parents=[common], help="print the replica logs of a model")
    lg.add_argument("model", help="MODEL or MODEL:VERSION (default: the serving version)")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing what comes")
    lg.add_argument("--replica", type=int, help="only this replica (as `clipper status` shows)")
    lg.add_argument(
        "--bytes", type=int, default=64 * 1024, dest="tail_bytes",
        help="start with the last this many bytes of each log (default: 65536)",
    )  # fmt: skip
    sub.add_parser(
        "status",
        parents=[common],
        help="applications with their recent rates and latencies, models, replica states",
    )
    st = sub.add_parser("stop", help="stop the frontend that runs on a state directory")
    st.add_argument(
        "--state-dir", type=Path, default=Path(env("STATE_DIR", str(Path.home() / ".clipper"))),
        help="its state directory (default: ~/.clipper) [CLIPPER_STATE_DIR]",
    )  # fmt: skip
    st.add_argument(
        "--timeout", type=float, default=60.0, dest="stop_timeout_s",
        help="seconds to wait for it to exit (default: 60)",
    )  # fmt: skip


def run_operator_command(client: Client | None, args: argparse.Namespace) -> int:
    """Run ``args.command``; :class:`ClipperError` goes to the caller's exit-code mapping."""
    cmd = args.command
    if cmd == "stop":
        return stop_frontend(args.state_dir, args.stop_timeout_s)
    assert client is not None
    if cmd == "apply":
        return _apply(client, args)
    if cmd == "export":
        return _export(client, args)
    if cmd == "logs":
        return _logs(client, args)
    return _status(client, args)


def _say(text: str) -> None:
    print(text, flush=True)


# -- apply / export ----------------------------------------------------------------------------
def _apply(client: Client, args: argparse.Namespace) -> int:
    from clipper.declarative.apply import execute, prepared_artifacts
    from clipper.declarative.plan import make_plan
    from clipper.declarative.spec import read_desired_state

    # DocumentError: nothing was asked of the server.
    desired = read_desired_state(args.file, max_bytes=args.max_file_bytes)
    plan = make_plan(desired, client.admin("export_state", {}), prune=args.prune)
    if args.json:
        doc: dict[str, Any] = {
            "changes": [s.to_json() for s in plan.steps],
            "notes": plan.notes,
            "dry_run": args.dry_run,
        }
        if not args.dry_run and not plan.empty:
            with prepared_artifacts(plan) as ready:
                execute(plan, client, ready, lambda _: None)
        doc["applied"] = not args.dry_run and not plan.empty
        print(orjson.dumps(doc).decode())
        return EXIT_OK
    _say(plan.render())
    if plan.empty:
        return EXIT_OK
    if args.dry_run:
        _say("dry run: nothing was changed")
        return EXIT_OK
    with prepared_artifacts(plan) as ready:  # every artifact loads before the first change
        n = execute(plan, client, ready, _say)
    _say(f"applied {n} changes")
    return EXIT_OK


def _export(client: Client, args: argparse.Namespace) -> int:
    from clipper.declarative.export import export_state

    path = export_state(
        client, args.output, fmt=args.format, echo=lambda line: print(line, file=sys.stderr)
    )
    _say(str(path))
    return EXIT_OK


# -- logs --------------------------------------------------------------------------------------
def _logs(client: Client, args: argparse.Namespace) -> int:
    printer = _LogPrinter()
    try:
        _print_logs(client, args, printer)
    except KeyboardInterrupt:
        if not args.follow:
            raise
        # Ctrl-C is how -f ends, whenever it comes (during the first read too).
    printer.flush()
    return EXIT_OK


def _print_logs(client: Client, args: argparse.Namespace, printer: _LogPrinter) -> None:
    name, _, version = args.model.partition(":")
    doc: dict[str, Any] = {"model_name": name, "max_bytes": min(max(args.tail_bytes, 0), 1 << 20)}
    if version:
        doc["model_version"] = version
    if args.replica is not None:
        doc["replica"] = args.replica
    answer = client.admin("get_replica_logs", doc)
    printer.show(answer["replicas"])
    if not answer["replicas"] and not args.follow:
        print(
            f"clipper: {answer['model_name']}:{answer['model_version']} has no replica logs yet",
            file=sys.stderr,
        )
    if not args.follow:
        return
    doc["model_version"] = answer["model_version"]  # follow the version first shown
    doc["max_bytes"] = 1 << 20
    while True:
        doc["offsets"] = printer.offsets
        time.sleep(_FOLLOW_POLL_S)
        printer.show(client.admin("get_replica_logs", doc)["replicas"])


class _LogPrinter:
    """Prints log chunks; with several replicas, each line prefixed with its replica, a line
    split across two polls printed once whole."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self._partial: dict[int, str] = {}
        self._many = False

    def show(self, chunks: list[dict[str, Any]]) -> None:
        self._many = self._many or len(chunks) > 1
        for c in chunks:
            self.offsets[str(c["replica"])] = c["next_offset"]
            text = c["text"]
            if not text:
                continue
            if not self._many:
                sys.stdout.write(text)
                continue
            text = self._partial.pop(c["replica"], "") + text
            lines = text.split("\n")
            if lines[-1]:
                self._partial[c["replica"]] = lines[-1]
            for line in lines[:-1]:
                sys.stdout.write(f"[replica {c['replica']}] {line}\n")
        sys.stdout.flush()

    def flush(self) -> None:
        for replica, rest in sorted(self._partial.items()):
            sys.stdout.write(f"[replica {replica}] {rest}\n")
        self._partial.clear()
        sys.stdout.flush()


# -- status ------------------------------------------------------------------------------------
def _status(client: Client, args: argparse.Namespace) -> int:
    status = client.admin("get_status", {})
    scaled = autoscale_rows(client.list_models())
    if scaled:
        status["autoscaling"] = scaled
    if args.json:
        print(orjson.dumps(status).decode())
        return EXIT_OK
    apps = [
        {
            **a,
            "slo_ms": a["latency_slo_micros"] / 1000,
            "linked_models": _linked(a),
            "ready": _yes_no(a.get("ready")),
            "errors": _pct(a["error_fraction"]),
            "defaults": _pct(a["default_fraction"]),
        }
        for a in status["applications"]
    ]
    models = [
        {
            **m,
            "current": "yes" if m["is_current_version"] else "",
            "replicas": f"{m['connected_replicas']}/{m['num_replicas']}",
            "errors": _pct(m.get("error_fraction")),
            "defaults": _pct(m.get("default_fraction")),
        }
        for m in status["models"]
    ]
    # Why each application that cannot answer cannot (a failing model: its error rate and
    # latest error), under the tables where an operator reads on.
    unready = [(a["name"], a.get("reasons") or []) for a in status["applications"]]
    unready = [(name, why) for name, why in unready if why]
    sections = (
        (f"applications (rates over the last {status['window_s']:g} s):", apps, _APP_COLUMNS),
        ("models:", models, _MODEL_COLUMNS),
        ("replicas:", status["replicas"], _REPLICA_COLUMNS),
    )
    for title, rows, cols in sections:
        print(title)
        print(table(rows, cols) if rows else "  (none)")
    owner = status.get("replica_owner")
    if owner and owner.get("shared_replicas"):
        here = " (this frontend)" if owner.get("is_owner") else ""
        print(f"replica owner: {owner.get('owner') or 'none'}{here}")
        print(f"frontends sharing the replicas: {', '.join(owner.get('frontends') or [])}")
    if unready:
        print("not ready:")
        for _, why in unready:
            for line in why:
                print(f"  {line}")
    if scaled:
        print("autoscaling:")
        print(table(scaled, list(scaled[0])))
    return EXIT_OK


_APP_COLUMNS = [
    "name", "input_type", "slo_ms", "linked_models", "ready", "qps", "p50_ms", "p99_ms",
    "errors", "defaults",
]  # fmt: skip
_MODEL_COLUMNS = [
    "model_name", "model_version", "current", "replicas", "queue_depth", "model_errors_per_s",
    "errors", "defaults",
]  # fmt: skip


def _linked(app: dict[str, Any]) -> list[str]:
    """An application's linked models; a pipeline's stages as ``stage=model`` (or
    ``stage=app:NAME`` for a stage that asks another application)."""
    stages = app.get("stages")
    if not stages:
        return list(app["linked_models"])
    return [
        f"{s['name']}={s['model']}" if s.get("model") else f"{s['name']}=app:{s['app']}"
        for s in stages
    ]


def _yes_no(value: object) -> str | None:
    return None if value is None else ("yes" if value else "no")


_REPLICA_COLUMNS = [
    "model_name", "model_version", "replica", "state", "location", "restarts", "last_exit", "pid",
    "in_flight_batches", "seconds_since_heard", "log",
]  # fmt: skip


def _pct(fraction: float | None) -> str | None:
    return None if fraction is None else f"{fraction * 100:.1f}%"


# -- stop --------------------------------------------------------------------------------------
def _holder(lock: Path) -> dict[str, Any] | None:
    """What the frontend holding ``lock`` recorded (pid, ports), or None when no process
    holds it: the lock is an flock, dropped by the kernel however its holder ended."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                doc = orjson.loads(os.pread(fd, 4096, 0) or b"{}")
            except orjson.JSONDecodeError:
                doc = {}
            return doc if isinstance(doc, dict) else {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _refused(message: str) -> int:
    print(f"clipper: {message}", file=sys.stderr)
    return EXIT_REFUSED


def _runs_clipper_start(pid: int) -> bool:
    """Whether ``pid``'s command line is a ``clipper start`` (``clipper start``, ``python -m
    clipper start``, ``python -m clipper.cli start``). True where the command line cannot be
    read (no /proc): the lock's holder is then taken at its word."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return not Path("/proc/self/cmdline").exists()
    for i, arg in enumerate(args):
        if arg == b"start":
            before = b" ".join(args[:i])
            return b"clipper" in before
    return False


def stop_frontend(state_dir: Path, timeout_s: float) -> int:
    """SIGTERM the frontend that holds ``state_dir``'s lock and wait until it has let go."""
    from clipper.runtime.state_lock import LOCK_FILE

    lock = Path(state_dir).expanduser() / LOCK_FILE
    holder = _holder(lock)
    if holder is None:
        _say(f"no frontend is running on {lock.parent}: nothing to stop")
        return EXIT_OK
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return _refused(
            f"a frontend holds {lock} but has not recorded its pid yet (it is starting): "
            "try again in a moment"
        )
    ports = ", ".join(
        f"{k.replace('_', ' ')} {v}" for k, v in holder.items() if k.endswith("port") and v
    )
    who = f"the frontend on {lock.parent} (pid {pid}{', ' + ports if ports else ''})"
    if not _runs_clipper_start(pid):
        # An embedded frontend (Clipper, ClipperThread) in a notebook, a script, a test run:
        # SIGTERM would end that whole program, not only its frontend.
        return _refused(
            f"{who} runs embedded in another program, not `clipper start`: stop it from that "
            "program (Clipper.stop())"
        )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        _say(f"{who} has just exited")
        return EXIT_OK
    except PermissionError:
        return _refused(f"not allowed to stop {who}: it runs as another user")
    t0 = time.monotonic()
    while _holder(lock) is not None:
        if time.monotonic() - t0 > timeout_s:
            _say(
                f"{who} is still stopping after {timeout_s:g} s (it answers the requests "
                "in flight first, for up to its drain_timeout_s, then drains its replicas); "
                "run `clipper stop` again to wait more (its signal also ends a drain still "
                f"under way), or `kill -9 {pid}`"
            )
            return EXIT_REFUSED
        time.sleep(_STOP_POLL_S)
    _say(f"stopped {who} in {time.monotonic() - t0:.1f} s")
    return EXIT_OK


def config_error(e: ConfigError) -> int:
    """A bad file or option: every problem on its own line."""
    for line in str(e).splitlines():
        print(f"clipper: {line}", file=sys.stderr)
    return EXIT_USAGE

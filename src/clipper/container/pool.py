"""A pool process: one container process holding many model versions within a memory budget.

Run as ``python -m clipper.container --pool --memory-budget-mb M --ip HOST --port PORT [...]``
by the local manager (``clipper start --pool-processes N``; docs/density.md). It holds no model
at first. The manager drives it over its stdin and stdout, one JSON object a line:

* ``{"op": "load", "name", "version", "input_type", "model_path", "token"}``: load the model
  (on a thread of its own, one load at a time), measure its size, evict least recently used
  models (by last predict) until it fits the budget, then serve it: an ordinary replica of
  ``name:version`` with that replica token, on links of its own to the frontend
  (:class:`clipper.container.runtime._Server` on a thread), so the frontend's replica
  directory, batching and routing see nothing new. Answered ``{"op": "loaded", "token",
  "bytes"}``, or ``{"op": "refused", "token", "error"}`` (a model bigger than the whole budget,
  one that fails to load or to pass its checks).
* ``{"op": "unload", "token"}``: the model leaves: its links say goodbye (the drain path: the
  batches it holds are answered), then ``{"op": "evicted", "token", "reason": "unloaded"}``.
  An eviction for room says ``"reason": "evicted: ..."``.

The size a model is charged: the growth of the process's resident memory while it loaded, and
at least its artifact's size on disk. A load that imported modules (the first model of a
framework) is charged its artifact's size only: the framework stays in the process whatever is
evicted, so it is the process's base, not the model's. The process exits when its stdin closes
(the manager is gone) or on SIGTERM, after every model has drained.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson

from clipper.container.pool_budget import PoolBudget, artifact_bytes
from clipper.container.runtime import _Prefixed, _Server, load_model, start_process
from clipper.errors import ConfigError
from clipper.inputs import InputType
from clipper.rpc.auth import ClientKeys
from clipper.rpc.wire import PredictRequest

__all__ = ["PoolHost", "pool_main", "rss_bytes"]

_log = logging.getLogger("clipper.container.pool")
# Reading a line bigger than this from the manager is a bug, not a request.
_MAX_LINE = 64 * 1024


def rss_bytes() -> int:
    """This process's resident memory, in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _PooledServer(_Server):
    """A model's links in a pool process: as a single-model container's, and it notes when
    it last answered a batch (the LRU order)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_used = time.monotonic()

    def execute(self, req: PredictRequest) -> list[bytes]:
        self.last_used = time.monotonic()
        return super().execute(req)


@dataclass(slots=True)
class _Loaded:
    token: str
    name: str
    version: str
    server: _PooledServer | None
    thread: threading.Thread
    reason: str = "stopped"


class PoolHost:
    """The models of one pool process and the control channel that loads and unloads them."""

    def __init__(
        self,
        *,
        address: str,
        budget_bytes: int,
        heartbeat_interval: float,
        activity_timeout: float,
        drain_timeout: float,
        keys: ClientKeys | None,
        parent_pid: int | None,
        out: IO[bytes],
    ) -> None:
        self.address = address
        self.budget = PoolBudget(budget_bytes)
        self.heartbeat_interval = heartbeat_interval
        self.activity_timeout = activity_timeout
        self.drain_timeout = drain_timeout
        self.keys = keys
        self.parent_pid = parent_pid
        self.out = out
        self._out_lock = threading.Lock()
        self._lock = threading.Lock()  # the models and the budget
        self._load_lock = threading.Lock()  # one load at a time: sizes are measured apart
        self.models: dict[str, _Loaded] = {}
        self.stopping = threading.Event()

    # -- the control channel -------------------------------------------------------------------
    def reply(self, **msg: Any) -> None:
        line = orjson.dumps(msg) + b"\n"
        with self._out_lock:
            try:
                self.out.write(line)
                self.out.flush()
            except (OSError, ValueError):
                self.stopping.set()  # the manager is gone

    def handle(self, line: bytes) -> None:
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            _log.warning("ignoring a control line that is not JSON: %r", line[:200])
            return
        if not isinstance(msg, dict):
            _log.warning("ignoring a control message that is not an object: %r", msg)
            return
        op = msg.get("op")
        if op == "load":
            threading.Thread(
                target=self.load, args=(msg,), name="clipper-pool-load", daemon=True
            ).start()
        elif op == "unload":
            self.evict(str(msg.get("token", "")), "unloaded")
        else:
            _log.warning("ignoring an unknown control message: %r", msg)

    def run(self, stdin: IO[bytes]) -> None:
        """Read control lines until stdin closes (or a stop), then drain every model."""
        reader = threading.Thread(
            target=self._read, args=(stdin,), name="clipper-pool-control", daemon=True
        )
        reader.start()
        while not self.stopping.wait(0.1):
            if self.parent_gone():
                _log.warning("parent process %s is gone; exiting", self.parent_pid)
                break
        self.stop_all()

    def _read(self, stdin: IO[bytes]) -> None:
        while not self.stopping.is_set():
            line = stdin.readline(_MAX_LINE)
            if not line:
                _log.info("control channel closed: leaving")
                break
            if line.strip():
                self.handle(line)
        self.stopping.set()

    def parent_gone(self) -> bool:
        if self.parent_pid is None:
            return False
        try:
            os.kill(self.parent_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return os.getppid() != self.parent_pid

    # -- loading and evicting ------------------------------------------------------------------
    def load(self, msg: dict[str, Any]) -> None:
        token = str(msg.get("token", ""))
        try:
            with self._load_lock:
                size = self._load(msg, token)
        except Exception as e:  # any failure refuses this model only
            _log.warning("refusing %s: %s: %s", token, type(e).__name__, e)
            self.reply(op="refused", token=token, error=f"{e}")
            return
        self.reply(op="loaded", token=token, bytes=size, rss=rss_bytes())

    def _load(self, msg: dict[str, Any], token: str) -> int:
        from clipper.deployers import check  # as serve() does: plain pickles need none of it

        if self.stopping.is_set():
            raise ConfigError("the pool process is stopping")
        name, version = str(msg["name"]), str(msg["version"])
        input_type = InputType.parse(str(msg["input_type"]))
        path = str(msg["model_path"])
        with self._lock:
            if token in self.models:
                return self.budget.size(token)
        floor = artifact_bytes(path)
        self._make_room(floor, keep=token)  # before loading: what is known of its size
        modules, before = len(sys.modules), rss_bytes()
        model = load_model(path)
        setup = getattr(model, "setup", None)
        if callable(setup):
            setup()
        check(model, input_type=input_type)
        gc.collect()
        grown = rss_bytes() - before
        # A load that imported modules grew by its framework too: that is the process's base.
        size = floor if len(sys.modules) != modules else max(floor, grown)
        self._make_room(size, keep=token)
        log = _Prefixed(_log, {"prefix": f"[{name}:{version} pid={os.getpid()} pool]"})
        server = _PooledServer(
            model,
            name=name,
            version=version,
            input_type=input_type,
            addresses=[self.address],
            heartbeat_interval=self.heartbeat_interval,
            activity_timeout=self.activity_timeout,
            fast=True,
            parent_pid=self.parent_pid,
            stop_event=threading.Event(),
            log=log,
            token=token,
            keys=self.keys,
            leave_event=threading.Event(),
            drain_timeout=self.drain_timeout,
        )
        thread = threading.Thread(
            target=self._serve, args=(token,), name=f"clipper-pool-{name}-{version}", daemon=True
        )
        with self._lock:
            self.models[token] = _Loaded(token, name, version, server, thread)
            self.budget.add(token, size, time.monotonic())
        thread.start()
        _log.info("loaded %s:%s (%d bytes, %d models held)", name, version, size, len(self.budget))
        return size

    def _make_room(self, size: int, *, keep: str) -> None:
        with self._lock:
            for token, loaded in self.models.items():
                if loaded.server is not None:
                    self.budget.used(token, loaded.server.last_used)
            victims = self.budget.evictions(size, keep=keep)  # ModelTooBig: refused
        for token in victims:
            self.evict(token, f"evicted: least recently used, for a model of {size} bytes")

    def evict(self, token: str, reason: str) -> None:
        """Tell ``token``'s model to leave (its links drain); reported once it has left."""
        with self._lock:
            loaded = self.models.get(token)
            if loaded is None or loaded.server is None:
                server = None
            else:
                self.budget.remove(token)  # its room is free for the model being loaded
                loaded.reason = reason
                server = loaded.server
        if server is None:
            self.reply(op="evicted", token=token, reason=reason)  # not held (any more)
            return
        _log.info("%s leaves: %s", token, reason)
        server.leave.set()

    def _serve(self, token: str) -> None:
        with self._lock:
            loaded = self.models[token]
        assert loaded.server is not None
        try:
            loaded.server.run()
        except Exception:
            _log.exception("the links of %s failed", token)
        finally:
            with self._lock:
                self.models.pop(token, None)
                self.budget.remove(token)
            reason = loaded.reason
            loaded.server = None  # the model goes with its server
            gc.collect()
            self.reply(op="evicted", token=token, reason=reason)

    def stop_all(self) -> None:
        self.stopping.set()
        with self._lock:
            held = list(self.models.values())
        for loaded in held:
            loaded.reason = "the pool process is stopping"
            if loaded.server is not None:
                loaded.server.leave.set()
        deadline = time.monotonic() + self.drain_timeout + 1.0
        for loaded in held:
            loaded.thread.join(max(deadline - time.monotonic(), 0.0))


def build_pool_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m clipper.container --pool",
        description="A pool process: model versions loaded and unloaded on demand within a "
        "memory budget, driven over stdin/stdout by the local manager (docs/density.md).",
    )
    p.add_argument("--pool", action="store_true", required=True)
    p.add_argument("--memory-budget-mb", type=float, required=True)
    p.add_argument("--ip", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7000)
    p.add_argument("--ipc", default=None, metavar="PATH", help="the frontend's Unix socket")
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--activity-timeout", type=float, default=10.0)
    p.add_argument("--drain-timeout", type=float, default=10.0)
    p.add_argument("--rpc-keys", default=os.environ.get("CLIPPER_RPC_KEYS"))
    p.add_argument("--parent-pid", type=int, default=None)
    p.add_argument("--nice", type=int, default=0)
    return p


def pool_main(argv: Sequence[str]) -> int:
    parser = build_pool_parser()
    args = parser.parse_args(argv)
    if not args.memory_budget_mb > 0:
        parser.error("--memory-budget-mb must be positive")
    if args.nice > 0:
        os.nice(args.nice)
    ok, keys = start_process(args.rpc_keys)
    if not ok:
        return 2
    host = PoolHost(
        address=f"ipc://{args.ipc}" if args.ipc else f"tcp://{args.ip}:{args.port}",
        budget_bytes=int(args.memory_budget_mb * 2**20),
        heartbeat_interval=args.heartbeat_interval,
        activity_timeout=args.activity_timeout,
        drain_timeout=args.drain_timeout,
        keys=keys,
        parent_pid=args.parent_pid,
        out=sys.stdout.buffer,
    )

    def on_signal(signum: int, _frame: object) -> None:
        _log.info("signal %d: draining every model, then exiting", signum)
        host.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _log.info("pool process up: budget %.1f MB, frontend %s", args.memory_budget_mb, host.address)
    host.run(sys.stdin.buffer)
    _log.info("stopping")
    return 0

"""``clipper start --workers N``: one machine's cores, as N frontend processes behind one port.

One frontend is one event loop on one core. The supervisor (:class:`Supervisor`, the
``clipper start`` process itself) runs N worker processes, each a whole frontend
(:class:`clipper.server.Clipper`) started by :func:`worker_main`:

* every worker binds the query port (and the gRPC port, when served) with SO_REUSEPORT, and the
  kernel spreads new connections over them. The supervisor binds those ports first (bound, not
  listening: it accepts nothing) and holds them while it runs, so a port 0 becomes one port for
  all, and another program cannot take it while a worker restarts;
* each worker has its own RPC port (ephemeral, or ``--rpc-port`` + its index when that is
  given), its own state directory ``<state-dir>/workers/<k>`` (its lock, node id and replica
  logs), and they share the store (the SQLite file in ``<state-dir>``, or ``--store``), the
  models and uploads (``<state-dir>``, :attr:`FrontendConfig.artifacts_dir`) and the RPC keys;
* worker 0 binds the admin port; the others bind an ephemeral one each. A change made on the
  admin port is committed to the store, and the other workers hear it from there (the SQLite
  store's change log, polled every few tens of milliseconds, or Redis's events);
* ``<state-dir>/workers.json`` lists the running workers (pid, ports, node id): each one's
  ``/metrics`` is on its own admin port.

The supervisor holds ``<state-dir>``'s lock (``clipper stop`` signals it; a second frontend on
that directory is refused), forwards SIGTERM/SIGINT to every worker (each drains as a single
frontend does; a second signal ends the drains), restarts a worker that exits while the
deployment runs (after a delay that doubles while restarts keep failing fast, logged), and
exits once every worker has stopped. A worker that fails before the deployment was ever ready
(a taken port, a bad setting) stops the whole start: exit status 1. Workers die with the
supervisor (the kernel sends them SIGTERM if it is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Final

import orjson

from clipper.clock import Clock, MonotonicClock, wait_event
from clipper.config import FrontendConfig
from clipper.errors import ClipperError, ConfigError
from clipper.logs import PROTOCOL_LOG
from clipper.runtime.ports import binding
from clipper.runtime.processes import containers_with
from clipper.runtime.state_lock import StateLock

__all__ = [
    "READY_PREFIX",
    "WORKERS_FILE",
    "Supervisor",
    "decode_config",
    "encode_config",
    "reserve_port",
    "restart_delay",
    "worker_config",
    "worker_main",
]

log = logging.getLogger("clipper.workers")

# The line a worker prints on its stdout once it serves, with its ports as JSON.
READY_PREFIX: Final = "clipper-worker ready "
# In the deployment's state directory: the running workers, for scrapers and operators.
WORKERS_FILE: Final = "workers.json"
# A worker that exits is started again after RESTART_MIN_S, doubled for each restart in a row
# that did not live HEALTHY_S, up to RESTART_MAX_S: a crash loop does not spin a core.
RESTART_MIN_S: Final = 0.5
RESTART_MAX_S: Final = 30.0
HEALTHY_S: Final = 10.0
_PR_SET_PDEATHSIG: Final = 1


def worker_config(
    config: FrontendConfig,
    index: int,
    *,
    query_port: int,
    grpc_port: int | None,
    rpc_port_given: bool,
) -> FrontendConfig:
    """Worker ``index``'s settings: the deployment's, with its own state directory, RPC and
    admin ports and node id, and the shared ports, store, artifacts and keys made explicit."""
    if config.state_dir is None:
        raise ConfigError("--workers needs a state directory (--state-dir)")
    root = Path(config.state_dir)
    rpc_port = config.rpc_port + index if rpc_port_given and config.rpc_port else 0
    return dataclasses.replace(
        config,
        state_dir=root / "workers" / str(index),
        artifacts_dir=config.artifacts_dir or root,
        rpc_keys_dir=config.rpc_keys_dir or root / "rpc-keys",
        query_port=query_port,
        grpc_port=grpc_port,
        reuse_port=True,
        rpc_port=rpc_port,
        admin_port=config.admin_port if index == 0 else 0,
        node_id=f"{config.node_id}-{index}" if config.node_id else None,
    )


def encode_config(config: FrontendConfig) -> bytes:
    """The settings as JSON (paths as text), for a worker's stdin: nothing on its command line
    or in its environment, where other users could read an admin token."""
    doc = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return orjson.dumps(doc, default=str)


def decode_config(data: bytes) -> FrontendConfig:
    doc = orjson.loads(data)
    hints = typing.get_type_hints(FrontendConfig)
    for name, hint in hints.items():
        if doc.get(name) is not None and Path in (hint, *typing.get_args(hint)):
            doc[name] = Path(doc[name])
    return FrontendConfig(**doc)


def reserve_port(host: str, port: int, setting: str) -> tuple[int, list[socket.socket]]:
    """Bind ``port`` (0: a free one) on every address of ``host`` with SO_REUSEPORT, without
    listening: the port, and the sockets that hold it for the workers."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    held: list[socket.socket] = []
    chosen = port
    try:
        with binding(setting, port):
            for family, kind, proto, _, addr in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                held.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio does
                sock.bind((addr[0], chosen, *addr[2:]))
                chosen = sock.getsockname()[1]
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return chosen, held


@dataclasses.dataclass(eq=False)
class _Worker:
    index: int
    config: FrontendConfig
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    info: dict[str, Any] | None = None  # its ready line, while it serves
    restarts: int = 0


class Supervisor:
    """Runs the workers of one deployment until a signal (or a failed start) stops them."""

    def __init__(
        self,
        config: FrontendConfig,
        *,
        demo: bool = False,
        log_level: str = "INFO",
        rpc_port_given: bool = False,
        clock: Clock | None = None,
        out: IO[str] | None = None,
    ) -> None:
        if config.workers < 2:
            raise ConfigError("a supervisor runs 2 or more workers (--workers 1 runs one process)")
        if config.store.partition("://")[0].lower() == "memory":
            raise ConfigError(
                "--workers needs a store its workers share: the default sqlite store in the "
                "state directory, or --store redis://..., not memory://"
            )
        if config.state_dir is None:
            raise ConfigError("--workers needs a state directory (--state-dir)")
        self.config = config
        self.state_dir = Path(config.state_dir)
        self.demo = demo
        self.log_level = log_level
        self.rpc_port_given = rpc_port_given
        self.clock: Clock = clock or MonotonicClock()
        self.out = out or sys.stdout
        self.workers: list[_Worker] = []
        self.query_port = 0
        self.grpc_port: int | None = None
        self._stopping = asyncio.Event()
        self._failed: str | None = None

    async def run(self) -> int:
        """0 once every worker stopped after a signal; 1 when the deployment could not start."""
        lock = StateLock(self.state_dir)
        lock.acquire()
        held: list[socket.socket] = []
        try:
            c = self.config
            self.query_port, socks = reserve_port(c.host, c.query_port, "query_port")
            held += socks
            if c.grpc_port is not None:
                self.grpc_port, socks = reserve_port(c.host, c.grpc_port, "grpc_port")
                held += socks
            if c.rpc_auth:
                from clipper.rpc.auth import ensure_keys

                # Made once, before the workers, which would otherwise race to make them.
                await asyncio.to_thread(
                    ensure_keys, Path(c.rpc_keys_dir or self.state_dir / "rpc-keys")
                )
            self.workers = [
                _Worker(k, worker_config(c, k, query_port=self.query_port,
                        grpc_port=self.grpc_port, rpc_port_given=self.rpc_port_given))
                for k in range(c.workers)
            ]  # fmt: skip
            return await self._supervise(lock)
        finally:
            for sock in held:
                sock.close()
            with contextlib.suppress(OSError):
                (self.state_dir / WORKERS_FILE).unlink()
            lock.release()

    async def _supervise(self, lock: StateLock) -> int:
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stop, f"signal {sig.name}")
                installed.append(sig)
        keepers = [
            asyncio.create_task(self._keep(w), name=f"clipper worker {w.index}")
            for w in self.workers
        ]
        try:
            # Until every worker serves, or the start is given up.
            waits: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(asyncio.gather(*(w.ready.wait() for w in self.workers))),
                asyncio.ensure_future(self._stopping.wait()),
            ]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for fut in waits:
                fut.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            if not self._stopping.is_set():
                admin = self.workers[0].info or {}
                lock.describe(
                    query_port=self.query_port,
                    admin_port=admin.get("admin_port"),
                    grpc_port=self.grpc_port,
                    workers=len(self.workers),
                )
                host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
                print(
                    f"clipper-serve ready: query API at http://{host}:{self.query_port} "
                    f"({len(self.workers)} workers)",
                    file=self.out,
                    flush=True,
                )
            await asyncio.gather(*keepers)
            if self._stopping.is_set():
                await asyncio.to_thread(self._stop_left_replicas)
        finally:
            for task in keepers:
                task.cancel()
            await asyncio.gather(*keepers, return_exceptions=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
        if self._failed is not None:
            print(f"clipper start: {self._failed}", file=sys.stderr, flush=True)
            return 1
        return 0

    def _stop_left_replicas(self) -> None:
        """SIGTERM the deployment's shared replicas that outlived every worker. The workers
        drain at once, so each sees the others still live and leaves the replicas to a next
        owner that never comes; the supervisor is the last one out. They are the container
        processes of this machine given this deployment's key directory (``--rpc-keys``)."""
        keys = str(self.config.rpc_keys_dir or self.state_dir / "rpc-keys").encode()
        for pid in containers_with(b"--rpc-keys", keys):
            log.info("stopping shared replica pid %s (no worker left)", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def stop(self, why: str = "stop") -> None:
        """Stop every worker (SIGTERM: each drains); again, and their drains end at once."""
        if not self._stopping.is_set():
            log.info("stopping %d workers (%s)", len(self.workers), why)
        self._stopping.set()
        for w in self.workers:
            if w.proc is not None and w.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)

    async def _keep(self, w: _Worker) -> None:
        """Run worker ``w``, and again each time it exits, until the deployment stops."""
        quick = 0  # restarts in a row that did not live HEALTHY_S
        while not self._stopping.is_set():
            started = self.clock.now()
            rc = await self._run_once(w)
            if self._stopping.is_set():
                return
            if not self._ever_ready():
                # Before the deployment served at all: a setting or a port is wrong, and every
                # restart would fail the same way.
                self._failed = f"worker {w.index} exited with status {rc} while starting"
                self.stop(self._failed)
                return
            lived = self.clock.now() - started
            quick = 0 if lived >= HEALTHY_S else quick + 1
            delay = restart_delay(quick)
            w.restarts += 1
            log.warning(
                "worker %d exited with status %s after %.1f s; restarting it in %.1f s "
                "(restart %d)", w.index, rc, lived, delay, w.restarts,
            )  # fmt: skip
            if await wait_event(self.clock, self._stopping, delay):
                return

    def _ever_ready(self) -> bool:
        return all(w.ready.is_set() for w in self.workers)

    async def _run_once(self, w: _Worker) -> int:
        parent = os.getpid()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clipper.workers",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            # Its own session: a Ctrl-C in the terminal reaches the supervisor only, which
            # sends each worker one SIGTERM (a second would end its drain).
            start_new_session=True,
            preexec_fn=lambda: _die_with(parent),
        )  # fmt: skip
        w.proc = proc
        assert proc.stdin is not None and proc.stdout is not None
        doc = {
            "index": w.index,
            "demo": self.demo and w.index == 0,
            "log_level": self.log_level,
            "config": orjson.Fragment(encode_config(w.config)),
        }
        with contextlib.suppress(ConnectionError):
            proc.stdin.write(orjson.dumps(doc))
            await proc.stdin.drain()
            proc.stdin.close()
        if self._stopping.is_set():  # a signal came while it was being started
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        async for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(READY_PREFIX):
                with contextlib.suppress(orjson.JSONDecodeError):
                    w.info = orjson.loads(line[len(READY_PREFIX) :])
                w.ready.set()
                self._write_workers_file()
                log.info("worker %d ready (pid %d)", w.index, proc.pid)
            else:
                self.out.write(line)
                self.out.flush()
        rc = await proc.wait()
        w.info = None
        self._write_workers_file()
        return rc

    def _write_workers_file(self) -> None:
        doc = {
            "supervisor_pid": os.getpid(),
            "query_port": self.query_port,
            "grpc_port": self.grpc_port,
            "workers": [w.info for w in self.workers if w.info is not None],
        }
        path = self.state_dir / WORKERS_FILE
        tmp = path.with_suffix(".tmp")
        # Replaced whole: a reader never sees half of it.
        tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)


def restart_delay(quick: int) -> float:
    """Seconds before a worker is started again, after ``quick`` short-lived runs in a row."""
    return min(RESTART_MIN_S * 2.0 ** max(quick - 1, 0), RESTART_MAX_S)


def _die_with(parent: int) -> None:
    """In the worker, before it runs: SIGTERM when the supervisor dies, however it dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the prctl
        os.kill(os.getpid(), signal.SIGTERM)


def worker_main(argv: Sequence[str] | None = None) -> int:
    """A worker process: its settings come on stdin as JSON (see :meth:`Supervisor._run_once`)."""
    doc = orjson.loads(sys.stdin.buffer.read())
    index = int(doc["index"])
    logging.basicConfig(
        level=str(doc.get("log_level", "INFO")).upper(),
        format=f"%(asctime)s %(levelname)s worker {index} %(name)s: %(message)s",
    )
    try:
        config = decode_config(orjson.dumps(doc["config"]))
    except ClipperError as e:
        print(f"clipper start: worker {index}: {e}", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(_serve(config, index, demo=bool(doc.get("demo"))))
    except ClipperError as e:  # a taken port, a locked state directory
        print(f"clipper start: worker {index}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"clipper start: worker {index}: cannot start: {e}", file=sys.stderr)
        return 1
    return 0


async def _serve(config: FrontendConfig, index: int, *, demo: bool) -> None:
    from prometheus_client import Gauge

    from clipper.server import Clipper

    try:
        async with Clipper(config) as clipper:
            if demo:
                from clipper.demo import deploy_demo

                for line in await deploy_demo(clipper):
                    print(line, flush=True)
            # Which worker answered a scrape of the shared query port's /metrics.
            Gauge(
                "clipper_worker_info",
                "this frontend's place in its `clipper start --workers N` deployment",
                ["worker", "node_id"],
                registry=clipper.metrics.registry,
            ).labels(worker=str(index), node_id=clipper.node.value).set(1)
            clipper.freeze_heap()
            info = {
                "index": index,
                "pid": os.getpid(),
                "node_id": clipper.node.value,
                "query_port": clipper.http.port,
                "admin_port": clipper.admin_http.port,
                "rpc_port": clipper.rpc.port,
                "grpc_port": clipper.grpc.port if clipper.grpc is not None else None,
            }
            print(READY_PREFIX + orjson.dumps(info).decode(), flush=True)
            await clipper.serve_forever()
    finally:
        PROTOCOL_LOG.flush()


if __name__ == "__main__":
    sys.exit(worker_main())

"""One replica on a Ray cluster: the actor that runs and supervises its container process.

:class:`ReplicaSupervisor` is made a named, detached, restartable Ray actor by
:mod:`clipper.managers.ray_engine`. Ray places it (by its resources) and restarts it when it or its
node dies; the actor in turn starts ``python -m clipper.container --fetch-artifact ...`` on its
node, which dials the frontend over ZeroMQ and fetches the model from it (so nothing of the
frontend's disk is needed here), restarts that process when it exits, and stops it with SIGTERM
(the container drains and says goodbye) when asked. Queries never pass through Ray: an actor call
costs about ten ZeroMQ round trips.

The container gets the actor's pid as ``--parent-pid``: when the actor dies (killed, its node
lost), its container exits by itself, and the restarted actor starts a new one. The CURVE keys
arrive as constructor arguments (through Ray, never on a command line) and are written to a
0700 directory of the actor's own.

This module imports nothing of Ray at import time; :func:`clipper.managers.ray_engine` wraps the
class with ``ray.remote``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["ReplicaSupervisor", "container_command"]

_BACKOFF_START_S = 0.1
_BACKOFF_MAX_S = 5.0
_STABLE_AFTER_S = 10.0
_LOG_LINES = 200


def container_command(spec: dict[str, Any], *, keys_dir: str | None, token: str,
                      parent_pid: int, ready_file: str) -> list[str]:  # fmt: skip
    """The container's command line for ``spec`` (what the manager sent): never a key."""
    keys = ["--rpc-keys", keys_dir] if keys_dir is not None else []
    cache = str(spec.get("cache_dir") or "")
    node = _node_id()
    cache_args = ["--cache-dir", cache.replace("{node}", node)] if cache else []
    return [
        sys.executable, "-m", "clipper.container",
        "--fetch-artifact",
        "--name", str(spec["name"]),
        "--version", str(spec["version"]),
        "--input-type", str(spec["input_type"]),
        "--ip", str(spec["host"]),
        "--port", str(spec["port"]),
        "--heartbeat-interval", str(spec["heartbeat_interval_s"]),
        "--parent-pid", str(parent_pid),
        "--replica-token", token,
        "--ready-file", ready_file,
        *cache_args,
        *keys,
    ]  # fmt: skip


def _node_id() -> str:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # outside Ray (unit use): the host name stands for the node
        return os.uname().nodename


def _node_ip() -> str:
    try:
        import ray.util

        return str(ray.util.get_node_ip_address())
    except Exception:
        return "127.0.0.1"


class ReplicaSupervisor:
    """The actor: see the module docstring. Every method returns quickly (no waits on the
    container but :meth:`stop`)."""

    def __init__(self, name: str, spec: dict[str, Any], keys: dict[str, bytes] | None) -> None:
        self.name = name
        self.spec = spec
        self.workdir = Path(tempfile.mkdtemp(prefix="clipper-replica-"))
        self.keys_dir: str | None = None
        if keys is not None:
            kdir = self.workdir / "rpc-keys"
            kdir.mkdir(mode=0o700)
            for fname, data in keys.items():
                path = kdir / Path(fname).name
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            self.keys_dir = str(kdir)
        self.node_id = _node_id()
        self.node_ip = _node_ip()
        self.lines: collections.deque[str] = collections.deque(maxlen=_LOG_LINES)
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""
        self.generation = 0
        self.restarts = 0
        self.last_exit: int | None = None
        self.stopping = False
        self.reconfiguring = False
        self.thread = threading.Thread(target=self._supervise, name="clipper-replica", daemon=True)
        self.thread.start()

    # -- actor methods ------------------------------------------------------------------------

    def configure(self, spec: dict[str, Any]) -> bool:
        """Adopted by a (restarted) frontend: a new address or settings restart the container
        with them. Returns whether it restarted."""
        with self.lock:
            if spec == self.spec:
                return False
            self.spec = spec
            self.reconfiguring = True
            proc = self.proc
        self._log(f"settings changed ({spec['host']}:{spec['port']}): restarting the container")
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the supervisor starts it again with the new spec
        return True

    def status(self) -> dict[str, Any]:
        with self.lock:
            proc = self.proc
            alive = proc is not None and proc.poll() is None
            return {
                "actor_pid": os.getpid(),
                "pid": proc.pid if alive and proc is not None else None,
                "token": self.token,
                "restarts": self.restarts,
                "last_exit": self.last_exit,
                "state": "stopping" if self.stopping else ("running" if alive else "restarting"),
                "node_id": self.node_id,
                "node_ip": self.node_ip,
                "ready": alive and (self.workdir / "ready").exists(),
                "log": "\n".join(self.lines),
                # A restarted actor runs with its creation arguments: the manager compares
                # and configures it again when the frontend's address changed since.
                "spec": self.spec,
            }

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the container (it drains and says goodbye) and wait for it, at most
        ``grace_s`` before SIGKILL; it is not started again."""
        with self.lock:
            self.stopping = True
            proc = self.proc
        if proc is None:
            return None
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    # -- the supervising thread ---------------------------------------------------------------

    def _log(self, line: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} [actor {self.name}] {line}"
        self.lines.append(stamped)
        print(stamped, file=sys.stderr, flush=True)  # into Ray's log of this actor

    def _start(self) -> subprocess.Popen[bytes]:
        with self.lock:
            self.generation += 1
            self.token = f"{self.name}#{os.getpid()}.{self.generation}"
            ready = str(self.workdir / "ready")
            cmd = container_command(
                self.spec, keys_dir=self.keys_dir, token=self.token,
                parent_pid=os.getpid(), ready_file=ready,
            )  # fmt: skip
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", "1")
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            return self.proc

    def _supervise(self) -> None:
        backoff = _BACKOFF_START_S
        while True:
            if self.stopping:
                return
            started = time.monotonic()
            proc = self._start()
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.lines.append(line)
                print(line, file=sys.stderr, flush=True)
            code = proc.wait()
            with self.lock:
                self.last_exit = code
                if self.stopping:
                    return
                if self.reconfiguring:  # asked for: not a failure, no backoff
                    self.reconfiguring = False
                    continue
                self.restarts += 1
            if time.monotonic() - started > _STABLE_AFTER_S:
                backoff = _BACKOFF_START_S
            self._log(f"container exited with {code}; restarting in {backoff:.1f} s")
            time.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

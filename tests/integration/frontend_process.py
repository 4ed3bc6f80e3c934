"""A ``clipper start`` frontend as a real subprocess, for tests that SIGKILL it.

The frontend listens on free ports picked here (a restart reuses them, as a supervisor restarting
the same configuration would), logs to a file in the test's directory, and is stopped by PID.
Its replicas are ``python -m clipper.container ... --parent-pid <frontend pid>`` processes that
exit by themselves once the frontend is gone; :func:`container_pids` finds them by that flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from clipper.runtime.processes import containers_with
from tests.integration.helpers import Response, pid_alive, post_json, request, wait_for
from tests.integration.redis_server import free_port, terminate

SRC = str(Path(__file__).resolve().parents[2] / "src")

START_LIMIT_S = 60.0


@dataclass(frozen=True, slots=True)
class Ports:
    query: int
    admin: int
    rpc: int

    @classmethod
    def free(cls) -> Ports:
        picked: set[int] = set()
        while len(picked) < 3:
            picked.add(free_port())
        query, admin, rpc = sorted(picked)
        return cls(query, admin, rpc)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone
    # "pid (comm) S ...": the state follows the last ')'.
    return stat[stat.rindex(")") + 2] in "ZX"


def container_pids(parent_pid: int) -> list[int]:
    """Live (not zombie) ``clipper.container`` processes started with ``--parent-pid <it>``."""
    return containers_with(b"--parent-pid", str(parent_pid).encode())


def keyed_container_pids(keys_dir: Path) -> list[int]:
    """Live ``clipper.container`` processes given ``--rpc-keys <keys_dir>``: a deployment's
    shared replicas, which have no parent to name (the key directory is the deployment's)."""
    return containers_with(b"--rpc-keys", str(keys_dir).encode())


def live(pid: int) -> bool:
    return pid_alive(pid) and not _is_zombie(pid)


class FrontendProcess:
    """One frontend configuration (ports, state dir, store); each :meth:`start` is a new process.

    Every PID it ever had is remembered, so :meth:`cleanup` can also reap replicas that outlived
    a killed frontend (they must not, and the tests assert that separately).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        store: str | None = None,
        name: str = "frontend",
        grpc_transport: str | None = None,
    ):
        self.state_dir = state_dir
        self.store = store
        self.name = name
        self.ports = Ports.free()
        # The V2 gRPC port, open on a free port with that transport (None: closed).
        self.grpc_transport = grpc_transport
        self.grpc_port = free_port() if grpc_transport is not None else -1
        self.log_path = state_dir.parent / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.past_pids: list[int] = []
        # Extra environment of the frontend (and so of its replicas, which inherit it).
        self.env: dict[str, str] = {}

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.admin}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "clipper.cli", "start",
            "--host", "127.0.0.1",
            "--query-port", str(self.ports.query),
            "--admin-port", str(self.ports.admin),
            "--rpc-port", str(self.ports.rpc),
            "--grpc-port", str(self.grpc_port),
            "--state-dir", str(self.state_dir),
        ]  # fmt: skip
        if self.grpc_transport is not None:
            cmd += ["--grpc-transport", self.grpc_transport]
        if self.store is not None:
            cmd += ["--store", self.store]
        return cmd

    def _spawn(self) -> subprocess.Popen[bytes]:
        # The child must not inherit a CLIPPER_* setting of the shell that runs the tests.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
        env["PYTHONPATH"] = SRC
        env["OMP_NUM_THREADS"] = "1"
        env.update(self.env)
        with self.log_path.open("ab") as log:
            log.write(f"\n==== start {time.strftime('%H:%M:%S')} ====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        self.past_pids.append(self.proc.pid)
        return self.proc

    async def start(self, *, limit_s: float = START_LIMIT_S) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} already runs"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        proc = self._spawn()

        async def pings() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"{self.name} exited {proc.returncode} while starting; its log ends with:\n"
                    f"{self.log_tail()}"
                )
            try:
                resp = await request(f"{self.admin_url}/admin/ping", limit_s=1.0)
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                return False
            return resp.status == 200

        try:
            await wait_for(
                pings, limit_s=limit_s, interval=0.05, what=f"{self.name} to answer ping"
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.name} log ends with:\n{self.log_tail()}") from None

    def kill(self) -> int:
        """SIGKILL the frontend (only the frontend: its replicas must notice by themselves)."""
        proc = self.proc
        assert proc is not None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        return proc.pid

    def stop(self) -> None:
        """SIGTERM (a graceful stop), SIGKILL after 20 s."""
        if self.proc is not None:
            terminate(self.proc, grace_s=20.0)

    def cleanup(self) -> None:
        """Stop the frontend; then kill, by PID, any replica of any of its past processes that
        is still alive 10 s later (a leak the tests report on their own)."""
        self.stop()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if not any(container_pids(p) for p in self.past_pids):
                return
            time.sleep(0.1)
        for parent in self.past_pids:
            for pid in container_pids(parent):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def log_tail(self, max_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-max_bytes:].decode(errors="replace")

    async def admin(self, route: str, doc: Any, *, limit_s: float = 10.0) -> Response:
        return await post_json(f"{self.admin_url}/admin/{route}", doc, limit_s=limit_s)

    async def admin_ok(self, route: str, doc: Any, *, limit_s: float = 30.0) -> Any:
        """POST and return the decoded JSON (or the text) of a 200 answer; fail otherwise."""
        resp = await self.admin(route, doc, limit_s=limit_s)
        assert resp.status == 200, f"{self.name} {route} {doc!r}: {resp.status} {resp.body[:500]!r}"
        if resp.headers.get("content-type", "").startswith("application/json"):
            return orjson.loads(resp.body)
        return resp.body.decode()

    async def apps(self) -> list[dict[str, Any]]:
        """``get_all_applications`` verbose, sorted by name."""
        apps: list[dict[str, Any]] = await self.admin_ok("get_all_applications", {"verbose": True})
        return sorted(apps, key=lambda a: str(a["name"]))

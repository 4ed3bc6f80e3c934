"""A redis-server for tests: started on a free port, answered PING, stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def start_redis() -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server on a free port that answers PING; the caller stops it with stop_redis."""
    assert REDIS_SERVER is not None
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [REDIS_SERVER, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 10.0
    while not answers_ping(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_redis(proc)
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            pytest.fail(f"redis-server on port {port} did not answer PING within 10 s: {err}")
        time.sleep(0.02)
    return proc, port


def terminate(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM by PID, SIGKILL after ``grace_s``; returns once the process is reaped."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    terminate(proc)
    if proc.stderr:
        proc.stderr.close()

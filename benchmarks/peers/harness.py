"""Install, start, probe and stop one system of the peer benchmark.

    python benchmarks/peers/harness.py install rayserve      # venvs/rayserve (idempotent)
    python benchmarks/peers/harness.py probe rayserve mlp    # start, one native + V2 query, stop

Runs with the project's interpreter (any Python 3.11 with NumPy); each peer runs in its own
virtual environment under ``venvs/`` (not committed). Servers start in their own session, so
stopping kills the whole process group; ``probe`` fails if any process of it survives.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ports import free_port  # noqa: E402
from spec import System, v2_request  # noqa: E402
from workloads import example_input  # noqa: E402

__all__ = ["Running", "install", "load", "start", "venv_python"]

VENVS = HERE / "venvs"
SYSTEMS = ("clipper", "triton", "mlserver", "rayserve", "bentoml", "litserve", "torchserve")
# Every venv gets these: the workloads' own dependencies. torch==2.13.0 is the CPU build on this
# machine's disk (a plain "torch" would pull a multi-GB CUDA build).
BASE_REQUIREMENTS = ("numpy", "scikit-learn", "torch==2.13.0")


def load(name: str) -> System:
    mod = importlib.import_module(f"systems.{name}")
    system = mod.SYSTEM
    assert isinstance(system, System)
    return system


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def install(system: System, log: Path | None = None) -> Path:
    """Create ``venvs/<name>`` and install the system into it (skipped when already done)."""
    py = venv_python(system.name)
    stamp = VENVS / system.name / ".installed"
    wanted = "\n".join([*BASE_REQUIREMENTS, *system.requirements, *system.post_install])
    if stamp.exists() and stamp.read_text() == wanted:
        return py
    out = open(log, "a") if log else None  # noqa: SIM115 (closed below)
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENVS / system.name)], check=True)
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True, stdout=out, stderr=out)
        subprocess.run([*pip, *BASE_REQUIREMENTS], check=True, stdout=out, stderr=out)
        subprocess.run([*pip, *system.requirements], check=True, stdout=out, stderr=out)
        for cmd in system.post_install:
            env = dict(os.environ, VENV=str(VENVS / system.name), PYTHON=str(py))
            subprocess.run(["bash", "-c", cmd], check=True, env=env, stdout=out, stderr=out)
    finally:
        if out:
            out.close()
    stamp.write_text(wanted)
    return py


def versions(system: System) -> dict[str, str]:
    py = venv_python(system.name)
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: out[d] = 'missing'\n"
        "print(json.dumps(out))"
    )
    res = subprocess.run(
        [str(py), "-c", code, *system.version_of], capture_output=True, text=True, check=True
    )
    return dict(json.loads(res.stdout))


@dataclass
class Running:
    system: System
    workload: str
    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http_port}{path}"


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return 0


def post(url: str, body: bytes, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the server leads its own session): catches workers
    that left the server's process group (Ray's do)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def _alive(pgid: int) -> bool:
    return _group_alive(pgid) or bool(_session_pids(pgid))


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> bool:
    """SIGTERM the server's process group, SIGKILL what is left; True if nothing survived."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or _alive(pgid)):
        time.sleep(0.1)
    if proc.poll() is None or _alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        for pid in _session_pids(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    deadline = time.monotonic() + 5
    while _alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pgid)


@contextlib.contextmanager
def start(system: System, workload: str, log_path: Path) -> Iterator[Running]:
    """Start ``system`` serving ``workload``; yield once it answers a native query; stop it."""
    http_port, grpc_port = free_port(), free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"peer-{system.name}-"))
    launch = system.launch(workload, venv_python(system.name), http_port, grpc_port, workdir)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(HERE))
    env.update(launch.env)
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(launch.argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd or str(workdir),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Running(system, workload, proc, http_port, grpc_port, log_path)
    try:
        req = system.native(workload, example_input(workload))
        deadline = time.monotonic() + launch.ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{system.name} exited with {proc.returncode}; see {log_path}")
            if _get(running.url(launch.ready_path)) == 200:
                with contextlib.suppress(OSError):
                    if post(running.url(req.path), req.body)[0] == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name} not ready in {launch.ready_timeout_s}s")
            time.sleep(0.25)
        yield running
    finally:
        clean = stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)
        if not clean:
            print(f"WARNING: processes of {system.name} survived killpg", file=sys.stderr)


def probe(name: str, workload: str) -> int:
    system = load(name)
    install(system)
    print("versions:", versions(system))
    log = Path(tempfile.gettempdir()) / f"probe-{name}-{workload}.log"
    t0 = time.monotonic()
    with start(system, workload, log) as r:
        print(f"ready in {time.monotonic() - t0:.1f}s (log {log})")
        req = system.native(workload, example_input(workload))
        status, body = post(r.url(req.path), req.body)
        print(f"native POST {req.path}: {status} {body[:300]!r}")
        if system.v2_model:
            v2 = v2_request(system.v2_model, example_input(workload))
            status, body = post(r.url(v2.path), v2.body)
            print(f"V2 POST {v2.path}: {status} {body[:300]!r}")
        pgid = r.proc.pid
    print("stopped; anything alive:", _alive(pgid))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install")
    i.add_argument("name", choices=SYSTEMS)
    pr = sub.add_parser("probe")
    pr.add_argument("name", choices=SYSTEMS)
    pr.add_argument("workload", choices=("noop", "logreg", "mlp"))
    a = p.parse_args()
    if a.cmd == "install":
        print(install(load(a.name)))
        return 0
    return probe(a.name, a.workload)


if __name__ == "__main__":
    raise SystemExit(main())

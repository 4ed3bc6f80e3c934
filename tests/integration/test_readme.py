"""The README's Quick start as a new user runs it: its two commands, in their order, in a fresh
virtual environment, with the demo left running while the tests run.

Heavy (a virtual environment, the ``demo`` extra and then the ``test`` extra installed from the
package index: minutes, and about 1.5 GB), so it runs only when asked: ``-m readme`` (as
``.ci/run`` does) or ``CLIPPER_README_TEST=1``.

What it runs is read from README.md's Quick start, not written here: the first bash block (venv,
install, ``clipper start --demo``), the second (the ``curl``, whose answer must be the one the
README shows), the third (the test command). They run in a copy of the project (so the
checkout's own ``.venv`` is left alone) with the state directory in a temporary one
(``CLIPPER_STATE_DIR``). The demo binds the README's ports (1337, 1338, 7000, 8001) when they
are free, which is the point: the tests must pass beside it. On a machine where something else
holds one of them, the demo gets free ports through its documented variables and the curl is
sent to its query port instead.

The test command runs a subset of the suite (``CLIPPER_README_TESTS`` replaces it; ``all`` runs
everything): the unit tests, which start embedded frontends, and the integration modules that
start frontends of their own and drive them through the CLI and the admin API. These are the
tests a frontend bound to a fixed port would break, and they fit in a few minutes; the whole
suite has already run in the step before (``.ci/run``), so running it again here would double
CI's time and prove nothing more about the README.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.readme, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
README_PORTS = {"QUERY": 1337, "ADMIN": 1338, "RPC": 7000, "GRPC": 8001}
SUBSET = (
    "tests/unit tests/integration/test_client_cli.py tests/integration/test_admin_api.py "
    "tests/integration/test_cli_start_errors.py"
)
INSTALL_LIMIT_S = 1800.0
Popen = subprocess.Popen[bytes]
TESTS_LIMIT_S = 1800.0


def _asked(config: pytest.Config) -> bool:
    markexpr = str(config.getoption("markexpr", "") or "")
    return ("readme" in markexpr and "not readme" not in markexpr) or (
        os.environ.get("CLIPPER_README_TEST") == "1"
    )


def quick_start(readme: str) -> list[str]:
    """The bash blocks of the README's Quick start section, in order."""
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    section = section.split("\n### ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_the_quick_start_blocks_are_the_three_commands() -> None:
    """Cheap, and always run: the README still has the shape the heavy test reads."""
    start, curl, tests = quick_start((ROOT / "README.md").read_text())
    assert "python3 -m venv .venv" in start and start.endswith("clipper start --demo")
    assert "'.[test]'" not in start  # the light install
    assert curl.splitlines()[0].startswith("curl ") and curl.splitlines()[1].startswith("# {")
    assert tests.startswith(".venv/bin/pip install -e '.[test]' && ")
    assert tests.endswith(".venv/bin/python -m pytest -q")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _copy_project(dest: Path) -> None:
    ignore = shutil.ignore_patterns(
        "__pycache__",
        "*.pyc",
        ".venv*",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "results",
        "venvs",
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    # What a clone has (tests read the docs' examples, and import benchmark and experiment
    # helpers).
    for name in ("src", "tests", "docs", "benchmarks", "experiments"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)


def _environment() -> dict[str, str]:
    """The user's shell: none of this test run's own Python settings or CLIPPER_* variables."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CLIPPER_", "PYTEST_", "PYTHON", "VIRTUAL_ENV", "COV_"))
    }


@contextlib.contextmanager
def _running(command: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[Popen]:
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        # The whole session: bash, pip or the frontend, and the frontend's replicas.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _tail(log: Path, n: int = 4000) -> str:
    return log.read_bytes()[-n:].decode(errors="replace")


def _wait_ready(proc: Popen, log: Path) -> None:
    deadline = time.monotonic() + INSTALL_LIMIT_S
    while time.monotonic() < deadline:
        if b"clipper-serve ready: query API at " in log.read_bytes():
            return
        if proc.poll() is not None:
            pytest.fail(f"the first command ended ({proc.returncode}):\n{_tail(log)}")
        time.sleep(1.0)
    pytest.fail(f"the demo was not ready within {INSTALL_LIMIT_S} s:\n{_tail(log)}")


def test_the_readme_commands_in_order_with_the_demo_running(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not _asked(request.config):
        pytest.skip("the README's commands in a fresh venv: run with -m readme")
    start, curl_block, tests = quick_start((ROOT / "README.md").read_text())
    project = tmp_path / "project"
    project.mkdir()
    _copy_project(project)
    env = _environment()  # the test command's: the user's shell
    # The demo's state goes to a directory of its own (its ports too, below, if need be): set
    # for the first command only, as the tests read these variables' defaults themselves.
    demo_env = {**env, "CLIPPER_STATE_DIR": str(tmp_path / "state")}
    curl, shown = curl_block.splitlines()[:2]
    if not all(_free(p) for p in README_PORTS.values()):
        # Something else holds a README port: the demo takes free ones, through the documented
        # variables, and the curl goes to its query port.
        ports = {name: _free_port() for name in README_PORTS}
        for name, port in ports.items():
            demo_env[f"CLIPPER_{name}_PORT"] = str(port)
        curl = curl.replace(":1337/", f":{ports['QUERY']}/")
    if shutil.which("curl") is None:
        pytest.fail("curl is not installed (the README's second command uses it)")

    demo_log = tmp_path / "first-command.log"
    with _running(start, project, demo_env, demo_log) as demo:
        _wait_ready(demo, demo_log)
        answered = subprocess.run(
            ["bash", "-c", curl], check=False, cwd=project, env=env, capture_output=True, timeout=30
        )
        assert answered.returncode == 0, answered.stderr
        got, want = orjson.loads(answered.stdout), orjson.loads(shown.removeprefix("# "))
        assert {**got, "query_id": 0} == {**want, "query_id": 0}

        selection = os.environ.get("CLIPPER_README_TESTS", SUBSET)
        command = tests if selection == "all" else f"{tests} {selection}"
        test_log = tmp_path / "test-command.log"
        with test_log.open("wb") as out:
            ran = subprocess.run(
                ["bash", "-c", command], check=False, cwd=project, env=env, stdout=out,
                stderr=subprocess.STDOUT, timeout=TESTS_LIMIT_S,
            )  # fmt: skip
        summary = _tail(test_log)
        assert ran.returncode == 0, summary
        assert re.search(r"\d+ passed", summary), summary
        assert " error" not in summary.splitlines()[-1], summary
        # The demo served on, beside the tests.
        assert demo.poll() is None, _tail(demo_log)
        again = subprocess.run(
            ["bash", "-c", curl], check=False, cwd=project, env=env, capture_output=True, timeout=30
        )
        assert again.returncode == 0 and orjson.loads(again.stdout)["default"] is False
    print(f"README test command ran: {command}", file=sys.stderr)

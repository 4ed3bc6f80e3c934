"""``clipper apply -f`` on hostile files, as a real CLI process: a billion-laughs YAML, a
self-referencing alias, a 50,000-deep list and a 100 MB file are each refused with one line on
stderr naming the file (and line and column), exit status 2, no traceback, and a peak RSS
within 100 MB of the same command refusing a one-line syntax error. No frontend is needed: the
file is judged before the server is asked anything (the admin URL points at nothing).

Each run is bounded (a 30 s subprocess limit); its wall time is reported by
``benchmarks/hostile_files.py``, not asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.redis_server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SRC = str(Path(__file__).resolve().parents[2] / "src")
RSS_MARGIN_KB = 100 * 1024

# Runs the command and prints its peak RSS (KB): this wrapper's only child is the CLI, so
# RUSAGE_CHILDREN is that process's alone, not the test run's.
_PEAK = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, timeout=30)\n"
    "sys.stdout.buffer.write(r.stderr)\n"
    "print(f'\\n@@ {r.returncode} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}')\n"
)


def _laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return "\n".join(lines) + "\napplications: *a9\n"


def _apply(path: Path) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in KB) of ``clipper apply -f path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
    env["PYTHONPATH"] = SRC
    nowhere = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "clipper", "apply", "-f", str(path), "--admin-url", nowhere]
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, *cmd], capture_output=True, env=env, timeout=60, check=True
    ).stdout.decode()
    stderr, _, tail = out.rpartition("\n@@ ")
    rc, rss = tail.split()
    return int(rc), stderr, int(rss)


def test_hostile_files_are_refused_in_one_line_without_growing(tmp_path: Path) -> None:
    baseline = tmp_path / "typo.yaml"
    baseline.write_text("applications: [\n")
    rc, err, base_rss = _apply(baseline)
    assert rc == 2 and err.count("\n") == 1 and "invalid YAML" in err, err

    files = {
        "laughs.yaml": (_laughs(), ":1:5: a YAML anchor (&a0) is not accepted"),
        "self.yaml": ("applications: &x [*x]\n", ":1:15: a YAML anchor (&x) is not accepted"),
        "deep.yaml": (
            "applications: " + "[" * 50_000 + "]" * 50_000 + "\n",
            ":1:78: nested deeper than 64 levels",
        ),
    }
    for name, (text, _) in files.items():
        (tmp_path / name).write_text(text)
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:  # 100 MB of real YAML, not a sparse file
        chunk = b"- {name: a, input_type: doubles}\n" * 30_000
        while f.tell() < 100 * 2**20:
            f.write(chunk)
    size = big.stat().st_size
    files["big.yaml"] = ("", f": {size:,} bytes is over the limit of 4,194,304")

    for name, (_, expected) in files.items():
        rc, err, rss = _apply(tmp_path / name)
        assert rc == 2, (name, rc, err)
        assert "Traceback" not in err, err
        assert err.count("\n") == 1, err  # one line
        assert err.startswith(f"clipper: {tmp_path / name}{expected}"), err
        assert rss - base_rss < RSS_MARGIN_KB, (name, rss, base_rss)

"""How long ``clipper apply -f`` takes to refuse a hostile file, and its peak memory: the
figures for docs/security.md ("Declarative files and logs").

    python benchmarks/hostile_files.py              # each file 3 times
    python benchmarks/hostile_files.py --runs 5 --json

Writes the attack files to a temporary directory (a billion-laughs YAML, aliases 9 levels
deep; ``applications: &x [*x]``; a 50,000-deep flow list as YAML and as JSON; two million
values in a 4 MB list, as YAML and as JSON; a 100 MB file of valid YAML) and a baseline (a
one-line syntax error), then runs the real CLI on each as a subprocess:
``python -m clipper apply -f FILE --admin-url <a closed port>`` (the file is judged
before any server is asked). Reports, per file: the wall time from spawn to exit (Python's
start and imports included: the baseline shows that part), the peak RSS of the CLI process
(``RUSAGE_CHILDREN`` of a wrapper whose only child it is), the exit status and the one line it
printed. Median of ``--runs``. Bounded: each run has a 30 s limit.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
_PEAK = (
    "import resource, subprocess, sys, time\n"
    "t = time.perf_counter()\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, timeout=30)\n"
    "took = time.perf_counter() - t\n"
    "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
    "print(r.returncode, took, rss, r.stderr.decode().strip().replace('\\n', ' | '))\n"
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _files(d: Path) -> dict[str, Path]:
    laughs = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    laughs += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    texts = {
        "baseline (syntax error).yaml": "applications: [\n",
        "billion laughs.yaml": "\n".join(laughs) + "\napplications: *a9\n",
        "self alias.yaml": "applications: &x [*x]\n",
        "50,000-deep list.yaml": "applications: " + "[" * 50_000 + "]" * 50_000 + "\n",
        "50,000-deep list.json": '{"applications": ' + "[" * 50_000 + "]" * 50_000 + "}\n",
        "4 MB, 2 million values.yaml": "applications: [" + "1," * 2_000_000 + "1]\n",
        "4 MB, 2 million values.json": '{"applications": [' + "1," * 2_000_000 + "1]}\n",
    }
    out = {}
    for name, text in texts.items():
        path = d / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
        path.write_text(text)
        out[name] = path
    big = d / "big.yaml"
    with big.open("wb") as f:
        chunk = b"- {name: a, input_type: doubles}\n" * 30_000
        while f.tell() < 100 * 2**20:
            f.write(chunk)
    out["100 MB file.yaml"] = big
    return out


def _run(path: Path) -> tuple[int, float, int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
    env["PYTHONPATH"] = SRC
    cmd = [sys.executable, "-m", "clipper", "apply", "-f", str(path)]
    cmd += ["--admin-url", f"http://127.0.0.1:{_closed_port()}"]
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, *cmd], capture_output=True, env=env, timeout=60, check=True
    ).stdout.decode()
    rc, took, rss, line = out.rstrip("\n").split(" ", 3)
    return int(rc), float(took), int(rss), line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in _files(Path(tmp)).items():
            runs = [_run(path) for _ in range(args.runs)]
            rows.append(
                {
                    "file": name,
                    "exit": runs[0][0],
                    "seconds": statistics.median(r[1] for r in runs),
                    "peak_rss_mb": statistics.median(r[2] for r in runs) / 1024,
                    "stderr": runs[0][3].replace(tmp + "/", ""),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"clipper apply -f, median of {args.runs} ({time.strftime('%Y-%m-%d')})")
    for r in rows:
        print(f"{r['file']:30} exit {r['exit']}  {r['seconds']:.2f} s  {r['peak_rss_mb']:.0f} MB")
        print(f"    {r['stderr'][:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

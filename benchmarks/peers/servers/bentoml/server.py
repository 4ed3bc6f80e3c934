"""Start ``bentoml serve`` for one peer-benchmark workload (the service is in service.py).

    python server.py --workload mlp --port 8000 --home /tmp/x --max-batch-size 64 \
        --max-latency-ms 1000

This process becomes the BentoML server (``exec``), so the harness's signals reach it directly:
its process manager and its one service worker shut down on SIGTERM.
"""

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workload", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--home", required=True, help="BENTOML_HOME (its model and bento stores)")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-latency-ms", type=int, default=1000)
    a = p.parse_args()

    os.environ["BENTOML_HOME"] = a.home
    os.environ["BENTOML_DO_NOT_TRACK"] = "true"  # no usage reports (and no network here)
    argv = [sys.executable, "-m", "bentoml", "serve", "service:WorkloadService"]
    argv += ["--working-dir", str(HERE), "--host", "127.0.0.1", "--port", str(a.port)]
    argv += ["--arg", f"workload={a.workload}", "--arg", f"max_batch_size={a.max_batch_size}"]
    argv += ["--arg", f"max_latency_ms={a.max_latency_ms}"]
    os.execv(sys.executable, argv)


if __name__ == "__main__":
    main()

"""TorchServe serving one peer-benchmark workload (run with the torchserve venv's python).

    python serve.py --workload mlp --http-port 8080 --grpc-port 7070 --workdir /tmp/w

Archives ``workload_handler.py`` with torch-model-archiver into ``<workdir>/model-store``,
writes ``<workdir>/config.properties`` (every address on 127.0.0.1, the model registered at
start-up with its batching settings and one worker), then execs
``torchserve --foreground --ncs --disable-token-auth`` (same pid, so the harness's signals
reach it). The Java frontend and its Python backend worker share our process group.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from ports import LOOPBACK, free_port

HERE = Path(__file__).resolve().parent
PEERS = HERE.parents[1]  # benchmarks/peers, which holds workloads.py

# Our log4j2 config (passed with --log-config, the docs' way to change TorchServe's logging).
# The default one writes ~10 lines per request (access log, frontend metrics, DEBUG and INFO
# lines of the worker thread and the backend's stdout) to files and stdout; here only
# warnings and errors reach stdout (the harness's log), plus the start-up summary.
LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders>
    <Console name="STDOUT" target="SYSTEM_OUT">
      <PatternLayout pattern="%d{ISO8601} [%-5p] %t %c - %m%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="ACCESS_LOG" level="off"/>
    <Logger name="TS_METRICS" level="off"/>
    <Logger name="MODEL_METRICS" level="off"/>
    <Logger name="MODEL_LOG" level="warn"/>
    <Logger name="io.netty" level="error"/>
    <Logger name="org.apache" level="off"/>
    <Logger name="org.pytorch.serve" level="warn"/>
    <Logger name="org.pytorch.serve.ModelServer" level="info"/>
    <Logger name="org.pytorch.serve.wlm.ModelManager" level="info"/>
    <Root level="warn">
      <AppenderRef ref="STDOUT"/>
    </Root>
  </Loggers>
</Configuration>
"""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", required=True)
    p.add_argument("--model", default="m")
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True, help="TorchServe's own gRPC API")
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-batch-delay-ms", type=int, default=2)
    p.add_argument("--workers", type=int, default=1)
    return p.parse_args()


def config_properties(a: argparse.Namespace, store: Path) -> str:
    # Registered at start-up (docs: batch_inference_with_ts.md, "config.properties" variant).
    models = {
        a.model: {
            "1.0": {
                "defaultVersion": True,
                "marName": f"{a.model}.mar",
                "minWorkers": a.workers,
                "maxWorkers": a.workers,
                "batchSize": a.batch_size,
                "maxBatchDelay": a.max_batch_delay_ms,
                "responseTimeout": 120,
            }
        }
    }
    props = {
        "inference_address": f"http://{LOOPBACK}:{a.http_port}",
        "management_address": f"http://{LOOPBACK}:{free_port()}",
        "metrics_address": f"http://{LOOPBACK}:{free_port()}",
        "grpc_inference_address": LOOPBACK,
        "grpc_inference_port": str(a.grpc_port),
        "grpc_management_address": LOOPBACK,
        "grpc_management_port": str(free_port()),
        # Backend workers talk to the frontend over Unix sockets named after these ports
        # (in java.io.tmpdir, which TEMP moves into the work dir); keep them distinct anyway.
        "initial_worker_port": str(free_port()),
        "initial_distribution_port": str(free_port()),
        "model_store": str(store),
        "load_models": f"{a.model}.mar",
        "models": json.dumps(models),
        "default_workers_per_model": str(a.workers),
        # The docs' advice for lightweight models: log off the request path.
        "async_logging": "true",
        # No periodic (once a minute) system-metrics subprocess stealing a core mid-run.
        "disable_system_metrics": "true",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def main() -> int:
    a = parse_args()
    sys.path.insert(0, str(PEERS))
    from workloads import INPUT_SIZE

    if a.workload not in INPUT_SIZE:
        raise SystemExit(f"unknown workload {a.workload!r}")
    workdir = a.workdir.resolve()
    store, tmp, logs = workdir / "model-store", workdir / "tmp", workdir / "logs"
    for d in (store, tmp, logs):
        d.mkdir(parents=True, exist_ok=True)
    model_config = workdir / "model-config.yaml"
    # JSON is YAML; the handler reads its workload from the "handler" section.
    model_config.write_text(json.dumps({"handler": {"workload": a.workload}}) + "\n")
    bindir = Path(sys.executable).parent
    archive = [
        str(bindir / "torch-model-archiver"),
        f"--model-name={a.model}",
        "--version=1.0",
        f"--handler={HERE / 'workload_handler.py'}",
        f"--config-file={model_config}",
        f"--export-path={store}",
        "--force",
    ]
    subprocess.run(archive, check=True)
    config = workdir / "config.properties"
    config.write_text(config_properties(a, store))
    log_config = workdir / "log4j2.xml"
    log_config.write_text(LOG4J2_XML)

    env = dict(os.environ)
    # The worker imports workloads.py through the PYTHONPATH the frontend passes on.
    path = [str(PEERS), *filter(None, env.get("PYTHONPATH", "").split(":"))]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(path))
    # torchserve keeps its pid file in the temp dir and the frontend its worker sockets in
    # java.io.tmpdir (set from TEMP): private ones keep runs from clashing with each other.
    env.update(TMPDIR=str(tmp), TEMP=str(tmp), LOG_LOCATION=str(logs), METRICS_LOCATION=str(logs))
    torchserve = bindir / "torchserve"
    argv = [
        str(torchserve),
        "--foreground",
        "--ncs",
        "--disable-token-auth",
        f"--ts-config={config}",
        f"--log-config={log_config}",
        f"--model-store={store}",
    ]
    os.chdir(workdir)
    os.execve(torchserve, argv, env)
    return 1  # not reached


if __name__ == "__main__":
    raise SystemExit(main())

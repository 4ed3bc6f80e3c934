"""RPC framing benchmark: Clipper v3 framing vs clipper-serve's fast framing.

A mock frontend (a ZeroMQ ROUTER using the real encoders/decoders in ``clipper.rpc.wire``)
drives a real container process (``python -m clipper.container``, a no-op model) with batches of
784-double inputs, once with ``--v3-only`` and once with the fast framing, and reports batches
and inputs per second for each batch size, plus the ratio, from one run.

    python benchmarks/wire_bench.py [--batches 300] [--sizes 1,8,32,128]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import numpy as np
import zmq

from clipper.inputs import InputType
from clipper.rpc import wire


class Noop:
    def predict(self, inputs: object) -> list[int]:
        return [0] * len(inputs)  # type: ignore[arg-type]


def _start(model_path: Path, port: int, fast: bool) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "clipper.container", "--model-path", str(model_path),
        "--name", "m", "--version", "1", "--input-type", "doubles", "--port", str(port),
        "--parent-pid", str(os.getpid()),
    ]  # fmt: skip
    if not fast:
        cmd.append("--v3-only")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _register(sock: zmq.Socket[bytes]) -> tuple[bytes, bool]:
    """Answer heartbeats until the container sends its metadata."""
    while True:
        if not sock.poll(20_000):
            raise TimeoutError("the container did not connect")
        frames = sock.recv_multipart()
        msg = wire.decode_container_message(frames[1:])
        if isinstance(msg, wire.Heartbeat):
            sock.send_multipart([frames[0], *wire.encode_heartbeat_reply(1)])
        elif isinstance(msg, wire.NewContainer):
            return frames[0], msg.fast


def _drive(
    sock: zmq.Socket[bytes], ident: bytes, fast: bool, n: int, batches: int, *, width: int = 784
) -> float:
    items = [np.random.default_rng(i).random(width).tobytes() for i in range(n)]
    t0 = time.perf_counter()
    done = 0
    msg_id = 0
    while done < batches:
        if fast:
            frames = wire.encode_predict_fast(msg_id, InputType.DOUBLES, items)
        else:
            frames = wire.encode_predict_v3(msg_id, InputType.DOUBLES, items)
        sock.send_multipart([ident, *frames])
        while True:
            if not sock.poll(10_000):
                raise TimeoutError("no answer")
            reply = sock.recv_multipart()
            msg = wire.decode_container_message(reply[1:])
            if isinstance(msg, wire.PredictResponse):
                assert msg.outputs is not None and len(msg.outputs) == n, msg
                break
            if isinstance(msg, wire.Heartbeat):
                sock.send_multipart([reply[0], *wire.encode_heartbeat_reply(0)])
        done += 1
        msg_id += 1
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--sizes", default="1,8,32,128")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_path = Path(tmp) / "noop.pkl"
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        model_path.write_bytes(cloudpickle.dumps(Noop()))
        rows = []
        for fast in (False, True):
            ctx = zmq.Context()
            sock = ctx.socket(zmq.ROUTER)
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            proc = _start(model_path, port, fast)
            try:
                ident, advertised = _register(sock)
                assert advertised == fast
                for n in sizes:
                    _drive(sock, ident, fast, n, 20)  # warm-up
                    secs = _drive(sock, ident, fast, n, args.batches)
                    rows.append((fast, n, args.batches / secs, args.batches * n / secs))
            finally:
                proc.terminate()
                proc.wait(10)
                sock.close(0)
                ctx.term()
    by = {(f, n): (b, i) for f, n, b, i in rows}
    print(
        "| batch size | v3 batches/s | fast batches/s | v3 inputs/s | fast inputs/s | fast / v3 |"
    )
    print("|---|---|---|---|---|---|")
    for n in sizes:
        vb, vi = by[(False, n)]
        fb, fi = by[(True, n)]
        print(f"| {n} | {vb:,.0f} | {fb:,.0f} | {vi:,.0f} | {fi:,.0f} | {fb / vb:.2f}x |")


if __name__ == "__main__":
    main()

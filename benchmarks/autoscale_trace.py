"""An autoscaling trace: offered load, replicas and p99 latency against the SLO, over time.

    PYTHONPATH=src python benchmarks/autoscale_trace.py [--png docs/autoscale-trace.png]
        [--scale 1.0] [--json out.json]

``clipper start`` runs in its own process with one application (SLO ``--slo-ms``, 300 ms) and
one model, :class:`models.PacedModel` (5 ms per batch + 20 ms per input: about 45 inputs/s per
replica whatever the batch, and no CPU), autoscaled between 1 and 6 replicas at target
utilisation 0.7, sampled every second, up window 5 s, down window 15 s. An open-loop load
(queries scheduled at the rate whatever the answers, each input new, over keep-alive
connections) follows 0.5x -> 3x -> 0.5x of one replica's capacity: 30 s low, a 20 s ramp,
60 s high, a 20 s ramp down, 90 s low (``--scale`` stretches every phase), after 10 s of the
low load that is not recorded (warm-up).

Every second it records the offered rate, the replica count the autoscaler asked for and the
replicas connected (admin API), the autoscaler's utilisation and capacity estimate, and the
p99 and default share of the queries answered in that second (client side, from the scheduled
send time). The PNG has three panels: load (with the capacity the replicas give at the target),
replicas, and p99 against the SLO. Prints the figures the docs quote (docs/autoscaling.md).

Loopback only; the server is stopped by PID (and its replicas with its process group).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models
from report import Config, Run, free_port, server

APP, MODEL = "paced", "paced"
PER_BATCH_S, PER_INPUT_S = 0.005, 0.02
NOMINAL_RPS = 45.0  # one replica, measured on this machine (the 20 ms per input plus overhead)
MAX_CONNECTIONS = 512
WARMUP_S = 10.0


@dataclass
class Second:
    t: float
    offered_rps: float
    answered: int = 0
    defaults: int = 0
    dropped: int = 0
    p99_ms: float = math.nan
    desired: int = 0
    connected: int = 0
    utilization: float | None = None
    capacity_rps: float | None = None
    last_decision: str | None = None


@dataclass
class Trace:
    slo_ms: float
    seconds: list[Second] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)


def schedule(scale: float) -> list[tuple[float, float, float]]:
    """(duration s, start rate, end rate) phases: 0.5x -> 3x -> 0.5x of one replica."""
    low, high = 0.5 * NOMINAL_RPS, 3.0 * NOMINAL_RPS
    return [
        (30 * scale, low, low),
        (20 * scale, low, high),
        (60 * scale, high, high),
        (20 * scale, high, low),
        (90 * scale, low, low),
    ]


def rate_at(phases: list[tuple[float, float, float]], t: float) -> float | None:
    for duration, a, b in phases:
        if t < duration:
            return a + (b - a) * t / duration
        t -= duration
    return None


class Pool:
    """Keep-alive HTTP/1.1 connections to the query port, opened on demand up to a cap."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0

    async def post(self, path: str, body: bytes) -> tuple[int, bytes] | None:
        """The answer, or None when every connection is busy (the client drops it). A
        keep-alive connection the server closed while idle (after its keep-alive timeout) is
        replaced and the request sent again, as HTTP clients do."""
        while self.idle:
            reader, writer = self.idle.pop()
            try:
                return await self._exchange(reader, writer, path, body)
            except (OSError, asyncio.IncompleteReadError):
                self.open -= 1
                writer.close()
        if self.open >= MAX_CONNECTIONS:
            return None
        self.open += 1
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return await self._exchange(reader, writer, path, body)

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        path: str,
        body: bytes,
    ) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = dict(ln.partition(":")[::2] for ln in lines[1:])
        length = int(next(v for k, v in headers.items() if k.lower() == "content-length"))
        data = await reader.readexactly(length)
        self.idle.append((reader, writer))
        return status, data

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def admin(url: str, route: str, doc: dict[str, Any]) -> Any:
    from clipper.client import Client

    return await asyncio.to_thread(Client(url).admin, route, doc)


async def drive(query_port: int, admin_url: str, scale: float, trace: Trace) -> None:
    phases = schedule(scale)
    pool = Pool(query_port)
    loop = asyncio.get_running_loop()
    # Warm-up, not recorded: the first phase's load for WARMUP_S (connections opened, the
    # replica past its first batches).
    warm: list[asyncio.Task[tuple[int, bytes] | None]] = []
    next_at = start = loop.time()
    while next_at - start < WARMUP_S:
        body = orjson.dumps({"input": [-float(len(warm)) - 1.0, 0.5]})
        warm.append(loop.create_task(pool.post(f"/{APP}/predict", body)))
        next_at += 1.0 / phases[0][1]
        await asyncio.sleep(max(next_at - loop.time(), 0.0))
    await asyncio.gather(*warm, return_exceptions=True)
    t0 = loop.time()
    latencies: list[list[float]] = []  # per second: ms of the queries answered in it
    seconds: list[Second] = []
    pending: set[asyncio.Task[None]] = set()

    def bucket(now: float) -> int:
        i = int(now - t0)
        while len(seconds) <= i:
            r = rate_at(phases, float(len(seconds))) or 0.0
            seconds.append(Second(float(len(seconds)), r))
            latencies.append([])
        return i

    async def one(i: int, scheduled: float) -> None:
        body = orjson.dumps({"input": [float(i), 0.5]})
        try:
            answer = await pool.post(f"/{APP}/predict", body)
        except (OSError, asyncio.IncompleteReadError):
            answer = None
        now = loop.time()
        s = bucket(now)
        if answer is None:
            seconds[s].dropped += 1
            return
        seconds[s].answered += 1
        latencies[s].append((now - scheduled) * 1e3)
        if answer[0] != 200 or orjson.loads(answer[1]).get("default"):
            seconds[s].defaults += 1

    async def sample() -> None:
        while True:
            await asyncio.sleep(1.0)
            s = bucket(loop.time())
            doc = await admin(admin_url, "get_model", {"model_name": MODEL, "model_version": "1"})
            replicas = await admin(admin_url, "get_replicas", {"model_name": MODEL})
            view = doc["autoscale"]
            status = view["status"] or {}
            last = status.get("last_decision")
            sec = seconds[s]
            sec.desired, sec.connected = view["num_replicas"], len(replicas)
            sec.utilization = status.get("utilization")
            sec.capacity_rps = status.get("replica_capacity_rps")
            if last is not None:
                sec.last_decision = last["reason"]
                if not trace.decisions or trace.decisions[-1]["detail"] != last["detail"]:
                    trace.decisions.append({"t": round(s - last["seconds_ago"], 1), **last})

    sampler = loop.create_task(sample())
    i = 0
    try:
        next_at = t0
        while True:
            r = rate_at(phases, next_at - t0)
            if r is None:
                break
            i += 1
            task = loop.create_task(one(i, next_at))
            pending.add(task)
            task.add_done_callback(pending.discard)
            next_at += 1.0 / max(r, 1.0)
            await asyncio.sleep(max(next_at - loop.time(), 0.0))  # pacing the offered load
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        pool.close()
    previous: Second | None = None
    for sec, lat in zip(seconds, latencies, strict=True):
        if sec.desired == 0 and previous is not None:  # a second the sampler did not see
            sec.desired, sec.connected = previous.desired, previous.connected
            sec.capacity_rps, sec.utilization = previous.capacity_rps, previous.utilization
        previous = sec
        if lat:
            lat.sort()
            sec.p99_ms = lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)]
    trace.seconds = seconds


def setup(admin_url: str, slo_ms: float) -> None:
    from clipper.client import Client

    models.picklable()
    c = Client(admin_url)
    c.register_application(APP, "doubles", "-1", round(slo_ms * 1000))
    c.deploy_model(MODEL, "1", models.PacedModel(PER_BATCH_S, PER_INPUT_S), input_type="doubles")
    c.link_model_to_app(APP, MODEL)
    c.set_autoscale(
        MODEL, "1", min_replicas=1, max_replicas=6, target_utilization=0.7,
        interval_s=1.0, up_window_s=5.0, down_window_s=15.0,
    )  # fmt: skip


def figures(trace: Trace, scale: float) -> dict[str, Any]:
    """What the docs quote: when the count moved, how high, p99 and defaults once converged."""
    secs = trace.seconds
    step = 30 * scale  # the ramp up starts
    high_to = 110 * scale
    peak = max(s.desired for s in secs)
    reached = next((s.t for s in secs if s.desired == peak), math.nan)
    connected = next((s.t for s in secs if s.connected == peak), math.nan)
    back = next((s.t for s in secs if s.t > high_to and s.desired == 1), math.nan)
    # converged: from one up window after the last replica connected to the end of the high load
    settled = [s for s in secs if connected + 5 <= s.t < high_to and s.answered]
    lat = sorted(s.p99_ms for s in settled if not math.isnan(s.p99_ms))
    answered = sum(s.answered for s in settled)
    defaults = sum(s.defaults for s in settled)
    return {
        "peak_replicas": peak,
        "peak_asked_s_after_ramp_start": round(reached - step, 1),
        "peak_connected_s_after_ramp_start": round(connected - step, 1),
        "converged_seconds": len(settled),
        "back_to_1_s_after_load_drop_ends": round(back - (130 * scale), 1),
        "converged_high_load_worst_second_p99_ms": round(lat[-1], 1) if lat else None,
        "converged_high_load_median_second_p99_ms": round(lat[len(lat) // 2], 1) if lat else None,
        "converged_high_load_default_share": round(defaults / answered, 4) if answered else None,
        "all_default_share": round(
            sum(s.defaults for s in secs) / max(1, sum(s.answered for s in secs)), 4
        ),
        "decisions": [(d["t"], d["replicas"], d["reason"]) for d in trace.decisions],
    }


def plot(trace: Trace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t for s in trace.seconds]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, sharex=True, figsize=(9, 7), dpi=90)
    ax1.plot(t, [s.offered_rps for s in trace.seconds], label="offered load", color="C0")
    served = [
        s.desired * s.capacity_rps * 0.7 if s.capacity_rps else math.nan for s in trace.seconds
    ]
    ax1.plot(t, served, label="replicas x capacity x target 0.7", color="C2", ls="--")
    ax1.set_ylabel("queries/s")
    ax1.legend(loc="upper right", fontsize=8)
    ax2.step(t, [s.desired for s in trace.seconds], where="post", label="asked", color="C1")
    ax2.plot(t, [s.connected for s in trace.seconds], label="connected", color="C3", ls=":")
    ax2.set_ylabel("replicas")
    ax2.set_ylim(0, max(s.desired for s in trace.seconds) + 1)
    ax2.legend(loc="upper right", fontsize=8)
    ax3.plot(t, [s.p99_ms for s in trace.seconds], label="p99 (per second)", color="C4")
    ax3.axhline(trace.slo_ms, color="k", ls="--", lw=1, label=f"SLO {trace.slo_ms:g} ms")
    share = [100.0 * s.defaults / s.answered if s.answered else 0.0 for s in trace.seconds]
    ax4 = ax3.twinx()
    ax4.bar(t, share, width=1.0, color="C3", alpha=0.3, label="default answers %")
    ax4.set_ylabel("defaults %")
    ax4.set_ylim(0, 100)
    ax3.set_ylabel("latency ms")
    ax3.set_xlabel("seconds")
    ax3.set_ylim(0, trace.slo_ms * 1.3)
    ax3.legend(loc="upper right", fontsize=8)
    ax4.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        "clipper-serve autoscaling to the SLO: 0.5x -> 3x -> 0.5x of one replica's capacity",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--png", type=Path, default=Path("docs/autoscale-trace.png"))
    p.add_argument("--json", type=Path, help="also write every second's figures here")
    p.add_argument("--scale", type=float, default=1.0, help="stretch every phase")
    p.add_argument("--slo-ms", type=float, default=300.0)
    args = p.parse_args(argv)
    qp, ap, rp = free_port(), free_port(), free_port()
    trace = Trace(args.slo_ms)
    with tempfile.TemporaryDirectory(prefix="clipper-autoscale-") as tmp:
        run = Run(out_dir=Path(tmp), cfg=Config())
        cmd = [
            "-m", "clipper", "start", "--query-port", str(qp), "--admin-port", str(ap),
            "--rpc-port", str(rp), "--state-dir", str(Path(tmp) / "state"),
        ]  # fmt: skip
        with server("autoscale", cmd, qp, run):
            admin_url = f"http://127.0.0.1:{ap}"
            setup(admin_url, args.slo_ms)
            started = time.monotonic()
            uvloop.run(drive(qp, admin_url, args.scale, trace))
            print(f"ran {time.monotonic() - started:.0f} s", file=sys.stderr)
    out = figures(trace, args.scale)
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    if args.json is not None:
        args.json.write_bytes(
            orjson.dumps({"figures": out, **asdict(trace)}, option=orjson.OPT_SERIALIZE_NUMPY)
        )
    plot(trace, args.png)
    print(f"wrote {args.png} ({args.png.stat().st_size // 1024} KB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

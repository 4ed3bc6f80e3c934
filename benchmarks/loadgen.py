"""HTTP load generator for clipper-serve benchmarks (importable module and CLI).

Two load models:

* **Closed loop** (``--concurrency C``): C keep-alive HTTP/1.1 connections, each with exactly
  one request outstanding; a new request is sent as soon as the previous answer arrives. Measures
  peak throughput and the latency at that throughput. Engines: ``wrk`` (``/usr/bin/wrk`` driven
  by a generated Lua script; the fastest client) and ``python`` (uvloop + ``asyncio.Protocol``
  over raw sockets, responses parsed with ``httptools``).

* **Open loop** (``--rate R``): requests are *scheduled* independently of the answers, and
  latency is measured from the scheduled send time, so a server (or client) that falls behind
  shows up as latency instead of being hidden by coordinated omission. Two engines:

  * Poisson arrivals (``--poisson``): MLCommons LoadGen (``mlperf_loadgen``, package
    ``mlcommons-loadgen``) in its Server scenario schedules the queries, measures their latency
    and gives its VALID verdict for a latency bound (``--slo-ms``) at the 99th percentile;
    :func:`poisson_run` is the system under test (an asyncio keep-alive client on a thread of
    its own) and one LoadGen run.
  * Fixed intervals (the default): the hand-written Python engine. LoadGen has no
    constant-rate Server mode, and the benchmarks that compare batching policies at one
    steady rate (``report.py``, ``issue10.py``) need one. A pool of keep-alive connections
    grows on demand up to ``--max-connections``; a request that finds no free connection at the
    cap is counted as ``dropped`` (by the client).

Every response body is parsed with orjson (up to ``parse_limit`` bodies) and the share of
answers with ``"default": true`` is reported: clipper-serve answers the application's default
output when it cannot meet the latency SLO, and a benchmark must make that visible.

Examples::

    python benchmarks/loadgen.py --url http://127.0.0.1:1337/bench/predict --input-size 784 \\
        --concurrency 64 --duration 10 --engine wrk
    python benchmarks/loadgen.py --url http://127.0.0.1:1337/bench/predict \\
        --body-file body.json --rate 2000 --duration 10 --json
    python benchmarks/loadgen.py --url http://127.0.0.1:1337/bench/predict --input-size 64 \\
        --rate 2000 --poisson --slo-ms 20 --duration 5
    python benchmarks/loadgen.py --url http://127.0.0.1:1337/bench/predict --input-size 64 \\
        --max-rate-slo-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import numpy as np
import orjson
import uvloop

__all__ = [
    "Counts",
    "KeepAliveConnection",
    "LoadGenClient",
    "LoadResult",
    "PoissonRun",
    "SustainableRate",
    "build_request",
    "closed_loop",
    "make_body",
    "max_sustainable_rate",
    "open_loop",
    "poisson_run",
    "run_wrk",
    "sustainable",
]

WRK_BIN = "/usr/bin/wrk"
_WRK_MARKER = "WRK_JSON "
_NS_PER_US = 1000


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    """One load run. Latencies are in microseconds; ``requests`` counts completed responses."""

    mode: str  # "closed" or "open"
    target: str  # the URL
    rate_or_concurrency: float  # offered rate (open) or number of connections (closed)
    duration_s: float  # measured wall time (first send to last answer)
    requests: int  # responses received (any status)
    throughput_rps: float  # responses per second
    p50_us: float
    p99_us: float
    p999_us: float
    errors: int  # connect/read/write errors and timeouts (requests without a response)
    non_2xx: int  # responses with a status outside 200-299 (wrk: status >= 400)
    defaults: int  # responses whose JSON body has "default": true
    engine: str = "python"
    p90_us: float = 0.0
    mean_us: float = 0.0
    max_us: float = 0.0
    dropped: int = 0  # open loop: scheduled requests with no free connection at the cap
    offered: int = 0  # open loop: scheduled requests
    parsed: int = 0  # response bodies inspected for "default"
    connections: int = 0  # connections opened
    client_lag_p99_us: float = 0.0  # open loop: p99 of (actual send - scheduled send)
    error_kinds: dict[str, int] = field(default_factory=dict)
    # Poisson open loop (engine "loadgen"): LoadGen's verdict for slo_ms at the 99th
    # percentile, and the conditions it found unmet when INVALID.
    loadgen_valid: bool | None = None
    slo_ms: float = 0.0
    loadgen_unmet: list[str] = field(default_factory=list)

    @property
    def default_share(self) -> float:
        """Share of inspected answers that were the default output."""
        return self.defaults / self.parsed if self.parsed else 0.0

    @property
    def goodput_rps(self) -> float:
        """2xx answers per second that were not the default output (useful throughput)."""
        if self.duration_s <= 0:
            return 0.0
        return (self.requests - self.non_2xx) * (1 - self.default_share) / self.duration_s

    @property
    def failure_share(self) -> float:
        """Share of requests that got no 2xx answer (errors, non-2xx, dropped)."""
        total = max(self.offered, self.requests + self.errors + self.dropped, 1)
        return (self.errors + self.non_2xx + self.dropped) / total

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["default_share"] = self.default_share
        d["goodput_rps"] = self.goodput_rps
        d["failure_share"] = self.failure_share
        return d

    def summary(self) -> str:
        what = (
            f"rate={self.rate_or_concurrency:g}/s"
            if self.mode == "open"
            else f"C={self.rate_or_concurrency:g}"
        )
        s = (
            f"{self.mode}/{self.engine} {what}: {self.throughput_rps:,.0f} rps "
            f"(goodput {self.goodput_rps:,.0f}) over {self.duration_s:.2f}s "
            f"({self.requests} responses); latency us "
            f"p50={self.p50_us:,.0f} p99={self.p99_us:,.0f} p99.9={self.p999_us:,.0f} "
            f"mean={self.mean_us:,.0f}; errors={self.errors} non2xx={self.non_2xx} "
            f"defaults={self.defaults}/{self.parsed} ({100 * self.default_share:.2f}%)"
        )
        if self.engine == "loadgen":
            verdict = "VALID" if self.loadgen_valid else "INVALID"
            unmet = f" ({', '.join(self.loadgen_unmet)} not met)" if self.loadgen_unmet else ""
            s += f" LoadGen {verdict} at p99 <= {self.slo_ms:g} ms{unmet}"
        elif self.mode == "open":
            s += f" dropped={self.dropped} client_lag_p99={self.client_lag_p99_us:,.0f}us"
        return s


@dataclass
class SustainableRate:
    """Outcome of :func:`max_sustainable_rate`: the best passing rate and every trial."""

    rate: float  # highest offered rate that passed (0 if none did)
    result: LoadResult | None  # the run at that rate
    trials: list[tuple[float, bool, LoadResult]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "result": self.result.to_dict() if self.result else None,
            "trials": [
                {"rate": r, "ok": ok, "result": res.to_dict()} for r, ok, res in self.trials
            ],
        }


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def make_body(size: int, seed: int = 0) -> bytes:
    """A ``{"input": [size doubles]}`` request body with reproducible random values."""
    rng = random.Random(seed)
    return orjson.dumps({"input": [rng.random() for _ in range(size)]})


def _split_url(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, parts.port or 80, path


def build_request(url: str, body: bytes) -> bytes:
    """The raw HTTP/1.1 ``POST`` of ``body`` (JSON) to ``url``, as the engines send it."""
    host, port, path = _split_url(url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _percentiles_us(lat_ns: Sequence[int] | np.ndarray) -> dict[str, float]:
    if len(lat_ns) == 0:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "p999": 0.0, "mean": 0.0, "max": 0.0}
    a = np.asarray(lat_ns, dtype=np.float64) / _NS_PER_US
    p50, p90, p99, p999 = np.percentile(a, [50, 90, 99, 99.9])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "p999": float(p999),
        "mean": float(a.mean()),
        "max": float(a.max()),
    }


def _is_default(body: bytes) -> bool:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(doc, dict) and doc.get("default") is True


# --------------------------------------------------------------------------------------------
# wrk engine (closed loop)
# --------------------------------------------------------------------------------------------


def _lua_long_string(s: str) -> str:
    level = 0
    while f"]{'=' * level}]" in s:
        level += 1
    eq = "=" * level
    # A newline right after the opening bracket is dropped by Lua; add one so the body is exact.
    return f"[{eq}[\n{s}]{eq}]"


def _wrk_script(body: bytes, count_defaults: bool) -> str:
    lines = [
        'wrk.method = "POST"',
        'wrk.headers["Content-Type"] = "application/json"',
        f"wrk.body = {_lua_long_string(body.decode())}",
        "local threads = {}",
        "function setup(thread) table.insert(threads, thread) end",
        "defaults = 0",
        "parsed = 0",
    ]
    if count_defaults:
        lines += [
            "function response(status, headers, body)",
            "  parsed = parsed + 1",
            "  if body and string.find(body, '\"default\"%s*:%s*true') then",
            "    defaults = defaults + 1",
            "  end",
            "end",
        ]
    lines += [
        "function done(summary, latency, requests)",
        "  local d, p = 0, 0",
        "  for _, t in ipairs(threads) do",
        '    d = d + (t:get("defaults") or 0)',
        '    p = p + (t:get("parsed") or 0)',
        "  end",
        "  local e = summary.errors",
        "  io.write(string.format('" + _WRK_MARKER + '{"requests":%d,"duration_us":%d,'
        '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,'
        '"p50":%.0f,"p90":%.0f,"p99":%.0f,"p999":%.0f,"mean":%.2f,"max":%.0f,'
        '"defaults":%d,"parsed":%d}\\n\',',
        "    summary.requests, summary.duration, e.connect, e.read, e.write, e.status,",
        "    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),",
        "    latency:percentile(99.9), latency.mean, latency.max, d, p))",
        "end",
    ]
    return "\n".join(lines) + "\n"


def run_wrk(
    url: str,
    body: bytes,
    concurrency: int,
    duration_s: float,
    *,
    threads: int = 1,
    timeout_s: float = 10.0,
    count_defaults: bool = True,
    wrk_bin: str = WRK_BIN,
    nice: int = 0,
) -> LoadResult:
    """Closed loop with wrk. ``count_defaults`` adds a Lua ``response()`` hook (costs wrk CPU).
    ``nice`` < 0 (root only) runs wrk ahead of the server for the CPU, so that on a machine
    where they share cores its timestamps are taken when the bytes arrive, not when it next
    gets a core."""
    if not (shutil.which(wrk_bin) or os.path.exists(wrk_bin)):
        raise FileNotFoundError(f"wrk not found at {wrk_bin}")
    threads = max(1, min(threads, concurrency))
    secs = max(1, math.ceil(duration_s))  # wrk takes whole seconds
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(_wrk_script(body, count_defaults))
        script = f.name
    try:
        cmd = [
            *(["nice", "-n", str(nice)] if nice else []),
            wrk_bin,
            f"-t{threads}",
            f"-c{concurrency}",
            f"-d{secs}s",
            f"--timeout={max(1, math.ceil(timeout_s))}s",
            "-s",
            script,
            url,
        ]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=secs + timeout_s + 30, check=False
        )
    finally:
        os.unlink(script)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(_WRK_MARKER)), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (rc={proc.returncode}): {proc.stdout}\n{proc.stderr}")
    d = orjson.loads(line[len(_WRK_MARKER) :])
    dur = d["duration_us"] / 1e6
    kinds = {k: int(d[k]) for k in ("connect", "read", "write", "timeout") if d[k]}
    return LoadResult(
        mode="closed",
        target=url,
        rate_or_concurrency=concurrency,
        duration_s=dur,
        requests=int(d["requests"]),
        throughput_rps=d["requests"] / dur if dur > 0 else 0.0,
        p50_us=float(d["p50"]),
        p99_us=float(d["p99"]),
        p999_us=float(d["p999"]),
        errors=sum(kinds.values()),
        non_2xx=int(d["status"]),
        defaults=int(d["defaults"]),
        engine="wrk",
        p90_us=float(d["p90"]),
        mean_us=float(d["mean"]),
        max_us=float(d["max"]),
        parsed=int(d["parsed"]),
        connections=concurrency,
        error_kinds=kinds,
    )


# --------------------------------------------------------------------------------------------
# Python engine: shared connection protocol and statistics
# --------------------------------------------------------------------------------------------


class _Stats:
    def __init__(self, parse_limit: int | None) -> None:
        self.latencies: list[int] = []
        self.lags: list[int] = []
        self.non_2xx = 0
        self.defaults = 0
        self.parsed = 0
        self.parse_limit = parse_limit
        self.errors: dict[str, int] = {}
        self.last_ns = 0

    def record(self, status: int, body: bytes, latency_ns: int, now_ns: int) -> None:
        self.latencies.append(latency_ns)
        self.last_ns = now_ns
        if not 200 <= status < 300:
            self.non_2xx += 1
        if self.parse_limit is None or self.parsed < self.parse_limit:
            self.parsed += 1
            if _is_default(body):
                self.defaults += 1

    def error(self, kind: str, n: int = 1) -> None:
        if n:
            self.errors[kind] = self.errors.get(kind, 0) + n


class KeepAliveConnection(asyncio.Protocol):
    """One keep-alive connection with at most one request outstanding (``request`` is what
    :meth:`send` writes; a caller with a body per send sets it before each)."""

    def __init__(
        self,
        request: bytes,
        on_response: Callable[[KeepAliveConnection, int, bytes, int], None],
        on_lost: Callable[[KeepAliveConnection], None],
    ) -> None:
        self.request = request
        self.on_response = on_response
        self.on_lost = on_lost
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.start_ns = 0
        self.busy = False
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_lost(self)

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        body = b"".join(self.body)
        self.body.clear()
        keep_alive = self.parser.should_keep_alive()
        self.busy = False
        if not keep_alive:
            self.close()
        self.on_response(self, status, body, self.start_ns)

    # client side
    def send(self, start_ns: int) -> None:
        assert self.transport is not None
        self.busy = True
        self.start_ns = start_ns
        self.transport.write(self.request)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


def _result_from_stats(
    mode: str,
    url: str,
    rate_or_concurrency: float,
    stats: _Stats,
    *,
    t0: int,
    t_end: int,
    **extra: Any,
) -> LoadResult:
    p = _percentiles_us(stats.latencies)
    dur = max(t_end - t0, 1) / 1e9
    n = len(stats.latencies)
    lag = _percentiles_us(stats.lags)["p99"] if stats.lags else 0.0
    return LoadResult(
        mode=mode,
        target=url,
        rate_or_concurrency=rate_or_concurrency,
        duration_s=dur,
        requests=n,
        throughput_rps=n / dur,
        p50_us=p["p50"],
        p99_us=p["p99"],
        p999_us=p["p999"],
        errors=sum(stats.errors.values()),
        non_2xx=stats.non_2xx,
        defaults=stats.defaults,
        engine="python",
        p90_us=p["p90"],
        mean_us=p["mean"],
        max_us=p["max"],
        parsed=stats.parsed,
        client_lag_p99_us=lag,
        error_kinds=dict(stats.errors),
        **extra,
    )


# --------------------------------------------------------------------------------------------
# Python engine: closed loop
# --------------------------------------------------------------------------------------------


async def closed_loop_async(
    url: str,
    body: bytes,
    concurrency: int,
    *,
    duration_s: float | None = 10.0,
    requests: int | None = None,
    timeout_s: float = 10.0,
    parse_limit: int | None = None,
) -> LoadResult:
    """Closed loop on the running event loop: ``concurrency`` connections, one request each."""
    if duration_s is None and requests is None:
        raise ValueError("give duration_s or requests")
    loop = asyncio.get_running_loop()
    host, port, _ = _split_url(url)
    request = build_request(url, body)
    stats = _Stats(parse_limit)
    state = {"sent": 0, "outstanding": 0, "stopping": False, "opened": 0}
    finished = loop.create_future()
    conns: list[KeepAliveConnection] = []
    tasks: set[asyncio.Task[None]] = set()

    def spawn_connect() -> None:
        task = loop.create_task(connect_and_send())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def may_send() -> bool:
        return not state["stopping"] and (requests is None or state["sent"] < requests)

    def send(conn: KeepAliveConnection) -> None:
        state["sent"] += 1
        state["outstanding"] += 1
        conn.send(time.perf_counter_ns())

    def check_done() -> None:
        if state["outstanding"] == 0 and not may_send() and not finished.done():
            finished.set_result(None)

    def on_response(conn: KeepAliveConnection, status: int, rbody: bytes, start_ns: int) -> None:
        now = time.perf_counter_ns()
        state["outstanding"] -= 1
        stats.record(status, rbody, now - start_ns, now)
        if requests is not None and state["sent"] >= requests:
            state["stopping"] = True
        if may_send():
            if conn.closed:
                spawn_connect()
            else:
                send(conn)
        check_done()

    def on_lost(conn: KeepAliveConnection) -> None:
        if conn.busy:
            conn.busy = False
            state["outstanding"] -= 1
            stats.error("read")
            if may_send():
                spawn_connect()
            check_done()

    def factory() -> KeepAliveConnection:
        return KeepAliveConnection(request, on_response, on_lost)

    async def connect() -> KeepAliveConnection | None:
        try:
            _, proto = await loop.create_connection(factory, host, port)
        except OSError:
            stats.error("connect")
            return None
        state["opened"] += 1
        conns.append(proto)
        return proto

    async def connect_and_send() -> None:
        conn = await connect()
        if conn is not None and may_send():
            send(conn)
        check_done()

    initial = [c for c in await asyncio.gather(*(connect() for _ in range(concurrency))) if c]
    if not initial:
        raise ConnectionError(f"could not connect to {host}:{port}")
    t0 = time.perf_counter_ns()
    stats.last_ns = t0
    for conn in initial:
        if may_send():
            send(conn)
    stopper = None
    if duration_s is not None:
        stopper = loop.call_later(duration_s, lambda: (state.update(stopping=True), check_done()))
    check_done()
    try:
        deadline = (duration_s or 0) + timeout_s if duration_s is not None else None
        await asyncio.wait_for(asyncio.shield(finished), deadline)
    except TimeoutError:
        stats.error("timeout", state["outstanding"])
    finally:
        if stopper is not None:
            stopper.cancel()
        for c in conns:
            c.close()
    return _result_from_stats(
        "closed", url, concurrency, stats, t0=t0, t_end=stats.last_ns, connections=state["opened"]
    )


def closed_loop(
    url: str,
    body: bytes,
    concurrency: int,
    *,
    duration_s: float | None = 10.0,
    requests: int | None = None,
    engine: str = "wrk",
    threads: int = 1,
    timeout_s: float = 10.0,
    count_defaults: bool = True,
    nice: int = 0,
) -> LoadResult:
    """Closed-loop load with the chosen engine (``wrk`` does not support ``requests``)."""
    if engine == "wrk":
        if requests is not None or duration_s is None:
            raise ValueError("wrk runs for a duration; use engine='python' for N requests")
        return run_wrk(
            url,
            body,
            concurrency,
            duration_s,
            threads=threads,
            timeout_s=timeout_s,
            count_defaults=count_defaults,
            nice=nice,
        )
    if engine == "python":
        return uvloop.run(
            closed_loop_async(
                url,
                body,
                concurrency,
                duration_s=duration_s,
                requests=requests,
                timeout_s=timeout_s,
                parse_limit=None if count_defaults else 0,
            )
        )
    raise ValueError(f"unknown engine {engine!r}")


# --------------------------------------------------------------------------------------------
# Python engine: open loop at a constant rate
# --------------------------------------------------------------------------------------------

# Poisson arrivals are LoadGen's (see :func:`poisson_run`). This engine stays for the fixed
# intervals only: LoadGen's Server scenario always draws Poisson arrivals and has no
# constant-rate mode, and report.py and issue10.py compare batching policies at one steady rate.


async def open_loop_async(
    url: str,
    body: bytes,
    rate: float,
    *,
    duration_s: float = 10.0,
    max_connections: int = 512,
    initial_connections: int = 8,
    drain_timeout_s: float = 5.0,
    parse_limit: int | None = None,
    spin: bool = False,
) -> LoadResult:
    """Constant-rate open loop on the running event loop (one request every ``1 / rate`` s);
    latency is measured from the scheduled send time.

    Timers on uvloop have millisecond resolution, so a request may be sent up to ~1 ms after
    its scheduled time (reported as ``client_lag_p99_us`` and included in the latency).
    ``spin=True`` busy-polls the loop when the next send is under 2 ms away (more precise,
    burns a CPU).
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    loop = asyncio.get_running_loop()
    host, port, _ = _split_url(url)
    request = build_request(url, body)
    stats = _Stats(parse_limit)
    idle: list[KeepAliveConnection] = []
    conns: list[KeepAliveConnection] = []
    tasks: set[asyncio.Task[None]] = set()
    state = {"open": 0, "outstanding": 0, "dropped": 0, "opened": 0, "scheduling": True}
    drained = asyncio.Event()

    def check_drained() -> None:
        if not state["scheduling"] and state["outstanding"] == 0:
            drained.set()

    def on_response(conn: KeepAliveConnection, status: int, rbody: bytes, sched_ns: int) -> None:
        now = time.perf_counter_ns()
        state["outstanding"] -= 1
        stats.record(status, rbody, now - sched_ns, now)
        if not conn.closed:
            idle.append(conn)
        check_drained()

    def on_lost(conn: KeepAliveConnection) -> None:
        state["open"] -= 1
        if conn in idle:
            idle.remove(conn)
        if conn.busy:
            conn.busy = False
            state["outstanding"] -= 1
            stats.error("read")
            check_drained()

    def factory() -> KeepAliveConnection:
        return KeepAliveConnection(request, on_response, on_lost)

    async def open_conn(sched_ns: int | None) -> None:
        try:
            _, proto = await loop.create_connection(factory, host, port)
        except OSError:
            state["open"] -= 1
            stats.error("connect")
            if sched_ns is not None:
                state["outstanding"] -= 1
                check_drained()
            return
        state["opened"] += 1
        conns.append(proto)
        if sched_ns is None:
            idle.append(proto)
        else:
            stats.lags.append(time.perf_counter_ns() - sched_ns)
            proto.send(sched_ns)

    def dispatch(sched_ns: int) -> None:
        while idle:
            conn = idle.pop()
            if not conn.closed:
                state["outstanding"] += 1
                stats.lags.append(time.perf_counter_ns() - sched_ns)
                conn.send(sched_ns)
                return
        if state["open"] < max_connections:
            state["open"] += 1
            state["outstanding"] += 1
            task = loop.create_task(open_conn(sched_ns))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            state["dropped"] += 1

    # Warm a few connections so the first requests do not all pay for a connect.
    n_init = max(0, min(initial_connections, max_connections))
    state["open"] += n_init
    await asyncio.gather(*(open_conn(None) for _ in range(n_init)))

    interval_ns = 1e9 / rate
    total = max(1, int(rate * duration_s))
    t0 = time.perf_counter_ns()
    stats.last_ns = t0
    next_off = 0.0
    i = 0
    try:
        while i < total:
            now = time.perf_counter_ns()
            due = t0 + int(next_off)
            if due > now:
                wait = (due - now) / 1e9
                await asyncio.sleep(0 if spin and wait < 0.002 else wait)
                continue
            while i < total and t0 + int(next_off) <= now:
                dispatch(t0 + int(next_off))
                i += 1
                next_off += interval_ns
            await asyncio.sleep(0)  # let I/O run between bursts
        state["scheduling"] = False
        check_drained()
        try:
            await asyncio.wait_for(drained.wait(), drain_timeout_s)
        except TimeoutError:
            stats.error("timeout", state["outstanding"])
    finally:
        for c in conns:
            c.close()
    end = max(stats.last_ns, t0 + int(next_off))
    return _result_from_stats(
        "open",
        url,
        rate,
        stats,
        t0=t0,
        t_end=end,
        dropped=state["dropped"],
        offered=total,
        connections=state["opened"],
    )


def open_loop(
    url: str,
    body: bytes,
    rate: float,
    *,
    duration_s: float = 10.0,
    poisson: bool = False,
    slo_ms: float = 20.0,
    max_connections: int = 512,
    drain_timeout_s: float = 5.0,
    spin: bool = False,
) -> LoadResult:
    """Open-loop load at ``rate`` requests/s for ``duration_s``.

    ``poisson=True``: Poisson arrivals by LoadGen (:func:`poisson_run`, every request
    ``body``), its verdict for a ``slo_ms`` bound at p99 in ``loadgen_valid``; LoadGen may run
    a little past ``duration_s`` to issue its minimum query count. Otherwise fixed intervals
    by the Python engine (its own uvloop; ``slo_ms`` unused, ``spin`` and ``drain_timeout_s``
    are its own).
    """
    if poisson:
        run = poisson_run(
            url,
            [build_request(url, body)],
            rate,
            duration_s,
            slo_ms=slo_ms,
            is_default=_is_default,
            max_connections=max_connections,
        )
        return run.load_result(url)
    return uvloop.run(
        open_loop_async(
            url,
            body,
            rate,
            duration_s=duration_s,
            max_connections=max_connections,
            drain_timeout_s=drain_timeout_s,
            spin=spin,
        )
    )


# --------------------------------------------------------------------------------------------
# LoadGen engine: Poisson open loop
# --------------------------------------------------------------------------------------------


def _lg() -> Any:
    """``mlperf_loadgen``, imported on first use: the closed loop and the constant-rate open
    loop run without it."""
    import mlperf_loadgen

    return mlperf_loadgen


@dataclass
class Counts:
    """What our client saw, beside LoadGen's own figures."""

    answered: int = 0  # responses, any status
    defaults: int = 0  # 200 responses whose body is the default output
    non_2xx: int = 0  # responses with a status other than 200
    failed: int = 0  # queries with no response (connect failed, connection lost)

    @property
    def errors(self) -> int:
        return self.non_2xx + self.failed


class LoadGenClient:
    """LoadGen's system under test: sends each sample's request on a keep-alive connection
    (one query in flight per connection, opened as needed, at most ``max_connections``; a
    query that finds none free waits for one, and LoadGen counts the wait as latency) and
    tells LoadGen when it is answered. Runs its own uvloop on a thread of its own, since
    LoadGen's ``StartTest`` blocks the caller and issues from LoadGen's threads."""

    def __init__(
        self,
        host: str,
        port: int,
        requests: Sequence[bytes],
        is_default: Callable[[bytes], bool],
        *,
        max_connections: int = 512,
    ) -> None:
        if not requests:
            raise ValueError("give at least one request")
        self.host, self.port = host, port
        self.requests = requests
        self.is_default = is_default
        self.max_connections = max_connections
        self.counts = Counts()
        self.lg = _lg()
        self.loop = uvloop.new_event_loop()
        self.idle: list[KeepAliveConnection] = []
        self.sending: dict[KeepAliveConnection, tuple[int, int]] = {}
        self.opening = 0
        self.open = 0
        self.opened = 0
        self.waiting: list[tuple[int, int]] = []
        self.conns: set[KeepAliveConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.first_ns = 0
        self.last_ns = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    # LoadGen's threads
    def issue(self, samples: list[Any]) -> None:
        self.loop.call_soon_threadsafe(self._issue, [(s.id, s.index) for s in samples])

    def flush(self) -> None:
        """Nothing is batched on this side."""

    def close(self) -> None:
        """Close every connection and stop the client's loop and thread (after the run)."""

        def shut() -> None:
            for task in self.tasks:
                task.cancel()
            for conn in self.conns:
                conn.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(shut)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()

    # the client's loop
    def _issue(self, samples: list[tuple[int, int]]) -> None:
        if not self.first_ns:
            self.first_ns = time.perf_counter_ns()
        for sample in samples:
            if self.idle:
                self._send(self.idle.pop(), sample)
            else:
                self.waiting.append(sample)
                if self.open + self.opening < self.max_connections:
                    self.opening += 1
                    task = self.loop.create_task(self._connect())
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)

    async def _connect(self) -> None:
        try:
            _, conn = await self.loop.create_connection(
                lambda: KeepAliveConnection(b"", self._answered, self._lost),
                self.host,
                self.port,
            )
        except OSError:
            self.opening -= 1
            if self.waiting:
                self._fail(self.waiting.pop(0))
            return
        self.opening -= 1
        self.open += 1
        self.opened += 1
        self.conns.add(conn)
        self._ready(conn)

    def _ready(self, conn: KeepAliveConnection) -> None:
        if self.waiting:
            self._send(conn, self.waiting.pop(0))
        else:
            self.idle.append(conn)

    def _send(self, conn: KeepAliveConnection, sample: tuple[int, int]) -> None:
        self.sending[conn] = sample
        conn.request = self.requests[sample[1] % len(self.requests)]
        conn.send(0)

    def _answered(self, conn: KeepAliveConnection, status: int, body: bytes, _: int) -> None:
        sample = self.sending.pop(conn)
        self.counts.answered += 1
        if status != 200:
            self.counts.non_2xx += 1
        elif self.is_default(body):
            self.counts.defaults += 1
        self._complete(sample)
        if not conn.closed:
            self._ready(conn)

    def _lost(self, conn: KeepAliveConnection) -> None:
        self.open -= 1
        self.conns.discard(conn)
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        sample = self.sending.pop(conn, None)
        if sample is not None:
            self._fail(sample)

    def _fail(self, sample: tuple[int, int]) -> None:
        # Completed for LoadGen (it must not wait for it), counted as a failure here: a
        # failed query is fast, so LoadGen's latency alone would flatter a broken server.
        self.counts.failed += 1
        self._complete(sample)

    def _complete(self, sample: tuple[int, int]) -> None:
        self.last_ns = time.perf_counter_ns()
        self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(sample[0], 0, 0)])


@dataclass
class PoissonRun:
    """One LoadGen Server-scenario run: LoadGen's verdict and latency figures (its own
    percentiles, from the scheduled issue time) and what our client counted."""

    qps: float  # LoadGen's target rate
    slo_ms: float  # the latency bound, at the 99th percentile
    loadgen_valid: bool
    unmet: list[str]  # LoadGen's conditions that failed (when INVALID)
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    mean_ms: float
    max_ms: float
    completed_qps: float  # LoadGen's completed samples per second
    scheduled_qps: float  # LoadGen's scheduled samples per second
    issued: int  # queries LoadGen issued
    duration_s: float  # our client: first issue to last completion
    connections: int  # connections our client opened
    counts: Counts

    @property
    def answered(self) -> int:
        return self.counts.answered

    @property
    def defaults(self) -> int:
        return self.counts.defaults

    @property
    def errors(self) -> int:
        return self.counts.errors

    @property
    def default_share(self) -> float:
        return self.counts.defaults / max(self.counts.answered, 1)

    def load_result(self, target: str) -> LoadResult:
        """This run as a :class:`LoadResult` (engine ``loadgen``, mode ``open``)."""
        c = self.counts
        # The duration LoadGen's completed rate implies, so that goodput and throughput agree.
        dur = self.issued / self.completed_qps if self.completed_qps > 0 else self.duration_s
        return LoadResult(
            mode="open",
            target=target,
            rate_or_concurrency=self.qps,
            duration_s=dur,
            requests=c.answered,
            throughput_rps=self.completed_qps,
            p50_us=self.p50_ms * 1e3,
            p99_us=self.p99_ms * 1e3,
            p999_us=self.p999_ms * 1e3,
            errors=c.failed,
            non_2xx=c.non_2xx,
            defaults=c.defaults,
            engine="loadgen",
            p90_us=self.p90_ms * 1e3,
            mean_us=self.mean_ms * 1e3,
            max_us=self.max_ms * 1e3,
            offered=self.issued,
            parsed=c.answered - c.non_2xx,
            connections=self.connections,
            error_kinds={"failed": c.failed} if c.failed else {},
            loadgen_valid=self.loadgen_valid,
            slo_ms=self.slo_ms,
            loadgen_unmet=list(self.unmet),
        )


def _summary_field(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else float("nan")


def _summary_ms(text: str, label: str) -> float:
    return _summary_field(text, rf"{label} \(ns\)\s*:\s*(\d+)") / 1e6


def poisson_run(
    target: str | tuple[str, int],
    requests: Sequence[bytes],
    qps: float,
    duration_s: float,
    *,
    slo_ms: float,
    is_default: Callable[[bytes], bool] | None = None,
    max_connections: int = 512,
) -> PoissonRun:
    """One LoadGen Server-scenario run at ``qps`` Poisson arrivals against ``target`` (an
    ``http://`` URL or ``(host, port)``), sending ``requests`` (raw HTTP/1.1 requests, e.g.
    from :func:`build_request`; LoadGen draws sample ``i`` as ``requests[i]``).

    LoadGen runs for at least ``duration_s`` and at least 90% of ``qps * duration_s`` queries
    (at most 3x ``duration_s``) and says VALID when the 99th percentile of latency is within
    ``slo_ms`` and those minimums (and its early-stopping bound) are met. ``is_default``
    (``None``: never) tells the default output from a body. One run at a time per process:
    LoadGen's state is global.
    """
    if qps <= 0 or duration_s <= 0 or slo_ms <= 0:
        raise ValueError("qps, duration_s and slo_ms must be > 0")
    host, port = _split_url(target)[:2] if isinstance(target, str) else target
    lg = _lg()
    client = LoadGenClient(
        host, port, requests, is_default or (lambda _: False), max_connections=max_connections
    )
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = qps
    settings.server_target_latency_ns = round(slo_ms * 1e6)
    settings.server_target_latency_percentile = 0.99
    settings.min_duration_ms = round(duration_s * 1e3)
    settings.max_duration_ms = round(duration_s * 3e3)
    settings.min_query_count = max(int(qps * duration_s * 0.9), 100)
    sut = lg.ConstructSUT(client.issue, client.flush)
    n = len(requests)
    qsl = lg.ConstructQSL(n, n, lambda _: None, lambda _: None)
    with tempfile.TemporaryDirectory(prefix="mlperf-") as out:
        log = lg.LogOutputSettings()
        log.outdir = out
        log.copy_summary_to_stdout = False
        log_settings = lg.LogSettings()
        log_settings.log_output = log
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
            client.close()
        summary = (Path(out) / "mlperf_log_summary.txt").read_text()
    valid = "Result is : VALID" in summary
    # Which of LoadGen's conditions failed (latency bound, duration, query count, early
    # stopping: too few queries to bound the percentile).
    unmet = (
        []
        if valid
        else re.findall(r"^\s*(.+?) satisfied\s*:\s*NO", summary, re.MULTILINE | re.IGNORECASE)
    )
    c = client.counts
    return PoissonRun(
        qps=qps,
        slo_ms=slo_ms,
        loadgen_valid=valid,
        unmet=unmet,
        p50_ms=_summary_ms(summary, r"50\.00 percentile latency"),
        p90_ms=_summary_ms(summary, r"90\.00 percentile latency"),
        p99_ms=_summary_ms(summary, r"99\.00 percentile latency"),
        p999_ms=_summary_ms(summary, r"99\.90 percentile latency"),
        mean_ms=_summary_ms(summary, "Mean latency"),
        max_ms=_summary_ms(summary, "Max latency"),
        completed_qps=_summary_field(summary, r"Completed samples per second\s*:\s*([\d.]+)"),
        scheduled_qps=_summary_field(summary, r"Scheduled samples per second\s*:\s*([\d.]+)"),
        issued=c.answered + c.failed,
        duration_s=max(client.last_ns - client.first_ns, 0) / 1e9,
        connections=client.opened,
        counts=c,
    )


# --------------------------------------------------------------------------------------------
# Max sustainable rate
# --------------------------------------------------------------------------------------------


def sustainable(
    res: LoadResult,
    slo_us: float,
    min_throughput_share: float = 0.95,
    max_default_share: float = 0.01,
    max_failure_share: float = 0.01,
) -> bool:
    """The criteria of :func:`max_sustainable_rate` for one open-loop run.

    A LoadGen (Poisson) run passes on LoadGen's VALID verdict for the SLO at p99 (its latency
    counts from the scheduled issue time, so a server that falls behind fails on latency; the
    run's own bound is ``res.slo_ms``), < 1% defaults and < 1% errors. A constant-rate run
    passes on p99 < SLO, >= 95% of the offered rate achieved, < 1% defaults and < 1%
    errors/non-2xx/dropped.
    """
    if res.engine == "loadgen":
        return (
            res.requests > 0
            and bool(res.loadgen_valid)
            and res.default_share < max_default_share
            and res.failure_share < max_failure_share
        )
    return (
        res.requests > 0
        and res.p99_us < slo_us
        and res.throughput_rps >= min_throughput_share * res.rate_or_concurrency
        and res.default_share < max_default_share
        and res.failure_share < max_failure_share
    )


def max_sustainable_rate(
    url: str,
    body: bytes,
    slo_us: float,
    *,
    start_rate: float = 200.0,
    growth: float = 2.0,
    min_rate: float = 10.0,
    max_rate: float = 200_000.0,
    bisect_steps: int = 4,
    max_steps: int = 14,
    step_duration_s: float = 3.0,
    pause_s: float = 1.0,
    warmup_s: float = 0.5,
    max_connections: int = 512,
    poisson: bool = False,
    log: Callable[[str], None] | None = None,
) -> SustainableRate:
    """Highest offered open-loop rate that passes :func:`sustainable` for ``slo_us``.

    ``poisson=True``: every step is a LoadGen Server-scenario run (Poisson arrivals) with the
    SLO as its p99 bound, and passes on LoadGen's VALID verdict + the default and error caps;
    otherwise a constant-rate run with p99 < SLO, >= 95% achieved and < 1% defaults.

    Geometric search (x ``growth``) from ``start_rate`` until a rate fails (or downwards if the
    first one fails), then ``bisect_steps`` bisections between the best pass and the first
    failure; at most ``max_steps`` runs of ``step_duration_s`` each (LoadGen may run a step a
    little longer, to issue its minimum query count). Each run is preceded by ``warmup_s`` of
    constant-rate load at the same rate (discarded) so that the state the previous (maybe
    overloaded) step left in the server does not decide this one.
    """
    trials: list[tuple[float, bool, LoadResult]] = []
    lo: float | None = None
    hi: float | None = None
    best: LoadResult | None = None
    rate = min(max(start_rate, min_rate), max_rate)
    bisections = 0
    for _ in range(max_steps):
        if warmup_s > 0:
            open_loop(url, body, rate, duration_s=warmup_s, max_connections=max_connections)
        res = open_loop(
            url,
            body,
            rate,
            duration_s=step_duration_s,
            poisson=poisson,
            slo_ms=slo_us / 1e3,
            max_connections=max_connections,
            drain_timeout_s=max(2.0, 3 * slo_us / 1e6),
        )
        ok = sustainable(res, slo_us)
        trials.append((rate, ok, res))
        if log:
            log(f"  search {'PASS' if ok else 'fail'} {res.summary()}")
        if ok and (lo is None or rate > lo):
            lo, best = rate, res
        if not ok and (hi is None or rate < hi):
            hi = rate
        if hi is None:  # still growing
            if rate >= max_rate:
                break
            rate = min(rate * growth, max_rate)
        elif lo is None:  # failing from the start: go down
            rate /= growth
            if rate < min_rate:
                break
        else:
            if bisections >= bisect_steps or hi / lo < 1.02:
                break
            bisections += 1
            rate = (lo + hi) / 2
        time.sleep(pause_s)  # let the server drain
    return SustainableRate(rate=lo or 0.0, result=best, trials=trials)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", required=True, help="e.g. http://127.0.0.1:1337/app/predict")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--body", help="request body (JSON)")
    src.add_argument("--body-file", help="file with the request body")
    src.add_argument("--input-size", type=int, help='generate {"input": [N random doubles]}')
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--rate", type=float, help="open loop at R requests/s")
    mode.add_argument("--concurrency", type=int, help="closed loop with C connections")
    mode.add_argument(
        "--max-rate-slo-ms", type=float, help="search the max sustainable open-loop rate"
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--requests", type=int, help="closed loop: stop after N requests (python)")
    p.add_argument("--engine", choices=["wrk", "python"], default="wrk", help="closed loop")
    p.add_argument("--threads", type=int, default=1, help="wrk threads (default 1)")
    p.add_argument("--timeout", type=float, default=10.0, help="request timeout, s")
    p.add_argument(
        "--poisson", action="store_true", help="open loop and search: Poisson arrivals (LoadGen)"
    )
    p.add_argument(
        "--slo-ms", type=float, default=20.0, help="--rate --poisson: LoadGen's p99 bound"
    )
    p.add_argument("--max-connections", type=int, default=512, help="open loop pool cap")
    p.add_argument(
        "--spin", action="store_true", help="constant-rate open loop: sub-ms send precision"
    )
    p.add_argument("--start-rate", type=float, default=200.0, help="search: first rate")
    p.add_argument("--no-defaults", action="store_true", help="do not inspect bodies")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.body is not None:
        body = args.body.encode()
    elif args.body_file is not None:
        with open(args.body_file, "rb") as f:
            body = f.read().strip()
    else:
        body = make_body(args.input_size or 784)
    out: dict[str, Any]
    if args.concurrency is not None:
        engine = "python" if args.requests is not None else args.engine
        res = closed_loop(
            args.url,
            body,
            args.concurrency,
            duration_s=None if args.requests is not None else args.duration,
            requests=args.requests,
            engine=engine,
            threads=args.threads,
            timeout_s=args.timeout,
            count_defaults=not args.no_defaults,
        )
        out, text = res.to_dict(), res.summary()
    elif args.rate is not None:
        res = open_loop(
            args.url,
            body,
            args.rate,
            duration_s=args.duration,
            poisson=args.poisson,
            slo_ms=args.slo_ms,
            max_connections=args.max_connections,
            spin=args.spin,
        )
        out, text = res.to_dict(), res.summary()
    else:
        log = None if args.json else (lambda s: print(s, file=sys.stderr))
        sr = max_sustainable_rate(
            args.url,
            body,
            args.max_rate_slo_ms * 1000,
            start_rate=args.start_rate,
            step_duration_s=min(args.duration, 5.0),
            max_connections=args.max_connections,
            poisson=args.poisson,
            log=log,
        )
        out = sr.to_dict()
        text = f"max sustainable rate: {sr.rate:,.0f} rps" + (
            f"\n  {sr.result.summary()}" if sr.result else ""
        )
    if args.json:
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    else:
        print(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

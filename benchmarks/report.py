"""Run every benchmark scenario on this machine and write a markdown report.

    python benchmarks/report.py                 # full run (10 s per point, a few minutes)
    python benchmarks/report.py --quick         # smoke run (short points)
    python benchmarks/report.py --only a,b --duration 5 --concurrency 64

Scenarios (each server is a subprocess on free ports, waited for ``ready``, driven by
:mod:`loadgen`, then stopped by PID):

a. ``bare_server.py``: the ceiling (uvloop + httptools + orjson, no model), closed loop wrk.
b. clipper-serve + noop model (784 doubles), same closed loop.
c. clipper-serve + logreg (digits, 64 doubles) at the SLO: unbatched vs aimd vs quantile vs
   fixed: closed-loop throughput and latency, and the max sustainable open-loop rate with
   p99 < SLO (the paper's Fig. 4); then aimd at 90% of its max sustainable rate.
d. aimd on logreg with batch wait 0..4 ms under an open loop at 60% of aimd's peak:
   throughput, mean/p99 latency, mean batch size from ``/metrics`` (the paper's Fig. 5).
e. the admin plane (:mod:`admin_latency`): mutating admin calls against ``clipper start`` with
   its SQLite store vs ``memory://``, sequential and concurrent; target p99 < 10 ms on SQLite.

Results go to ``benchmarks/results/<timestamp>/`` (report.md, results.json, server logs).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
from loadgen import LoadResult

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONTROLLERS = ("unbatched", "aimd", "quantile", "fixed")


@dataclass
class Config:
    duration: float = 10.0
    concurrency: int = 64
    slo_ms: float = 20.0
    fixed_batch: int = 32
    waits_ms: tuple[float, ...] = (0, 1, 2, 3, 4)
    d_load_share: float = 0.6
    peak_share: float = 0.9
    search_step_s: float = 3.0
    search_bisect: int = 3
    search_max_steps: int = 9
    warmup_s: float = 1.0
    wrk_threads: int = 1
    ready_timeout_s: float = 120.0
    admin_calls: int = 100
    admin_concurrency: int = 8

    @property
    def slo_us(self) -> float:
        return self.slo_ms * 1000


@dataclass
class Run:
    """Everything measured, plus a log of what happened."""

    out_dir: Path
    cfg: Config
    results: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def is_ready_line(line: str) -> bool:
    """``serve.py`` and ``bare_server.py`` print ``ready``; ``clipper start`` prints
    ``clipper-serve ready: query API at ...``."""
    text = line.strip()
    return text == "ready" or text.startswith("clipper-serve ready")


def _pump(src: TextIO, dst: TextIO, first: list[str], ready: threading.Event) -> None:
    seen = False
    for line in src:
        dst.write(line)
        dst.flush()
        if not seen and is_ready_line(line):
            seen = True
            ready.set()
        if not seen:
            first.append(line)
    if not seen:
        first.append("<EOF: the server closed its stdout before printing ready>\n")
        ready.set()  # wake the waiter, which reports the failure


@contextlib.contextmanager
def server(
    name: str, args: list[str], port: int, run: Run, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """Start ``python <args>``, wait for ``ready`` and the port, yield, then stop it by PID."""
    log_path = run.out_dir / f"{name}.log"
    full_env = dict(os.environ)
    full_env["PYTHONUNBUFFERED"] = "1"
    # An explicit PYTHONPATH comes first (e.g. to try another build), then this checkout's src.
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (full_env.get("PYTHONPATH", ""), str(ROOT / "src")) if p
    )
    if env:
        full_env.update(env)
    with open(log_path, "w") as log:
        log.write(f"$ {sys.executable} {' '.join(args)}\n")
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the model containers join it
        )
        try:
            ready = threading.Event()
            first: list[str] = []
            assert proc.stdout is not None
            pump = threading.Thread(target=_pump, args=(proc.stdout, log, first, ready))
            pump.daemon = True
            pump.start()
            ok = ready.wait(run.cfg.ready_timeout_s)
            if not ok or (first and first[-1].startswith("<EOF")) or proc.poll() is not None:
                tail = "".join(first[-30:])
                raise RuntimeError(f"{name} did not become ready (rc={proc.poll()}):\n{tail}")
            _wait_port(port, 10)
            run.log(f"{name} ready (pid {proc.pid}, port {port})")
            yield proc
        finally:
            _stop(proc)
            run.log(f"{name} stopped (rc={proc.returncode})")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _stop(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """SIGTERM the server by PID; then clean up what is left of the group it started."""
    pgid = proc.pid  # start_new_session=True: the group id is the server's PID
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    deadline = time.monotonic() + 3
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(pgid):  # orphaned model containers of this server
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        time.sleep(1)
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

_METRIC_RE = re.compile(r"^clipper_model_batch_size_(sum|count)(\{[^}]*\})?\s+(\S+)")


def batch_size_totals(port: int) -> tuple[float, float] | None:
    """(sum, count) of the ``clipper_model_batch_size`` histogram, or None if unavailable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    totals = {"sum": 0.0, "count": 0.0}
    found = False
    for line in text.splitlines():
        m = _METRIC_RE.match(line)
        if m and (m.group(2) is None or 'model="m"' in m.group(2)):
            totals[m.group(1)] += float(m.group(3))
            found = True
    return (totals["sum"], totals["count"]) if found else None


_BUCKET_RE = re.compile(r'^clipper_app_latency_seconds_bucket\{app="bench",le="([^"]+)"\}\s+(\S+)')


def latency_buckets(port: int) -> dict[float, float] | None:
    """The server's own cumulative latency histogram for the bench app: {upper bound: count}."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError:
        return None
    out = {
        float(m.group(1)): float(m.group(2)) for m in map(_BUCKET_RE.match, text.splitlines()) if m
    }
    return out or None


def server_quantile_ms(
    before: dict[float, float] | None, after: dict[float, float] | None, q: float
) -> float:
    """Upper bound (ms) of the histogram bucket holding the server-side ``q`` quantile of the
    queries answered between the two scrapes: the server's view, without client lag."""
    if before is None or after is None:
        return float("nan")
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0.0)
    if total <= 0:
        return float("nan")
    for b in bounds:
        if after[b] - before.get(b, 0.0) >= q * total:
            return b * 1000.0
    return float("inf")


def mean_batch(before: tuple[float, float] | None, after: tuple[float, float] | None) -> float:
    if before is None or after is None or after[1] <= before[1]:
        return float("nan")
    return (after[0] - before[0]) / (after[1] - before[1])


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def noop_body() -> bytes:
    return loadgen.make_body(784)


def logreg_body() -> bytes:
    sys.path.insert(0, str(HERE))
    import models

    return orjson.dumps({"input": models.digits_inputs(1)[0]})


def _closed(run: Run, url: str, body: bytes) -> LoadResult:
    cfg = run.cfg
    if cfg.warmup_s > 0:
        loadgen.closed_loop(url, body, cfg.concurrency, duration_s=cfg.warmup_s, engine="wrk")
    res = loadgen.closed_loop(
        url,
        body,
        cfg.concurrency,
        duration_s=cfg.duration,
        engine="wrk",
        threads=cfg.wrk_threads,
    )
    run.log("  " + res.summary())
    return res


def _open(run: Run, url: str, body: bytes, rate: float, duration: float) -> LoadResult:
    if run.cfg.warmup_s > 0:
        loadgen.open_loop(url, body, rate, duration_s=run.cfg.warmup_s)
    res = loadgen.open_loop(url, body, rate, duration_s=duration)
    run.log("  " + res.summary())
    return res


def _serve_args(
    qp: int, rp: int, model: str, controller: str, *, wait_ms: float, cfg: Config
) -> list[str]:
    args = [
        str(HERE / "serve.py"),
        "--query-port",
        str(qp),
        "--rpc-port",
        str(rp),
        "--model",
        model,
        "--controller",
        controller,
        "--max-wait-ms",
        str(wait_ms),
        "--slo-ms",
        str(cfg.slo_ms),
    ]
    if controller == "fixed":
        args += ["--max-batch-size", str(cfg.fixed_batch)]
    return args


@contextlib.contextmanager
def _load_on_cpu1() -> Iterator[list[str]]:
    """The ratio of (b) to (a) is defined with the server on one core and wrk on the other:
    yield the server's pinning arguments and run the load (wrk, a child) on CPU 1. Unpinned,
    the kernel's placement of the frontend, its container and wrk made (b) bimodal (9.5k or
    13.5k req/s from one run to the next, whatever the code)."""
    if (os.cpu_count() or 1) < 2:
        yield []
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        yield ["--cpus", "0"]
    finally:
        os.sched_setaffinity(0, before)


def scenario_a(run: Run) -> None:
    port = free_port()
    run.log(f"(a) bare server, closed loop C={run.cfg.concurrency}")
    with _load_on_cpu1() as pin:
        args = [str(HERE / "bare_server.py"), "--port", str(port), *pin]
        with server("a_bare", args, port, run):
            res = _closed(run, f"http://127.0.0.1:{port}/bench/predict", noop_body())
    run.results["a"] = {"closed": res.to_dict()}


def scenario_b(run: Run) -> None:
    qp, rp = free_port(), free_port()
    run.log(f"(b) clipper-serve + noop, closed loop C={run.cfg.concurrency}")
    with _load_on_cpu1() as pin:
        args = [*_serve_args(qp, rp, "noop", "aimd", wait_ms=0, cfg=run.cfg), *pin]
        _scenario_b(run, qp, args)


def _scenario_b(run: Run, qp: int, args: list[str]) -> None:
    with server("b_clipper_noop", args, qp, run):
        before = batch_size_totals(qp)
        res = _closed(run, f"http://127.0.0.1:{qp}/bench/predict", noop_body())
        mb = mean_batch(before, batch_size_totals(qp))
    run.results["b"] = {"closed": res.to_dict(), "mean_batch": mb}


def _search(run: Run, url: str, body: bytes, start: float) -> loadgen.SustainableRate:
    cfg = run.cfg
    return loadgen.max_sustainable_rate(
        url,
        body,
        cfg.slo_us,
        start_rate=max(20.0, start),
        growth=2.0,
        bisect_steps=cfg.search_bisect,
        max_steps=cfg.search_max_steps,
        step_duration_s=cfg.search_step_s,
        log=run.log,
    )


def scenario_c(run: Run) -> None:
    cfg = run.cfg
    body = logreg_body()
    out: dict[str, Any] = {}
    run.results["c"] = out
    for ctl in CONTROLLERS:
        qp, rp = free_port(), free_port()
        run.log(f"(c) clipper-serve + logreg, controller={ctl}")
        try:
            with server(
                f"c_{ctl}", _serve_args(qp, rp, "logreg", ctl, wait_ms=0, cfg=cfg), qp, run
            ):
                url = f"http://127.0.0.1:{qp}/bench/predict"
                before = batch_size_totals(qp)
                closed = _closed(run, url, body)
                mb = mean_batch(before, batch_size_totals(qp))
                sr = _search(run, url, body, 0.5 * closed.goodput_rps)
                run.log(f"  max sustainable rate ({ctl}): {sr.rate:,.0f} rps")
                entry: dict[str, Any] = {
                    "closed": closed.to_dict(),
                    "closed_mean_batch": mb,
                    "sustainable": sr.to_dict(),
                }
                if ctl == "aimd" and sr.rate > 0:
                    rate = cfg.peak_share * sr.rate
                    run.log(f"  aimd at {100 * cfg.peak_share:.0f}% of peak: {rate:,.0f} rps")
                    lb = latency_buckets(qp)
                    entry["at_peak_share"] = _open(run, url, body, rate, cfg.duration).to_dict()
                    la = latency_buckets(qp)
                    entry["at_peak_share"]["server_p99_ms"] = server_quantile_ms(lb, la, 0.99)
                    entry["at_peak_share"]["server_p999_ms"] = server_quantile_ms(lb, la, 0.999)
                out[ctl] = entry
        except Exception as e:
            run.log(f"  (c) {ctl} failed: {e!r}")
            run.failures[f"c/{ctl}"] = traceback.format_exc()


def scenario_d(run: Run) -> None:
    cfg = run.cfg
    body = logreg_body()
    peak = run.results.get("c", {}).get("aimd", {}).get("sustainable", {}).get("rate", 0.0)
    out: dict[str, Any] = {"points": {}}
    run.results["d"] = out
    for wait in cfg.waits_ms:
        qp, rp = free_port(), free_port()
        run.log(f"(d) aimd + logreg, batch wait {wait:g} ms")
        try:
            with server(
                f"d_wait{wait:g}",
                _serve_args(qp, rp, "logreg", "aimd", wait_ms=wait, cfg=cfg),
                qp,
                run,
            ):
                url = f"http://127.0.0.1:{qp}/bench/predict"
                if not peak:
                    run.log("  no aimd peak from (c): searching it now")
                    closed = _closed(run, url, body)
                    peak = _search(run, url, body, 0.5 * closed.goodput_rps).rate
                    if not peak:
                        run.log("  no sustainable rate found for aimd: (d) skipped")
                        return
                rate = cfg.d_load_share * peak
                out["rate"] = rate
                if cfg.warmup_s > 0:
                    loadgen.open_loop(url, body, rate, duration_s=cfg.warmup_s)
                before = batch_size_totals(qp)
                res = loadgen.open_loop(url, body, rate, duration_s=cfg.duration)
                mb = mean_batch(before, batch_size_totals(qp))
                run.log(f"  {res.summary()} mean_batch={mb:.2f}")
                out["points"][f"{wait:g}"] = {
                    "wait_ms": wait,
                    "open": res.to_dict(),
                    "mean_batch": mb,
                }
        except Exception as e:
            run.log(f"  (d) wait {wait:g} failed: {e!r}")
            run.failures[f"d/{wait:g}"] = traceback.format_exc()


def scenario_e(run: Run) -> None:
    import admin_latency

    s = admin_latency.Settings(calls=run.cfg.admin_calls, concurrency=run.cfg.admin_concurrency)
    run.log(f"(e) admin plane: {s.calls} calls per op, sqlite vs memory://")
    run.results["e"] = admin_latency.measure(s, run)


SCENARIOS: dict[str, Callable[[Run], None]] = {
    "a": scenario_a,
    "b": scenario_b,
    "c": scenario_c,
    "d": scenario_d,
    "e": scenario_e,
}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return format(x, fmt)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _closed_row(name: str, d: dict[str, Any], extra: str = "") -> str:
    return (
        f"| {name} | {_f(d['throughput_rps'])} | {_f(d['goodput_rps'])} | "
        f"{_f(d['p50_us'] / 1000, '.2f')} | "
        f"{_f(d['p99_us'] / 1000, '.2f')} | {_f(d['p999_us'] / 1000, '.2f')} | "
        f"{d['errors']} | {d['non_2xx']} | {_pct(d['default_share'])} |{extra}"
    )


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def targets(run: Run) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) rows."""
    r, slo = run.results, run.cfg.slo_us
    rows: list[tuple[str, str, str]] = []
    a = r.get("a", {}).get("closed")
    b = r.get("b", {}).get("closed")
    if a and b:
        ratio = b["goodput_rps"] / a["goodput_rps"] if a["goodput_rps"] else 0.0
        ok = ratio >= 0.5 and b["p99_us"] < slo
        rows.append(
            (
                "(b)/(a) closed-loop goodput >= 0.5 with (b) p99 < SLO",
                f"{ratio:.3f} ({_f(b['goodput_rps'])} / {_f(a['goodput_rps'])} rps), "
                f"(b) p99 {b['p99_us'] / 1000:.2f} ms",
                _verdict(ok),
            )
        )
    else:
        rows.append(("(b)/(a) throughput >= 0.5, (b) p99 < SLO", "not measured", "n/a"))
    c = r.get("c", {})
    if "aimd" in c and "unbatched" in c:
        t_a = c["aimd"]["closed"]["goodput_rps"]
        t_u = c["unbatched"]["closed"]["goodput_rps"]
        s_a = c["aimd"]["sustainable"]["rate"]
        s_u = c["unbatched"]["sustainable"]["rate"]
        ratio = t_a / t_u if t_u else float("inf")
        sratio = s_a / s_u if s_u else float("inf")
        rows.append(
            (
                "aimd / unbatched throughput >= 5 (closed-loop goodput)",
                f"{ratio:.2f} ({_f(t_a)} / {_f(t_u)} rps); max sustainable rate ratio "
                f"{sratio:.2f} ({_f(s_a)} / {_f(s_u)} rps)",
                _verdict(ratio >= 5),
            )
        )
    else:
        rows.append(("aimd / unbatched throughput >= 5", "not measured", "n/a"))
    peak = c.get("aimd", {}).get("at_peak_share")
    if peak:
        ok = peak["p99_us"] < slo and peak["default_share"] < 0.01
        rows.append(
            (
                f"p99 < SLO at {100 * run.cfg.peak_share:.0f}% of aimd peak",
                f"{_f(peak['rate_or_concurrency'])} rps offered, {_f(peak['throughput_rps'])} "
                f"achieved, p99 {peak['p99_us'] / 1000:.2f} ms, defaults "
                f"{_pct(peak['default_share'])}; server-side p99 <= "
                f"{peak.get('server_p99_ms', float('nan')):.0f} ms, p99.9 <= "
                f"{peak.get('server_p999_ms', float('nan')):.0f} ms",
                _verdict(ok),
            )
        )
    else:
        rows.append(("p99 < SLO at 90% of aimd peak", "not measured", "n/a"))
    seq = r.get("e", {}).get("verdict", {}).get("sequential")
    if seq:
        rows.append(
            (
                "admin calls p99 < 10 ms on SQLite (sequential, every op)",
                f"worst {seq['worst_op']} p99 {seq['worst_p99_ms']:.2f} ms",
                _verdict(seq["pass"]),
            )
        )
    return rows


def render(run: Run, started: str, elapsed_s: float) -> str:
    cfg, r = run.cfg, run.results
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    lines = [
        f"# clipper-serve benchmark report ({started})",
        "",
        f"* machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, "
        f"Python {platform.python_version()}; commit `{commit or '?'}`",
        f"* per point {cfg.duration:g} s, closed loop C={cfg.concurrency} (wrk, "
        f"{cfg.wrk_threads} thread), SLO {cfg.slo_ms:g} ms, search steps {cfg.search_step_s:g} s; "
        f"total run {elapsed_s:.0f} s",
        "* load generator and servers share this machine's CPUs: absolute numbers are "
        "machine- and noise-dependent, compare the ratios.",
        '* latency in ms; `defaults` = share of answers with `"default": true` (SLO missed); '
        "`goodput` = non-default 2xx answers per second (throughput that served the model).",
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
    ]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(run)]
    head = (
        "| system | throughput rps | goodput rps | p50 | p99 | p99.9 | errors | non-2xx "
        "| defaults |"
    )
    sep = "|---|---|---|---|---|---|---|---|---|"
    if "a" in r or "b" in r:
        lines += ["", "## (a) ceiling vs (b) clipper-serve + noop (784 doubles)", "", head, sep]
        if "a" in r:
            lines.append(_closed_row("(a) bare uvloop+httptools+orjson", r["a"]["closed"]))
        if "b" in r:
            lines.append(_closed_row("(b) clipper-serve noop (aimd)", r["b"]["closed"]))
            lines += ["", f"(b) mean batch size: {_f(r['b'].get('mean_batch'), '.2f')}"]
    c = r.get("c", {})
    if c:
        lines += [
            "",
            f"## (c) logreg (digits, 64 doubles), SLO {cfg.slo_ms:g} ms: batching controllers",
            "",
            "Closed loop:",
            "",
            head + " mean batch |",
            sep + "---|",
        ]
        for ctl, e in c.items():
            lines.append(
                _closed_row(ctl, e["closed"], f" {_f(e.get('closed_mean_batch'), '.2f')} |")
            )
        lines += [
            "",
            "Max sustainable open-loop rate (p99 < SLO, >= 95% achieved, < 1% defaults):",
            "",
            "| controller | max rate rps | p50 | p99 | p99.9 | defaults | client lag p99 "
            "| trials |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for ctl, e in c.items():
            s = e["sustainable"]
            res = s["result"]
            trials = ", ".join(f"{t['rate']:,.0f}{'✓' if t['ok'] else '✗'}" for t in s["trials"])
            if res:
                lines.append(
                    f"| {ctl} | {_f(s['rate'])} | {res['p50_us'] / 1000:.2f} | "
                    f"{res['p99_us'] / 1000:.2f} | {res['p999_us'] / 1000:.2f} | "
                    f"{_pct(res['default_share'])} | {res['client_lag_p99_us'] / 1000:.2f} | "
                    f"{trials} |"
                )
            else:
                lines.append(f"| {ctl} | 0 | n/a | n/a | n/a | n/a | n/a | {trials} |")
        peak = c.get("aimd", {}).get("at_peak_share")
        if peak:
            lines += [
                "",
                f"aimd at {100 * cfg.peak_share:.0f}% of its max sustainable rate: "
                f"{peak['throughput_rps']:,.0f} rps, p50 {peak['p50_us'] / 1000:.2f} ms, "
                f"p99 {peak['p99_us'] / 1000:.2f} ms, p99.9 {peak['p999_us'] / 1000:.2f} ms, "
                f"defaults {_pct(peak['default_share'])}, dropped {peak['dropped']}, "
                f"client lag p99 {peak['client_lag_p99_us'] / 1000:.2f} ms",
            ]
    d = r.get("d", {})
    if d.get("points"):
        lines += [
            "",
            f"## (d) aimd + logreg: batch wait, open loop at {_f(d.get('rate'))} rps "
            f"({100 * cfg.d_load_share:.0f}% of aimd peak)",
            "",
            "| wait ms | throughput rps | mean | p50 | p99 | p99.9 | defaults | mean batch "
            "| client lag p99 |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in d["points"].values():
            o = p["open"]
            lines.append(
                f"| {p['wait_ms']:g} | {_f(o['throughput_rps'])} | {o['mean_us'] / 1000:.2f} | "
                f"{o['p50_us'] / 1000:.2f} | {o['p99_us'] / 1000:.2f} | "
                f"{o['p999_us'] / 1000:.2f} | {_pct(o['default_share'])} | "
                f"{_f(p['mean_batch'], '.2f')} | {o['client_lag_p99_us'] / 1000:.2f} |"
            )
        lines += [
            "",
            "`client lag` = how late the open-loop client sent (included in the latency); "
            "if it is a sizeable part of p99, the client, not the server, was the limit.",
        ]
    if r.get("e", {}).get("points"):
        import admin_latency

        lines += ["", admin_latency.render_markdown(r["e"], heading="## (e)").rstrip()]
    if run.failures:
        lines += ["", "## Failures", ""]
        for k, tb in run.failures.items():
            lines += [f"### {k}", "", "```", tb.strip()[-3000:], "```", ""]
    return "\n".join(lines) + "\n"


def plots(run: Run) -> list[str]:
    """Fig. 4 / Fig. 5 style PNGs if matplotlib is installed (optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made: list[str] = []
    c = run.results.get("c", {})
    if c:
        names = list(c)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        ax1.bar(names, [c[n]["sustainable"]["rate"] for n in names])
        ax1.set_ylabel("max sustainable rate (rps)")
        ax1.set_title(f"throughput, p99 < {run.cfg.slo_ms:g} ms")
        ax2.bar(names, [c[n]["closed"]["p99_us"] / 1000 for n in names])
        ax2.axhline(run.cfg.slo_ms, color="r", linestyle="--")
        ax2.set_ylabel("closed-loop p99 (ms)")
        fig.tight_layout()
        fig.savefig(run.out_dir / "fig4_controllers.png")
        plt.close(fig)
        made.append("fig4_controllers.png")
    pts = list(run.results.get("d", {}).get("points", {}).values())
    if pts:
        waits = [p["wait_ms"] for p in pts]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        ax1.plot(waits, [p["open"]["throughput_rps"] for p in pts], "o-")
        ax1.set_xlabel("batch wait (ms)")
        ax1.set_ylabel("throughput (rps)")
        ax2.plot(waits, [p["open"]["mean_us"] / 1000 for p in pts], "o-", label="mean")
        ax2.plot(waits, [p["open"]["p99_us"] / 1000 for p in pts], "s-", label="p99")
        ax2.set_xlabel("batch wait (ms)")
        ax2.set_ylabel("latency (ms)")
        ax2.legend()
        fig.tight_layout()
        fig.savefig(run.out_dir / "fig5_batch_wait.png")
        plt.close(fig)
        made.append("fig5_batch_wait.png")
    return made


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=None, help="seconds per point (10)")
    p.add_argument("--quick", action="store_true", help="short points: a smoke run")
    p.add_argument("--only", default="a,b,c,d,e", help="comma-separated scenarios (a..e)")
    p.add_argument("--concurrency", type=int, default=64, help="closed loop connections")
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--fixed-batch", type=int, default=32, help="batch size of 'fixed'")
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=HERE / "results", help="results root")
    args = p.parse_args(argv)

    cfg = Config(
        concurrency=args.concurrency,
        slo_ms=args.slo_ms,
        fixed_batch=args.fixed_batch,
        wrk_threads=args.wrk_threads,
    )
    if args.quick:
        cfg.duration, cfg.search_step_s, cfg.search_bisect, cfg.search_max_steps = 2, 1.5, 2, 7
        cfg.warmup_s = 0.5
        cfg.admin_calls = 30
    if args.duration is not None:
        cfg.duration = args.duration
        cfg.search_step_s = min(cfg.search_step_s, max(1.0, args.duration / 3))
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; choose from {','.join(SCENARIOS)}")

    started = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out / started
    out_dir.mkdir(parents=True, exist_ok=True)
    run = Run(out_dir=out_dir, cfg=cfg)
    run.log(f"results in {out_dir}")
    t0 = time.monotonic()
    for name in only:
        try:
            SCENARIOS[name](run)
        except Exception as e:
            run.log(f"scenario ({name}) failed: {e!r}")
            run.failures[name] = traceback.format_exc()
    elapsed = time.monotonic() - t0
    report = render(run, started, elapsed)
    (out_dir / "report.md").write_text(report)
    raw = {"config": cfg.__dict__, "results": run.results, "failures": run.failures}
    (out_dir / "results.json").write_bytes(
        orjson.dumps(raw, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    pngs = plots(run)
    print()
    print(report)
    print(f"written: {out_dir}/report.md, results.json" + "".join(f", {x}" for x in pngs))
    return 1 if run.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Admin-plane latency: what a mutating admin call costs now that it answers only after its
change is committed to the config store (SQLite: WAL, ``synchronous=FULL``, one transaction per
change; Redis: MULTI/EXEC).

    python benchmarks/admin_latency.py                        # sqlite vs memory, 100 calls each
    python benchmarks/admin_latency.py --calls 300 --concurrency 8 --redis
    python benchmarks/admin_latency.py --redis-url redis://127.0.0.1:6379/0 --json

Starts one ``clipper start`` per store (a subprocess on free ports, ``--grpc-port -1``, its own
temporary state directory): ``sqlite`` (the CLI's default store, ``clipper.db`` in the state
directory), ``memory`` (``--store memory://``, the baseline: the same admin path without a
durable write) and, with ``--redis`` (a local ``redis-server`` on a free port, started with
``--appendonly yes --appendfsync always`` and stopped by PID) or ``--redis-url``, ``redis``.
Every server is started before the first call and stopped by PID at the end.

Then, for each of ``add_app``, ``update_app`` (an SLO change), ``add_model`` (registers a
version, starts no container), ``add_model_links`` and ``delete_app``, in that order, ``--calls``
calls:

* **sequential**: one client, one call at a time: the latency of one call;
* **concurrent**: ``--concurrency`` clients (threads), the same number of calls split between
  them: calls/s and the latency under contention (commits queue behind each other).

The stores are interleaved per operation (sqlite, memory, then memory, sqlite for the next
operation, ...), so a burst of noise on the shared machine hits both; the ``sqlite / memory``
ratios come from the same run. Every call goes over HTTP/1.1 keep-alive (one persistent
connection per client, opened before timing; ``--fresh-connections`` opens one per call
instead, and then the connect is timed too). Latency is measured by the client
(``time.perf_counter_ns`` around request and full response); a non-200 answer aborts the run.

Writes ``report.md``, ``admin_latency.json`` and one log per server to
``benchmarks/results/admin-<timestamp>/``; ``--json`` also prints the JSON. Also scenario
``e`` of ``report.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report

HERE = Path(__file__).resolve().parent
OPS = ("add_app", "update_app", "add_model", "add_model_links", "delete_app")
P99_TARGET_MS = 10.0


@dataclass
class Settings:
    calls: int = 100
    concurrency: int = 8
    warmup: int = 20
    stores: tuple[str, ...] = ("sqlite", "memory")
    redis_url: str | None = None
    start_redis: bool = False
    fresh_connections: bool = False
    state_root: Path | None = None  # where the temporary state directories go


@dataclass
class Target:
    """One running ``clipper start`` and how to reach its admin API."""

    store: str
    url: str
    admin_port: int
    state_dir: Path


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class AdminError(RuntimeError):
    pass


class AdminClient:
    """HTTP/1.1 to the admin API: one keep-alive connection, or a fresh one per call."""

    def __init__(self, port: int, *, fresh: bool = False) -> None:
        self.port = port
        self.fresh = fresh
        self.conn: http.client.HTTPConnection | None = None
        if not fresh:
            self.conn = self._connect()

    def _connect(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.connect()
        return conn

    def call(self, route: str, body: dict[str, Any]) -> int:
        """POST ``/admin/<route>``; the latency in ns (connect included when ``fresh``)."""
        data = orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        t0 = time.perf_counter_ns()
        conn = self._connect() if self.fresh else self.conn
        assert conn is not None
        conn.request("POST", f"/admin/{route}", body=data, headers=headers)
        resp = conn.getresponse()
        text = resp.read()
        elapsed = time.perf_counter_ns() - t0
        if self.fresh:
            conn.close()
        if resp.status != 200:
            raise AdminError(f"{route} {body}: HTTP {resp.status}: {text[:300]!r}")
        return elapsed

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def request_body(op: str, prefix: str, i: int) -> dict[str, Any]:
    app, model = f"{prefix}-a{i}", f"{prefix}-m{i}"
    if op == "add_app":
        return {
            "name": app,
            "input_type": "doubles",
            "default_output": "-1",
            "latency_slo_micros": 100_000,
        }
    if op == "update_app":
        return {"name": app, "latency_slo_micros": 20_000 + i}
    if op == "add_model":
        return {"model_name": model, "model_version": "1", "input_type": "doubles"}
    if op == "add_model_links":
        return {"app_name": app, "model_names": [model]}
    if op == "delete_app":
        return {"name": app}
    raise ValueError(op)


def run_batch(
    port: int, op: str, prefix: str, n: int, *, concurrency: int = 1, fresh: bool = False
) -> tuple[list[int], float]:
    """``n`` calls of ``op`` (items 0..n-1) split over ``concurrency`` clients:
    (latencies in ns, wall seconds from the first send to the last answer)."""
    workers = max(1, min(concurrency, n))
    clients = [AdminClient(port, fresh=fresh) for _ in range(workers)]
    lat: list[list[int]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(workers + 1)

    def work(w: int) -> None:
        barrier.wait()
        try:
            for i in range(w, n, workers):
                lat[w].append(clients[w].call(op, request_body(op, prefix, i)))
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    return [x for part in lat for x in part], wall


def stats(lat_ns: Sequence[int], wall_s: float) -> dict[str, float]:
    xs = sorted(lat_ns)
    n = len(xs)

    def pct(q: float) -> float:  # nearest rank
        return xs[max(0, math.ceil(q * n) - 1)] / 1e6 if n else float("nan")

    # In call order (sequential mode): does a call get slower as the registry grows?
    tenth = max(1, len(lat_ns) // 10)
    first, last = sorted(lat_ns[:tenth]), sorted(lat_ns[-tenth:])
    return {
        "n": n,
        "first_tenth_p50_ms": first[len(first) // 2] / 1e6 if n else float("nan"),
        "last_tenth_p50_ms": last[len(last) // 2] / 1e6 if n else float("nan"),
        "mean_ms": sum(xs) / n / 1e6 if n else float("nan"),
        "p50_ms": pct(0.50),
        "p90_ms": pct(0.90),
        "p99_ms": pct(0.99),
        "max_ms": xs[-1] / 1e6 if n else float("nan"),
        "calls_per_s": n / wall_s if wall_s > 0 else float("nan"),
    }


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(data_dir: Path, log: Callable[[str], None]) -> Iterator[str]:
    """A local redis-server on a free loopback port, AOF fsync on every write; its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("--redis needs redis-server on PATH (apt-get install redis-server)")
    port = report.free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    args = [
        exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
        "--save", "", "--appendonly", "yes", "--appendfsync", "always",
    ]  # fmt: skip
    with open(data_dir / "redis.log", "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        report._wait_port(port, 10)
        log(f"redis-server ready (pid {proc.pid}, port {port}, appendfsync always)")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log(f"redis-server stopped (rc={proc.returncode})")


def _store_url(store: str, state_dir: Path, redis_url: str | None) -> str | None:
    if store == "sqlite":
        return None  # the CLI's default: sqlite:///<state dir>
    if store == "memory":
        return "memory://"
    if store == "redis":
        assert redis_url is not None
        return redis_url
    raise ValueError(f"unknown store {store!r}")


@contextlib.contextmanager
def clipper_servers(
    s: Settings, run: report.Run, tmp: Path, redis_url: str | None
) -> Iterator[list[Target]]:
    with contextlib.ExitStack() as stack:
        targets: list[Target] = []
        for store in s.stores:
            qp, ap, rp = report.free_port(), report.free_port(), report.free_port()
            state = tmp / store
            state.mkdir()
            url = _store_url(store, state, redis_url)
            args = [
                "-m", "clipper", "start", "--query-port", str(qp), "--admin-port", str(ap),
                "--rpc-port", str(rp), "--grpc-port", "-1", "--state-dir", str(state),
            ]  # fmt: skip
            if url is not None:
                args += ["--store", url]
            stack.enter_context(report.server(f"admin_{store}", args, ap, run))
            targets.append(Target(store, url or f"sqlite:///{state}", ap, state))
        yield targets


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


class StderrRun(report.Run):
    """``report.Run`` logging to stderr: stdout carries the report (or the JSON)."""

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def measure(s: Settings, run: report.Run) -> dict[str, Any]:
    """Start the servers, run every (mode, op, store) batch, stop them; the results. Server
    logs go to ``run.out_dir``, progress to ``run.log``."""
    if s.start_redis or s.redis_url:
        s.stores = (*(x for x in s.stores if x != "redis"), "redis")
    log = run.log
    modes = (("sequential", 1), ("concurrent", s.concurrency))
    results: dict[str, Any] = {
        "settings": {
            "calls": s.calls,
            "concurrency": s.concurrency,
            "warmup": s.warmup,
            "stores": list(s.stores),
            "connections": "fresh per call" if s.fresh_connections else "HTTP/1.1 keep-alive",
            "redis": "local, appendfsync always" if s.start_redis else s.redis_url,
        },
        "stores": {},
        "points": {},
    }
    root = s.state_root or run.out_dir
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=root, prefix="state-")))
        redis_url = s.redis_url
        if s.start_redis:
            redis_url = stack.enter_context(redis_server(tmp / "redis-server", log))
        targets = stack.enter_context(clipper_servers(s, run, tmp, redis_url))
        tag = secrets.token_hex(2)  # names unique per run (a shared redis keeps old keys)
        for t in targets:
            results["stores"][t.store] = {"url": t.url, "state_dir": str(t.state_dir)}
            for op in OPS:  # warm-up, discarded
                run_batch(t.admin_port, op, f"w{tag}", s.warmup, fresh=s.fresh_connections)
        for mode, conc in modes:
            for k, op in enumerate(OPS):
                order = targets if k % 2 == 0 else targets[::-1]
                for t in order:
                    lat, wall = run_batch(
                        t.admin_port,
                        op,
                        f"{mode[0]}{tag}",
                        s.calls,
                        concurrency=conc,
                        fresh=s.fresh_connections,
                    )
                    st = stats(lat, wall)
                    results["points"].setdefault(t.store, {}).setdefault(mode, {})[op] = st
                    log(
                        f"  {t.store:6} {mode:10} C={conc:<3} {op:16} p50 {st['p50_ms']:6.2f} "
                        f"p99 {st['p99_ms']:6.2f} max {st['max_ms']:6.2f} ms "
                        f"{st['calls_per_s']:7,.0f} calls/s"
                    )
        for t in targets:
            db = t.state_dir / "clipper.db"
            if t.store == "sqlite":
                results["stores"][t.store]["db_bytes"] = db.stat().st_size if db.exists() else 0
    results["verdict"] = verdict(results)
    return results


def verdict(results: dict[str, Any]) -> dict[str, Any]:
    """p99 < 10 ms for every op on SQLite, sequential (the target) and concurrent (for info)."""
    out: dict[str, Any] = {"target_ms": P99_TARGET_MS}
    sq = results["points"].get("sqlite", {})
    for mode in ("sequential", "concurrent"):
        ops = sq.get(mode, {})
        if ops:
            worst = max(ops.items(), key=lambda kv: kv[1]["p99_ms"])
            out[mode] = {
                "worst_op": worst[0],
                "worst_p99_ms": worst[1]["p99_ms"],
                "pass": all(v["p99_ms"] < P99_TARGET_MS for v in ops.values()),
            }
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def render_markdown(results: dict[str, Any], heading: str = "##") -> str:
    st = results["settings"]
    pts = results["points"]
    lines = [
        f"{heading} Admin plane: durable writes",
        "",
        f"{st['calls']} calls per operation, sequential (1 client) and concurrent "
        f"({st['concurrency']} clients); {st['connections']}; latency in ms, client-side; "
        f"stores interleaved per operation; warm-up {st['warmup']} calls per op discarded. "
        "`p50 first / last 10%`: the median of the first and of the last tenth of the calls "
        "(in call order in the sequential mode): whether a call slows as the registry grows.",
        "",
        "| store | mode | op | p50 | p90 | p99 | max | calls/s | p50 first / last 10% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for store, modes in pts.items():
        for mode, ops in modes.items():
            for op, v in ops.items():
                lines.append(
                    f"| {store} | {mode} | {op} | {v['p50_ms']:.2f} | {v['p90_ms']:.2f} | "
                    f"{v['p99_ms']:.2f} | {v['max_ms']:.2f} | {v['calls_per_s']:,.0f} | "
                    f"{v.get('first_tenth_p50_ms', math.nan):.2f} / "
                    f"{v.get('last_tenth_p50_ms', math.nan):.2f} |"
                )
    base = pts.get("memory")
    durable = [x for x in pts if x != "memory"]
    if base and durable:
        lines += [
            "",
            "Cost of the durable write (ratio to `memory://`, same run):",
            "",
            "| store | op | seq p50 x | seq p99 x | conc calls/s x |",
            "|---|---|---|---|---|",
        ]
        for store in durable:
            for op in OPS:
                sq, bq = pts[store]["sequential"][op], base["sequential"][op]
                cc, bc = pts[store]["concurrent"][op], base["concurrent"][op]
                lines.append(
                    f"| {store} | {op} | {sq['p50_ms'] / bq['p50_ms']:.2f} | "
                    f"{sq['p99_ms'] / bq['p99_ms']:.2f} | "
                    f"{cc['calls_per_s'] / bc['calls_per_s']:.2f} |"
                )
    v = results.get("verdict", {})
    for mode in ("sequential", "concurrent"):
        if mode in v:
            m = v[mode]
            lines += [
                "",
                f"SQLite {mode}: p99 < {v['target_ms']:g} ms for every op: "
                f"**{'PASS' if m['pass'] else 'FAIL'}** (worst {m['worst_op']} "
                f"p99 {m['worst_p99_ms']:.2f} ms)",
            ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--calls", type=int, default=100, help="calls per operation and mode")
    p.add_argument("--concurrency", type=int, default=8, help="clients in the concurrent mode")
    p.add_argument("--warmup", type=int, default=20, help="discarded calls per op and store")
    p.add_argument("--no-memory", action="store_true", help="skip the memory:// baseline")
    p.add_argument("--redis", action="store_true", help="also start a local redis-server")
    p.add_argument("--redis-url", default=None, help="also measure this redis store")
    p.add_argument("--fresh-connections", action="store_true", help="one connection per call")
    p.add_argument("--state-root", type=Path, default=None, help="parent of the state dirs")
    p.add_argument("--out", type=Path, default=HERE / "results", help="results root")
    p.add_argument("--json", action="store_true", help="print the JSON results")
    args = p.parse_args(argv)
    if args.redis and args.redis_url:
        p.error("--redis starts its own redis-server; give --redis or --redis-url, not both")
    s = Settings(
        calls=args.calls,
        concurrency=args.concurrency,
        warmup=args.warmup,
        stores=("sqlite",) if args.no_memory else ("sqlite", "memory"),
        redis_url=args.redis_url,
        start_redis=args.redis,
        fresh_connections=args.fresh_connections,
        state_root=args.state_root,
    )
    started = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out / f"admin-{started}"
    out_dir.mkdir(parents=True, exist_ok=True)

    run = StderrRun(out_dir=out_dir, cfg=report.Config())
    run.log(f"results in {out_dir}")
    results = measure(s, run)
    results["started"] = started
    results["machine"] = f"{os.cpu_count()} CPUs"
    md = render_markdown(results, heading="#")
    (out_dir / "report.md").write_text(md)
    (out_dir / "admin_latency.json").write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    if args.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    else:
        print(md)
    run.log(f"written: {out_dir}/report.md, admin_latency.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

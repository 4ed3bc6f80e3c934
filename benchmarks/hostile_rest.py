"""Hostile clients of the HTTP/1.1 ports, and what the well-behaved clients beside them see.

Runs a frontend in a child process (free ports, ``--max-connections`` lowered so the idle row
stays within the file descriptor limit, an admin token) with one no-op doubles application,
then, from this process, for ``--seconds`` each:

* ``baseline``: probes alone: REST predicts at ``--rate`` per second (a fresh connection
  each), latency p50/p99/max, defaults and failures counted;
* ``million-item batch``: the same probes while another client posts a 1,000,000-item
  ``input_batch`` (about 9 MB, under the 10 MiB body cap) once a second: its statuses and
  how long each took to be refused;
* ``admin uploads``: ``--uploaders`` connections each uploading 9 MB to ``/admin/upload_model``
  without the token (reconnecting when cut), while an authorized ``GET /admin/ping`` runs 10
  times a second: its statuses and worst latency, and the frontend's RSS before and after;
* ``idle connections``: ``max_connections + 500`` keep-alive connections that asked once and
  sit idle, then 40 fresh health checks and predictions: how many succeed.

    PYTHONPATH=src:. python benchmarks/hostile_rest.py [--seconds 5] [--rate 100]

Each row is bounded (the whole run well under a minute). Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import time
from typing import Any

import orjson

TOKEN = "bench-token"
MAX_CONNECTIONS = 500


def sums(inputs: list[Any]) -> list[str]:
    """The application's model: each row's sum (a string, as containers answer)."""
    return [str(float(sum(x))) for x in inputs]


def _serve(conn: Any) -> None:
    from clipper.config import BatchingConfig
    from clipper.server import Clipper

    async def main() -> None:
        async with Clipper(
            query_port=0, rpc_port=0, admin_port=0, admin_token=TOKEN,
            max_connections=MAX_CONNECTIONS,
        ) as c:  # fmt: skip
            await c.deploy_model(
                "sums", "1", sums, input_type="doubles", batching=BatchingConfig(max_wait_micros=0)
            )
            await c.register_application("sums", "doubles", "-1.0", 100_000, cache=False)
            await c.link_model_to_app("sums", "sums")
            conn.send((c.http.port, c.admin_http.port))
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until told

    asyncio.run(main())


async def _http(port: int, data: bytes, limit_s: float = 5.0) -> tuple[int, bytes, float]:
    t = time.perf_counter()
    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), limit_s)
    try:
        w.write(data)
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), limit_s)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r")[0])
        body = await asyncio.wait_for(r.readexactly(length), limit_s)
        return int(head.split(b" ")[1]), body, time.perf_counter() - t
    finally:
        w.close()


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n" % (path.encode(), len(body), extra)
    ) + body


async def _probes(port: int, rate: float, seconds: float) -> dict[str, Any]:
    lat: list[float] = []
    defaults = failed = 0
    tasks = []

    async def one(i: int) -> None:
        nonlocal defaults, failed
        try:
            st, body, dt = await _http(port, _post("/sums/predict", b'{"input": [%d.0, 1.0]}' % i))
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            failed += 1
            return
        if st != 200:
            failed += 1
            return
        defaults += orjson.loads(body)["default"] is True
        lat.append(dt)

    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    lat.sort()
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: 0.0)
    return {
        "sent": len(tasks), "ok": len(lat), "defaults": defaults, "failed": failed,
        "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": lat[-1] * 1e3 if lat else 0.0,
    }  # fmt: skip


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _million(port: int, seconds: float) -> list[tuple[int, float]]:
    body = orjson.dumps({"input_batch": [[0.5, 1.0]] * 1_000_000})
    out = []
    for _ in range(int(seconds)):
        st, _b, dt = await _http(port, _post("/sums/predict", body), limit_s=10)
        out.append((st, dt))
        await asyncio.sleep(max(0.0, 1.0 - dt))
    return out


async def _uploads(admin: int, n: int, seconds: float, pid: int) -> dict[str, Any]:
    head = (
        b"POST /admin/upload_model?name=m&version=1 HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\n\r\n" % (9 * 2**20)
    )
    chunk = b"\0" * 2**20
    stop = asyncio.Event()

    async def uploader() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
                r, w = await asyncio.open_connection("127.0.0.1", admin)
                w.write(head)
                for _ in range(9):
                    if r.at_eof():
                        break
                    w.write(chunk)
                    await asyncio.wait_for(w.drain(), 5)
                await asyncio.wait_for(r.read(), 5)
                w.close()

    rss0 = _rss_mb(pid)
    tasks = [asyncio.ensure_future(uploader()) for _ in range(n)]
    statuses: list[int] = []
    worst = 0.0
    auth = b"GET /admin/ping HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n" % (
        TOKEN.encode()
    )
    peak = rss0
    for _ in range(int(seconds * 10)):
        try:
            st, _b, dt = await _http(admin, auth, limit_s=1.0)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            st, dt = 0, 1.0
        statuses.append(st)
        worst = max(worst, dt)
        peak = max(peak, _rss_mb(pid))
        await asyncio.sleep(0.1)
    stop.set()
    for t in tasks:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t, 10)
    return {"pings": len(statuses), "ok": statuses.count(200), "worst_ms": worst * 1e3,
            "rss_delta_mb": peak - rss0}  # fmt: skip


async def _idle(port: int) -> dict[str, Any]:
    held = []
    for _ in range(MAX_CONNECTIONS + 500):
        with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(w)
            await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    ok = 0
    for i in range(20):
        for req in (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                    _post("/sums/predict", b'{"input": [%d.0, 1.0]}' % i)):  # fmt: skip
            with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
                st, _b, _dt = await _http(port, req)
                ok += st == 200
    for w in held:
        w.close()
    return {"idle_opened": len(held), "fresh_ok": ok, "fresh_sent": 40}


async def _run(args: argparse.Namespace, port: int, admin: int, pid: int) -> None:
    base = await _probes(port, args.rate, args.seconds)
    print("baseline probes:", base)
    probes = asyncio.ensure_future(_probes(port, args.rate, args.seconds))
    big = await _million(port, args.seconds)
    print("million-item batch: probes", await probes)
    print("  the batch:", [(st, round(dt * 1e3)) for st, dt in big], "(status, ms)")
    print(f"admin, {args.uploaders} unauthenticated 9 MB uploads:",
          await _uploads(admin, args.uploaders, args.seconds, pid))  # fmt: skip
    print(f"idle: max_connections {MAX_CONNECTIONS} + 500:", await _idle(port))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--uploaders", type=int, default=70)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(theirs,))
    proc.start()
    try:
        if not ours.poll(60):
            raise SystemExit("the frontend did not start within 60 s")
        port, admin = ours.recv()
        assert proc.pid is not None
        asyncio.run(_run(args, port, admin, proc.pid))
    finally:
        ours.send("stop")
        proc.join(30)
        if proc.is_alive():
            proc.terminate()


if __name__ == "__main__":
    main()

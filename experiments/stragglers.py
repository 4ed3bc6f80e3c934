"""Fig 9 of the Clipper paper: straggler mitigation, through the real server.

Sixteen models, each a small decision tree (depth 8, 16 features per split) trained on its own
bootstrap sample of 600 digits, run in their own container processes. Each model's latency is
heavy-tailed: for every query it sleeps a time drawn per (model, query), lognormal with a 3 ms
median (sigma 0.4), replaced with probability 1% by a straggle of 30-100 ms (uniform); a batch
sleeps its slowest query's draw. Ensembles of the first 1, 2, 4, 8, 12 and 16 models are
applications with the ``exp4`` policy (equal weights: no feedback is sent, so it is a majority
vote) and a 20 ms SLO; at the deadline the frontend combines whatever arrived. Models batch with
the server's default AIMD controller (``--max-batch-size N`` caps it), and each is warmed up
alone with 30 straggle-free queries first.

A closed-loop client (2 keep-alive connections, one request outstanding on each) sends 40
warm-up queries and then 600 test digits per ensemble size, and reports clipper-serve's latency
as the client sees it (mean, P99), the share of predictions missing from the answers
(``1 - len(models) / size``), the answers that were the default output, and the accuracy.

The **wait-for-all (blocking)** baseline comes from the same run: each model process logs, on
the machine's wall clock, when it started and finished each batch and which queries it held.
A query's blocking latency is the time from the client's send until the slowest member finished
it, plus the return path (model -> frontend -> client, the median measured on this run's
queries that had every answer before the deadline). A member that never ran the query (the
frontend dropped it from that member's queue at the deadline, or shed it) is counted as
finishing it after the batch it was busy with, plus its own draw for the query and its median
compute time. A real blocking server would also queue behind its stragglers (the frontend here
drops the expired queries instead), so the baseline is a lower bound of what it would see.

The script starts the server in a child process (``--serve``; the client and the server then
have their own event loops), and stops it by PID when done. Writes
``experiments/results/stragglers.png``.

    python experiments/stragglers.py [--queries 600] [--concurrency 2] [--sizes 1,2,4,8,12,16]
        [--max-batch-size 0] [--in-flight 1] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from common import (
    Connection,
    digits,
    markdown_table,
    pct,
    pyplot,
    save,
    split,
    start_child,
    stop_server,
)

N_MODELS = 16
SIZES = (1, 2, 4, 8, 12, 16)
SLO_MS = 20.0
N_TRAIN = 600
WARMUP = 40  # queries per ensemble size before the measured ones
WARMUP_EACH = 30  # straggle-free queries to each model alone, before everything
MEDIAN_MS = 3.0
SIGMA = 0.4
STRAGGLE_P = 0.01
STRAGGLE_MS = (30.0, 100.0)
N_FEATURES = 64
QID_STRIDE = 100_000  # qid = size index * stride + query number: unique across the run


def delay_ms(model: int, qid: int) -> float:
    """The time model ``model`` takes on query ``qid``: the same draw whoever asks.
    Warm-up queries (negative ids) never straggle."""
    rng = random.Random(model * 1_000_003 + qid)
    if rng.random() < STRAGGLE_P and qid >= 0:
        return rng.uniform(*STRAGGLE_MS)
    return rng.lognormvariate(math.log(MEDIAN_MS), SIGMA)


class StragglerModel:
    """A decision tree behind a heavy-tailed sleep; logs each batch to ``log_path``.

    Inputs are 64 pixels plus the query id as a 65th column. A log line per query of a batch:
    ``qid start end slept_ms`` (wall-clock seconds)."""

    def __init__(self, estimator: Any, index: int, log_path: str) -> None:
        self.estimator = estimator
        self.index = index
        self.log_path = log_path

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Loaded in the container: run the code paths once, so the first query is not slow.
        self.__dict__.update(state)
        self.estimator.predict(np.zeros((1, N_FEATURES)))

    def predict(self, inputs: Any) -> list[int]:
        start = time.time()
        x = np.asarray(inputs, dtype=np.float64).reshape(len(inputs), -1)
        qids = [int(q) for q in x[:, N_FEATURES]]
        slept = max(delay_ms(self.index, q) for q in qids)
        time.sleep(slept / 1000.0)
        labels = [int(v) for v in self.estimator.predict(x[:, :N_FEATURES])]
        end = time.time()
        with open(self.log_path, "a") as f:
            f.write("".join(f"{q} {start:.6f} {end:.6f} {slept:.3f}\n" for q in qids))
        return labels


def model_name(i: int) -> str:
    return f"tree-{i:02d}"


def app_name(size: int) -> str:
    return f"ensemble-{size}"


def warmup_app(i: int) -> str:
    return f"warmup-{i:02d}"


# --- the server (child process) ------------------------------------------------------------------


def train_models(log_dir: Path, seed: int) -> list[StragglerModel]:
    from sklearn.tree import DecisionTreeClassifier

    x, y = digits()
    train, _ = split(y, [N_TRAIN], seed)
    rng = np.random.default_rng(seed)
    models = []
    for i in range(N_MODELS):
        sample = rng.choice(train, size=len(train), replace=True)
        tree = DecisionTreeClassifier(max_depth=8, max_features=16, random_state=seed * 100 + i)
        tree.fit(x[sample], y[sample])
        models.append(StragglerModel(tree, i, str(log_dir / f"{model_name(i)}.log")))
    return models


async def serve(log_dir: Path, args: argparse.Namespace) -> None:
    from clipper import BatchingConfig, Clipper

    models = train_models(log_dir, args.seed)
    batching = BatchingConfig(
        max_wait_micros=0, max_batch_size=args.max_batch_size or None, in_flight=args.in_flight
    )
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await asyncio.gather(
            *(
                c.deploy_model(
                    model_name(i),
                    "1",
                    m,
                    input_type="doubles",
                    batching=batching,
                    ready_timeout_s=120.0,
                )
                for i, m in enumerate(models)
            )
        )
        for i in range(N_MODELS):
            await c.register_application(
                warmup_app(i), "doubles", "-1", round(SLO_MS * 1000), cache=False
            )
            await c.link_model_to_app(warmup_app(i), model_name(i))
        for size in args.sizes:
            await c.register_application(
                app_name(size),
                "doubles",
                "-1",
                round(SLO_MS * 1000),
                cache=False,
                policy="exp4",
            )
            for i in range(size):
                await c.link_model_to_app(app_name(size), model_name(i))
        print(f"ready {c.query_url}", flush=True)
        await c.serve_forever()


def serve_main(args: argparse.Namespace) -> int:
    import uvloop

    uvloop.run(serve(Path(args.log_dir), args))
    return 0


# --- the client ----------------------------------------------------------------------------------


@dataclass
class Answer:
    qid: int
    label: int
    sent: float  # wall clock, seconds
    latency_ms: float
    doc: dict[str, Any]


Ask = Callable[[Connection, int, list[float]], Awaitable[dict[str, Any]]]


async def closed_loop(
    url: str,
    app: str,
    queries: list[tuple[int, list[float], int]],
    concurrency: int,
    ask: Ask | None = None,
) -> list[Answer]:
    """Send every query, ``concurrency`` at a time, each connection waiting for its answer.
    ``ask`` (connection, query id, pixels) -> answer document replaces the one predict
    request to ``app`` (e.g. a chain of requests)."""
    rest = url.split("//", 1)[1]
    host, port = rest.rsplit(":", 1)
    pending = iter(queries)
    answers: list[Answer] = []

    async def one(conn: Connection, qid: int, pixels: list[float]) -> dict[str, Any]:
        body = orjson.dumps({"input": [*pixels, float(qid)]})
        doc: dict[str, Any] = orjson.loads(await conn.post(f"/{app}/predict", body))
        return doc

    async def worker() -> None:
        conn = Connection(host, int(port))
        try:
            for qid, pixels, label in pending:
                sent = time.time()
                t0 = time.perf_counter()
                doc = await (ask or one)(conn, qid, pixels)
                latency = (time.perf_counter() - t0) * 1000.0
                answers.append(Answer(qid, label, sent, latency, doc))
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


@dataclass
class Batch:
    start: float
    end: float
    slept_ms: float


@dataclass
class ModelLog:
    """One model's log: when it finished each query, and its batches in time order."""

    finished: dict[int, float] = field(default_factory=dict)
    batch_ends: list[float] = field(default_factory=list)
    compute_s: float = 0.0  # median batch time beyond the sleep


def read_log(path: Path) -> ModelLog:
    log = ModelLog()
    batches: dict[tuple[float, float], Batch] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            qid, start, end, slept = line.split()
            log.finished[int(qid)] = float(end)
            batches[(float(start), float(end))] = Batch(float(start), float(end), float(slept))
    ordered = sorted(batches.values(), key=lambda b: b.end)
    log.batch_ends = [b.end for b in ordered]
    if ordered:
        log.compute_s = float(np.median([b.end - b.start - b.slept_ms / 1000 for b in ordered]))
    return log


def member_done(log: ModelLog, model: int, qid: int, sent: float) -> float:
    """When member ``model`` finished ``qid`` (or would have, had it run it)."""
    done = log.finished.get(qid)
    if done is not None:
        return done
    i = int(np.searchsorted(log.batch_ends, sent))
    free = log.batch_ends[i] if i < len(log.batch_ends) else sent
    return max(free, sent) + delay_ms(model, qid) / 1000 + log.compute_s


@dataclass
class Row:
    size: int
    latency_ms: np.ndarray
    blocking_ms: np.ndarray
    missing: float
    defaults: float
    accuracy: float
    dropped: float  # share of (query, member) pairs the member never ran
    member_p99_ms: float  # P99 of one member's own time per query (log), for reference


def analyse(size: int, answers: list[Answer], logs: list[ModelLog]) -> Row:
    ret = [
        a.sent + a.latency_ms / 1000 - max(logs[m].finished[a.qid] for m in range(size))
        for a in answers
        if len(a.doc.get("models", [])) == size
        and all(a.qid in logs[m].finished for m in range(size))
    ]
    return_path = float(np.median(ret)) if ret else 0.0
    blocking, own = [], []
    dropped = 0
    for a in answers:
        done = []
        for m in range(size):
            done.append(member_done(logs[m], m, a.qid, a.sent))
            dropped += a.qid not in logs[m].finished
        blocking.append((max(done) - a.sent + return_path) * 1000)
        own.append(delay_ms(0, a.qid) + logs[0].compute_s * 1000)
    return Row(
        size=size,
        latency_ms=np.array([a.latency_ms for a in answers]),
        blocking_ms=np.array(blocking),
        missing=float(np.mean([1 - len(a.doc.get("models", [])) / size for a in answers])),
        defaults=float(np.mean([bool(a.doc.get("default")) for a in answers])),
        accuracy=float(np.mean([a.doc.get("output") == a.label for a in answers])),
        dropped=dropped / (len(answers) * size),
        member_p99_ms=float(np.percentile(own, 99)),
    )


def start_server(log_dir: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve",
        "--log-dir",
        str(log_dir),
        "--seed",
        str(args.seed),
        "--sizes",
        ",".join(map(str, args.sizes)),
        "--in-flight",
        str(args.in_flight),
    ]
    cmd += ["--max-batch-size", str(args.max_batch_size)]
    server, url = start_child(cmd, log_dir / "server.log")
    return server, url


async def warm_up(url: str, x: np.ndarray, test: np.ndarray) -> None:
    """Each model alone, one query at a time, none straggling: see the README (the
    admission estimate of a model whose first batches are slow never recovers)."""
    for i in range(N_MODELS):
        queries = [
            (-(i * 1000 + j + 1), [float(v) for v in x[test[j]]], 0) for j in range(WARMUP_EACH)
        ]
        got = await closed_loop(url, warmup_app(i), queries, 1)
        shed = sum(bool(a.doc.get("default")) for a in got[-10:])
        if shed:
            print(
                f"  warning: {model_name(i)} answered {shed} of its last 10 warm-up"
                " queries with the default output"
            )


def run_client(url: str, args: argparse.Namespace, log_dir: Path) -> list[Row]:
    import uvloop

    x, y = digits()
    _, test = split(y, [N_TRAIN], args.seed)
    rng = np.random.default_rng(args.seed)
    answers: dict[int, list[Answer]] = {}

    async def drive() -> None:
        await warm_up(url, x, test)
        for s, size in enumerate(args.sizes):
            picks = rng.choice(test, size=WARMUP + args.queries, replace=True)
            queries = [
                (s * QID_STRIDE + i, [float(v) for v in x[j]], int(y[j]))
                for i, j in enumerate(picks)
            ]
            await closed_loop(url, app_name(size), queries[:WARMUP], args.concurrency)
            got = await closed_loop(url, app_name(size), queries[WARMUP:], args.concurrency)
            answers[size] = got
            await asyncio.sleep(0.3)  # let the members finish what they hold
            print(f"  size {size:2d}: {len(got)} answers", flush=True)

    uvloop.run(drive())
    time.sleep(0.5)
    logs = [read_log(log_dir / f"{model_name(i)}.log") for i in range(N_MODELS)]
    return [analyse(size, answers[size], logs) for size in args.sizes]


def table(rows: Sequence[Row]) -> str:
    def ms(v: float) -> str:
        return f"{v:.1f}"

    return markdown_table(
        [
            "ensemble size",
            "clipper-serve mean / P99 (ms)",
            "blocking mean / P99 (ms)",
            "% predictions missing",
            "default answers",
            "accuracy",
        ],
        [
            [
                r.size,
                f"{ms(r.latency_ms.mean())} / {ms(float(np.percentile(r.latency_ms, 99)))}",
                f"{ms(r.blocking_ms.mean())} / {ms(float(np.percentile(r.blocking_ms, 99)))}",
                pct(r.missing),
                pct(r.defaults),
                pct(r.accuracy),
            ]
            for r in rows
        ],
    )


def plot(rows: Sequence[Row]) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    sizes = [r.size for r in rows]
    for name, key, colour in (
        ("clipper-serve", "latency_ms", "C0"),
        ("blocking (wait for all)", "blocking_ms", "C3"),
    ):
        values = [getattr(r, key) for r in rows]
        left.plot(sizes, [v.mean() for v in values], marker="o", color=colour, label=f"{name} mean")
        left.plot(
            sizes,
            [np.percentile(v, 99) for v in values],
            marker="s",
            ls="--",
            color=colour,
            label=f"{name} P99",
        )
    left.axhline(SLO_MS, color="grey", ls=":", label="SLO")
    left.set_xlabel("ensemble size")
    left.set_ylabel("latency (ms)")
    left.set_yscale("log")
    left.legend(fontsize=8)
    left.set_title(f"latency, {SLO_MS:.0f} ms SLO")
    right.plot(sizes, [100 * r.missing for r in rows], marker="o", label="% predictions missing")
    right.plot(sizes, [100 * r.accuracy for r in rows], marker="s", label="accuracy (%)")
    right.set_xlabel("ensemble size")
    right.set_ylim(0, 100)
    right.legend(fontsize=8)
    right.set_title("missing predictions and accuracy")
    fig.suptitle("Fig 9: straggler mitigation (digits, heavy-tailed model latency)")
    print(f"plot: {save(fig, 'stragglers.png')}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=600, help="measured queries per size")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    p.add_argument(
        "--sizes",
        type=lambda s: [int(v) for v in s.split(",")],
        default=list(SIZES),
        help="ensemble sizes, comma-separated (<= 16)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=0,
        help="cap of each model's AIMD batch size (0: uncapped, the server's default)",
    )
    p.add_argument("--in-flight", type=int, default=1, help="batches in flight per replica")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve_main(args)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stragglers-") as tmp:
        log_dir = Path(tmp)
        print(f"starting clipper-serve with {N_MODELS} model processes ...", flush=True)
        server, url = start_server(log_dir, args)
        try:
            print(f"ready at {url} after {time.perf_counter() - t0:.1f} s", flush=True)
            rows = run_client(url, args, log_dir)
        finally:
            stop_server(server)
    print(
        f"\n## Fig 9: straggler mitigation ({args.queries} queries per size, "
        f"{args.concurrency} in flight, {SLO_MS:.0f} ms SLO, {os.cpu_count()} CPUs)\n"
    )
    print(table(rows))
    print(
        f"\nOne member's own time per query (sleep + compute): P99 {rows[0].member_p99_ms:.1f} ms."
        " Share of (query, member) pairs the member never ran (dropped at the deadline or shed): "
        + ", ".join(f"{r.size}: {pct(r.dropped)}" for r in rows)
    )
    budget = SLO_MS * 1.15
    worst = max(float(np.percentile(r.latency_ms, 99)) for r in rows)
    ok = worst <= budget
    print(
        f"{'PASS' if ok else 'FAIL'}: clipper-serve's worst P99 over the sizes, {worst:.1f} ms,"
        f" {'<=' if ok else '>'} SLO + 15% ({budget:.1f} ms)"
    )
    first, last = rows[0], rows[-1]
    grows = np.percentile(last.blocking_ms, 99) > np.percentile(first.blocking_ms, 99)
    print(
        f"{'PASS' if grows else 'FAIL'}: the blocking P99 grows with the ensemble"
        f" ({np.percentile(first.blocking_ms, 99):.1f} ms at size {first.size},"
        f" {np.percentile(last.blocking_ms, 99):.1f} ms at size {last.size})"
    )
    plot(rows)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

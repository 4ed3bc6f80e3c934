"""A three-stage pipeline at a 50 ms SLO whose middle stage is heavy-tailed, through the real
server: deadline budgets against waiting for every stage.

The stages, each a model in its own container process, all trained here on 600 digits:

* ``feat``: PCA to 20 components, plus a quick nearest-centroid label in that space (about 1 ms);
* ``score``: an RBF SVM on the components, behind a heavy-tailed sleep drawn per query:
  lognormal with a 5 ms median and sigma 1.0 (mean 8.2 ms, P90 18 ms, P99 51 ms); a batch
  sleeps its slowest query's draw;
* ``post``: the SVM's label when it came, else the quick label (about 1 ms).

Four ways of serving the same queries (each stage's cache off, so nothing is answered twice):

* **budgets, auto**: one pipeline application, 50 ms SLO, every stage ``"budget": "auto"``;
  ``score`` has ``"default": null``, so when it misses its budget ``post`` answers the quick
  label and the answer lists ``score`` under ``degraded``;
* **budgets, static 0.2/0.6/0.2**: the same with static shares;
* **wait for every stage, per-stage timeout** (Triton's ensemble semantics: every member gets
  the whole timeout): three single-model applications with a 50 ms SLO each, chained by the
  client; a stage that times out fails the request (counted as a wrong answer);
* **wait for every stage**: the pipeline with a 10 s SLO, so no stage ever misses.

A closed-loop client (2 connections, one request outstanding on each) sends 40 warm-up queries
and then ``--queries`` test digits per way, drawn with replacement from the digits not used
for training; every way gets the same queries in the same order, and the middle stage the same
draws (seeded by the query id). Reported: the client's latency (median, P99), the share of full
answers (no stage degraded, none failed), accuracy, and agreement with the answers of waiting
for every stage. Writes ``experiments/results/pipeline.png``.

    python experiments/pipeline.py [--queries 600] [--concurrency 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from common import digits, markdown_table, pct, pyplot, save, split, start_child
from stragglers import Answer, Connection, closed_loop, stop_server

SLO_MS = 50.0
N_TRAIN = 600
N_COMPONENTS = 20
MEDIAN_MS = 5.0
SIGMA = 1.0
WARMUP = 40
WARMUP_EACH = 30  # straggle-free queries through each stage before everything
QID_STRIDE = 100_000
N_PIXELS = 64


def delay_ms(qid: int) -> float:
    """The middle stage's time on query ``qid``: the same draw whichever way asks. Warm-up
    queries (negative ids) take the median."""
    if qid < 0:
        return MEDIAN_MS
    return random.Random(qid * 7919 + 17).lognormvariate(math.log(MEDIAN_MS), SIGMA)


class FeatModel:
    """Pixels (and the query id, a 65th column) -> {"z": components + id, "quick": label}."""

    def __init__(self, pca: Any, centroids: np.ndarray) -> None:
        self.pca = pca
        self.centroids = centroids

    def predict(self, inputs: Any) -> list[dict[str, Any]]:
        x = np.asarray(inputs, dtype=np.float64).reshape(len(inputs), -1)
        z = self.pca.transform(x[:, :N_PIXELS])
        dist = ((z[:, None, :] - self.centroids[None, :, :]) ** 2).sum(axis=2)
        quick = dist.argmin(axis=1)
        return [
            {"z": [*z[i].tolist(), float(x[i, N_PIXELS])], "quick": int(quick[i])}
            for i in range(len(x))
        ]


class ScoreModel:
    """Components + query id -> the SVM's label, after the query's heavy-tailed sleep."""

    def __init__(self, svm: Any) -> None:
        self.svm = svm

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # loaded in the container: run the code path once
        self.svm.predict(np.zeros((1, N_COMPONENTS)))

    def predict(self, inputs: Any) -> list[int]:
        z = np.asarray(inputs, dtype=np.float64).reshape(len(inputs), -1)
        time.sleep(max(delay_ms(int(q)) for q in z[:, N_COMPONENTS]) / 1000.0)
        return [int(v) for v in self.svm.predict(z[:, :N_COMPONENTS])]


def post(inputs: list[Any]) -> list[int]:
    """{"score": label or null, "quick": label} -> the score's label when it came."""
    return [int(d["quick"] if d.get("score") is None else d["score"]) for d in inputs]


def pipeline(budgets: Sequence[Any]) -> dict[str, Any]:
    feat, score, fin = budgets
    return {
        "stages": [
            {"name": "feat", "model": "feat", "budget": feat, "fields": ["z", "quick"]},
            {"name": "score", "model": "score", "input": "$feat.z", "budget": score,
             "default": None},
            {"name": "post", "model": "post", "budget": fin,
             "input": {"score": "$score", "quick": "$feat.quick"}},
        ]
    }  # fmt: skip


# way -> (application, its SLO in ms, its pipeline's budgets); the chain's apps are per stage
WAYS: dict[str, tuple[str, float, Sequence[Any] | None]] = {
    "budgets, auto": ("auto", SLO_MS, ("auto", "auto", "auto")),
    "budgets, static 0.2/0.6/0.2": ("static", SLO_MS, (0.2, 0.6, 0.2)),
    "wait for every stage, per-stage timeout": ("chain", SLO_MS, None),
    "wait for every stage": ("wait", 10_000.0, ("auto", "auto", "auto")),
}
STAGE_APPS = {"feat": "doubles", "score": "doubles", "post": "json"}


# --- the server (child process) ------------------------------------------------------------------


def train(seed: int) -> tuple[FeatModel, ScoreModel]:
    from sklearn.decomposition import PCA
    from sklearn.svm import SVC

    x, y = digits()
    train_idx, _ = split(y, [N_TRAIN], seed)
    pca = PCA(n_components=N_COMPONENTS, random_state=seed).fit(x[train_idx])
    z = pca.transform(x[train_idx])
    centroids = np.stack([z[y[train_idx] == k].mean(axis=0) for k in range(10)])
    svm = SVC(kernel="rbf", gamma="scale", C=10.0).fit(z, y[train_idx])
    return FeatModel(pca, centroids), ScoreModel(svm)


async def serve(args: argparse.Namespace) -> None:
    from clipper import BatchingConfig, Clipper

    feat, score = train(args.seed)
    batching = BatchingConfig(max_wait_micros=0)
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await asyncio.gather(
            c.deploy_model("feat", "1", feat, input_type="doubles", batching=batching),
            c.deploy_model("score", "1", score, input_type="doubles", batching=batching),
            c.deploy_model("post", "1", post, input_type="json", batching=batching),
        )
        for stage, itype in STAGE_APPS.items():  # the chain's stages, also the warm-up
            await c.register_application(
                f"chain-{stage}", itype, "null", round(SLO_MS * 1000), cache=False
            )
            await c.link_model_to_app(f"chain-{stage}", stage)
        for app, slo_ms, budgets in WAYS.values():
            if budgets is not None:
                await c.register_application(
                    app, "doubles", "-1", round(slo_ms * 1000), cache=False,
                    pipeline=pipeline(budgets),
                )  # fmt: skip
        print(f"ready {c.query_url}", flush=True)
        await c.serve_forever()


def serve_main(args: argparse.Namespace) -> int:
    import uvloop

    uvloop.run(serve(args))
    return 0


# --- the client ----------------------------------------------------------------------------------


async def chained(
    url: str, queries: list[tuple[int, list[float], int]], concurrency: int
) -> list[Answer]:
    """Triton's ensemble semantics from the client: each stage its own request with the whole
    timeout; a stage that times out (answers the default) fails the request."""

    async def ask(conn: Connection, qid: int, pixels: list[float]) -> dict[str, Any]:
        value: Any = [*pixels, float(qid)]
        feat: Any = None
        for stage in ("feat", "score", "post"):
            if stage == "score":
                value = feat["z"]
            elif stage == "post":
                value = {"score": value, "quick": feat["quick"]}
            got = orjson.loads(
                await conn.post(f"/chain-{stage}/predict", orjson.dumps({"input": value}))
            )
            if got.get("default"):
                return {**got, "output": None, "failed": stage}
            value = got["output"]
            feat = value if stage == "feat" else feat
        return {"output": value}

    return await closed_loop(url, "", queries, concurrency, ask)


@dataclass
class Row:
    way: str
    latency_ms: np.ndarray
    full: float  # no stage degraded, none failed
    failed: float  # the request's answer is no prediction (default or a failed stage)
    accuracy: float
    agreement: float  # same label as waiting for every stage


def analyse(way: str, answers: list[Answer], reference: dict[int, Any]) -> Row:
    def is_full(a: Answer) -> bool:
        d = a.doc
        return not d.get("default") and not d.get("degraded") and d.get("failed") is None

    def failed(a: Answer) -> bool:
        return bool(a.doc.get("default")) or a.doc.get("failed") is not None

    return Row(
        way=way,
        latency_ms=np.array([a.latency_ms for a in answers]),
        full=float(np.mean([is_full(a) for a in answers])),
        failed=float(np.mean([failed(a) for a in answers])),
        accuracy=float(np.mean([not failed(a) and a.doc["output"] == a.label for a in answers])),
        agreement=float(np.mean([a.doc.get("output") == reference.get(a.qid) for a in answers])),
    )


def run_client(url: str, args: argparse.Namespace) -> list[Row]:
    import uvloop

    x, y = digits()
    _, test = split(y, [N_TRAIN], args.seed)
    rng = np.random.default_rng(args.seed)
    picks = rng.choice(test, size=WARMUP + args.queries, replace=True)
    answers: dict[str, list[Answer]] = {}

    async def drive() -> None:
        # Each stage alone first, straggle-free (negative ids), so that no admission estimate
        # starts from a cold first batch.
        warm = [(-(i + 1), [float(v) for v in x[test[i]]], 0) for i in range(WARMUP_EACH)]
        await chained(url, warm, 1)
        for way, (app, _, _) in WAYS.items():
            queries = [
                (i, [float(v) for v in x[j]], int(y[j])) for i, j in enumerate(picks)
            ]  # the same ids for every way: the same middle-stage draws
            warmup = [(-(QID_STRIDE + i), q[1], q[2]) for i, q in enumerate(queries[:WARMUP])]
            test_q = queries[WARMUP:]
            if app == "chain":
                await chained(url, warmup, args.concurrency)
                got = await chained(url, test_q, args.concurrency)
            else:
                await closed_loop(url, app, warmup, args.concurrency)
                got = await closed_loop(url, app, test_q, args.concurrency)
            answers[way] = got
            await asyncio.sleep(0.3)  # let the middle stage finish what it holds
            print(f"  {way}: {len(got)} answers", flush=True)

    uvloop.run(drive())
    print("\nwhy answers failed (the three commonest reasons per way, numbers as N):")
    for way, got in answers.items():
        reasons: dict[str, int] = {}
        for a in got:
            why = re.sub(r"\d+(\.\d+)?", "N", str(a.doc.get("default_explanation", "")))
            if why:
                reasons[why] = reasons.get(why, 0) + 1
        for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:3]:
            print(f"  {way}: {n} x {why}")
    reference = {a.qid: a.doc.get("output") for a in answers["wait for every stage"]}
    return [analyse(way, got, reference) for way, got in answers.items()]


def table(rows: Sequence[Row]) -> str:
    def ms(v: np.ndarray, q: float) -> str:
        return f"{float(np.percentile(v, q)):.1f}"

    return markdown_table(
        ["way", "median / P99 / max (ms)", "full answers", "failed", "accuracy",
         "agrees with waiting"],
        [
            [r.way, f"{ms(r.latency_ms, 50)} / {ms(r.latency_ms, 99)} / {ms(r.latency_ms, 100)}",
             pct(r.full), pct(r.failed), pct(r.accuracy), pct(r.agreement)]
            for r in rows
        ],
    )  # fmt: skip


def plot(rows: Sequence[Row]) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in rows:
        v = np.sort(r.latency_ms)
        left.plot(v, np.arange(1, len(v) + 1) / len(v), label=r.way)
    left.axvline(SLO_MS, color="grey", ls=":", label="SLO")
    left.set_xscale("log")
    left.set_xlim(10, None)
    left.set_xlabel("latency seen by the client (ms)")
    left.set_ylabel("share of queries")
    left.set_ylim(0.8, 1.001)
    left.legend(fontsize=8, loc="lower right")
    left.set_title("latency CDF (top 20%)")
    xs = np.arange(len(rows))
    width = 0.27
    for k, (name, key) in enumerate(
        (("P99 / SLO x 100", "p99"), ("full answers (%)", "full"), ("accuracy (%)", "accuracy"))
    ):
        vals = [
            100 * float(np.percentile(r.latency_ms, 99)) / SLO_MS if key == "p99"
            else 100 * getattr(r, key)
            for r in rows
        ]  # fmt: skip
        right.bar(xs + (k - 1) * width, vals, width, label=name)
    right.axhline(100, color="grey", ls=":")
    right.set_xticks(xs, [r.way.replace(", ", ",\n") for r in rows], fontsize=7)
    right.legend(fontsize=8)
    right.set_title("P99 against the SLO, full answers, accuracy")
    fig.suptitle(f"A 3-stage pipeline at a {SLO_MS:.0f} ms SLO, heavy-tailed middle stage")
    print(f"plot: {save(fig, 'pipeline.png')}")


def claims(rows: Sequence[Row]) -> list[str]:
    by = {r.way: r for r in rows}
    auto, chain = by["budgets, auto"], by["wait for every stage, per-stage timeout"]
    wait = by["wait for every stage"]
    p99 = float(np.percentile(auto.latency_ms, 99))
    out = []
    limit = SLO_MS * 1.15

    def line(ok: bool, text: str) -> None:
        out.append(f"{'PASS' if ok else 'FAIL'}: {text}")

    line(p99 <= limit, f"budgets (auto) P99 {p99:.1f} ms <= SLO + 15% ({limit:.1f} ms)")
    wp99 = float(np.percentile(wait.latency_ms, 99))
    line(wp99 > SLO_MS, f"waiting for every stage has a P99 of {wp99:.1f} ms, past the SLO")
    line(
        auto.accuracy >= chain.accuracy,
        f"budgets (auto) accuracy {pct(auto.accuracy)} >= per-stage timeouts "
        f"{pct(chain.accuracy)} (which fail {pct(chain.failed)} of the requests)",
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=600, help="measured queries per way")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve_main(args)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pipeline-") as tmp:
        print("starting clipper-serve with 3 model processes ...", flush=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", "--seed", str(args.seed)]
        server, url = start_child(cmd, Path(tmp) / "server.log")
        try:
            print(f"ready at {url} after {time.perf_counter() - t0:.1f} s", flush=True)
            rows = run_client(url, args)
        finally:
            stop_server(server)
    print(
        f"\n## A pipeline with deadline budgets ({args.queries} queries per way, "
        f"{args.concurrency} in flight, {SLO_MS:.0f} ms SLO, {os.cpu_count()} CPUs)\n"
    )
    print(table(rows))
    print("\n```\n" + "\n".join(claims(rows)) + "\n```")
    plot(rows)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

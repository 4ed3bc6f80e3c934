"""A canary and a shadow between versions of one model, through the real server.

Five versions of one model ``digits`` serve an application with a 20 ms SLO (cache off, so every
query is evaluated). All are trained in the script on 600 of scikit-learn's digits and answer a
digit label:

* ``1``: logistic regression, the current version;
* ``2``: a decision tree of depth 8, the canary;
* ``3``: a decision tree of depth 6, a fast shadow (it agrees with version 1 on part of the
  queries);
* ``4``: version 1's model that sleeps 50 ms a batch: a shadow slower than the SLO;
* ``5``: a model that answers 0 without computing: a shadow whose only cost is the frontend's.

The client (its own process and event loop; the server runs in a child process started with
``--serve`` and is stopped by PID) sends test digits from keep-alive connections, one request
outstanding on each, and measures each answer's latency as it sees it. It runs:

1. **canary**: a 90/10 split of versions 1 and 2; the share each version served is read from
   the server (``get_traffic``, the ``clipper_split_requests_total`` counters), against the
   configured weights;
2. **shadow**: version 3 shadows every query; the server's agreement rate is set against the
   agreement of the two models' predictions computed offline on the same digits;
3. **the real answers' latency with and without a shadow**: the same workload without a shadow,
   and with version 5 (no work), version 3 (fast) or version 4 (slower than the SLO) shadowing
   every query, in short blocks taken in turn (20 rounds of 100 queries per setting, in a fresh
   random order each round: a shared machine's noise falls on the settings alike); the P50 and
   P99 of the real answers, how many were the default output (and of those, how many were shed
   because the frontend's event loop ran late), and what the shadow did (copies sent, compared,
   expired or shed, dropped at the in-flight bound). The claim checked is that a shadow's
   slowness never reaches the real answers (version 4); versions 5 and 3 show what a shadow's
   work costs on the same CPUs: the frontend's part (5) and the model's (3).

Writes ``experiments/results/canary.png``.

    python experiments/canary.py [--queries 1500] [--concurrency 4] [--rounds 20] [--block 100]
        [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from common import Connection, digits, markdown_table, pct, pyplot, save, split, stop_server

SLO_MS = 20.0
N_TRAIN = 600
SPLIT = {"1": 90.0, "2": 10.0}
SLOW_SHADOW_S = 0.05


class Served:
    """An estimator served as a function of 64 pixels; ``delay_s`` of sleep per batch."""

    def __init__(self, estimator: Any, delay_s: float = 0.0) -> None:
        self.estimator = estimator
        self.delay_s = delay_s

    def predict(self, inputs: Any) -> list[int]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [int(v) for v in self.estimator.predict(np.asarray(inputs, dtype=np.float64))]


class Constant:
    """A model that does no work: the shadow whose only cost is the frontend's."""

    def predict(self, inputs: Any) -> np.ndarray:
        return np.zeros(len(inputs), dtype=np.int64)


def train(seed: int) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.tree import DecisionTreeClassifier

    x, y = digits()
    train_idx, _ = split(y, [N_TRAIN], seed)
    xt, yt = x[train_idx], y[train_idx]
    logreg = LogisticRegression(max_iter=3000).fit(xt, yt)
    return {
        "1": logreg,
        "2": DecisionTreeClassifier(max_depth=8, random_state=seed).fit(xt, yt),
        "3": DecisionTreeClassifier(max_depth=6, random_state=seed).fit(xt, yt),
        "4": logreg,
        "5": Constant(),
    }


# --- the server (a child process) ----------------------------------------------------------------


async def serve(args: argparse.Namespace) -> None:
    from clipper import BatchingConfig, Clipper

    models = train(args.seed)
    batching = BatchingConfig(max_wait_micros=0)
    async with Clipper(query_port=0, rpc_port=0, admin_port=0) as c:
        await c.register_application("digits", "doubles", "-1", round(SLO_MS * 1000), cache=False)
        for version, est in models.items():
            await c.deploy_model(
                "digits",
                version,
                Served(est, SLOW_SHADOW_S if version == "4" else 0.0),
                input_type="doubles",
                batching=batching,
                set_current=version == "1",
                ready_timeout_s=120.0,
            )
        await c.link_model_to_app("digits", "digits")
        print(f"ready {c.query_url} {c.admin_url}", flush=True)
        await c.serve_forever()


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen[str], str, str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve", "--seed", str(args.seed)]
    with log.open("w") as err:  # the child keeps its own copy
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    assert server.stdout is not None
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if line.startswith("ready "):
            _, query_url, admin_url = line.split()
            return server, query_url, admin_url
        if not line and server.poll() is not None:
            break
    server.kill()
    raise RuntimeError(f"the server did not start; its log ends with:\n{log.read_text()[-3000:]}")


# --- the client ----------------------------------------------------------------------------------


def closed_loop(url: str, rows: np.ndarray, concurrency: int) -> tuple[np.ndarray, list[Any]]:
    """Send every row, ``concurrency`` at a time; (latencies in ms, answers) in row order."""
    import uvloop

    host, port = url.split("//", 1)[1].rsplit(":", 1)
    latency = np.zeros(len(rows))
    answers: list[Any] = [None] * len(rows)
    pending = iter(range(len(rows)))

    async def worker() -> None:
        conn = Connection(host, int(port))
        try:
            for i in pending:
                body = orjson.dumps({"input": rows[i].tolist(), "uid": f"user-{i % 200}"})
                t0 = time.perf_counter()
                raw = await conn.post("/digits/predict", body)
                latency[i] = (time.perf_counter() - t0) * 1000.0
                answers[i] = orjson.loads(raw)
        finally:
            conn.close()

    async def drive() -> None:
        await asyncio.gather(*(worker() for _ in range(concurrency)))

    uvloop.run(drive())
    return latency, answers


SETTINGS: list[tuple[str, str | None]] = [
    ("none", None),
    ("no-op (v5)", "5"),
    ("fast (v3)", "3"),
    ("slower than SLO (v4)", "4"),
]


@dataclass
class LatencyRow:
    shadow: str
    latency_ms: np.ndarray
    defaults: int
    behind: int  # of the defaults: shed because the frontend's event loop ran late
    sent: int
    compared: int
    errors: int
    dropped: int

    @property
    def n(self) -> int:
        return len(self.latency_ms)

    def p(self, q: float) -> float:
        return float(np.percentile(self.latency_ms, q))


def _shadow_stats(client: Any, version: str | None) -> dict[str, Any]:
    """The server's counts for shadow ``version`` since it started (zeros for none)."""
    zero: dict[str, Any] = dict.fromkeys(("sent", "compared", "agreements", "errors", "dropped"), 0)
    if version is None:
        return zero
    s = client.get_traffic("digits")["stats"]["shadow"].get(version)
    if s is None:
        return zero
    return {**s, "errors": sum(s["errors"].values())}


def warm_up(client: Any, query_url: str, rows: np.ndarray, concurrency: int) -> None:
    """Until the answers stop being shed: right after a start the containers are still
    loading scikit-learn (the CPUs are busy) and the models' latencies are not known yet."""
    client.set_traffic_split("digits", {"1": 1.0, "2": 1.0})
    closed_loop(query_url, rows[:300], concurrency)
    client.set_traffic_split("digits", None)
    for version in ("3", "4", "5"):
        client.set_shadow("digits", version, 1.0)
        closed_loop(query_url, rows[:100], concurrency)
    client.set_shadow("digits", None)
    for _ in range(8):
        _, answers = closed_loop(query_url, rows[:300], concurrency)
        if sum(bool(a["default"]) for a in answers) <= 1:
            break


def run(args: argparse.Namespace, query_url: str, admin_url: str) -> dict[str, Any]:
    from clipper.client import Client

    client = Client(admin_url, query_url)
    x, y = digits()
    _, test = split(y, [N_TRAIN], args.seed)
    rng = np.random.default_rng(args.seed)
    rows = x[rng.choice(test, size=args.queries, replace=True)]
    models = train(args.seed)
    offline = {v: models[v].predict(rows) for v in ("1", "3")}
    out: dict[str, Any] = {}

    warm_up(client, query_url, rows, args.concurrency)

    # 1. the canary
    before = client.get_traffic("digits")["stats"]["split"]
    client.set_traffic_split("digits", SPLIT)
    _, answers = closed_loop(query_url, rows, args.concurrency)
    after = client.get_traffic("digits")["stats"]["split"]
    served = {
        v: after.get(v, {}).get("requests", 0) - before.get(v, {}).get("requests", 0) for v in SPLIT
    }
    fallbacks = sum(s["fallbacks"] for s in after.values())
    client.set_traffic_split("digits", None)
    out["canary"] = (served, fallbacks, sum(bool(a["default"]) for a in answers))

    # 2. the shadow's agreement, against the offline agreement on the same digits
    start = _shadow_stats(client, "3")
    client.set_shadow("digits", "3", 1.0)
    closed_loop(query_url, rows, args.concurrency)
    time.sleep(0.5)  # the last copies come back
    end = _shadow_stats(client, "3")
    client.set_shadow("digits", None)
    delta = {k: end[k] - start[k] for k in ("sent", "compared", "agreements", "errors", "dropped")}
    out["shadow"] = (delta, end["latency_ms"], float(np.mean(offline["1"] == offline["3"])))

    # 3. the real answers' latency without a shadow, with a fast one and with a slow one, in
    # short blocks taken in turn (this machine's noise falls on the three settings alike)
    blocks: dict[str, list[np.ndarray]] = {label: [] for label, _ in SETTINGS}
    defaults = dict.fromkeys(blocks, 0)
    keys = ("sent", "compared", "errors", "dropped")
    counts = {label: dict.fromkeys(keys, 0) for label in blocks}
    behind = dict.fromkeys(blocks, 0)
    order = np.random.default_rng(args.seed + 1)
    for k in range(args.rounds):
        for s in order.permutation(len(SETTINGS)):  # a fresh order each round
            label, version = SETTINGS[s]
            picked = rows[(k * args.block) % len(rows) :][: args.block]
            start = _shadow_stats(client, version)
            if version is not None:
                client.set_shadow("digits", version, 1.0)
            lat, answers = closed_loop(query_url, picked, args.concurrency)
            if version is not None:
                client.set_shadow("digits", None)
                time.sleep(2 * SLOW_SHADOW_S)  # its copies come back
            end = _shadow_stats(client, version)
            blocks[label].append(lat)
            defaults[label] += sum(bool(a["default"]) for a in answers)
            behind[label] += sum(
                "frontend is behind" in a.get("default_explanation", "") for a in answers
            )
            for key in counts[label]:
                counts[label][key] += end[key] - start[key]
        print(f"  round {k + 1} of {args.rounds}", flush=True)
    latency_rows = [
        LatencyRow(
            label, np.concatenate(blocks[label]), defaults[label], behind[label], **counts[label]
        )
        for label, _ in SETTINGS
    ]
    out["latency"] = latency_rows
    return out


def report(out: dict[str, Any], args: argparse.Namespace) -> None:
    served, fallbacks, defaults = out["canary"]
    total = sum(served.values())
    weights = sum(SPLIT.values())
    print(f"\n## Canary: a 90/10 split, {total} queries\n")
    print(
        markdown_table(
            ["version", "configured share", "served", "measured share", "binomial 99% range"],
            [
                [
                    v,
                    pct(w / weights),
                    served[v],
                    pct(served[v] / total) if total else "-",
                    _binomial_range(w / weights, total),
                ]
                for v, w in SPLIT.items()
            ],
        )
    )
    print(f"\nFallbacks to the current version: {fallbacks}; default answers: {defaults}.")

    delta, latency, offline = out["shadow"]
    rate = delta["agreements"] / delta["compared"] if delta["compared"] else None
    print(f"\n## Shadow: version 3 on every query ({args.queries} queries)\n")
    print(
        markdown_table(
            [
                "copies sent",
                "compared",
                "agreement (server)",
                "agreement (offline, same digits)",
                "expired or shed",
                "dropped",
                "real P50 / P99 (ms, server)",
                "shadow P50 / P99 (ms, server)",
            ],
            [
                [
                    delta["sent"],
                    delta["compared"],
                    "-" if rate is None else pct(rate),
                    pct(offline),
                    delta["errors"],
                    delta["dropped"],
                    _pair(latency["real"]),
                    _pair(latency["shadow"]),
                ]
            ],
        )
    )
    rows: list[LatencyRow] = out["latency"]
    print(
        f"\n## The real answers with and without a shadow ({args.rounds} blocks of "
        f"{args.block} queries each, taken in turn; {args.concurrency} in flight, "
        f"{SLO_MS:.0f} ms SLO, {os.cpu_count()} CPUs)\n"
    )
    print(
        markdown_table(
            [
                "shadow",
                "queries",
                "real P50 (ms)",
                "real P99 (ms)",
                "default answers",
                "of which: event loop late",
                "shadow copies sent",
                "compared",
                "expired or shed",
                "dropped at the bound",
            ],
            [
                [
                    r.shadow,
                    r.n,
                    f"{r.p(50):.2f}",
                    f"{r.p(99):.2f}",
                    f"{r.defaults} ({pct(r.defaults / r.n, 2)})",
                    r.behind,
                    r.sent,
                    r.compared,
                    r.errors,
                    r.dropped,
                ]
                for r in rows
            ],
        )
    )
    ok_share = all(
        _within(served[v] / total, w / weights, total) for v, w in SPLIT.items() if total
    )
    print(
        f"\n{'PASS' if ok_share else 'FAIL'}: each version's measured share is within the "
        "binomial 99% range of its configured share"
    )
    agree = rate is not None and abs(rate - offline) < 0.02
    print(
        f"{'PASS' if agree else 'FAIL'}: the server's agreement rate is within 2 points of the "
        "offline agreement (the server compares only the copies that came back)"
    )
    none = rows[0]
    for r in rows[1:]:
        line = (
            f"with the {r.shadow} shadow the real answers' P50 / P99 are {r.p(50):.2f} / "
            f"{r.p(99):.2f} ms (without a shadow: {none.p(50):.2f} / {none.p(99):.2f} ms) and "
            f"{pct(r.defaults / r.n, 2)} of them are defaults (without: "
            f"{pct(none.defaults / none.n, 2)})"
        )
        if r.shadow.startswith("slower"):
            ok = (
                r.p(99) <= 1.25 * none.p(99) + 1.0
                and r.defaults / r.n <= none.defaults / none.n + 0.005
            )
            print(f"{'PASS' if ok else 'FAIL'}: {line} (bounds: P99 25% + 1 ms, 0.5 points more)")
        else:
            print(f"COST: {line}")
    plot(served, total, rate, offline, rows)


def _pair(lat: dict[str, float | None]) -> str:
    return " / ".join("-" if v is None else f"{v:.1f}" for v in (lat["p50"], lat["p99"]))


def _binomial_range(p: float, n: int) -> str:
    if not n:
        return "-"
    half = 2.576 * (p * (1 - p) / n) ** 0.5
    return f"{pct(max(p - half, 0.0))} - {pct(min(p + half, 1.0))}"


def _within(measured: float, p: float, n: int) -> bool:
    return bool(abs(measured - p) <= 2.576 * (p * (1 - p) / n) ** 0.5)


def plot(
    served: dict[str, int],
    total: int,
    rate: float | None,
    offline: float,
    rows: Sequence[LatencyRow],
) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(14, 4.2))
    versions = list(SPLIT)
    weights = sum(SPLIT.values())
    xs = np.arange(len(versions))
    left.bar(xs - 0.2, [100 * SPLIT[v] / weights for v in versions], 0.4, label="configured")
    left.bar(xs + 0.2, [100 * served[v] / max(total, 1) for v in versions], 0.4, label="served")
    left.set_xticks(xs, [f"version {v}" for v in versions])
    left.set_ylabel("% of queries")
    left.set_title("canary: traffic share per version")
    left.legend(fontsize=8)
    middle.bar(
        [0, 1],
        [100 * (rate or 0.0), 100 * offline],
        color=["C0", "C7"],
    )
    middle.set_xticks([0, 1], ["server (shadow)", "offline"])
    middle.set_ylim(0, 100)
    middle.set_ylabel("% agreement with version 1")
    middle.set_title("shadow: agreement rate")
    xs3 = np.arange(len(rows))
    right.bar(xs3 - 0.2, [r.p(50) for r in rows], 0.4, label="P50")
    right.bar(xs3 + 0.2, [r.p(99) for r in rows], 0.4, label="P99")
    right.axhline(SLO_MS, color="grey", ls=":", label="SLO")
    right.set_xticks(xs3, ["no shadow", "no-op shadow", "fast shadow", "slow shadow"])
    right.set_ylabel("real answers' latency (ms)")
    right.set_title("the real answers with and without a shadow")
    right.legend(fontsize=8)
    fig.suptitle("A canary and a shadow between versions of one model (digits, 20 ms SLO)")
    print(f"plot: {save(fig, 'canary.png')}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=1500, help="queries per measured run")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--rounds", type=int, default=20, help="blocks of each shadow setting")
    p.add_argument("--block", type=int, default=100, help="queries per block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        import uvloop

        uvloop.run(serve(args))
        return 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="canary-") as tmp:
        print("starting clipper-serve with 5 versions of one model ...", flush=True)
        server, query_url, admin_url = start_server(args, Path(tmp) / "server.log")
        try:
            print(f"ready at {query_url} after {time.perf_counter() - t0:.1f} s", flush=True)
            out = run(args, query_url, admin_url)
        finally:
            stop_server(server)
    report(out, args)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

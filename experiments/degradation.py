"""Fig 8 of the Clipper paper: the best model degrades half-way through a stream of queries.

Four scikit-learn classifiers of different quality are trained on 300 digits; the best of them on
300 validation digits is "the best model". A stream of 3000 queries (drawn with replacement from
the remaining digits) is answered with feedback on every query. From query 1501 on, the best
model's prediction is replaced by a uniformly random label with probability 0.6.

Each selection policy answers the same stream and learns from the same feedback:

* ``exp3`` evaluates one model per query and learns from that model's loss only;
* ``exp4`` evaluates every model, answers their weighted vote, and learns from all losses;
* the static best model (chosen up front, never revised: the ``single`` policy over it);
* uniform random choice (``ab_split`` with equal weights);
* ``epsilon_greedy``, ``ucb1`` and ``thompson`` with their default parameters, for comparison.

The whole run is repeated over 5 seeds (data split, stream, noise and policy draws) and averaged.
Prints the error table and PASS/FAIL for "Exp3 and Exp4 beat the static best model over the
last 500 queries"; writes ``experiments/results/degradation.png``.

    python experiments/degradation.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from common import as_labels, digits, markdown_table, pct, pyplot, save, split

from clipper.selection import make_loss, make_policy

N_QUERIES = 3000
DEGRADE_AT = 1500  # queries 0..1499 are clean, 1500.. are degraded
NOISE = 0.6
LAST = 500
WINDOW = 100  # rolling window of the plot's right panel
N_TRAIN = 300
N_VALIDATION = 300


def _logreg() -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=2000)


def _tree() -> Any:
    from sklearn.tree import DecisionTreeClassifier

    return DecisionTreeClassifier(max_depth=6, random_state=0)


def _naive_bayes() -> Any:
    from sklearn.naive_bayes import GaussianNB

    return GaussianNB()


def _knn() -> Any:
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier(n_neighbors=5)


MODELS: dict[str, Callable[[], Any]] = {
    "logreg": _logreg,
    "tree": _tree,
    "naive_bayes": _naive_bayes,
    "knn": _knn,
}

PolicyFactory = Callable[[list[str], str], Any]  # (models, best model) -> policy

POLICIES: dict[str, PolicyFactory] = {
    "exp3": lambda ms, best: make_policy("exp3", ms, eta=0.1),
    "exp4": lambda ms, best: make_policy("exp4", ms, eta=0.1),
    "static best model": lambda ms, best: make_policy("single", [best]),
    "uniform random": lambda ms, best: make_policy("ab_split", ms, weights={m: 1.0 for m in ms}),
    "epsilon_greedy": lambda ms, best: make_policy("epsilon_greedy", ms),
    "ucb1": lambda ms, best: make_policy("ucb1", ms),
    "thompson": lambda ms, best: make_policy("thompson", ms),
}
MAIN = ("exp3", "exp4", "static best model", "uniform random")


@dataclass
class Stream:
    """One seed's query stream: labels, each model's outputs (degraded ones included)."""

    labels: list[int]
    outputs: dict[str, list[int]]
    best: str
    validation_error: dict[str, float]
    clean_error: dict[str, float]  # each model's error on the stream before the degradation
    degraded_error: float  # the best model's error on the stream after it


def make_stream(seed: int) -> Stream:
    x, y = digits()
    train, validation, pool = split(y, [N_TRAIN, N_VALIDATION], seed)
    rng = np.random.default_rng(seed)
    queries = rng.choice(pool, size=N_QUERIES, replace=True)
    labels = y[queries]
    outputs: dict[str, np.ndarray] = {}
    validation_error: dict[str, float] = {}
    for name, factory in MODELS.items():
        clf = factory().fit(x[train], y[train])
        validation_error[name] = float(np.mean(clf.predict(x[validation]) != y[validation]))
        outputs[name] = np.asarray(clf.predict(x[queries]), dtype=np.int64)
    best = min(validation_error, key=lambda m: validation_error[m])
    noisy = rng.random(N_QUERIES) < NOISE
    noisy[:DEGRADE_AT] = False
    degraded = outputs[best].copy()
    degraded[noisy] = rng.integers(0, 10, size=int(noisy.sum()))
    outputs[best] = degraded
    clean = {m: float(np.mean(o[:DEGRADE_AT] != labels[:DEGRADE_AT])) for m, o in outputs.items()}
    return Stream(
        labels=as_labels(labels),
        outputs={m: as_labels(o) for m, o in outputs.items()},
        best=best,
        validation_error=validation_error,
        clean_error=clean,
        degraded_error=float(np.mean(degraded[DEGRADE_AT:] != labels[DEGRADE_AT:])),
    )


@dataclass
class Run:
    errors: np.ndarray  # 0/1 per query
    evaluated: float  # models evaluated per query, on average


def run_policy(policy: Any, stream: Stream, seed: int) -> Run:
    """Answer the stream with ``policy``, learning from the feedback after every query."""
    loss = make_loss("0/1")
    rng = random.Random(seed)
    state = policy.init_state()
    errors = np.zeros(N_QUERIES)
    evaluated = 0
    for t, label in enumerate(stream.labels):
        chosen = policy.select(state, rng)
        outputs = {m: stream.outputs[m][t] for m in chosen}
        evaluated += len(chosen)
        answer = policy.combine(state, outputs)
        errors[t] = answer.output != label
        policy.observe(state, outputs, label, loss)
    return Run(errors=errors, evaluated=evaluated / N_QUERIES)


def run(seeds: Sequence[int]) -> tuple[dict[str, np.ndarray], dict[str, float], list[Stream]]:
    """Mean 0/1 error per query index and models evaluated per query, for each policy."""
    errors = {name: np.zeros(N_QUERIES) for name in POLICIES}
    evaluated = dict.fromkeys(POLICIES, 0.0)
    streams = []
    for seed in seeds:
        stream = make_stream(seed)
        streams.append(stream)
        models = list(MODELS)
        for name, factory in POLICIES.items():
            result = run_policy(factory(models, stream.best), stream, seed)
            errors[name] += result.errors / len(seeds)
            evaluated[name] += result.evaluated / len(seeds)
    return errors, evaluated, streams


def model_table(streams: Sequence[Stream]) -> str:
    rows = []
    for m in MODELS:
        val = float(np.mean([s.validation_error[m] for s in streams]))
        clean = float(np.mean([s.clean_error[m] for s in streams]))
        chosen = sum(s.best == m for s in streams)
        rows.append([m, pct(val), pct(clean), f"{chosen} of {len(streams)}"])
    return markdown_table(
        ["model", "validation error", "stream error, queries 1-1500", "chosen as best"], rows
    )


def policy_table(errors: dict[str, np.ndarray], evaluated: dict[str, float]) -> str:
    rows = []
    for name, e in errors.items():
        rows.append(
            [
                name,
                f"{evaluated[name]:.2f}",
                pct(float(e[:DEGRADE_AT].mean())),
                pct(float(e[DEGRADE_AT:].mean())),
                pct(float(e[-LAST:].mean())),
                pct(float(e.mean())),
            ]
        )
    return markdown_table(
        [
            "policy",
            "models evaluated / query",
            f"error, queries 1-{DEGRADE_AT}",
            f"error, queries {DEGRADE_AT + 1}-{N_QUERIES}",
            f"error, last {LAST}",
            "cumulative error",
        ],
        rows,
    )


def plot(errors: dict[str, np.ndarray]) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    t = np.arange(1, N_QUERIES + 1)
    kernel = np.ones(WINDOW) / WINDOW
    for name, e in errors.items():
        style: dict[str, Any] = {"lw": 2.0} if name in MAIN else {"lw": 1.0, "ls": "--"}
        left.plot(t, np.cumsum(e) / t, label=name, **style)
        right.plot(t[WINDOW - 1 :], np.convolve(e, kernel, mode="valid"), label=name, **style)
    for ax, title in (
        (left, "cumulative error rate"),
        (right, f"error over the last {WINDOW} queries"),
    ):
        ax.axvline(DEGRADE_AT, color="grey", ls=":", lw=1)
        ax.set_xlabel("queries (feedback after each)")
        ax.set_ylabel("error")
        ax.set_title(title)
        ax.set_ylim(0, None)
    left.legend(fontsize=8)
    fig.suptitle(f"Fig 8: the best model degrades at query {DEGRADE_AT} (digits)")
    print(f"plot: {save(fig, 'degradation.png')}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="repetitions, averaged")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    errors, evaluated, streams = run(range(args.seeds))
    degraded = float(np.mean([s.degraded_error for s in streams]))
    print(f"## Fig 8: model degradation ({args.seeds} seeds, {N_QUERIES} queries each)\n")
    print(model_table(streams))
    print(
        f"\nAfter query {DEGRADE_AT} the best model answers a random label with probability"
        f" {NOISE}: its error on the rest of the stream is {pct(degraded)}.\n"
    )
    print(policy_table(errors, evaluated))
    static = float(errors["static best model"][-LAST:].mean())
    print()
    for name in ("exp3", "exp4"):
        mine = float(errors[name][-LAST:].mean())
        verdict = "PASS" if mine < static else "FAIL"
        print(
            f"{verdict}: {name} error over the last {LAST} queries {pct(mine)}"
            f" {'<' if mine < static else '>='} static best model {pct(static)}"
        )
    plot(errors)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

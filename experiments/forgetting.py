"""Forgetting: the best model degrades, and the model that takes over was the worst before.

Three scikit-learn classifiers answer a stream of 3000 digits with feedback after every query:

* ``knn`` (5-NN) is the best model. From query 1501 on its answer is replaced by a uniformly
  random label with probability 0.6 (its error rises to about 55%).
* ``tree`` (a depth-4 decision tree) is mediocre all along (about 41% error).
* ``successor`` (logistic regression) answers a wrong label on *every* query before the change,
  as if its input feature were broken, and its own prediction after it (about 6% error): it is
  the worst model before the change and the best one after.

Every learning policy (``exp3``, ``exp4``, ``epsilon_greedy``, ``ucb1``, ``thompson``) answers the
same stream twice: with its default forgetting (a weight floor for exp3, fixed-share for exp4,
discounted statistics for the other three) and with forgetting off (``floor`` / ``share`` 0,
``discount`` 1: the stationary rules). The one-model policies run with bandit feedback (the
default: they learn from the model they drew, exp3 importance-weighted by the probability it was
drawn with, as the server does) and with full feedback (every model's loss); exp4 always learns
from every model.

The reference is the best model in hindsight *per window* of 100 queries (the best single model
of each window, chosen after the fact). Over the last quarter of the stream, each policy with
forgetting should be within 10 points of it. Means over 5 seeds. Prints the tables and
PASS/FAIL lines; writes ``experiments/results/forgetting.png``.

    python experiments/forgetting.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from common import as_labels, digits, markdown_table, pct, pyplot, save, split

from clipper.selection import make_loss, make_policy

N_QUERIES = 3000
CHANGE_AT = 1500  # queries 0..1499 before the change, 1500.. after
LAST_QUARTER = N_QUERIES * 3 // 4  # queries 2250.. are the last quarter
NOISE = 0.6
WINDOW = 100
N_TRAIN = 300
TARGET_POINTS = 0.10
LEARNERS = ("exp3", "exp4", "epsilon_greedy", "ucb1", "thompson")
OFF: dict[str, dict[str, Any]] = {
    "exp3": {"floor": 0.0},
    "exp4": {"share": 0.0},
    "epsilon_greedy": {"discount": 1.0},
    "ucb1": {"discount": 1.0},
    "thompson": {"discount": 1.0},
}
MODELS = ("knn", "tree", "successor")


@dataclass
class Stream:
    labels: list[int]
    outputs: dict[str, list[int]]


def make_stream(seed: int) -> Stream:
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.tree import DecisionTreeClassifier

    x, y = digits()
    train, pool = split(y, [N_TRAIN], seed)
    rng = np.random.default_rng(seed)
    queries = rng.choice(pool, size=N_QUERIES, replace=True)
    labels = y[queries]
    fitted = {
        "knn": KNeighborsClassifier(n_neighbors=5),
        "tree": DecisionTreeClassifier(max_depth=4, random_state=0),
        "successor": LogisticRegression(max_iter=2000),
    }
    outputs = {
        m: np.asarray(clf.fit(x[train], y[train]).predict(x[queries]), dtype=np.int64)
        for m, clf in fitted.items()
    }
    noisy = rng.random(N_QUERIES) < NOISE
    noisy[:CHANGE_AT] = False
    outputs["knn"][noisy] = rng.integers(0, 10, size=int(noisy.sum()))
    # Before the change the successor is wrong on every query: the label shifted by 1..9.
    shift = rng.integers(1, 10, size=CHANGE_AT)
    outputs["successor"][:CHANGE_AT] = (labels[:CHANGE_AT] + shift) % 10
    return Stream(as_labels(labels), {m: as_labels(o) for m, o in outputs.items()})


def run_policy(policy: Any, stream: Stream, seed: int) -> np.ndarray:
    """0/1 error per query of ``policy`` on ``stream``, with feedback after every query: as the
    server gives it, from the drawn model (bandit) or from every model (full information)."""
    loss = make_loss("0/1")
    rng = random.Random(seed)
    state = policy.init_state()
    errors = np.zeros(N_QUERIES)
    for t, label in enumerate(stream.labels):
        chosen = policy.select(state, rng)
        drawn = {m: policy.draw_probability(state, m) for m in chosen}
        outputs = {m: stream.outputs[m][t] for m in chosen}
        errors[t] = policy.combine(state, outputs).output != label
        if policy.bandit_feedback:
            known = {m: p for m, p in drawn.items() if p is not None}
            policy.observe(state, outputs, label, loss, drawn=known or None)
        else:
            policy.observe(state, {m: stream.outputs[m][t] for m in MODELS}, label, loss)
    return errors


def variants() -> list[tuple[str, str, dict[str, Any]]]:
    """(row name, policy, parameters with forgetting left at its default) per row."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for name in LEARNERS:
        if name == "exp4":
            out.append((name, name, {}))
        else:
            out.append((f"{name}, bandit feedback", name, {"feedback": "bandit"}))
            out.append((f"{name}, full feedback", name, {"feedback": "full"}))
    return out


def window_best(stream: Stream) -> np.ndarray:
    """Per query: the error rate of its window's best single model (chosen in hindsight)."""
    labels = np.asarray(stream.labels)
    out = np.zeros(N_QUERIES)
    for start in range(0, N_QUERIES, WINDOW):
        sl = slice(start, start + WINDOW)
        out[sl] = min(
            float(np.mean(np.asarray(stream.outputs[m])[sl] != labels[sl])) for m in MODELS
        )
    return out


@dataclass
class Results:
    policies: dict[str, np.ndarray]  # "<policy>" (forgetting) and "<policy>, no forgetting"
    models: dict[str, np.ndarray]
    best_per_window: np.ndarray


def run(seeds: Sequence[int]) -> Results:
    models = list(MODELS)
    policies: dict[str, np.ndarray] = {}
    singles = {m: np.zeros(N_QUERIES) for m in MODELS}
    best = np.zeros(N_QUERIES)
    for seed in seeds:
        stream = make_stream(seed)
        labels = np.asarray(stream.labels)
        for m in MODELS:
            singles[m] += (np.asarray(stream.outputs[m]) != labels) / len(seeds)
        best += window_best(stream) / len(seeds)
        for row, name, params in variants():
            for key, extra in ((row, {}), (f"{row}, no forgetting", OFF[name])):
                policy = make_policy(name, models, **params, **extra)
                errors = run_policy(policy, stream, seed)
                policies[key] = policies.get(key, np.zeros(N_QUERIES)) + errors / len(seeds)
    return Results(policies, singles, best)


def table(r: Results) -> str:
    best_last = float(r.best_per_window[LAST_QUARTER:].mean())
    rows = []
    for name, _, _ in variants():
        on, off = r.policies[name], r.policies[f"{name}, no forgetting"]
        rows.append(
            [
                name,
                pct(float(off[:CHANGE_AT].mean())),
                pct(float(on[:CHANGE_AT].mean())),
                pct(float(off[LAST_QUARTER:].mean())),
                pct(float(on[LAST_QUARTER:].mean())),
                f"{100 * (float(on[LAST_QUARTER:].mean()) - best_last):+.1f}",
            ]
        )
    for m, e in r.models.items():
        rows.append([f"model `{m}` alone", pct(float(e[:CHANGE_AT].mean())), "", "", "", ""])
        rows[-1][3] = pct(float(e[LAST_QUARTER:].mean()))
    rows.append(
        [
            f"best model per {WINDOW}-query window (hindsight)",
            pct(float(r.best_per_window[:CHANGE_AT].mean())),
            "",
            pct(best_last),
            "",
            "",
        ]
    )
    return markdown_table(
        [
            "policy",
            f"queries 1-{CHANGE_AT}, no forgetting",
            f"queries 1-{CHANGE_AT}, forgetting",
            f"last quarter ({LAST_QUARTER + 1}-{N_QUERIES}), no forgetting",
            "last quarter, forgetting",
            "forgetting vs window best (points)",
        ],
        rows,
    )


def plot(r: Results) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    t = np.arange(1, N_QUERIES + 1)
    kernel = np.ones(WINDOW) / WINDOW
    for ax, suffix, title in (
        (axes[0], ", no forgetting", "without forgetting (floor / share 0, discount 1)"),
        (axes[1], "", "with the default forgetting"),
    ):
        for name, _, _ in variants():
            e = r.policies[name + suffix]
            style = "-" if "full" not in name else "--"
            label = name.replace(" feedback", "")
            ax.plot(t[WINDOW - 1 :], np.convolve(e, kernel, mode="valid"), style, label=label)
        ax.plot(t, r.best_per_window, color="black", ls="--", lw=1, label="best model per window")
        ax.axvline(CHANGE_AT, color="grey", ls=":", lw=1)
        ax.axvspan(LAST_QUARTER, N_QUERIES, color="grey", alpha=0.08)
        ax.set_xlabel("queries (feedback after each)")
        ax.set_title(title)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel(f"error over the last {WINDOW} queries")
    axes[1].legend(fontsize=8)
    fig.suptitle(
        f"The best model degrades at query {CHANGE_AT}; the worst one becomes the best (digits)"
    )
    print(f"plot: {save(fig, 'forgetting.png')}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="repetitions, averaged")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    r = run(range(args.seeds))
    print(f"## Forgetting ({args.seeds} seeds, {N_QUERIES} queries each)\n")
    print(table(r))
    best_last = float(r.best_per_window[LAST_QUARTER:].mean())
    print()
    for name, _, _ in variants():
        mine = float(r.policies[name][LAST_QUARTER:].mean())
        ok = mine - best_last <= TARGET_POINTS
        print(
            f"{'PASS' if ok else 'FAIL'}: {name} with forgetting, last quarter {pct(mine)}"
            f" {'within' if ok else 'more than'} {100 * TARGET_POINTS:.0f} points of the best"
            f" model per window ({pct(best_last)})"
        )
    plot(r)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

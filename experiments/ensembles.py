"""Fig 7 / Table 2 of the Clipper paper: a 5-model ensemble and confident predictions.

Five diverse scikit-learn classifiers, Gaussian naive Bayes, a small random forest, 5-nearest
neighbours, logistic regression and an RBF SVM, are each trained on their own 150 digits (five
disjoint training sets, as if five teams had each built a model from their own data; small, so
that none is perfect). The ``exp4`` policy combines the five outputs of every test digit, two
ways:

* **equal weights**: a fresh state (no feedback), i.e. a plain majority vote; its confidence is
  the share of models that agree with the answer, so confidence >= 0.8 is "4-agree" (at least 4
  of the 5 models agree) and confidence = 1.0 is "5-agree" (all 5 agree);
* **learned weights**: the state after 300 feedback digits (``eta`` 0.1, then frozen); the
  confidence is then the weight of the models that agree, so the same thresholds mean "models
  holding 80% (100%) of the weight agree".

The table has the paper's layout: each single model's error, the ensemble's error (and its change
relative to the best single model), and for the 4-agree and 5-agree thresholds the error and the
share of the confident answers and of the rest. 5 seeds (splits), errors pooled over the seeds'
test sets (the 897 digits left each time). Writes ``experiments/results/ensembles.png``.

    python experiments/ensembles.py [--seeds 5]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from common import as_labels, digits, markdown_table, pct, pyplot, save, split

from clipper.selection import make_loss, make_policy

N_TRAIN = 150
N_FEEDBACK = 300
ETA = 0.1
THRESHOLDS = {"4-agree": 0.8, "5-agree": 1.0}
EPS = 1e-9  # confidences are sums of float weights


def _naive_bayes() -> Any:
    from sklearn.naive_bayes import GaussianNB

    return GaussianNB()


def _forest() -> Any:
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0)


def _knn() -> Any:
    from sklearn.neighbors import KNeighborsClassifier

    return KNeighborsClassifier(n_neighbors=5)


def _logreg() -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=2000)


def _svm() -> Any:
    from sklearn.svm import SVC

    return SVC(gamma=0.001)


MODELS: dict[str, Callable[[], Any]] = {
    "naive_bayes": _naive_bayes,
    "forest": _forest,
    "knn": _knn,
    "logreg": _logreg,
    "svm": _svm,
}


@dataclass
class Answers:
    """One way of combining, pooled over seeds: per test digit, right or wrong and confidence."""

    wrong: list[bool] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    agreeing: list[int] = field(default_factory=list)  # models whose output is the answer

    def error(self) -> float:
        return float(np.mean(self.wrong))

    def bucket(self, threshold: float) -> tuple[float, float, float, float]:
        """(confident error, confident share, unsure error, unsure share)."""
        wrong = np.asarray(self.wrong)
        confident = np.asarray(self.confidence) >= threshold - EPS
        n = len(wrong)

        def err(mask: np.ndarray) -> float:
            return float(wrong[mask].mean()) if mask.any() else float("nan")

        return err(confident), confident.sum() / n, err(~confident), (~confident).sum() / n


@dataclass
class Results:
    single_wrong: dict[str, list[bool]] = field(default_factory=lambda: {m: [] for m in MODELS})
    equal: Answers = field(default_factory=Answers)
    learned: Answers = field(default_factory=Answers)
    learned_weights: list[dict[str, float]] = field(default_factory=list)


def answer_all(
    policy: Any, state: dict[str, Any], outputs: dict[str, list[int]], labels: list[int]
) -> Answers:
    """exp4's answer to every test digit from a frozen state."""
    answers = Answers()
    for t, label in enumerate(labels):
        row = {m: o[t] for m, o in outputs.items()}
        combined = policy.combine(state, row)
        answers.wrong.append(combined.output != label)
        answers.confidence.append(float(combined.confidence))
        answers.agreeing.append(sum(y == combined.output for y in row.values()))
    return answers


def learned_weights(policy: Any, state: dict[str, Any]) -> dict[str, float]:
    """Each model's weight as the policy sees it: the confidence of its output when it alone
    disagrees with all the others (a probe that needs nothing of the state's layout)."""
    weights = {}
    for m in policy.models:
        probe = {other: 1 for other in policy.models}
        probe[m] = 0
        combined = policy.combine(state, probe)
        weights[m] = combined.confidence if combined.output == 0 else 1.0 - combined.confidence
    return weights


def run_seed(seed: int, results: Results) -> None:
    x, y = digits()
    *trains, feedback, test = split(y, [N_TRAIN] * len(MODELS) + [N_FEEDBACK], seed)
    fb_out: dict[str, list[int]] = {}
    test_out: dict[str, list[int]] = {}
    for (name, factory), train in zip(MODELS.items(), trains, strict=True):
        clf = factory().fit(x[train], y[train])
        fb_out[name] = as_labels(clf.predict(x[feedback]))
        test_out[name] = as_labels(clf.predict(x[test]))
    labels = as_labels(y[test])
    for m, o in test_out.items():
        results.single_wrong[m] += [a != b for a, b in zip(o, labels, strict=True)]

    policy = make_policy("exp4", list(MODELS), eta=ETA)
    ensemble = answer_all(policy, policy.init_state(), test_out, labels)
    for key in ("wrong", "confidence", "agreeing"):
        getattr(results.equal, key).extend(getattr(ensemble, key))

    state = policy.init_state()
    loss = make_loss("0/1")
    rng = random.Random(seed)
    for t, label in enumerate(as_labels(y[feedback])):
        chosen = policy.select(state, rng)
        policy.observe(state, {m: fb_out[m][t] for m in chosen}, label, loss)
    trained = answer_all(policy, state, test_out, labels)
    for key in ("wrong", "confidence", "agreeing"):
        getattr(results.learned, key).extend(getattr(trained, key))
    results.learned_weights.append(learned_weights(policy, state))


def table(results: Results) -> str:
    single = {m: float(np.mean(w)) for m, w in results.single_wrong.items()}
    best = min(single.values())
    ordered = sorted(single.values(), reverse=True)
    singles = ", ".join(f"**{pct(e, 2)}**" if e == best else pct(e, 2) for e in ordered)
    rows = []
    for name, answers in (
        ("exp4, equal weights (majority vote)", results.equal),
        (f"exp4, weights learned from {N_FEEDBACK} feedback (eta {ETA})", results.learned),
    ):
        err = answers.error()
        cells = [name, singles, f"{pct(err, 2)} ({100 * (err - best) / best:+.1f}% relative)"]
        for threshold in THRESHOLDS.values():
            ce, cs, ue, us = answers.bucket(threshold)
            cells += [f"{pct(ce, 2)} / {pct(cs)}", f"{pct(ue, 2)} / {pct(us)}"]
        rows.append(cells)
    return markdown_table(
        [
            "combination",
            "single models (error)",
            "ensemble (error)",
            "4-agree: confident err / share",
            "4-agree: unsure err / share",
            "5-agree: confident err / share",
            "5-agree: unsure err / share",
        ],
        rows,
    )


def check_agreement(answers: Answers) -> str:
    """With equal weights, confidence >= 0.8 must mean 4 or 5 of the 5 models agree."""
    conf = np.asarray(answers.confidence)
    agree = np.asarray(answers.agreeing)
    ok4 = np.array_equal(conf >= 0.8 - EPS, agree >= 4)
    ok5 = np.array_equal(conf >= 1.0 - EPS, agree == 5)
    verdict = "PASS" if ok4 and ok5 else "FAIL"
    return (
        f"{verdict}: with equal weights, confidence >= 0.8 <=> at least 4 models agree ({ok4}),"
        f" confidence = 1.0 <=> all 5 agree ({ok5})"
    )


def plot(results: Results) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [*MODELS, "exp4 equal", "exp4 learned"]
    errs = [float(np.mean(results.single_wrong[m])) for m in MODELS]
    errs += [results.equal.error(), results.learned.error()]
    left.bar(names, [100 * e for e in errs], color=["C0"] * len(MODELS) + ["C1", "C2"])
    left.set_ylabel("top-1 error (%)")
    left.set_title("single models vs the 5-model ensemble")
    left.tick_params(axis="x", rotation=30)
    labels, values, colours = [], [], []
    for bucket, threshold in THRESHOLDS.items():
        ce, cs, ue, us = results.equal.bucket(threshold)
        labels += [f"{bucket}\nconfident\n({pct(cs, 0)})", f"{bucket}\nunsure\n({pct(us, 0)})"]
        values += [100 * ce, 100 * ue]
        colours += ["C2", "C3"]
    right.bar(labels, values, color=colours)
    right.axhline(100 * results.equal.error(), color="grey", ls=":", label="whole ensemble")
    right.set_ylabel("top-1 error (%)")
    right.set_title("equal weights: confident answers vs the rest (share of queries)")
    right.legend(fontsize=8)
    fig.suptitle("Fig 7: ensembles and robust predictions (digits, 5 models)")
    print(f"plot: {save(fig, 'ensembles.png')}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="splits, pooled")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results = Results()
    for seed in range(args.seeds):
        run_seed(seed, results)
    n = len(results.equal.wrong)
    print(f"## Fig 7: 5-model ensembles on digits ({args.seeds} seeds, {n} test answers)\n")
    print(
        markdown_table(
            ["model", *MODELS],
            [["error", *(pct(float(np.mean(results.single_wrong[m])), 2) for m in MODELS)]],
        )
    )
    print()
    print(table(results))
    weights = {m: float(np.mean([w[m] for w in results.learned_weights])) for m in MODELS}
    print(
        "\nLearned weights (mean over seeds): "
        + ", ".join(f"{m} {w:.3f}" for m, w in weights.items())
    )
    print(check_agreement(results.equal))
    plot(results)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

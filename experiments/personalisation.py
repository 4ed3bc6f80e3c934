"""Fig 10 of the Clipper paper: one selection-policy state per user.

The paper's users are TIMIT speakers from dialect regions, with a speech model per dialect. Here
the users are writers from four groups, and each group writes its digits its own way: upright,
mirrored (left-right), upside down, or transposed (8x8 images of scikit-learn's digits). There
is one logistic-regression model per group, trained on 150 digits written the group's way, and a
general model trained on the same 150 digits written all four ways (600 images). A group model is
good on its own group and poor on the others; the general model is fair on every group.

200 users (50 per group) each send 10 labelled queries, one at a time. Each user has their own
policy state (``UserStates``) over the five models. Before each feedback example (after 0..10 of
them), the user's current state answers 20 held-out digits of that user (frozen state: not
learned from), and the error over all users is reported against the number of feedback examples,
for ``exp3`` and ``exp4`` (``eta`` 0.1, the default, and 1.0, which trusts each example more),
against the general model and the oracle (each user's own group model, as if the group were
known). 3 seeds, averaged. Writes ``experiments/results/personalisation.png``.

    python experiments/personalisation.py [--seeds 3] [--users 200]
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

from clipper.selection import UserStates, make_loss, make_policy

N_TRAIN = 150
FEEDBACK = 10
N_EVAL = 20  # held-out digits per user, answered at every checkpoint

GROUPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "upright": lambda im: im,
    "mirrored": lambda im: im[:, :, ::-1],
    "upside_down": lambda im: im[:, ::-1, :],
    "transposed": lambda im: im.transpose(0, 2, 1),
}
GENERAL = "general"
MODELS = [*GROUPS, GENERAL]

POLICIES: dict[str, tuple[str, dict[str, float]]] = {
    "exp3, eta 0.1": ("exp3", {"eta": 0.1}),
    "exp3, eta 1.0": ("exp3", {"eta": 1.0}),
    "exp4, eta 0.1": ("exp4", {"eta": 0.1}),
    "exp4, eta 1.0": ("exp4", {"eta": 1.0}),
}


def written(group: str, x: np.ndarray) -> np.ndarray:
    """Rows of 64 pixels, written the group's way (and scaled to [0, 1])."""
    return GROUPS[group](x.reshape(-1, 8, 8) / 16.0).reshape(-1, 64)


def _logreg() -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=3000)


@dataclass
class User:
    group: str
    feedback_labels: list[int]
    feedback_outputs: dict[str, list[int]]  # model -> output per feedback query
    eval_labels: list[int]
    eval_outputs: dict[str, list[int]]


def make_users(seed: int, n_users: int) -> list[User]:
    x, y = digits()
    train, pool = split(y, [N_TRAIN], seed)
    models: dict[str, Any] = {g: _logreg().fit(written(g, x[train]), y[train]) for g in GROUPS}
    everyone = np.vstack([written(g, x[train]) for g in GROUPS])
    models[GENERAL] = _logreg().fit(everyone, np.concatenate([y[train]] * len(GROUPS)))
    rng = np.random.default_rng(seed)
    groups = list(GROUPS)
    users = []
    for u in range(n_users):
        group = groups[u % len(groups)]
        idx = rng.choice(pool, size=FEEDBACK + N_EVAL, replace=False)
        images = written(group, x[idx])
        outputs = {m: as_labels(clf.predict(images)) for m, clf in models.items()}
        labels = as_labels(y[idx])
        users.append(
            User(
                group=group,
                feedback_labels=labels[:FEEDBACK],
                feedback_outputs={m: o[:FEEDBACK] for m, o in outputs.items()},
                eval_labels=labels[FEEDBACK:],
                eval_outputs={m: o[FEEDBACK:] for m, o in outputs.items()},
            )
        )
    return users


def static_error(users: Sequence[User], model: str | None = None) -> float:
    """Error of one model on the users' held-out digits (``None``: each user's group model)."""
    wrong = [
        o != label
        for user in users
        for o, label in zip(user.eval_outputs[model or user.group], user.eval_labels, strict=True)
    ]
    return float(np.mean(wrong))


def policy_errors(
    users: Sequence[User], kind: str, params: dict[str, float], seed: int
) -> list[float]:
    """Error after 0..FEEDBACK feedback examples per user (mean over users and eval digits)."""
    policy = make_policy(kind, MODELS, **params)
    states = UserStates(policy, capacity=1000)
    loss = make_loss("0/1")
    rng = random.Random(seed)
    wrong = np.zeros(FEEDBACK + 1)
    for uid, user in enumerate(users):
        for k in range(FEEDBACK + 1):
            state = states.get(str(uid))
            for t, label in enumerate(user.eval_labels):
                chosen = policy.select(state, rng)
                answer = policy.combine(state, {m: user.eval_outputs[m][t] for m in chosen})
                wrong[k] += answer.output != label
            if k < FEEDBACK:
                chosen = policy.select(state, rng)
                outputs = {m: user.feedback_outputs[m][k] for m in chosen}
                policy.observe(state, outputs, user.feedback_labels[k], loss)
    return list(wrong / (len(users) * N_EVAL))


def plot(curves: dict[str, list[float]], general: float, oracle: float) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks = list(range(FEEDBACK + 1))
    for name, errs in curves.items():
        ax.plot(ks, [100 * e for e in errs], marker="o", label=name)
    ax.axhline(100 * general, color="k", ls="--", label="general model")
    ax.axhline(100 * oracle, color="grey", ls=":", label="oracle: the user's group model")
    ax.set_xlabel("feedback examples from the user")
    ax.set_ylabel("error (%)")
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    ax.set_title("Fig 10: per-user model selection (digits written 4 ways)")
    print(f"plot: {save(fig, 'personalisation.png')}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="repetitions, averaged")
    p.add_argument("--users", type=int, default=200, help="users per seed (<= 1000)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    curves = {name: np.zeros(FEEDBACK + 1) for name in POLICIES}
    general = oracle = 0.0
    per_group = {g: np.zeros(len(MODELS)) for g in GROUPS}
    for seed in range(args.seeds):
        users = make_users(seed, args.users)
        general += static_error(users, GENERAL) / args.seeds
        oracle += static_error(users) / args.seeds
        for g in GROUPS:
            mine = [u for u in users if u.group == g]
            per_group[g] += np.array([static_error(mine, m) for m in MODELS])
        for name, (kind, params) in POLICIES.items():
            curves[name] += np.asarray(policy_errors(users, kind, params, seed)) / args.seeds
    n = args.users * args.seeds
    print(f"## Fig 10: personalised selection ({n} users, {args.seeds} seeds)\n")
    print("Each model's error on each group's users:\n")
    print(
        markdown_table(
            ["users \\ model", *MODELS],
            [[g, *(pct(e / args.seeds) for e in errs)] for g, errs in per_group.items()],
        )
    )
    print(f"\nGeneral model: {pct(general)}; oracle (each user's group model): {pct(oracle)}\n")
    rows = [[k, *(pct(float(curves[name][k])) for name in POLICIES)] for k in range(FEEDBACK + 1)]
    print(markdown_table(["feedback examples", *POLICIES], rows))
    plot({k: list(v) for k, v in curves.items()}, general, oracle)
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

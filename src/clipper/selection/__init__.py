"""Model selection: which linked models answer a query, how their outputs combine, and how
feedback teaches the choice (Clipper's selection layer).

Build a policy with :func:`make_policy`, keep its :data:`State` per user with
:class:`UserStates`, score feedback with a loss from :func:`make_loss`.
"""

from __future__ import annotations

from clipper.selection.ab_split import ABSplit
from clipper.selection.bandits import UCB1, EpsilonGreedy, Exp3, Thompson
from clipper.selection.base import POLICIES, Combined, Loss, SelectionPolicy, State, make_policy
from clipper.selection.exp4 import Exp4
from clipper.selection.losses import LOSSES, make_loss
from clipper.selection.single import SingleModel
from clipper.selection.states import SHARED, UserStates

__all__ = [
    "LOSSES",
    "POLICIES",
    "SHARED",
    "UCB1",
    "ABSplit",
    "Combined",
    "EpsilonGreedy",
    "Exp3",
    "Exp4",
    "Loss",
    "SelectionPolicy",
    "SingleModel",
    "State",
    "Thompson",
    "UserStates",
    "make_loss",
    "make_policy",
]

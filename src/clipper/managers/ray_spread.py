"""Which Ray node each replica of a version runs on: the ray:// manager's placement planner.

Pure (no Ray, no clock): :func:`plan_spread` takes the cluster's nodes as the manager last saw
them (alive or not, total and free resources), what one replica reserves, and where the
version's replicas are (slot -> node; None for a slot that needs one: new, or lost with its
node), and says

* a node for each slot that needs one, or why it waits unplaced;
* at most one replica to move (``rebalance``): from the node holding the most of the version's
  replicas to the one holding the fewest, when they differ by two or more, or when a node holds
  more than the hard limit.

The per-node limit is ``max_per_node`` when given (hard: never more on one node; with too few
nodes the extra replicas wait), else a soft spread: ceil(replicas / usable nodes), which always
leaves room for every replica (only resources can make one wait). A usable node is alive and
has, in total, what one replica reserves (and is the pinned node, when the version has one).
A node is chosen among the usable ones under the limit with the reservation free now: the one
holding fewest of the version's replicas, then the one with the most free of what is reserved,
then by id (so the plan is the same for the same input).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Move", "NodeState", "SpreadPlan", "demand_text", "fits", "per_node_cap", "plan_spread"]

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class NodeState:
    """A Ray node as the manager saw it: ``total`` and ``free`` resources by name."""

    node_id: str
    alive: bool
    total: Mapping[str, float]
    free: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Move:
    """Start a replacement of ``slot`` on ``target``, then retire the one on ``source``."""

    slot: int
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class SpreadPlan:
    cap: int  # the per-node limit this plan kept to
    placed: Mapping[int, str]  # slot -> node, for the slots that needed one
    waiting: Mapping[int, str]  # slot -> why it has no node
    move: Move | None = None


def fits(resources: Mapping[str, float], demand: Mapping[str, float]) -> bool:
    """Whether ``resources`` hold ``demand`` (a name absent counts as 0)."""
    return all(resources.get(k, 0.0) + _EPS >= v for k, v in demand.items() if v > 0)


def demand_text(demand: Mapping[str, float]) -> str:
    """``CPU=1, GPU=0.5`` (``nothing`` for a replica that reserves nothing)."""
    return ", ".join(f"{k}={v:g}" for k, v in sorted(demand.items()) if v > 0) or "nothing"


def per_node_cap(replicas: int, usable_nodes: int, max_per_node: int | None) -> int:
    """The hard limit when given, else the soft spread: ceil(replicas / usable nodes)."""
    if max_per_node is not None:
        return max_per_node
    return max(1, math.ceil(replicas / max(usable_nodes, 1)))


def plan_spread(
    nodes: Sequence[NodeState],
    demand: Mapping[str, float],
    current: Mapping[int, str | None],
    *,
    max_per_node: int | None = None,
    pinned: str | None = None,
    rebalance: bool = False,
) -> SpreadPlan:
    """See the module docstring. ``current`` holds every slot of the version: its node, or None
    when it needs one; a slot on a node not alive or not known (an adopted actor not yet seen)
    counts on no node and is left where it is (the caller passes a lost one as None)."""
    alive = {n.node_id: n for n in nodes if n.alive}
    usable = [
        n
        for n in alive.values()
        if fits(n.total, demand) and (pinned is None or n.node_id == pinned)
    ]
    cap = per_node_cap(len(current), len(usable), max_per_node)
    counts = {n.node_id: 0 for n in alive.values()}
    for node in current.values():
        if node in counts:
            counts[node] += 1
    free = {n.node_id: dict(n.free) for n in usable}
    # The scarcest thing reserved (GPU before CPU, ...) breaks ties between equal counts.
    key_resource = max(demand, key=lambda k: demand[k], default="")

    def receivers() -> list[NodeState]:
        return sorted(
            (n for n in usable if counts[n.node_id] < cap and fits(free[n.node_id], demand)),
            key=lambda n: (counts[n.node_id], -free[n.node_id].get(key_resource, 0.0), n.node_id),
        )

    placed: dict[int, str] = {}
    waiting: dict[int, str] = {}
    for slot in sorted(s for s, node in current.items() if node is None):
        choice = receivers()
        if not choice:
            waiting[slot] = _why_waiting(usable, counts, cap, demand, pinned=pinned,
                                         hard=max_per_node is not None)  # fmt: skip
            continue
        node_id = choice[0].node_id
        placed[slot] = node_id
        counts[node_id] += 1
        for k, v in demand.items():
            free[node_id][k] = free[node_id].get(k, 0.0) - v
    move = None
    if rebalance and not placed and not waiting:
        move = _one_move(current, counts, cap, receivers())
    return SpreadPlan(cap=cap, placed=placed, waiting=waiting, move=move)


def _one_move(
    current: Mapping[int, str | None],
    counts: Mapping[str, int],
    cap: int,
    receivers: list[NodeState],
) -> Move | None:
    for source, held in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if held == 0:
            return None
        for target in receivers:
            if target.node_id == source:
                continue
            if held > cap or held - counts[target.node_id] >= 2:
                slot = max(s for s, node in current.items() if node == source)
                return Move(slot=slot, source=source, target=target.node_id)
            break  # the emptiest receiver is not empty enough: neither is any other
    return None


def _why_waiting(
    usable: list[NodeState],
    counts: Mapping[str, int],
    cap: int,
    demand: Mapping[str, float],
    *,
    pinned: str | None,
    hard: bool,
) -> str:
    asks = demand_text(demand)
    if not usable:
        if pinned is not None:
            return f"its node {pinned} is not alive, or has not {asks} in all"
        return f"no alive node has {asks} in all"
    if hard and all(counts[n.node_id] >= cap for n in usable):
        return (
            f"each of the {len(usable)} alive node(s) that can run it already holds "
            f"max_per_node={cap} of this version's replicas"
        )
    return f"no node under the per-node limit of {cap} has {asks} free now"

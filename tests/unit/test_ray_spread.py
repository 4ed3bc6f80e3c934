"""The ray:// manager's placement planner (clipper.managers.ray_spread), without Ray: nodes as
plain records, replicas as slot -> node."""

from __future__ import annotations

from clipper.managers.ray_actors import actor_name, parse_slot
from clipper.managers.ray_spread import Move, NodeState, demand_text, per_node_cap, plan_spread

CPU = {"CPU": 1.0}


def node(node_id: str, *, alive: bool = True, cpus: float = 4, free: float | None = None,
         gpus: float = 0) -> NodeState:  # fmt: skip
    total = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
    avail = {"CPU": cpus if free is None else free, **({"GPU": gpus} if gpus else {})}
    return NodeState(node_id, alive, total, avail)


def test_new_replicas_spread_one_per_node_with_a_hard_limit_of_one() -> None:
    plan = plan_spread([node("a"), node("b"), node("c")], CPU, {0: None, 1: None},
                       max_per_node=1)  # fmt: skip
    assert plan.cap == 1 and plan.waiting == {}
    assert len(set(plan.placed.values())) == 2 and set(plan.placed) == {0, 1}


def test_a_lost_replica_goes_to_the_node_that_holds_none_never_beside_the_other() -> None:
    # Slot 1's node died (the caller passes it as None): a, holding slot 0, is full up.
    nodes = [node("a"), node("b", alive=False), node("c")]
    plan = plan_spread(nodes, CPU, {0: "a", 1: None}, max_per_node=1)
    assert plan.placed == {1: "c"}


def test_with_too_few_nodes_the_hard_limit_leaves_replicas_waiting_and_says_why() -> None:
    nodes = [node("a"), node("b", alive=False), node("c", alive=False)]
    plan = plan_spread(nodes, CPU, {0: "a", 1: None}, max_per_node=1)
    assert plan.placed == {}
    assert plan.waiting == {
        1: "each of the 1 alive node(s) that can run it already holds max_per_node=1 of this "
        "version's replicas"
    }


def test_the_soft_spread_doubles_up_only_when_the_nodes_are_too_few() -> None:
    assert per_node_cap(2, 1, None) == 2 and per_node_cap(2, 3, None) == 1
    assert per_node_cap(5, 2, None) == 3 and per_node_cap(5, 2, 1) == 1
    # One node alive: both replicas on it (soft), none waits.
    plan = plan_spread([node("a"), node("b", alive=False)], CPU, {0: "a", 1: None})
    assert plan.placed == {1: "a"} and plan.cap == 2
    # Three alive: one each.
    plan = plan_spread([node("a"), node("b"), node("c")], CPU, {0: None, 1: None, 2: None})
    assert sorted(plan.placed.values()) == ["a", "b", "c"]


def test_a_node_without_the_free_resources_is_passed_over_and_none_free_waits() -> None:
    nodes = [node("a", cpus=1, free=0), node("b", cpus=1, free=1)]
    assert plan_spread(nodes, CPU, {0: None}).placed == {0: "b"}
    full = [node("a", cpus=1, free=0), node("b", cpus=1, free=0)]
    plan = plan_spread(full, CPU, {0: None})
    assert plan.waiting == {0: "no node under the per-node limit of 1 has CPU=1 free now"}
    # What one placement takes is counted before the next: b has room for one only.
    plan = plan_spread([node("a", cpus=1, free=0), node("b", cpus=2, free=1)], CPU,
                       {0: None, 1: None})  # fmt: skip
    assert plan.placed == {0: "b"} and set(plan.waiting) == {1}


def test_only_nodes_that_have_the_resources_at_all_count_toward_the_spread() -> None:
    # Two GPU replicas, one GPU node: the soft limit is 2 there, not ceil(2 / 3).
    gpu = {"GPU": 0.5}
    nodes = [node("a"), node("g", gpus=1), node("c")]
    plan = plan_spread(nodes, gpu, {0: None, 1: None})
    assert plan.placed == {0: "g", 1: "g"} and plan.cap == 2
    assert plan_spread([node("a")], gpu, {0: None}).waiting == {
        0: "no alive node has GPU=0.5 in all"
    }


def test_a_pinned_version_goes_to_its_node_or_waits_for_it() -> None:
    nodes = [node("a"), node("b")]
    assert plan_spread(nodes, CPU, {0: None, 1: None}, pinned="b").placed == {0: "b", 1: "b"}
    plan = plan_spread([node("a"), node("b", alive=False)], CPU, {0: None}, pinned="b")
    assert plan.waiting == {0: "its node b is not alive, or has not CPU=1 in all"}


def test_ties_go_to_the_node_with_the_most_free_then_by_id() -> None:
    nodes = [node("a", free=1), node("b", free=3), node("c", free=3)]
    assert plan_spread(nodes, CPU, {0: None}).placed == {0: "b"}


def test_a_node_back_gets_one_replica_moved_to_it_and_no_more() -> None:
    # Both on a (the other node died earlier); b came back.
    nodes = [node("a"), node("b")]
    plan = plan_spread(nodes, CPU, {0: "a", 1: "a"}, rebalance=True)
    assert plan.move == Move(slot=1, source="a", target="b")
    # Balanced: nothing to move; and nothing without rebalance.
    assert plan_spread(nodes, CPU, {0: "a", 1: "b"}, rebalance=True).move is None
    assert plan_spread(nodes, CPU, {0: "a", 1: "a"}).move is None
    # Uneven by one is as even as it gets.
    three = [node("a"), node("b")]
    assert plan_spread(three, CPU, {0: "a", 1: "a", 2: "b"}, rebalance=True).move is None


def test_a_move_needs_room_on_the_target_and_waits_for_placements() -> None:
    nodes = [node("a"), node("b", cpus=1, free=0)]
    assert plan_spread(nodes, CPU, {0: "a", 1: "a"}, rebalance=True).move is None
    # A slot still to place comes first: no move in the same plan.
    plan = plan_spread([node("a"), node("b")], CPU, {0: "a", 1: "a", 2: None}, rebalance=True)
    assert plan.placed == {2: "b"} and plan.move is None


def test_more_than_the_hard_limit_on_a_node_is_moved_even_when_nearly_even() -> None:
    # Adopted actors placed before the limit: 2 on a, 1 on b, the limit 1, c empty.
    nodes = [node("a"), node("b"), node("c")]
    plan = plan_spread(nodes, CPU, {0: "a", 1: "a", 2: "b"}, max_per_node=1, rebalance=True)
    assert plan.move == Move(slot=1, source="a", target="c")
    # Four replicas over 3 nodes as (2, 2, 0): one moves to the empty node.
    plan = plan_spread(nodes, CPU, {0: "a", 1: "a", 2: "b", 3: "b"}, rebalance=True)
    assert plan.move == Move(slot=1, source="a", target="c")


def test_replicas_on_unknown_nodes_stay_and_count_nowhere() -> None:
    # An adopted actor whose node the poll has not seen yet ("") is not placed again.
    plan = plan_spread([node("a"), node("b")], CPU, {0: "", 1: None}, max_per_node=1)
    assert plan.placed == {1: "a"}


def test_demand_text_and_actor_names_with_generations() -> None:
    assert demand_text({"CPU": 1.0, "GPU": 0.5, "accel": 0}) == "CPU=1, GPU=0.5"
    assert demand_text({}) == "nothing"
    assert actor_name("clipper/n/m/1/", 2, 0) == "clipper/n/m/1/2"
    assert actor_name("clipper/n/m/1/", 2, 3) == "clipper/n/m/1/2.3"
    assert parse_slot("2") == (2, 0) and parse_slot("2.3") == (2, 3)
    assert parse_slot("x") is None and parse_slot("2.") is None and parse_slot("2.a") is None

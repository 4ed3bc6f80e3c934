"""The pool arithmetic (clipper.container.pool_budget): LRU eviction within a budget, a model
over the whole budget, and which pool process a model is placed on."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipper.container.pool_budget import (
    MemberLoad,
    ModelTooBig,
    PoolBudget,
    artifact_bytes,
    place,
)
from clipper.errors import ReplicaError

MB = 2**20


def test_nothing_is_evicted_while_the_model_fits() -> None:
    b = PoolBudget(10 * MB)
    b.add("a", 4 * MB, now=1.0)
    assert b.evictions(6 * MB) == []
    assert b.free_bytes == 6 * MB and b.used_bytes == 4 * MB


def test_evicts_least_recently_used_first_until_it_fits() -> None:
    b = PoolBudget(10 * MB)
    b.add("a", 3 * MB, now=1.0)
    b.add("b", 3 * MB, now=2.0)
    b.add("c", 3 * MB, now=3.0)
    b.used("a", 4.0)  # a predicted last: b is now the least recently used
    assert b.evictions(2 * MB) == ["b"]
    assert b.evictions(5 * MB) == ["b", "c"]
    assert b.evictions(10 * MB) == ["b", "c", "a"]


def test_a_use_never_moves_a_model_back_in_time() -> None:
    b = PoolBudget(4 * MB)
    b.add("a", 2 * MB, now=5.0)
    b.add("b", 2 * MB, now=6.0)
    b.used("a", 1.0)  # an older timestamp (a batch that started earlier) changes nothing
    assert b.evictions(2 * MB) == ["a"]


def test_the_model_being_loaded_is_never_its_own_victim() -> None:
    b = PoolBudget(10 * MB)
    b.add("a", 4 * MB, now=1.0)
    b.add("new", 6 * MB, now=0.5)  # oldest, but it is the one being loaded
    assert b.evictions(7 * MB, keep="new") == ["a"]


def test_a_model_over_the_whole_budget_is_refused() -> None:
    b = PoolBudget(10 * MB)
    b.add("a", 1 * MB, now=1.0)
    with pytest.raises(ModelTooBig, match=r"needs 11\.0 MB .* whole memory budget is 10\.0 MB"):
        b.evictions(11 * MB)
    assert issubclass(ModelTooBig, ReplicaError)
    assert b.tokens() == ["a"]  # nothing evicted for a model that can never fit


def test_remove_returns_the_size() -> None:
    b = PoolBudget(10 * MB)
    b.add("a", 3 * MB, now=1.0)
    assert b.size("a") == 3 * MB and "a" in b and len(b) == 1
    assert b.remove("a") == 3 * MB and b.remove("a") == 0 and "a" not in b


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        PoolBudget(0)


def test_placement_prefers_the_holder_then_the_most_free_then_the_fewest_models() -> None:
    members = [
        MemberLoad(0, True, free_bytes=5 * MB, models=3),
        MemberLoad(1, True, free_bytes=8 * MB, models=4),
        MemberLoad(2, True, free_bytes=8 * MB, models=2),
    ]
    assert place(members, holder=0) == 0
    assert place(members) == 2  # most free, fewest models among equals
    assert place(members[:2]) == 1


def test_placement_skips_members_that_are_down() -> None:
    members = [MemberLoad(0, False, 9 * MB, 0), MemberLoad(1, True, 1 * MB, 7)]
    assert place(members, holder=0) == 1  # its holder died: the model is placed anew
    assert place([MemberLoad(0, False, 9 * MB, 0)]) is None


def test_artifact_bytes_sums_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"1" * 100)
    (tmp_path / "d" / "sub").mkdir()
    (tmp_path / "d" / "sub" / "y").write_bytes(b"2" * 50)
    (tmp_path / "f").write_bytes(b"3" * 7)
    assert artifact_bytes(str(tmp_path / "d")) == 150
    assert artifact_bytes(str(tmp_path / "f")) == 7

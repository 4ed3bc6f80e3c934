"""The record of recent draws that bandit feedback looks up."""

from __future__ import annotations

import pytest

from clipper.errors import ConfigError
from clipper.selection.draws import Draw, Draws


def test_a_draw_is_found_by_user_and_input_once() -> None:
    d = Draws(capacity=10)
    d.record("alice", b"[1.0]", Draw("a", 0.25))
    d.record("", b"[1.0]", Draw("b", None))
    assert d.take("bob", b"[1.0]") is None
    assert d.take("alice", b"[2.0]") is None
    assert d.take("alice", b"[1.0]") == Draw("a", 0.25)
    assert d.take("alice", b"[1.0]") is None  # one feedback per query
    assert d.take("", b"[1.0]") == Draw("b", None)
    assert len(d) == 0


def test_a_later_draw_of_the_same_input_replaces_the_earlier() -> None:
    d = Draws(capacity=10)
    d.record("u", b"x", Draw("a", 0.5))
    d.record("u", b"x", Draw("c", 0.1))
    assert len(d) == 1
    assert d.take("u", b"x") == Draw("c", 0.1)


def test_the_least_recently_drawn_are_evicted_at_capacity() -> None:
    d = Draws(capacity=2)
    d.record("u", b"1", Draw("a", None))
    d.record("u", b"2", Draw("a", None))
    d.record("u", b"1", Draw("b", None))  # drawn again: now the most recent
    d.record("u", b"3", Draw("a", None))
    assert len(d) == 2
    assert d.take("u", b"2") is None
    assert d.take("u", b"1") == Draw("b", None)
    assert d.take("u", b"3") == Draw("a", None)


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_capacity_must_be_a_positive_integer(capacity: object) -> None:
    with pytest.raises(ConfigError, match="capacity"):
        Draws(capacity=capacity)  # type: ignore[arg-type]

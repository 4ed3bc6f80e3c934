"""A frontend's node id: configured, else kept in its state directory (written once), and read
only at start — so a restarted frontend finds the same id and its unfinished intents."""

from __future__ import annotations

from pathlib import Path

import pytest

from clipper.errors import ConfigError
from clipper.runtime.node import NODE_ID_FILE, NodeIdentity


def test_the_first_start_writes_an_id_that_the_next_start_reads(tmp_path: Path) -> None:
    first = NodeIdentity(tmp_path)
    assert first.value == ""  # nothing is read before start
    assert not (tmp_path / NODE_ID_FILE).exists()
    node = first.resolve()
    assert len(node) == 16 and first() == node
    assert (tmp_path / NODE_ID_FILE).read_text() == node + "\n"
    again = NodeIdentity(tmp_path)
    assert again.resolve() == node
    assert again.resolve() == node  # resolving twice reads nothing new


def test_a_configured_id_wins_and_is_known_before_start(tmp_path: Path) -> None:
    (tmp_path / NODE_ID_FILE).write_text("kept\n")
    ident = NodeIdentity(tmp_path, "fe-0")
    assert ident.value == "fe-0"
    assert ident.resolve() == "fe-0"
    assert NodeIdentity.fixed("n1").resolve() == "n1"


def test_an_identity_with_nowhere_to_keep_it_must_be_configured() -> None:
    with pytest.raises(ConfigError, match="must be configured"):
        NodeIdentity(None).resolve()

"""This frontend's identity in the store: the node id that owns its version-change intents and
the autoscaling it drives.

Configured (``--node-id``), or kept in the state directory so that a restarted frontend
recognises the version changes it left unfinished. It is read (and, the first time, written)
only at start, once the frontend holds its state directory's lock: before then two frontends
racing on one fresh directory could each write one. Everything that needs it holds this object
and reads :attr:`NodeIdentity.value` when it acts.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from clipper.errors import ConfigError

__all__ = ["NODE_ID_FILE", "NodeIdentity"]

NODE_ID_FILE = "node-id"


class NodeIdentity:
    __slots__ = ("_configured", "_path", "_value")

    def __init__(self, state_dir: Path | None, configured: str | None = None) -> None:
        self._path = state_dir / NODE_ID_FILE if state_dir is not None else None
        self._configured = configured or None
        self._value = self._configured or ""

    @classmethod
    def fixed(cls, node_id: str) -> NodeIdentity:
        """An identity known up front (tests, embedders with their own naming)."""
        return cls(None, node_id)

    @property
    def value(self) -> str:
        """The node id; empty before :meth:`resolve` unless it was configured."""
        return self._value

    def __call__(self) -> str:
        return self._value

    def resolve(self) -> str:
        """The configured id, else the one in the state directory, else a new one written
        there. Call it holding the state directory's lock."""
        if self._value:
            return self._value
        if self._path is None:
            raise ConfigError("a node identity without a state directory must be configured")
        try:
            existing = self._path.read_text().strip()
        except OSError:
            existing = ""
        if not existing:
            existing = secrets.token_hex(8)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.write_text(existing + "\n")
        self._value = existing
        return existing

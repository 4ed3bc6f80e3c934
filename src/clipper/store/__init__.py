"""The persistent config store: JSON records of apps, models, current versions and links.

``open_store(url)`` picks the backend: ``memory://`` (tests), ``sqlite:///path`` (default; the
frontend processes of one machine share and watch it) or ``redis://host:port/db`` (frontends
on several machines that share and watch state).
"""

from clipper.store.base import (
    CONFIG_KINDS,
    KINDS,
    RUNTIME_KINDS,
    Delete,
    DeletePrefix,
    Kind,
    Lease,
    Op,
    Put,
    Snapshot,
    Store,
    StoreError,
    StoreEvent,
    Watcher,
)
from clipper.store.memory import MemoryStore
from clipper.store.open import open_store
from clipper.store.sqlite import SqliteStore

__all__ = [
    "CONFIG_KINDS",
    "KINDS",
    "RUNTIME_KINDS",
    "Delete",
    "DeletePrefix",
    "Kind",
    "Lease",
    "MemoryStore",
    "Op",
    "Put",
    "Snapshot",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreEvent",
    "Watcher",
    "open_store",
]

"""The config store interface: JSON records in a few kinds, persisted and watched.

The store is what survives a frontend restart: applications, model versions, each model's
current version, each application's links, the version changes under way (intents) and each
model's traffic split and shadow (rollouts), and the tenants with their quotas and hashed API
keys (clipper.tenants), as the registry holds them. A change is written as
one atomic :meth:`Store.commit` of several operations, and the frontend answers an admin call
only after that commit returned.

Values are plain JSON (dicts, lists, strings, numbers, booleans, null); the registry's own
types are mapped to and from JSON by the caller, so a backend never sees a Python object it
cannot write.

Besides the configuration, the store holds what frontends sharing it coordinate with at run
time: a **lease** (:meth:`Store.claim`: one holder at a time, taken over when it expires; the
deployment's replica owner), **presence** (:meth:`Store.announce` / :meth:`Store.live`: entries
that vanish unless renewed; each frontend's RPC address) and **runtime records** (kind
``replica``: which replicas the owner started, for the next owner to adopt). None of these is
configuration: ``load()`` never returns them, so ``clipper export`` never shows them.

Every method is async because the frontend is one event loop that nothing may block: the SQLite
backend runs its calls on its own worker thread, the Redis backend is natively async.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from clipper.errors import ConfigError, StoreError

__all__ = [
    "CONFIG_KINDS",
    "KINDS",
    "RUNTIME_KINDS",
    "STATE_PAGE",
    "Delete",
    "DeletePrefix",
    "Kind",
    "Lease",
    "Op",
    "Put",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreEvent",
    "Watcher",
    "bad_url",
    "decode_value",
    "empty_snapshot",
    "encode_value",
    "redact_url",
    "split_redis_url",
    "sqlite_path",
]

Kind = Literal[
    "app", "model", "current", "links", "intent", "rollout", "tenant", "state", "replica"
]
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)
# What load() returns: the configuration. "state" (selection-policy state per application and
# user) can hold millions of keys: it is read one key at a time with get().
CONFIG_KINDS: Final[tuple[Kind, ...]] = (
    "app",
    "model",
    "current",
    "links",
    "intent",
    "rollout",
    "tenant",
)
# Written at run time, not configuration: never in load() (nor in an export), never sent to
# watchers; read whole with Store.records() (a few entries: one per replica slot).
RUNTIME_KINDS: Final[tuple[Kind, ...]] = ("replica",)

# How many users one page of Store.state_users lists: a page is what one awaited step holds.
STATE_PAGE: Final = 1000

# kind -> key -> value; all four kinds are always present, possibly empty.
Snapshot = dict[str, dict[str, Any]]

ACCEPTED_URLS: Final = (
    "'memory://', 'sqlite:///path/to/clipper.db', 'sqlite:///path/to/state-dir' "
    "(-> state-dir/clipper.db), 'redis://host:port/db' (optionally '?prefix=name') or 'rediss://'"
)
SQLITE_FILENAME: Final = "clipper.db"
# A path with one of these suffixes names the database file itself; anything else is a directory.
_SQLITE_SUFFIXES: Final = (".db", ".sqlite", ".sqlite3")


@dataclass(frozen=True, slots=True)
class Put:
    kind: Kind
    key: str
    value: Any


@dataclass(frozen=True, slots=True)
class Delete:
    kind: Kind
    key: str


@dataclass(frozen=True, slots=True)
class DeletePrefix:
    """Every key of ``kind`` that starts with ``prefix`` (an application's selection states)."""

    kind: Kind
    prefix: str


Op = Put | Delete | DeletePrefix


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """A change written by another store instance; ``value`` is None when the key was deleted.

    The operations of one commit arrive as consecutive events, the last with ``last=True``, so a
    watcher can apply a commit whole (an application and its links together)."""

    kind: Kind
    key: str
    value: Any | None
    last: bool = True


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a lease after a :meth:`Store.claim`, and for how much longer (seconds, as the
    store's own clock counts them: the redis server's, this machine's wall clock, the memory
    store's injected clock)."""

    holder: str
    expires_in_s: float


Watcher = Callable[[StoreEvent], None]
Resync = Callable[[], None]


def check_ops(ops: Sequence[Op]) -> list[tuple[Op, bytes | None]]:
    """Each operation with its JSON text (None for deletions), checked before anything is
    written: a bad operation fails the whole commit."""
    out: list[tuple[Op, bytes | None]] = []
    for op in ops:
        if isinstance(op, Put):
            out.append((op, encode_value(op.kind, op.key, op.value)))
        elif isinstance(op, Delete):
            check_kind(op.kind)
            out.append((op, None))
        elif isinstance(op, DeletePrefix):
            check_kind(op.kind)
            if not op.prefix:
                raise StoreError("a prefix deletion needs a non-empty prefix")
            out.append((op, None))
        else:
            raise StoreError(f"not a store operation: {op!r}")
    return out


class Store(Protocol):
    """What every backend provides. Use: ``await open()``, ``load()`` once, then ``commit`` (or
    ``put``/``delete``) for each change, and ``watch()`` for the changes others make;
    ``await close()`` at the end.

    ``commit(ops)`` is atomic and durable when it returns: all of ``ops`` are stored (SQLite:
    committed and synced to its write-ahead log; Redis: executed in one MULTI/EXEC with its
    event) or, when it raises :class:`StoreError`, none is.

    ``watch(callback)`` calls ``callback(event)`` on the event loop for changes written by *other*
    store instances (never for this instance's own writes): other frontends on one Redis, or
    other processes on one SQLite file (``clipper start --workers N``, whose change log each
    store polls); the memory backend has no others and never calls it.
    ``on_resync(callback)`` is called when events may have been missed (a reconnect, a gap in
    the store's revision): the watcher should ``load()`` again and apply the difference.

    ``state_users(app)`` lists the users whose selection states of ``app`` are stored (the
    ``uid`` of each ``app:uid`` key; the shared state ``app:`` is not listed), in pages of at
    most ``batch``, least recently written first where the backend keeps that order (memory,
    SQLite); Redis lists them in its scan order, and may list a user twice. Keys written or
    deleted while the listing runs may or may not be listed.

    ``claim(name, holder, ttl_s)`` is atomic: when the lease ``name`` is free or expired,
    ``holder`` takes it for ``ttl_s``; when ``holder`` holds it, it is renewed for ``ttl_s``;
    otherwise nothing changes. It returns who holds it now. ``release(name, holder)`` frees it
    if ``holder`` holds it (True), else changes nothing (False).

    ``announce(group, key, value, ttl_s)`` publishes ``value`` under ``key`` for ``ttl_s``
    (renewed by announcing again); ``live(group)`` is every unexpired entry of ``group``;
    ``withdraw(group, key)`` removes one at once.

    ``records(kind)`` is every record of a runtime kind (:data:`RUNTIME_KINDS`), which are
    written with ``put``/``delete``/``commit`` like the others.
    """

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def load(self) -> Snapshot: ...

    async def commit(self, ops: Sequence[Op]) -> None: ...

    async def put(self, kind: Kind, key: str, value: Any) -> None: ...

    async def delete(self, kind: Kind, key: str) -> None: ...

    async def get(self, kind: Kind, key: str) -> Any | None: ...

    def state_users(self, app: str, batch: int = STATE_PAGE) -> AsyncIterator[list[str]]: ...

    def watch(self, callback: Watcher) -> None: ...

    def on_resync(self, callback: Resync) -> None: ...

    async def claim(self, name: str, holder: str, ttl_s: float) -> Lease: ...

    async def release(self, name: str, holder: str) -> bool: ...

    async def announce(self, group: str, key: str, value: Any, ttl_s: float) -> None: ...

    async def withdraw(self, group: str, key: str) -> None: ...

    async def live(self, group: str) -> dict[str, Any]: ...

    async def records(self, kind: Kind) -> dict[str, Any]: ...


def check_runtime_kind(kind: str) -> Kind:
    if kind not in RUNTIME_KINDS:
        raise StoreError(
            f"records() reads runtime kinds only ({', '.join(RUNTIME_KINDS)}), not {kind!r}"
        )
    return check_kind(kind)


def check_lease(name: str, holder: str, ttl_s: float | None = None) -> None:
    """Leases and presence entries need names, and a lifetime a clock can count."""
    if not isinstance(name, str) or not name or not isinstance(holder, str) or not holder:
        raise StoreError(
            f"a lease or presence entry needs a non-empty name and holder/key, got "
            f"{name!r}, {holder!r}"
        )
    if ttl_s is not None and not (0 < ttl_s < 86_400 * 365):
        raise StoreError(f"a lease or presence lifetime must be > 0 seconds, got {ttl_s!r}")


def empty_snapshot() -> Snapshot:
    return {kind: {} for kind in CONFIG_KINDS}


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise StoreError(f"unknown store kind {kind!r}: use one of {', '.join(KINDS)}")
    return kind


def encode_value(kind: str, key: str, value: Any) -> bytes:
    """The JSON text of ``value``, made at call time so later mutation by the caller is not seen."""
    check_kind(kind)
    if not isinstance(key, str) or not key:
        raise StoreError(f"store keys are non-empty strings, got {key!r} for kind {kind!r}")
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        raise StoreError(f"cannot store {kind} {key!r}: value is not JSON ({exc})") from None


def decode_value(kind: str, key: str, text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"stored {kind} {key!r} is not valid JSON ({exc})") from None


def redact_url(url: str) -> str:
    """``url`` with any password replaced, fit for error messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # IPv6
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def bad_url(problem: str) -> ConfigError:
    """A store URL is not accepted: ``problem``, and the forms that are."""
    return ConfigError(f"{problem}; accepted forms: {ACCEPTED_URLS}")


def sqlite_path(rest: str) -> str:
    """The database file for the part of a ``sqlite://`` URL after the scheme.

    ``sqlite:///abs/file.db`` is ``/abs/file.db``. A path that is an existing directory, ends in
    '/', or has none of the suffixes .db/.sqlite/.sqlite3 (and is not an existing file) is a state
    directory and the file is ``<dir>/clipper.db``.
    """
    if not rest:
        raise bad_url("sqlite store URL has no path")
    path = os.path.expanduser(rest)
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        return os.path.join(path, SQLITE_FILENAME)
    if os.path.isfile(path) or path.lower().endswith(_SQLITE_SUFFIXES):
        return path
    return os.path.join(path, SQLITE_FILENAME)


def split_redis_url(url: str) -> tuple[str, str]:
    """(URL for redis-py, key prefix): our ``prefix`` query option is not redis-py's to see."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise bad_url(f"redis store URL {redact_url(url)!r} has no host")
    try:
        _ = parts.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        raise bad_url(f"redis store URL {redact_url(url)!r} has a bad port") from None
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise bad_url(
            f"redis store URL {redact_url(url)!r}: the path must be a database number, got {db!r}"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in query if name == "prefix"]
    prefix = prefixes[-1] if prefixes else "clipper"
    if not prefix:
        raise bad_url(f"redis store URL {redact_url(url)!r}: prefix must not be empty")
    rest = urlencode([(name, value) for name, value in query if name != "prefix"])
    return urlunsplit(parts._replace(query=rest)), prefix

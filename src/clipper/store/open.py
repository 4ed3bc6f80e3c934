"""Opening a config store by URL: the factory that knows every backend.

:func:`open_store` looks the URL's scheme up in the STORES table of :mod:`clipper.choices`,
whose entries name the builders here. It lives apart from :mod:`clipper.store.base` because
the backends import that module.
"""

from __future__ import annotations

from collections.abc import Callable

from clipper.choices import STORES
from clipper.clock import Clock
from clipper.store.base import Store, bad_url, redact_url, split_redis_url, sqlite_path
from clipper.store.memory import MemoryStore
from clipper.store.redis import RedisStore
from clipper.store.sqlite import SqliteStore

__all__ = ["open_memory", "open_redis", "open_sqlite", "open_store"]


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """The store named by ``url`` (not yet opened: ``await store.open()``); a backend with
    timers (redis: its revision poller, its reconnect back-off) waits on ``clock``.

    Accepted (the STORES table in ``clipper.choices``): ``memory://``;
    ``sqlite:///path/to/clipper.db`` or ``sqlite:///state-dir``; ``redis://host:port/db`` or
    ``rediss://...`` (TLS), with ``?prefix=name`` to share one redis between deployments
    (default prefix ``clipper``). Anything else is a :class:`ConfigError`.
    """
    if not isinstance(url, str):
        raise bad_url(f"store URL must be a string, got {type(url).__name__}")
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme not in STORES:
        raise bad_url(f"unknown store URL {redact_url(url)!r}")
    build: Callable[[str, Clock | None], Store] = STORES.load(scheme)
    return build(url, clock)


def open_memory(url: str, clock: Clock | None = None) -> Store:
    if url.partition("://")[2]:
        raise bad_url(f"memory store URL takes nothing after 'memory://', got {url!r}")
    return MemoryStore(clock=clock)


def open_sqlite(url: str, clock: Clock | None = None) -> Store:
    return SqliteStore(sqlite_path(url.partition("://")[2]), clock=clock)


def open_redis(url: str, clock: Clock | None = None) -> Store:
    redis_url, prefix = split_redis_url(url)
    return RedisStore(redis_url, prefix=prefix, clock=clock)

"""A store in Redis, shared by several frontends that hear each other's changes.

Layout, with ``P`` the key prefix (default ``clipper``, so deployments can share one redis):

* one hash per kind: ``P:app``, ``P:model``, ``P:current``, ``P:links``; field = key, value = JSON;
* one pub/sub channel ``P:events``; every write publishes
  ``{"origin": <writer's random id>, "db": <db number>, "kind", "key", "value"}`` (value null =
  deleted) in the same MULTI/EXEC transaction as the write, so a change and its event go together.

Each store subscribes in :meth:`RedisStore.open` (before the caller's first ``load()``, so no change
falls between the snapshot and the events) and runs one listener task that it owns; events of its
own origin are skipped. Pub/sub is not durable: events published while a frontend is disconnected
are lost to it, and it should ``load()`` again after a reconnect to catch up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import orjson

from clipper.errors import ConfigError
from clipper.store.base import (
    CONFIG_KINDS,
    KINDS,
    Kind,
    Snapshot,
    StoreError,
    StoreEvent,
    Watcher,
    check_kind,
    decode_value,
    empty_snapshot,
    encode_value,
    redact_url,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.client import PubSub

__all__ = ["RedisStore"]

log = logging.getLogger(__name__)

_INSTALL_HINT: Final = "the redis store needs: pip install 'clipper-serve[redis]'"
_CONNECT_TIMEOUT_S: Final = 5.0
_RECONNECT_MAX_S: Final = 5.0


class RedisStore:
    def __init__(self, url: str, *, prefix: str = "clipper") -> None:
        try:
            # Imported here so that redis stays an optional extra.
            import redis.asyncio
            import redis.asyncio.retry
            import redis.backoff
            import redis.exceptions
        except ImportError:
            raise ConfigError(_INSTALL_HINT) from None
        if not prefix:
            raise ConfigError("redis store prefix must not be empty")
        self.url = url
        self.prefix = prefix
        self.channel = f"{prefix}:events"
        # Random per instance: lets the listener drop the events of this instance's own writes.
        self.origin = secrets.token_hex(8)
        self._redis = redis
        self._errors_caught: tuple[type[BaseException], ...] = (
            redis.exceptions.RedisError,
            OSError,
        )
        self._client: Redis | None = None
        self._pubsub: PubSub | None = None
        self._listener: asyncio.Task[None] | None = None
        self._db = 0
        self._watchers: list[Watcher] = []

    def __repr__(self) -> str:
        return f"RedisStore({redact_url(self.url)!r}, prefix={self.prefix!r})"

    def _hash(self, kind: str) -> str:
        return f"{self.prefix}:{kind}"

    @contextlib.contextmanager
    def _failing(self, action: str) -> Iterator[None]:
        try:
            yield
        except self._errors_caught as exc:
            raise StoreError(
                f"redis store {redact_url(self.url)}: {action} failed: {exc or type(exc).__name__}"
            ) from exc

    def _live(self) -> Redis:
        if self._client is None:
            raise StoreError(
                f"redis store {redact_url(self.url)} is not open: call 'await store.open()'"
            )
        return self._client

    async def open(self) -> None:
        if self._client is not None:
            return
        aioredis = self._redis.asyncio
        # A few quick retries, not redis-py's default back-off of seconds: an unreachable server
        # at startup should be reported promptly.
        retry = aioredis.retry.Retry(self._redis.backoff.ExponentialBackoff(cap=0.5, base=0.05), 3)
        try:
            client = aioredis.Redis.from_url(
                self.url,
                decode_responses=True,
                socket_connect_timeout=_CONNECT_TIMEOUT_S,
                retry=retry,
            )
        except ValueError as exc:
            raise ConfigError(f"bad redis store URL {redact_url(self.url)!r}: {exc}") from None
        pubsub = client.pubsub()
        try:
            with self._failing("connect"):
                await client.ping()
                await pubsub.subscribe(self.channel)
                await self._await_subscribed(pubsub)
        except BaseException:
            await _close_quietly(pubsub, client)
            raise
        self._db = int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
        self._client = client
        self._pubsub = pubsub
        self._listener = asyncio.create_task(self._listen(pubsub), name=f"{self!r} listener")

    async def _await_subscribed(self, pubsub: PubSub) -> None:
        # The server registers the subscription only when it answers; events published before
        # that would be missed, so open() returns only after the confirmation.
        async with asyncio.timeout(_CONNECT_TIMEOUT_S):
            while True:
                msg = await pubsub.get_message(timeout=_CONNECT_TIMEOUT_S)
                if msg is not None and msg.get("type") == "subscribe":
                    return

    async def close(self) -> None:
        task, self._listener = self._listener, None
        if task is not None:
            task.cancel()
            # wait() rather than awaiting the task: a cancel of close() itself still propagates.
            await asyncio.wait([task])
        pubsub, self._pubsub = self._pubsub, None
        client, self._client = self._client, None
        await _close_quietly(pubsub, client)

    async def load(self) -> Snapshot:
        client = self._live()
        with self._failing("load"):
            # One transaction: a consistent snapshot across the four hashes.
            async with client.pipeline(transaction=True) as pipe:
                for kind in CONFIG_KINDS:
                    pipe.hgetall(self._hash(kind))
                results = await pipe.execute()
        snapshot = empty_snapshot()
        for kind, fields in zip(CONFIG_KINDS, results, strict=True):
            snapshot[kind] = {key: decode_value(kind, key, text) for key, text in fields.items()}
        return snapshot

    async def put(self, kind: Kind, key: str, value: Any) -> None:
        text = encode_value(kind, key, value)
        await self._write(kind, key, text, value)

    async def delete(self, kind: Kind, key: str) -> None:
        check_kind(kind)
        await self._write(kind, key, None, None)

    async def get(self, kind: Kind, key: str) -> Any | None:
        check_kind(kind)
        client = self._live()
        with self._failing("get"):
            text = await client.hget(self._hash(kind), key)
        return None if text is None else decode_value(kind, key, text)

    async def _write(self, kind: Kind, key: str, text: bytes | None, value: Any) -> None:
        client = self._live()
        event = orjson.dumps(
            {"origin": self.origin, "db": self._db, "kind": kind, "key": key, "value": value}
        )
        with self._failing(f"{'put' if text is not None else 'delete'} {kind} {key!r}"):
            async with client.pipeline(transaction=True) as pipe:
                if text is None:
                    pipe.hdel(self._hash(kind), key)
                else:
                    pipe.hset(self._hash(kind), key, text)
                pipe.publish(self.channel, event)
                await pipe.execute()

    def watch(self, callback: Watcher) -> None:
        self._watchers.append(callback)

    async def _listen(self, pubsub: PubSub) -> None:
        delay = 0.05
        while True:
            try:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            except self._errors_caught as exc:
                # redis-py reconnects and resubscribes on the next read; back off meanwhile.
                log.warning("redis store %s: event listener: %s", redact_url(self.url), exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_MAX_S)
                continue
            delay = 0.05
            if msg is not None and msg.get("type") == "message":
                self._dispatch(msg.get("data"))

    def _dispatch(self, data: Any) -> None:
        try:
            doc = orjson.loads(data)
            origin, db, kind, key = doc["origin"], doc["db"], doc["kind"], doc["key"]
            value = doc["value"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            log.warning("redis store %s: ignoring malformed event %r", self.channel, data)
            return
        # Channels are server-wide, not per db: events of another db are another deployment's.
        if origin == self.origin or db != self._db or kind not in KINDS or not isinstance(key, str):
            return
        event = StoreEvent(kind, key, value)
        for callback in list(self._watchers):
            try:
                callback(event)
            except Exception:
                # One failing watcher must not stop the others or the listener.
                log.exception("redis store watcher %r failed on %r", callback, event)


async def _close_quietly(pubsub: PubSub | None, client: Redis | None) -> None:
    # Closing must not fail on a server that is already gone.
    for resource in (pubsub, client):
        if resource is None:
            continue
        closer = getattr(resource, "aclose", None) or resource.close  # aclose: redis>=5.0.1
        with contextlib.suppress(Exception):
            await closer()

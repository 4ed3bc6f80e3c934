"""A store in Redis, shared by several frontends that hear each other's changes.

Layout, with ``P`` the key prefix (default ``clipper``, so deployments can share one redis):

* one hash per kind: ``P:app``, ``P:model``, ``P:current``, ``P:links``, ``P:intent``,
  ``P:rollout``, ``P:tenant``, ``P:state``; field = key, value = JSON;
* ``P:rev``, a counter incremented by every commit: the store's revision;
* one pub/sub channel ``P:events``; every commit publishes
  ``{"origin": <writer's random id>, "db": <db number>, "rev": <its revision>, "ops": [{"kind",
  "key", "value"}, ...]}`` (value null = deleted) in the same MULTI/EXEC transaction as its writes,
  so a change and its event go together.

Each store subscribes in :meth:`RedisStore.open` (before the caller's first ``load()``, so no change
falls between the snapshot and the events) and runs two tasks that it owns: the event listener
(events of its own origin are skipped) and a revision poller. Pub/sub is not durable: events
published while a frontend is disconnected are lost to it. So the store remembers which revisions
it has seen (its own commits, events, the last ``load()``); when the server's revision stays ahead
of them for a poll interval, or the event connection broke, it calls the ``on_resync`` callbacks,
whose owner loads the snapshot again and applies the difference. An event older than what this
store already holds for a key (it raced a later commit) is dropped, so a late event never reverts
a newer value.

Leases are keys ``P:lease:<name>`` holding the holder's id with an expiry the server counts
(``SET ... PX`` inside a script that also renews when the caller holds it): frontends on
different machines agree because none of their clocks is asked. Presence is a sorted set
``P:live:<group>`` (member = key, score = the server time in ms it expires) with the values in
the hash ``P:live:<group>:values``; a script stamps and reads them by the server's ``TIME``.
Runtime records (kind ``replica``) are a hash like the others; their commits carry events that
watchers never get (they are not configuration).

Selection states keep no write order in Redis (a hash has none, and a second structure per write
would double what they cost): :meth:`RedisStore.state_users` lists an application's users with
HSCAN (a bounded step per call, never KEYS or HGETALL), in the server's scan order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from clipper.clock import Clock, MonotonicClock, sleep, wait_for
from clipper.errors import ConfigError
from clipper.store.base import (
    CONFIG_KINDS,
    STATE_PAGE,
    Delete,
    DeletePrefix,
    Kind,
    Lease,
    Op,
    Put,
    Resync,
    Snapshot,
    StoreError,
    StoreEvent,
    Watcher,
    check_kind,
    check_lease,
    check_ops,
    check_runtime_kind,
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
# How often the revision is compared with what this store has seen; a gap that outlives one
# interval (no event in flight explains it) means a missed event and a resync.
_POLL_S: Final = 1.0
# Deletes the fields of a hash whose names start with ARGV[1]: a prefix deletion inside the
# commit's MULTI/EXEC (HSCAN cannot run there).
_DELETE_PREFIX_LUA: Final = """
local n = 0
local len = string.len(ARGV[1])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, len) == ARGV[1] then
    redis.call('HDEL', KEYS[1], field)
    n = n + 1
  end
end
return n
"""

# Takes the lease KEYS[1] for ARGV[1] (ARGV[2] ms) when it is free, renews it when ARGV[1]
# holds it; returns {holder, ms left}. One script: no other claim falls between the read and
# the write.
_CLAIM_LUA: Final = """
local cur = redis.call('GET', KEYS[1])
if (not cur) or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {ARGV[1], tonumber(ARGV[2])}
end
return {cur, redis.call('PTTL', KEYS[1])}
"""
_RELEASE_LUA: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# Presence by the server's clock: KEYS[1] the expiry set, KEYS[2] the values.
_NOW_MS_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
_ANNOUNCE_LUA: Final = (
    _NOW_MS_LUA
    + """
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""
)
_LIVE_LUA: Final = (
    _NOW_MS_LUA
    + """
for _, k in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('HDEL', KEYS[2], k)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local out = {}
for _, k in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  table.insert(out, k)
  table.insert(out, redis.call('HGET', KEYS[2], k) or '')
end
return out
"""
)


class RedisStore:
    def __init__(self, url: str, *, prefix: str = "clipper", clock: Clock | None = None) -> None:
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
        self.clock: Clock = clock or MonotonicClock()
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
        self._poller: asyncio.Task[None] | None = None
        self._db = 0
        self._watchers: list[Watcher] = []
        self._resyncs: list[Resync] = []
        # Revisions: everything up to _rev_base is reflected locally; _revs_seen holds the
        # later ones seen out of order; _key_rev the revision of each key's last applied write.
        self._rev_base = 0
        self._revs_seen: set[int] = set()
        self._key_rev: dict[tuple[str, str], int] = {}
        self._gap_since_poll = False
        self._events_broken = False

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
        self._poller = asyncio.create_task(self._poll(), name=f"{self!r} revision poller")

    async def _await_subscribed(self, pubsub: PubSub) -> None:
        # The server registers the subscription only when it answers; events published before
        # that would be missed, so open() returns only after the confirmation.
        async def confirmed() -> None:
            while True:
                msg = await pubsub.get_message(timeout=_CONNECT_TIMEOUT_S)
                if msg is not None and msg.get("type") == "subscribe":
                    return

        await wait_for(self.clock, confirmed(), _CONNECT_TIMEOUT_S)

    async def close(self) -> None:
        tasks = [t for t in (self._listener, self._poller) if t is not None]
        self._listener = self._poller = None
        for task in tasks:
            task.cancel()
        if tasks:
            # wait() rather than awaiting the tasks: a cancel of close() itself still propagates.
            await asyncio.wait(tasks)
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
                pipe.get(self._rev_key)
                results = await pipe.execute()
        snapshot = empty_snapshot()
        for kind, fields in zip(CONFIG_KINDS, results[:-1], strict=True):
            snapshot[kind] = {key: decode_value(kind, key, text) for key, text in fields.items()}
        # The snapshot holds everything up to its revision: older events are stale from now on.
        self._rev_base = int(results[-1] or 0)
        self._revs_seen = {r for r in self._revs_seen if r > self._rev_base}
        self._key_rev = {k: r for k, r in self._key_rev.items() if r > self._rev_base}
        self._gap_since_poll = False
        return snapshot

    @property
    def _rev_key(self) -> str:
        return f"{self.prefix}:rev"

    def _seen(self, rev: int) -> None:
        if rev <= self._rev_base:
            return
        self._revs_seen.add(rev)
        while self._rev_base + 1 in self._revs_seen:
            self._rev_base += 1
            self._revs_seen.discard(self._rev_base)

    async def put(self, kind: Kind, key: str, value: Any) -> None:
        await self.commit([Put(kind, key, value)])

    async def delete(self, kind: Kind, key: str) -> None:
        check_kind(kind)
        await self.commit([Delete(kind, key)])

    async def commit(self, ops: Sequence[Op]) -> None:
        checked = check_ops(ops)
        if not checked:
            return
        client = self._live()
        docs: list[dict[str, Any]] = []
        for op, _ in checked:
            if isinstance(op, DeletePrefix):
                docs.append({"kind": op.kind, "prefix": op.prefix})
            else:
                docs.append({"kind": op.kind, "key": op.key, "value": getattr(op, "value", None)})
        what = ", ".join(f"{d['kind']} {d.get('key', d.get('prefix'))!r}" for d in docs[:3])
        with self._failing(f"commit of {what}{' ...' if len(docs) > 3 else ''}"):
            async with client.pipeline(transaction=True) as pipe:
                for op, text in checked:
                    if isinstance(op, Put):
                        assert text is not None
                        pipe.hset(self._hash(op.kind), op.key, text)
                    elif isinstance(op, DeletePrefix):
                        pipe.eval(_DELETE_PREFIX_LUA, 1, self._hash(op.kind), op.prefix)
                    else:
                        pipe.hdel(self._hash(op.kind), op.key)
                pipe.incr(self._rev_key)
                # The event carries the revision the INCR will return: the script computes it
                # inside the transaction, so it is exact even with concurrent writers.
                pipe.eval(
                    "return redis.call('PUBLISH', KEYS[1], string.format(ARGV[1], "
                    "redis.call('GET', KEYS[2])))",
                    2,
                    self.channel,
                    self._rev_key,
                    orjson.dumps({"origin": self.origin, "db": self._db, "rev": 0, "ops": docs})
                    .decode()
                    .replace("%", "%%")
                    .replace('"rev":0', '"rev":%s', 1),
                )
                results = await pipe.execute()
        rev = int(results[-2])
        for op, _ in checked:
            # Selection states are never watched (and may be millions): not tracked.
            if not isinstance(op, DeletePrefix) and op.kind in CONFIG_KINDS:
                self._key_rev[(op.kind, op.key)] = rev
        self._seen(rev)

    async def get(self, kind: Kind, key: str) -> Any | None:
        check_kind(kind)
        client = self._live()
        with self._failing("get"):
            text = await client.hget(self._hash(kind), key)
        return None if text is None else decode_value(kind, key, text)

    async def state_users(self, app: str, batch: int = STATE_PAGE) -> AsyncIterator[list[str]]:
        client = self._live()
        prefix = f"{app}:"
        match = "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + "*"
        batch = max(1, batch)
        cursor = 0
        while True:
            with self._failing(f"listing the stored states of {app!r}"):
                cursor, fields = await client.hscan(
                    self._hash("state"), cursor, match=match, count=batch
                )
            # decode_responses: the fields are str; the shared state is not a user's.
            uids = [str(key)[len(prefix) :] for key in fields if str(key) != prefix]
            # A small hash answers whole whatever the count: cut it to pages.
            for start in range(0, len(uids), batch):
                yield uids[start : start + batch]
            if cursor == 0:
                return

    def watch(self, callback: Watcher) -> None:
        self._watchers.append(callback)

    def on_resync(self, callback: Resync) -> None:
        self._resyncs.append(callback)

    async def claim(self, name: str, holder: str, ttl_s: float) -> Lease:
        check_lease(name, holder, ttl_s)
        ms = max(1, round(ttl_s * 1000))
        with self._failing(f"claim of lease {name!r}"):
            found = await self._live().eval(
                _CLAIM_LUA, 1, f"{self.prefix}:lease:{name}", holder, str(ms)
            )
        who, left = found
        return Lease(str(who), max(0.0, int(left) / 1000))

    async def release(self, name: str, holder: str) -> bool:
        check_lease(name, holder)
        with self._failing(f"release of lease {name!r}"):
            done = await self._live().eval(_RELEASE_LUA, 1, f"{self.prefix}:lease:{name}", holder)
        return bool(done)

    def _presence(self, group: str) -> tuple[str, str]:
        return f"{self.prefix}:live:{group}", f"{self.prefix}:live:{group}:values"

    async def announce(self, group: str, key: str, value: Any, ttl_s: float) -> None:
        check_lease(group, key, ttl_s)
        text = encode_value("replica", key, value).decode()
        ms = max(1, round(ttl_s * 1000))
        with self._failing(f"announce of {group} {key!r}"):
            await self._live().eval(_ANNOUNCE_LUA, 2, *self._presence(group), key, text, str(ms))

    async def withdraw(self, group: str, key: str) -> None:
        expiry, values = self._presence(group)
        with self._failing(f"withdrawal of {group} {key!r}"):
            async with self._live().pipeline(transaction=True) as pipe:
                pipe.zrem(expiry, key)
                pipe.hdel(values, key)
                await pipe.execute()

    async def live(self, group: str) -> dict[str, Any]:
        with self._failing(f"reading the live {group}"):
            flat = await self._live().eval(_LIVE_LUA, 2, *self._presence(group))
        out: dict[str, Any] = {}
        for key, text in zip(flat[::2], flat[1::2], strict=True):
            if text:  # an entry whose value went missing is not live
                out[str(key)] = decode_value(group, str(key), text)
        return out

    async def records(self, kind: Kind) -> dict[str, Any]:
        check_runtime_kind(kind)
        with self._failing(f"reading the {kind} records"):
            fields = await self._live().hgetall(self._hash(kind))
        return {str(key): decode_value(kind, str(key), text) for key, text in fields.items()}

    def _resync(self, why: str) -> None:
        log.info("redis store %s: reloading (%s)", redact_url(self.url), why)
        for callback in list(self._resyncs):
            try:
                callback()
            except Exception:
                log.exception("redis store resync callback %r failed", callback)

    async def _listen(self, pubsub: PubSub) -> None:
        delay = 0.05
        while True:
            try:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            except self._errors_caught as exc:
                # redis-py reconnects and resubscribes on the next read; back off meanwhile.
                # Whatever was published meanwhile is lost to us: the poller resyncs.
                self._events_broken = True
                log.warning("redis store %s: event listener: %s", redact_url(self.url), exc)
                await sleep(self.clock, delay)
                delay = min(delay * 2, _RECONNECT_MAX_S)
                continue
            delay = 0.05
            if msg is not None and msg.get("type") == "message":
                self._dispatch(msg.get("data"))

    async def _poll(self) -> None:
        failing = False
        while True:
            await sleep(self.clock, _POLL_S)
            try:
                rev = int(await self._live().get(self._rev_key) or 0)
            except self._errors_caught as exc:
                if not failing:
                    log.warning("redis store %s: unreachable: %s", redact_url(self.url), exc)
                failing = True
                continue
            if failing or self._events_broken:
                # Back after an outage: what changed meanwhile came as no event to us.
                failing = self._events_broken = False
                self._resync("the connection to redis was lost and is back")
            elif rev > self._rev_base:
                if self._gap_since_poll:
                    self._resync(f"revision {rev} is ahead of the {self._rev_base} seen")
                self._gap_since_poll = True
            else:
                self._gap_since_poll = False

    def _dispatch(self, data: Any) -> None:
        try:
            doc = orjson.loads(data)
            origin, db, rev, ops = doc["origin"], doc["db"], int(doc["rev"]), doc["ops"]
            events = [
                StoreEvent(op["kind"], op["key"], op["value"])
                for op in ops
                if "key" in op and op["kind"] in CONFIG_KINDS and isinstance(op["key"], str)
            ]
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError):
            log.warning("redis store %s: ignoring malformed event %r", self.channel, data)
            return
        # Channels are server-wide, not per db: events of another db are another deployment's.
        if origin == self.origin or db != self._db:
            return
        # Drop what a later commit (ours, or a snapshot's) already superseded.
        fresh = [e for e in events if self._key_rev.get((e.kind, e.key), self._rev_base) < rev]
        for e in events:
            self._key_rev[(e.kind, e.key)] = max(rev, self._key_rev.get((e.kind, e.key), 0))
        self._seen(rev)
        for i, e in enumerate(fresh):
            event = StoreEvent(e.kind, e.key, e.value, last=i == len(fresh) - 1)
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

"""Tenants: who is asking, how much they may ask, and how much their queries matter.

A **tenant** is an operator-created name (a team, a customer) with a default
:class:`PriorityClass`, rate :class:`Quota` s (a token bucket each: ``rate`` queries a second
refilling up to ``burst``, for one application or across all of them) and API keys. A key is
``ck_`` followed by 32 random URL-safe bytes, shown once when it is created; only its SHA-256 is
kept (:class:`ApiKey`), in the config store with its tenant, so every frontend of a deployment
knows the same keys and none can give one back.

:class:`TenantGate` judges a request before anything is queued: the key (``Authorization:
Bearer ck_…`` or ``X-Api-Key``) names the tenant; a request over one of the tenant's quotas is
refused with 429 (:class:`QuotaExceeded`, with ``Retry-After`` and the IETF ``RateLimit-Policy``
and ``RateLimit`` header fields) before it takes a queue slot, so a tenant over its quota never
delays another tenant's queries. The admitted request carries its class: the key's (or the
tenant's), lowered per request with ``X-Priority`` (never raised).

The class is what admission sheds by under overload (:mod:`clipper.batching.scheduler`):
sheddable first, then standard, while critical queries keep their deadline. A frontend with no
tenants, and every request without a key to an application that does not require one, is
standard: the behaviour without tenants.
"""

from __future__ import annotations

import enum
import hashlib
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from clipper.clock import Clock
from clipper.errors import RegistryError, RequestError
from clipper.metrics import Metrics

__all__ = [
    "ALL_APPS",
    "KEY_PREFIX",
    "Admitted",
    "ApiKey",
    "BadTenantHeader",
    "KeyRequired",
    "PriorityClass",
    "PriorityForbidden",
    "Quota",
    "QuotaExceeded",
    "Tenant",
    "TenantGate",
    "TenantRefused",
    "TokenBucket",
    "UnknownKey",
    "hash_key",
    "new_key",
    "quotas_from_doc",
    "quotas_to_doc",
    "request_key",
]

KEY_PREFIX: Final = "ck_"
# The key of a quota across every application in the admin API and desired-state files.
ALL_APPS: Final = "*"
# How many tenants and keys a deployment may hold: every one is a record in the store and a
# label value in /metrics, so both stay bounded.
MAX_TENANTS: Final = 1000
MAX_KEYS_PER_TENANT: Final = 100
MAX_QUOTAS_PER_TENANT: Final = 100


class PriorityClass(enum.IntEnum):
    """Lower value, higher priority: the queue serves critical first (the rank of a task)."""

    CRITICAL = 0
    STANDARD = 1
    SHEDDABLE = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: object) -> PriorityClass:
        if isinstance(text, str):
            try:
                return cls[text.strip().upper()]
            except KeyError:
                pass
        raise RegistryError(f"priority must be one of critical, standard, sheddable; got {text!r}")


class TenantRefused(RequestError):
    """A request the tenant gate refuses; ``headers`` (:class:`RequestError`'s) are the extra
    response header lines its answer carries."""


class KeyRequired(TenantRefused):
    """An application that requires an API key, queried without one (401)."""

    status = 401
    error = "Unauthorized"
    headers = b'WWW-Authenticate: Bearer realm="clipper"\r\n'


class UnknownKey(TenantRefused):
    """A key no tenant holds (401)."""

    status = 401
    error = "Unauthorized"
    headers = b'WWW-Authenticate: Bearer realm="clipper", error="invalid_token"\r\n'


class PriorityForbidden(TenantRefused):
    """``X-Priority`` above the key's class (403)."""

    status = 403
    error = "Forbidden"


class BadTenantHeader(TenantRefused):
    """A key or priority header that is not one (400)."""

    status = 400
    error = "Bad request"


class QuotaExceeded(TenantRefused):
    """Over a quota (429): ``Retry-After`` and the RateLimit header fields say when to come back."""

    status = 429
    error = "Too many requests"

    def __init__(self, cause: str, *, retry_after_s: int, policy: str, burst: int, window_s: int):
        super().__init__(cause)
        self.retry_after_s = retry_after_s
        self.headers = (
            b'Retry-After: %d\r\nRateLimit-Policy: "%s";q=%d;w=%d\r\n'
            b'RateLimit: "%s";r=0;t=%d\r\n'
            % (retry_after_s, policy.encode(), burst, window_s, policy.encode(), retry_after_s)
        )


def new_key() -> tuple[str, str]:
    """A fresh key and its digest: the key goes to the operator once, the digest to the store."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    return key, hash_key(key.encode())


def hash_key(key: bytes) -> str:
    """What is stored of a key: its SHA-256, hex. A key is 256 random bits, so a plain hash is
    as hard to reverse as the key is to guess (no salt or slow hash is needed, and a lookup
    is one dictionary get)."""
    return hashlib.sha256(key).hexdigest()


@dataclass(frozen=True, slots=True)
class Quota:
    """``rate`` queries a second, up to ``burst`` at once; for ``app`` only, or across every
    application when ``app`` is None (each request counts one, whatever its batch)."""

    rate: float
    burst: int
    app: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int | float):
            raise RegistryError(
                f"quota rate must be a number of queries a second, got {self.rate!r}"
            )
        if not 0 < self.rate <= 1e9:
            raise RegistryError(f"quota rate must be in (0, 1e9] queries a second, got {self.rate}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise RegistryError(f"quota burst must be an integer >= 1, got {self.burst!r}")
        if self.app is not None and not isinstance(self.app, str):
            raise RegistryError(f"quota app must be an application name or null, got {self.app!r}")

    @property
    def policy(self) -> str:
        """The quota's name in the RateLimit header fields."""
        return "all" if self.app is None else f"app.{self.app}"

    @property
    def window_s(self) -> int:
        """Seconds an empty bucket takes to fill: the policy's window."""
        return max(1, math.ceil(self.burst / self.rate))

    def to_record(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst, "app": self.app}

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> Quota:
        if not isinstance(r, Mapping):
            raise RegistryError(f"a quota is an object {{rate, burst, app}}, got {r!r}")
        unknown = sorted(set(r) - {"rate", "burst", "app"})
        if unknown:
            raise RegistryError(f"unknown quota keys {unknown}; a quota has rate, burst, app")
        if "rate" not in r or "burst" not in r:
            raise RegistryError("a quota needs rate (queries a second) and burst")
        return cls(rate=r["rate"], burst=r["burst"], app=r.get("app"))


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as stored: its digest, an id to name it by (the digest's first 12 hex digits),
    its own class when it has one (else the tenant's), and when it was created (Unix time)."""

    digest: str
    priority: PriorityClass | None = None
    created: float = 0.0

    @property
    def key_id(self) -> str:
        return self.digest[:12]

    def to_record(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "priority": None if self.priority is None else self.priority.label,
            "created": self.created,
        }

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> ApiKey:
        digest = r.get("digest")
        if not isinstance(digest, str) or len(digest) != 64:
            raise RegistryError(f"a key record needs its sha256 digest (64 hex digits): {r!r}")
        p = r.get("priority")
        return cls(
            digest, None if p is None else PriorityClass.parse(p), float(r.get("created", 0))
        )


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    priority: PriorityClass = PriorityClass.STANDARD
    quotas: tuple[Quota, ...] = ()
    keys: tuple[ApiKey, ...] = ()

    def __post_init__(self) -> None:
        if len(self.quotas) > MAX_QUOTAS_PER_TENANT:
            raise RegistryError(f"a tenant has at most {MAX_QUOTAS_PER_TENANT} quotas")
        scopes = [q.app for q in self.quotas]
        if len(set(scopes)) != len(scopes):
            raise RegistryError(
                f"tenant {self.name!r}: one quota per application and one across all, got {scopes}"
            )
        if len(self.keys) > MAX_KEYS_PER_TENANT:
            raise RegistryError(
                f"tenant {self.name!r} has {MAX_KEYS_PER_TENANT} keys, the most one may hold"
            )

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "priority": self.priority.label,
            "quotas": [q.to_record() for q in self.quotas],
            "keys": [k.to_record() for k in self.keys],
        }

    @classmethod
    def from_record(cls, r: Mapping[str, Any]) -> Tenant:
        return cls(
            name=str(r["name"]),
            priority=PriorityClass.parse(r.get("priority", "standard")),
            quotas=tuple(Quota.from_record(q) for q in r.get("quotas", [])),
            keys=tuple(ApiKey.from_record(k) for k in r.get("keys", [])),
        )

    def describe(self) -> dict[str, Any]:
        """The tenant as the admin API shows it (quotas as it takes them): key ids, never
        digests."""
        return {
            "name": self.name,
            "priority": self.priority.label,
            "quotas": quotas_to_doc(self.quotas),
            "keys": [
                {"key_id": k.key_id, "priority": None if k.priority is None else k.priority.label,
                 "created": k.created}
                for k in self.keys
            ],
        }  # fmt: skip


def quotas_from_doc(doc: object) -> tuple[Quota, ...]:
    """``{"*" | app: {"rate", "burst"}}`` as quotas (a RegistryError names what is wrong)."""
    if not isinstance(doc, Mapping):
        raise RegistryError(
            'quotas must be an object {"*" | application: {"rate": number, "burst": int}}'
        )
    out = []
    for scope, q in doc.items():
        if not isinstance(q, Mapping):
            raise RegistryError(f"quota {scope!r} must be an object {{rate, burst}}, got {q!r}")
        out.append(Quota.from_record({**q, "app": None if scope == ALL_APPS else scope}))
    return tuple(out)


def quotas_to_doc(quotas: tuple[Quota, ...]) -> dict[str, Any]:
    return {
        ALL_APPS if q.app is None else q.app: {"rate": q.rate, "burst": q.burst} for q in quotas
    }


class TokenBucket:
    """``rate`` tokens a second up to ``burst``, on the injected clock; starts full."""

    __slots__ = ("burst", "clock", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = float(burst)
        self.stamp = clock.now()

    def refill(self) -> float:
        """The tokens there are now."""
        now = self.clock.now()
        if now > self.stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return self.tokens

    def take(self, n: float = 1.0) -> bool:
        if self.refill() >= n:
            self.tokens -= n
            return True
        return False

    def wait_s(self, n: float = 1.0) -> float:
        """How long until ``n`` tokens are there (0.0: now)."""
        return max(0.0, (n - self.refill()) / self.rate)


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request past the gate: its tenant ("" for an anonymous request that lowered its
    class) and its class."""

    tenant: str
    priority: PriorityClass


_Limit = tuple[Quota, TokenBucket]


@dataclass(slots=True)
class _Entry:
    tenant: Tenant
    key: ApiKey
    # The quotas (and their buckets) this key's requests draw from: across all applications,
    # and per application.
    overall: _Limit | None
    per_app: dict[str, _Limit] = field(default_factory=dict)


_NAMES = {c.label.encode(): c for c in PriorityClass}


class TenantGate:
    """Judges each request's key, quota and class. ``tenants`` is the registry's live mapping:
    :meth:`changed` marks it changed, and the key index is rebuilt at the next request (a
    snapshot of a thousand tenants costs one rebuild, not one per tenant). Buckets whose
    quota did not change keep their tokens."""

    def __init__(
        self, tenants: Mapping[str, Tenant], clock: Clock, metrics: Metrics | None = None
    ) -> None:
        self.tenants = tenants
        self.clock = clock
        self.metrics = metrics
        self._by_digest: dict[str, _Entry] = {}
        # (tenant, app or "") -> bucket: kept across a rebuild while its quota is the same.
        self._buckets: dict[tuple[str, str], tuple[Quota, TokenBucket]] = {}
        self._stale = True
        # (tenant, class) -> its answer and its admitted counter: made once, not per request.
        self._admitted: dict[tuple[str, PriorityClass], tuple[Admitted, Any]] = {}

    def changed(self) -> None:
        self._stale = True

    def judge(self, headers: Mapping[bytes, bytes], app: str, require_key: bool) -> Admitted | None:
        """:meth:`admit` with what a request's headers say (``authorization``, ``x-api-key``,
        ``x-priority``; lower-case names, as the HTTP layer and gRPC metadata give them)."""
        auth = headers.get(b"authorization")
        api_key = headers.get(b"x-api-key")
        priority = headers.get(b"x-priority")
        if auth is None and api_key is None and priority is None and not require_key:
            return None  # the common anonymous query: three lookups
        if not self.tenants and not require_key:
            # A deployment without tenants reads no keys: an Authorization header meant for
            # something in front of it changes nothing, as before tenants existed.
            return None if priority is None else Admitted("", _parse_priority(priority))
        return self.admit(request_key(auth, api_key), app, require_key, priority)

    def shed(self, admitted: Admitted, n: int) -> None:
        """``n`` inputs of an admitted request were shed (default output or 503)."""
        if self.metrics is not None and admitted.tenant:
            self.metrics.tenant_shed.labels(admitted.tenant, admitted.priority.label).inc(n)

    def rebuild(self, tenants: Mapping[str, Tenant]) -> None:
        buckets: dict[tuple[str, str], _Limit] = {}
        for t in tenants.values():
            for q in t.quotas:
                scope = (t.name, q.app or "")
                old = self._buckets.get(scope)
                buckets[scope] = (
                    old if old is not None and old[0] == q
                    else (q, TokenBucket(q.rate, q.burst, self.clock))
                )  # fmt: skip
        by_digest: dict[str, _Entry] = {}
        for t in tenants.values():
            overall = buckets.get((t.name, ""))
            per_app = {q.app: buckets[(t.name, q.app)] for q in t.quotas if q.app is not None}
            for k in t.keys:
                by_digest[k.digest] = _Entry(t, k, overall, per_app)
        self._buckets = buckets
        self._by_digest = by_digest
        self._admitted = {}
        self._stale = False
        if self.metrics is not None:
            self.metrics.forget_tenants(set(tenants))

    def admit(
        self, key: bytes | None, app: str, require_key: bool, priority: bytes | None
    ) -> Admitted | None:
        """The tenant and class of a request for ``app``, or None for an anonymous standard
        request (no key, and ``app`` does not require one). Raises a :class:`TenantRefused`."""
        if key is None:
            if require_key:
                raise KeyRequired(
                    f"application '{app}' requires an API key: send 'Authorization: Bearer "
                    "ck_...' or 'X-Api-Key: ck_...' (keys come from the admin API's create_key)"
                )
            if priority is None:
                return None
            return Admitted("", _parse_priority(priority))  # anonymous, and lowered
        if self._stale:
            self.rebuild(self.tenants)
        entry = self._by_digest.get(hash_key(key))
        if entry is None:
            raise UnknownKey("the API key is not one this deployment knows (revoked, or mistyped)")
        tenant = entry.tenant
        cls = entry.key.priority if entry.key.priority is not None else tenant.priority
        if priority is not None:
            wanted = _parse_priority(priority)
            if wanted < cls:
                raise PriorityForbidden(
                    f"X-Priority: {wanted.label} is above this key's class ({cls.label}): a "
                    "request may only lower its class"
                )
            cls = wanted
        limits = [lim for lim in (entry.overall, entry.per_app.get(app)) if lim is not None]
        for quota, bucket in limits:
            if bucket.refill() < 1.0:
                self._refuse(tenant.name, quota, bucket, app)
        for _, bucket in limits:
            bucket.tokens -= 1.0
        known = self._admitted.get((tenant.name, cls))
        if known is None:
            m = self.metrics
            counter = m.tenant_admitted.labels(tenant.name, cls.label) if m is not None else None
            known = self._admitted[(tenant.name, cls)] = (Admitted(tenant.name, cls), counter)
        if known[1] is not None:
            known[1].inc()
        return known[0]

    def _refuse(self, tenant: str, quota: Quota, bucket: TokenBucket, app: str) -> None:
        retry = max(1, math.ceil(bucket.wait_s()))
        if self.metrics is not None:
            self.metrics.tenant_refused.labels(tenant, "quota").inc()
        scope = "across all applications" if quota.app is None else f"for application '{app}'"
        raise QuotaExceeded(
            f"tenant '{tenant}' is over its quota {scope} ({quota.rate:g} queries a second, "
            f"burst {quota.burst}); retry in {retry} s",
            retry_after_s=retry, policy=quota.policy, burst=quota.burst, window_s=quota.window_s,
        )  # fmt: skip


def request_key(authorization: bytes | None, x_api_key: bytes | None) -> bytes | None:
    """The API key a request carries: ``Authorization: Bearer <key>`` (the scheme in any case)
    or ``X-Api-Key: <key>``; None when it carries neither. Another scheme, two keys that
    differ, or a repeated header (joined with a comma by the HTTP layer) is refused (400)."""
    key: bytes | None = None
    if authorization is not None:
        scheme, _, credentials = authorization.strip().partition(b" ")
        if scheme.lower() != b"bearer" or not credentials.strip():
            raise _bad("Authorization must be 'Bearer ck_...' on the query port")
        key = credentials.strip()
    if x_api_key is not None:
        other = x_api_key.strip()
        if key is not None and other != key:
            raise _bad("Authorization and X-Api-Key carry different keys: send one")
        key = other
    if key is not None and b"," in key:
        raise _bad("one API key per request (the key header was repeated)")
    return key


def _bad(cause: str) -> BadTenantHeader:
    return BadTenantHeader(cause)


def _parse_priority(value: bytes) -> PriorityClass:
    cls = _NAMES.get(value.strip().lower())
    if cls is None:
        raise _bad(f"X-Priority must be critical, standard or sheddable, got {value[:40]!r}")
    return cls

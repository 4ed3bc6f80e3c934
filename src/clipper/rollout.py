"""A model's rollout: how its unpinned queries split between versions, and which version
shadows them. Data only; the registry holds one per model that has one, the store one record.

A split names versions with relative weights (``{"1": 95, "2": 5}`` and ``{"1": 0.95,
"2": 0.05}`` are the same split). A query without a ``version`` goes to a version drawn by
weight; with ``sticky``, a query that gives a ``uid`` goes to the version that a hash of the
model name and the uid picks, the same on every frontend and after every restart. Versions are
laid out in sorted order on [0, 1), so in a split of two, growing one version's weight only
moves users onto it.

A shadow is a version that also gets a ``share`` (0 to 1) of the queries; its answers are only
compared with the real ones, never returned (:mod:`clipper.query.traffic` runs it).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from clipper.errors import RegistryError

__all__ = ["MAX_SPLIT_VERSIONS", "Rollout", "Shadow", "sticky_point", "with_shadow", "with_split"]

MAX_SPLIT_VERSIONS = 16


def sticky_point(model: str, uid: str) -> float:
    """Where ``uid`` falls on [0, 1) for ``model``: a hash, stable across processes."""
    digest = hashlib.blake2b(f"{model}\0{uid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _weight(model: str, version: Any, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistryError(
            f"the weight of version {version!r} of model '{model}' must be a number > 0, "
            f"got {value!r}"
        )
    w = float(value)
    if not math.isfinite(w) or w <= 0.0:
        raise RegistryError(
            f"the weight of version {version!r} of model '{model}' must be a finite number > 0, "
            f"got {value!r} (leave a version out of the split to give it no traffic)"
        )
    return w


@dataclass(frozen=True, slots=True)
class Shadow:
    version: str
    share: float

    def to_record(self) -> dict[str, Any]:
        return {"version": self.version, "share": self.share}


@dataclass(frozen=True, slots=True)
class Rollout:
    """``split``: (version, weight) pairs sorted by version, weights > 0 (empty: no split, the
    model's current version answers); ``shadow``: the shadow version, or None."""

    name: str
    split: tuple[tuple[str, float], ...] = ()
    sticky: bool = False
    shadow: Shadow | None = None
    # Derived: the upper edge of each version's interval on [0, 1).
    _cumulative: tuple[float, ...] = field(default=(), init=False, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        name: str,
        weights: Mapping[str, Any] | None,
        *,
        sticky: bool = False,
        shadow: Shadow | None = None,
    ) -> Rollout:
        """A rollout from ``{version: weight}`` (checked: a clear error for each mistake)."""
        if weights is not None and not isinstance(weights, Mapping):
            raise RegistryError(
                f'a split is an object {{version: weight}}, e.g. {{"1": 95, "2": 5}}; got '
                f"{weights!r}"
            )
        pairs = tuple(sorted((str(v), _weight(name, v, w)) for v, w in (weights or {}).items()))
        return cls(name, pairs, sticky, shadow)

    def __post_init__(self) -> None:
        if len(self.split) > MAX_SPLIT_VERSIONS:
            raise RegistryError(
                f"a split names at most {MAX_SPLIT_VERSIONS} versions, got {len(self.split)}"
            )
        for version, w in self.split:
            _weight(self.name, version, w)
        if self.shadow is not None:
            share = self.shadow.share
            if isinstance(share, bool) or not isinstance(share, int | float):
                raise RegistryError(f"a shadow's share must be a number in [0, 1], got {share!r}")
            if not 0.0 <= share <= 1.0:
                raise RegistryError(
                    f"a shadow's share must be in [0, 1] (0.1 = 10% of the queries), got {share!r}"
                )
            if self.shadow.version in self.weights:
                raise RegistryError(
                    f"version '{self.shadow.version}' of model '{self.name}' cannot shadow "
                    "queries and answer them too: it is in the split"
                )
        total = math.fsum(w for _, w in self.split)
        cumulative: list[float] = []
        acc = 0.0
        for _, w in self.split:
            acc += w / total
            cumulative.append(acc)
        object.__setattr__(self, "_cumulative", tuple(cumulative))

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.split)

    @property
    def versions(self) -> frozenset[str]:
        """Every version the rollout needs running: the split's and the shadow."""
        named = {v for v, _ in self.split}
        if self.shadow is not None:
            named.add(self.shadow.version)
        return frozenset(named)

    @property
    def empty(self) -> bool:
        return not self.split and self.shadow is None

    def shares(self) -> dict[str, float]:
        """Each split version's share of the traffic (the weights normalised)."""
        total = math.fsum(w for _, w in self.split)
        return {v: w / total for v, w in self.split}

    def pick(self, uid: str, rng: random.Random) -> str:
        """The version for one query (the split must not be empty)."""
        point = sticky_point(self.name, uid) if self.sticky and uid else rng.random()
        for (version, _), edge in zip(self.split, self._cumulative, strict=True):
            if point < edge:
                return version
        return self.split[-1][0]  # rounding: the last edge may fall a hair below 1.0

    def to_record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "split": {v: w for v, w in self.split},
            "sticky": self.sticky,
            "shadow": None if self.shadow is None else self.shadow.to_record(),
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Rollout:
        shadow = r.get("shadow")
        return cls.build(
            str(r["name"]),
            r.get("split") or {},
            sticky=bool(r.get("sticky", False)),
            shadow=None
            if shadow is None
            else Shadow(str(shadow["version"]), float(shadow["share"])),
        )


def with_split(
    rollout: Rollout | None, name: str, weights: Mapping[str, Any] | None, *, sticky: bool
) -> Rollout:
    """``rollout`` with its split replaced (None or ``{}``: no split); the shadow stays."""
    return Rollout.build(
        name, weights, sticky=sticky, shadow=rollout.shadow if rollout is not None else None
    )


def with_shadow(rollout: Rollout | None, name: str, version: str | None, share: float) -> Rollout:
    """``rollout`` with its shadow replaced (``version`` None: no shadow); the split stays."""
    return Rollout.build(
        name,
        rollout.weights if rollout is not None else None,
        sticky=rollout.sticky if rollout is not None else False,
        shadow=None if version is None else Shadow(version, share),
    )

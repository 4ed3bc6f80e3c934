"""The ray:// manager's settings: its URL (``ray://ADDRESS?param=value&...``) and a model
version's ``ray:KEY=VALUE`` labels, which say where its replicas' actors may run (see
docs/scale-out.md). Pure parsing: Ray is imported only to build a node-affinity strategy."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

from clipper.errors import ConfigError
from clipper.registry import ModelVersion

__all__ = ["Placement", "RaySettings", "parse_ray_url", "version_placement"]

_PARAMS = ("namespace", "num_cpus", "num_gpus", "node", "strategy", "max_per_node", "cache_dir",
           "poll_s", "stop_timeout_s", "sweep_after_s", "settle_s",
           "start_timeout_s")  # fmt: skip
# What a version's labels may override (``ray:KEY=VALUE``), besides ``resource:NAME``.
_PLACEMENT = ("num_cpus", "num_gpus", "node", "strategy", "max_per_node")
_LABEL_PREFIX = "ray:"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an actor may run: what it reserves, and on which node."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()
    node: str | None = None
    strategy: str = "default"
    # Hard: never more of the version's replicas on one node (None: the soft spread).
    max_per_node: int | None = None

    def with_settings(self, settings: dict[str, str]) -> Placement:
        """This placement overridden by ``settings`` (URL parameters or a version's labels)."""
        resources = dict(self.resources)
        kw: dict[str, Any] = {}
        for key, value in settings.items():
            if key.startswith("resource."):
                resources[key.removeprefix("resource.")] = _number(key, value)
            elif key in ("num_cpus", "num_gpus"):
                kw[key] = _number(key, value)
            elif key == "node":
                kw["node"] = value or None
            elif key == "strategy":
                if value not in ("default", "spread"):
                    raise ConfigError(f"ray strategy must be default or spread, got {value!r}")
                kw["strategy"] = value
            elif key == "max_per_node":
                kw["max_per_node"] = _limit(value)
        return Placement(
            num_cpus=kw.get("num_cpus", self.num_cpus),
            num_gpus=kw.get("num_gpus", self.num_gpus),
            resources=tuple(sorted(resources.items())),
            node=kw.get("node", self.node),
            strategy=kw.get("strategy", self.strategy),
            max_per_node=kw.get("max_per_node", self.max_per_node),
        )

    def demand(self) -> dict[str, float]:
        """What one replica reserves, by Ray's resource names (what the planner fits)."""
        wanted = {"CPU": self.num_cpus, "GPU": self.num_gpus, **dict(self.resources)}
        return {k: v for k, v in wanted.items() if v > 0}

    def options(self, on_node: str | None = None) -> dict[str, Any]:
        """The placement part of ``ActorClass.options``: on ``on_node`` (the planner's choice,
        hard), or where Ray likes (an adopted actor keeps its node; no node view: Ray's own
        placement, spread when asked)."""
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            opts["resources"] = dict(self.resources)
        node = on_node or self.node
        if node is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        elif self.strategy == "spread":
            opts["scheduling_strategy"] = "SPREAD"
        return opts


def _number(key: str, value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise ConfigError(f"ray {key} must be a number, got {value!r}") from None
    if n < 0:
        raise ConfigError(f"ray {key} must be >= 0, got {value!r}")
    return n


def _limit(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"ray max_per_node must be a whole number >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class RaySettings:
    address: str
    namespace: str
    placement: Placement
    cache_dir: str
    poll_s: float
    stop_timeout_s: float
    sweep_after_s: float
    # After the set of alive nodes changes, how long it must stay the same before a replica is
    # moved back toward the spread (a flapping node churns nothing).
    settle_s: float = 10.0
    # How long an actor pinned to a node may take to start (and, when it replaces a moved
    # replica, its container to connect) before it is retired and its slot placed again,
    # avoiding that node for as long.
    start_timeout_s: float = 120.0


def parse_ray_url(rest: str) -> RaySettings:
    """``ADDRESS?param=value&...`` (what follows ``ray://``); ConfigError naming what is wrong."""
    address, _, query = rest.partition("?")
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as e:
        raise ConfigError(f"ray://{rest}: bad parameters: {e}") from None
    settings: dict[str, str] = {}
    for key, value in pairs:
        if key not in _PARAMS and not key.startswith("resource."):
            raise ConfigError(
                f"ray://: unknown parameter {key!r}; expected one of {', '.join(_PARAMS)} or "
                "resource.<NAME>"
            )
        settings[key] = value
    placement = Placement().with_settings(
        {k: v for k, v in settings.items() if k in _PLACEMENT or k.startswith("resource.")}
    )
    return RaySettings(
        address=address or "auto",
        namespace=settings.get("namespace") or "clipper",
        placement=placement,
        cache_dir=settings.get("cache_dir", ""),
        poll_s=_number("poll_s", settings.get("poll_s", "1")) or 1.0,
        stop_timeout_s=_number("stop_timeout_s", settings.get("stop_timeout_s", "15")),
        sweep_after_s=_number("sweep_after_s", settings.get("sweep_after_s", "30")),
        settle_s=_number("settle_s", settings.get("settle_s", "10")),
        start_timeout_s=_number("start_timeout_s", settings.get("start_timeout_s", "120")) or 120,
    )


def version_placement(base: Placement, mv: ModelVersion) -> Placement:
    """``base`` overridden by the version's ``ray:key=value`` labels."""
    settings: dict[str, str] = {}
    for label in mv.labels:
        if not label.startswith(_LABEL_PREFIX):
            continue
        key, sep, value = label.removeprefix(_LABEL_PREFIX).partition("=")
        key = key.replace("resource:", "resource.", 1)
        if not sep or (key not in _PLACEMENT and not key.startswith("resource.")):
            raise ConfigError(
                f"model {mv.name}:{mv.version}: label {label!r} is not ray:num_cpus=N, "
                "ray:num_gpus=N, ray:resource:NAME=N, ray:node=NODE_ID, ray:strategy=spread "
                "or ray:max_per_node=N"
            )
        settings[key] = value
    return base.with_settings(settings)

"""Every named choice, one table each: the names, what each builds, and its one-line help.

The ``Literal`` types, the CLI's ``choices=`` and help, the admin schemas and the "expected one
of ..." messages all derive from these tables, so a new option is one line here (plus its code).
Each table checks at import that its ``Literal`` lists exactly its names, in order.

What an option builds is a lazy ``"module:attribute"`` reference, loaded on first use: this module
is imported by the command line and the config, which must not pull in numpy (the controllers) or
the selection policies just to list their names.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Literal, get_args

from clipper.errors import ConfigError

__all__ = [
    "CACHE_POLICIES",
    "CONTROLLERS",
    "GRPC_TRANSPORTS",
    "INPUT_TYPES",
    "LOSSES",
    "MANAGERS",
    "ON_MODEL_ERROR",
    "OVERLOAD",
    "POLICIES",
    "STORES",
    "WAITS",
    "CachePolicy",
    "Choice",
    "Controller",
    "GrpcTransport",
    "InputTypeName",
    "LossName",
    "ManagerScheme",
    "OnModelError",
    "Option",
    "Overload",
    "PolicyName",
    "StoreScheme",
    "WaitName",
]


# Plain classes, not dataclasses: a container imports this module (through clipper.inputs), and
# building two dataclasses would more than double its import time.
class Option:
    """One option: its help line and, when it builds something, where that lives."""

    __slots__ = ("help", "ref")

    def __init__(self, help: str, ref: str = "") -> None:
        self.help = help
        self.ref = ref
        """``"package.module:attribute[.attribute]"``; empty when the name itself is the value."""

    def __repr__(self) -> str:
        return f"Option({self.help!r}, {self.ref!r})"


class Choice:
    """A named choice: ``what`` it is (for messages) and its options, in display order.

    ``literal`` is the ``Literal[...]`` type of the names; it must list exactly the options.
    """

    __slots__ = ("_loaded", "literal", "options", "what")

    def __init__(self, what: str, literal: Any, options: Mapping[str, Option]) -> None:
        if get_args(literal) != tuple(options):
            raise TypeError(
                f"the {what} Literal {get_args(literal)} differs from its table {tuple(options)}"
            )
        self.what = what
        self.literal = literal
        self.options = options
        self._loaded: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Choice({self.what!r}, {list(self.options)!r})"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.options)

    def __contains__(self, name: object) -> bool:
        return name in self.options

    def __iter__(self) -> Iterator[str]:
        return iter(self.options)

    def listing(self) -> str:
        """``a, b or c``: for prose and messages."""
        *head, last = self.names
        return f"{', '.join(head)} or {last}" if head else last

    def unknown(self, name: object) -> str:
        """The message for a name that is not an option."""
        return f"unknown {self.what} {name!r}; expected one of {', '.join(self.names)}"

    def check(self, name: object) -> str:
        """``name`` if it is an option, else :class:`ConfigError` listing the options."""
        if not isinstance(name, str) or name not in self.options:
            raise ConfigError(self.unknown(name))
        return name

    def help(self) -> str:
        """``a: what a does; b: what b does``: for ``--help``."""
        return "; ".join(f"{n}: {o.help}" for n, o in self.options.items())

    def schema(self) -> str:
        """``"a" | "b" | "c"``: the admin API's schema notation."""
        return " | ".join(f'"{n}"' for n in self.names)

    def load(self, name: str) -> Any:
        """What option ``name`` builds (imported on first use); ConfigError if unknown."""
        self.check(name)
        if name not in self._loaded:
            module, _, attr = self.options[name].ref.partition(":")
            if not module:
                raise LookupError(f"the {self.what} {name!r} builds nothing")
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            self._loaded[name] = obj
        return self._loaded[name]


Controller = Literal["aimd", "quantile", "fixed"]
CONTROLLERS = Choice(
    "batching controller",
    Controller,
    {
        "aimd": Option(
            "additive increase, multiplicative decrease around the latency target",
            "clipper.batching.controllers:_build_aimd",
        ),
        "quantile": Option(
            "the largest size whose P99 batch latency (a quantile regression) meets the target",
            "clipper.batching.controllers:_build_quantile",
        ),
        "fixed": Option(
            "always max_batch_size (baselines, models that cannot batch)",
            "clipper.batching.controllers:_build_fixed",
        ),
    },
)

WaitName = Literal["adaptive", "fixed"]
WAITS = Choice(
    "batch wait policy",
    WaitName,
    {
        "adaptive": Option(
            "wait up to max_wait_micros only while recent waits grew batches (probing now and "
            "then when arrivals are close); one client in a closed loop gets no wait",
            "clipper.batching.wait:AdaptiveWait",
        ),
        "fixed": Option(
            "always wait up to max_wait_micros for a partial batch (Clipper as published)",
            "clipper.batching.wait:FixedWait",
        ),
    },
)

PolicyName = Literal["single", "exp3", "exp4", "epsilon_greedy", "ucb1", "thompson", "ab_split"]
POLICIES = Choice(
    "selection policy",
    PolicyName,
    {
        "single": Option(
            "always the first linked model (no learning)", "clipper.selection.single:SingleModel"
        ),
        "exp3": Option(
            "Exp3 bandit: one model per query, drawn by learnt weights",
            "clipper.selection.bandits:Exp3",
        ),
        "exp4": Option(
            "ensemble: every model answers, weighted vote learnt from feedback",
            "clipper.selection.exp4:Exp4",
        ),
        "epsilon_greedy": Option(
            "the best model so far, a random one with probability epsilon",
            "clipper.selection.bandits:EpsilonGreedy",
        ),
        "ucb1": Option(
            "the model with the best upper confidence bound", "clipper.selection.bandits:UCB1"
        ),
        "thompson": Option(
            "Thompson sampling, a Beta posterior per model",
            "clipper.selection.bandits:Thompson",
        ),
        "ab_split": Option(
            "fixed traffic shares per model (weights)", "clipper.selection.ab_split:ABSplit"
        ),
    },
)

LossName = Literal["0/1", "squared", "absolute"]
LOSSES = Choice(
    "loss",
    LossName,
    {
        "0/1": Option(
            "classification: 0 if equal, else 1", "clipper.selection.losses:_build_zero_one"
        ),
        "squared": Option(
            "(output - label)^2 / scale^2, clipped to 1", "clipper.selection.losses:_build_squared"
        ),
        "absolute": Option(
            "|output - label| / scale, clipped to 1", "clipper.selection.losses:_build_absolute"
        ),
    },
)

InputTypeName = Literal["bytes", "integers", "floats", "doubles", "strings", "json"]
INPUT_TYPES = Choice(
    "input type",
    InputTypeName,
    {
        "bytes": Option("base64 strings, sent raw", "clipper.inputs:InputType.BYTES"),
        "integers": Option("arrays of 32-bit integers", "clipper.inputs:InputType.INTS"),
        "floats": Option("arrays of 32-bit floats", "clipper.inputs:InputType.FLOATS"),
        "doubles": Option("arrays of 64-bit floats", "clipper.inputs:InputType.DOUBLES"),
        "strings": Option("one string per input", "clipper.inputs:InputType.STRINGS"),
        "json": Option("any JSON value per input", "clipper.inputs:InputType.JSON"),
    },
)

CachePolicy = Literal["clock", "lru"]
CACHE_POLICIES = Choice(
    "cache policy",
    CachePolicy,
    {
        "clock": Option("second-chance CLOCK eviction, as in Clipper"),
        "lru": Option("least-recently-used eviction"),
    },
)

Overload = Literal["default", "reject"]
OVERLOAD = Choice(
    "overload answer",
    Overload,
    {
        "default": Option("a shed query gets the application's default output"),
        "reject": Option("a shed query gets 503 Service unavailable"),
    },
)

OnModelError = Literal["auto", "error", "default"]
ON_MODEL_ERROR = Choice(
    "model error answer",
    OnModelError,
    {
        "auto": Option(
            "V2 REST and gRPC answer an error (500 / INTERNAL) with the model's message; the "
            "Clipper REST API answers the default output, as the original"
        ),
        "error": Option("every protocol answers an error (500 / INTERNAL) with the message"),
        "default": Option("every protocol answers the default output and the reason"),
    },
)

ManagerScheme = Literal["local", "external", "k8s", "ray"]
MANAGERS = Choice(
    "container manager",
    ManagerScheme,
    {
        "local": Option(
            "local:// - replicas are child processes of this frontend, restarted when they exit",
            "clipper.managers.base:build_local",
        ),
        "external": Option(
            "external:// - replicas are started by someone else and dial in to the RPC port",
            "clipper.managers.base:build_external",
        ),
        "k8s": Option(
            "k8s://NAMESPACE?image=... - one Kubernetes Deployment per model version "
            "(docs/scale-out.md)",
            "clipper.managers.base:build_kubernetes",
        ),
        "ray": Option(
            "ray://ADDRESS?namespace=NAME&num_cpus=N&num_gpus=N&resource.NAME=N - replicas are "
            "detached Ray actors, placed and restarted by Ray (extra: clipper-serve[ray])",
            "clipper.managers.ray_engine:build_ray",
        ),
    },
)

StoreScheme = Literal["memory", "sqlite", "redis", "rediss"]
STORES = Choice(
    "config store",
    StoreScheme,
    {
        "memory": Option("memory:// - gone with the process", "clipper.store.open:open_memory"),
        "sqlite": Option(
            "sqlite:///path/to/clipper.db or sqlite:///state-dir - one frontend",
            "clipper.store.open:open_sqlite",
        ),
        "redis": Option(
            "redis://host:port/db[?prefix=name] - shared by several frontends",
            "clipper.store.open:open_redis",
        ),
        "rediss": Option("rediss://... - redis over TLS", "clipper.store.open:open_redis"),
    },
)

GrpcTransport = Literal["native", "grpcio"]
GRPC_TRANSPORTS = Choice(
    "gRPC transport",
    GrpcTransport,
    {
        "native": Option(
            "HTTP/2 on the frontend's event loop, unary calls (the fast path)",
            "clipper.frontend.grpc.native:NativeGrpcServer",
        ),
        "grpcio": Option(
            "grpc.aio (grpcio's C core and its own thread)",
            "clipper.frontend.grpc.server:V2GrpcServer",
        ),
    },
)

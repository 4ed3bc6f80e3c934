"""clipper-serve: low-latency prediction serving with SLO-driven adaptive batching.

The public surface; everything else is internal and may change.

Names resolve lazily (PEP 562): ``import clipper`` loads nothing else, and ``from clipper import
Clipper`` imports only what the frontend needs. A model container imports
``clipper.container.runtime`` (which imports the package first), so an eager ``__init__`` would
make every replica pay for the frontend, the store, the HTTP stack and the metrics library.
"""

# Underscored imports, and no ``from __future__``: every public name of this module is in __all__.
import importlib as _importlib
import typing as _typing

if (
    _typing.TYPE_CHECKING
):  # the type checkers see the names; at runtime ``__getattr__`` imports them
    from clipper.background import ClipperThread
    from clipper.client import Client
    from clipper.clock import Clock, FakeClock, MonotonicClock
    from clipper.config import BatchingConfig, FrontendConfig
    from clipper.errors import (
        BadInputError,
        ClipperError,
        ConfigError,
        DeadlineExceeded,
        ModelError,
        NotFoundError,
        OverloadedError,
        PayloadTooLarge,
        RegistryError,
        ReplicaError,
        RequestError,
        WireError,
    )
    from clipper.inputs import InputType
    from clipper.registry import Application, ModelVersion
    from clipper.server import Clipper
    from clipper.version import __version__

__all__ = [
    "Application",
    "BadInputError",
    "BatchingConfig",
    "Client",
    "Clipper",
    "ClipperError",
    "ClipperThread",
    "Clock",
    "ConfigError",
    "DeadlineExceeded",
    "FakeClock",
    "FrontendConfig",
    "InputType",
    "ModelError",
    "ModelVersion",
    "MonotonicClock",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLarge",
    "RegistryError",
    "ReplicaError",
    "RequestError",
    "WireError",
    "__version__",
]

# Public name -> the module that defines it.
_ORIGIN: dict[str, str] = {
    "Application": "clipper.registry",
    "BadInputError": "clipper.errors",
    "BatchingConfig": "clipper.config",
    "Client": "clipper.client",
    "Clipper": "clipper.server",
    "ClipperError": "clipper.errors",
    "ClipperThread": "clipper.background",
    "Clock": "clipper.clock",
    "ConfigError": "clipper.errors",
    "DeadlineExceeded": "clipper.errors",
    "FakeClock": "clipper.clock",
    "FrontendConfig": "clipper.config",
    "InputType": "clipper.inputs",
    "ModelError": "clipper.errors",
    "ModelVersion": "clipper.registry",
    "MonotonicClock": "clipper.clock",
    "NotFoundError": "clipper.errors",
    "OverloadedError": "clipper.errors",
    "PayloadTooLarge": "clipper.errors",
    "RegistryError": "clipper.errors",
    "ReplicaError": "clipper.errors",
    "RequestError": "clipper.errors",
    "WireError": "clipper.errors",
    "__version__": "clipper.version",
}


def __getattr__(name: str) -> _typing.Any:
    module = _ORIGIN.get(name)
    if module is None:
        raise AttributeError(f"module 'clipper' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # cached: the next lookup is an ordinary global
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

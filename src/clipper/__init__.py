"""clipper-serve: low-latency prediction serving with SLO-driven adaptive batching.

The public surface; everything else is internal and may change.
"""

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

__version__ = "0.1.0"

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

"""W3C trace context and the ``OTEL_*`` settings, as plain values (no OpenTelemetry import).

:func:`parse_traceparent` reads a ``traceparent`` header (https://www.w3.org/TR/trace-context/,
version 00 and the forward-compatible rule for later versions); a malformed one is ignored, as
the recommendation says: the request starts a trace of its own. :class:`TraceSettings` reads
the standard environment variables (and ``clipper start --trace-ratio``) once, at start.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from clipper.errors import ConfigError

__all__ = [
    "SAMPLERS",
    "TraceParent",
    "TraceSettings",
    "format_traceparent",
    "parse_traceparent",
    "sampled",
]

_HEX = frozenset("0123456789abcdef")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
SAMPLED = 0x01

# OTEL_TRACES_SAMPLER values this package understands (the SDK's own names).
SAMPLERS = (
    "parentbased_traceidratio",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "always_on",
    "always_off",
)
# OTEL_TRACES_EXPORTER values: otlp (OTLP over HTTP/protobuf), console (stdout), none.
EXPORTERS = ("otlp", "console", "none")


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed ``traceparent``: the caller's trace id, its span id and its flags."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)


def _is_hex(s: str) -> bool:
    return bool(s) and _HEX.issuperset(s)


def parse_traceparent(value: str | bytes | None) -> TraceParent | None:
    """The header's context, or None when absent or malformed (then a new trace starts)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    value = value.strip()
    parts = value.split("-")
    if len(parts) < 4:
        return None
    version, trace_id, span_id, flags = parts[0], parts[1], parts[2], parts[3]
    if len(version) != 2 or not _is_hex(version) or version == "ff":
        return None
    if version == "00" and (len(parts) != 4 or len(value) != 55):
        return None  # version 00 is exactly this long; later ones may append fields
    if len(trace_id) != 32 or not _is_hex(trace_id) or trace_id == _ZERO_TRACE:
        return None
    if len(span_id) != 16 or not _is_hex(span_id) or span_id == _ZERO_SPAN:
        return None
    if len(flags) != 2 or not _is_hex(flags):
        return None
    return TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))


def format_traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    """The version-00 header for a span (what goes to the container over the RPC wire)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


_LOW64 = (1 << 64) - 1


def sampled(
    settings: TraceSettings,
    parent: TraceParent | None,
    draw: Callable[[], float] = random.random,
) -> bool:
    """Whether a request with this (parsed) parent is traced, as ``OTEL_TRACES_SAMPLER`` says.

    ``parentbased_*``: a valid parent's sampled flag decides (a sampled caller is traced at any
    ratio, an unsampled one never); without one the root rule does. ``traceidratio``: the
    ratio, on the parent's trace id when there is one (the SDK's rule: the low 64 bits under
    ``ratio * 2**64``), else on ``draw()`` (a request that starts its trace). Decided here, in
    a float compare, rather than by the SDK's sampler: an unsampled request creates nothing."""
    name = settings.sampler
    if parent is not None and name.startswith("parentbased_"):
        return parent.sampled
    if name.endswith("always_on"):
        return True
    if name.endswith("always_off"):
        return False
    ratio = settings.ratio
    if parent is not None:
        return (parent.trace_id & _LOW64) < round(ratio * (_LOW64 + 1))
    return draw() < ratio


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """What the ``OTEL_*`` variables (and ``--trace-ratio``) ask for.

    Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``), or,
    with that variable unset, when an OTLP endpoint is given (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none`` turns it off. The same rule holds in the frontend and in the
    containers it starts (they inherit its environment), so both export or neither does."""

    enabled: bool
    exporter: str = "otlp"
    sampler: str = "parentbased_traceidratio"
    ratio: float = 1.0
    service_name: str = "clipper"

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        ratio: float | None = None,
        default_service: str = "clipper",
    ) -> TraceSettings:
        """Read the settings; ``ratio`` (``--trace-ratio``) overrides ``OTEL_TRACES_SAMPLER_ARG``.
        Raises :class:`~clipper.errors.ConfigError` for a value the SDK would not take."""
        exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
        if exporter and exporter not in EXPORTERS:
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: expected one of {', '.join(EXPORTERS)}"
            )
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        enabled = not disabled and (
            exporter in ("otlp", "console") or (not exporter and bool(endpoint))
        )
        sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_traceidratio"
        if sampler not in SAMPLERS:
            raise ConfigError(f"OTEL_TRACES_SAMPLER={sampler!r}: expected one of {SAMPLERS}")
        if ratio is None:
            raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
            try:
                ratio = float(raw) if raw else 1.0
            except ValueError:
                raise ConfigError(
                    f"OTEL_TRACES_SAMPLER_ARG={raw!r}: expected a ratio between 0 and 1"
                ) from None
        elif "traceidratio" not in sampler:
            sampler = "parentbased_traceidratio"  # --trace-ratio asks for a ratio sampler
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(f"trace ratio {ratio!r}: expected a number between 0 and 1")
        service = env.get("OTEL_SERVICE_NAME", "").strip() or default_service
        return cls(enabled, exporter or "otlp", sampler, ratio, service)

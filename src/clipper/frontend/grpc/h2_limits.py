"""The native gRPC transport's limits on what one HTTP/2 peer may make the server do.

Each limit answers one of the attacks the HTTP/2 world learned about (rapid reset, CONTINUATION
and control-frame floods, HPACK as a CPU lever, unbounded buffering), the way nginx, Go's
net/http2 and h2o answer them: a budget counted on the injected clock, and GOAWAY
ENHANCE_YOUR_CALM when it is spent. :class:`H2Limits` holds them (defaults are the module's
constants; the frontend's settings fill in the ones a deployment may want to change), and
:class:`WindowBudget` counts one of them. docs/security.md, "HTTP/2 (the gRPC port)", lists
each with its default and what an attacker gets.
"""

from __future__ import annotations

from dataclasses import dataclass

from clipper.errors import ConfigError

__all__ = [
    "BODY_TIMEOUT_S",
    "BUFFERED_BYTES",
    "CONNECTION_WINDOW",
    "CONTROL_BUDGET",
    "CONTROL_WINDOW_S",
    "DECODE_BUDGET_S",
    "DECODE_WINDOW_S",
    "GOAWAY_LINGER_S",
    "MAX_BYTES_PER_TURN",
    "MAX_CONTINUATIONS",
    "MAX_FRAMES_PER_TURN",
    "MAX_HEADER_BLOCK",
    "MAX_STREAMS",
    "RESET_HOLD_MAX_S",
    "RESET_WINDOW_S",
    "SEND_TIMEOUT_S",
    "H2Limits",
    "WindowBudget",
]

MAX_STREAMS = 1024  # concurrent calls per connection (SETTINGS_MAX_CONCURRENT_STREAMS)
# Rapid reset (CVE-2023-44487): more resets than twice the stream limit in 10 s. A client that
# cancels calls now and then never comes near it; one that opens only to reset does at once.
RESET_WINDOW_S = 10.0
# A reset call's query still holds its place among the connection's streams until its
# deadline (the application's SLO or the call's timeout), at most this long: resets cannot
# open more than MAX_STREAMS queries at a time.
RESET_HOLD_MAX_S = 10.0
# PING, SETTINGS, PRIORITY, empty DATA and unknown frames with no call opened in between.
CONTROL_BUDGET = 100
CONTROL_WINDOW_S = 1.0
# One connection's share of one event-loop turn; what is left is parsed on a later turn, with
# reading paused meanwhile.
MAX_FRAMES_PER_TURN = 128
MAX_BYTES_PER_TURN = 512 * 1024
# A header block: its encoded bytes (HEADERS + CONTINUATION) and the CONTINUATION frames in it
# (empty ones count: the 2024 CONTINUATION flood).
MAX_HEADER_BLOCK = 16 * 1024
MAX_CONTINUATIONS = 8
# Decoding a header block over hpack_blocks.CACHE_BLOCK_BYTES costs pure-Python time; a
# connection may spend this much of it per window.
DECODE_BUDGET_S = 0.05
DECODE_WINDOW_S = 1.0
# Request bytes one connection may have buffered (its receive window, refilled only as calls
# are dispatched or dropped), and all connections together.
CONNECTION_WINDOW = 16 * 2**20
BUFFERED_BYTES = 128 * 2**20
# A call's request must be complete this long after its HEADERS; an answer that the peer's
# window holds back is given up this long after it last moved.
BODY_TIMEOUT_S = 30.0
SEND_TIMEOUT_S = 30.0
# After a GOAWAY we half-close and discard what the peer still sends for this long, then close.
GOAWAY_LINGER_S = 1.0


@dataclass(frozen=True, slots=True)
class H2Limits:
    """Every per-peer limit of the native transport (see the module's constants)."""

    max_streams: int = MAX_STREAMS
    reset_budget: int = 2 * MAX_STREAMS
    reset_window_s: float = RESET_WINDOW_S
    reset_hold_max_s: float = RESET_HOLD_MAX_S
    control_budget: int = CONTROL_BUDGET
    control_window_s: float = CONTROL_WINDOW_S
    max_frames_per_turn: int = MAX_FRAMES_PER_TURN
    max_bytes_per_turn: int = MAX_BYTES_PER_TURN
    max_header_block: int = MAX_HEADER_BLOCK
    max_continuations: int = MAX_CONTINUATIONS
    decode_budget_s: float = DECODE_BUDGET_S
    decode_window_s: float = DECODE_WINDOW_S
    connection_window: int = CONNECTION_WINDOW
    buffered_bytes: int = BUFFERED_BYTES
    body_timeout_s: float = BODY_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in (
            "max_streams", "reset_budget", "control_budget", "max_frames_per_turn",
            "max_bytes_per_turn", "max_header_block", "connection_window", "buffered_bytes",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ConfigError(f"HTTP/2 limit {name} must be >= 1, got {getattr(self, name)}")
        if not 65_535 <= self.connection_window <= 2**31 - 1:
            raise ConfigError(
                "HTTP/2 connection_window must be 65535 to 2**31-1 bytes, "
                f"got {self.connection_window}"
            )
        for name in (
            "reset_window_s", "control_window_s", "decode_budget_s", "decode_window_s",
            "body_timeout_s", "send_timeout_s",
        ):  # fmt: skip
            if not getattr(self, name) > 0:
                raise ConfigError(f"HTTP/2 limit {name} must be > 0, got {getattr(self, name)}")


class WindowBudget:
    """``limit`` units per ``window_s`` seconds on the clock, counted in fixed windows (a
    burst across a boundary gets at most twice the limit): :meth:`spend` says whether the
    budget still holds."""

    __slots__ = ("limit", "start", "used", "window_s")

    def __init__(self, limit: float, window_s: float, now: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self.start = now
        self.used = 0.0

    def spend(self, now: float, amount: float = 1.0) -> bool:
        if now - self.start >= self.window_s:
            self.start = now
            self.used = 0.0
        self.used += amount
        return self.used <= self.limit

    def refill(self) -> None:
        """Forget what was spent (a control-frame budget, once a call is opened)."""
        self.used = 0.0

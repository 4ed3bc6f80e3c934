"""Log lines a client can cause, bounded: :class:`LogLimiter`, and :data:`PROTOCOL_LOG`, the
one limiter every per-connection protocol-error line of the frontend goes through (the REST
server, the native gRPC transport, the replicas' RPC server).

A client that reconnects and sends garbage in a loop made one line per connection (82 lines a
second from one client). Now the first line of a kind is logged as it comes; the repeats are
counted, and at most one line per interval (10 s) says "... and N more like it", with the
latest one's text. A kind is the logger, the level and the message's format string, so its
arguments (a peer's address, an error's detail) do not make new kinds. The count of a burst
that stopped is logged with the next line of its kind, or by :meth:`LogLimiter.flush` (the CLI
calls it when the frontend stops). No timer: nothing to own or stop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from clipper.clock import Clock

__all__ = ["PROTOCOL_LOG", "LogLimiter"]

_Kind = tuple[str, int, str]  # logger name, level, format string


@dataclass(slots=True)
class _Seen:
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]
    at: float  # when the last line of this kind was written
    repeats: int = 0  # not written since
    latest: tuple[object, ...] = ()  # the arguments of the latest repeat


class LogLimiter:
    """At most one line per ``interval_s`` for each kind of message (see the module's text).
    At most ``max_kinds`` kinds are remembered; the oldest is summed up and forgotten to make
    room (kinds are format strings, so in practice there are a few dozen)."""

    def __init__(self, interval_s: float = 10.0, *, max_kinds: int = 256) -> None:
        self.interval_s = interval_s
        self.max_kinds = max_kinds
        self._kinds: dict[_Kind, _Seen] = {}

    def info(
        self, log: logging.Logger | logging.LoggerAdapter[logging.Logger], clock: Clock,
        msg: str, *args: object,
    ) -> bool:  # fmt: skip
        return self.log(logging.INFO, log, clock, msg, *args)

    def warning(
        self, log: logging.Logger | logging.LoggerAdapter[logging.Logger], clock: Clock,
        msg: str, *args: object,
    ) -> bool:  # fmt: skip
        return self.log(logging.WARNING, log, clock, msg, *args)

    def error(
        self, log: logging.Logger | logging.LoggerAdapter[logging.Logger], clock: Clock,
        msg: str, *args: object,
    ) -> bool:  # fmt: skip
        return self.log(logging.ERROR, log, clock, msg, *args)

    def exception(
        self, log: logging.Logger | logging.LoggerAdapter[logging.Logger], clock: Clock,
        msg: str, *args: object,
    ) -> bool:  # fmt: skip
        """An error with the traceback being handled; its repeats are counted without one."""
        return self.log(logging.ERROR, log, clock, msg, *args, exc_info=True)

    def log(
        self,
        level: int,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
        clock: Clock,
        msg: str,
        *args: object,
        exc_info: bool = False,
    ) -> bool:
        """Write the line, or count it; whether a line was written."""
        if not log.isEnabledFor(level):
            return False  # a level that is off costs nothing, and is not counted
        name = log.logger.name if isinstance(log, logging.LoggerAdapter) else log.name
        kind = (name, level, msg)
        now = clock.now()
        seen = self._kinds.get(kind)
        # A clock that went back (another server's clock, in tests) starts a new interval.
        if seen is not None and 0.0 <= now - seen.at < self.interval_s:
            seen.repeats += 1
            seen.latest = args
            return False
        if seen is None:
            if len(self._kinds) >= self.max_kinds:
                oldest = next(iter(self._kinds))
                self._summary(oldest, self._kinds.pop(oldest), now)
            self._kinds[kind] = _Seen(log, now)
        elif seen.repeats:
            # The interval is over: one line with the count, this one's text as the latest.
            seen.repeats += 1
            seen.latest = args
            self._summary(kind, seen, now)
            seen.at = now
            return True
        else:
            seen.at = now
        log.log(level, msg, *args, exc_info=True if exc_info else None)
        return True

    def flush(self, clock: Clock | None = None) -> None:
        """Write the counts not yet written (when the server stops)."""
        now = clock.now() if clock is not None else None
        for kind, seen in self._kinds.items():
            self._summary(kind, seen, now)

    def _summary(self, kind: _Kind, seen: _Seen, now: float | None) -> None:
        if not seen.repeats:
            return
        n, seen.repeats = seen.repeats, 0
        took = "" if now is None else f" in {max(now - seen.at, 0.0):.0f} s"
        seen.logger.log(
            kind[1], "... and %s more like it%s; the latest: " + kind[2], f"{n:,}", took,
            *seen.latest,
        )  # fmt: skip


# The frontend's one limiter for lines a peer's connection causes (protocol errors, a request
# that crashed its handler): shared by every server in the process, flushed when it stops.
PROTOCOL_LOG = LogLimiter(10.0)

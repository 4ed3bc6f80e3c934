"""A model that keeps raising, said on the frontend's console: at once, then once per interval.

Every failed batch is counted in ``clipper_model_errors_total`` and answered with the default
output (reason ``model_error``) or, for V2 clients, an error; but nothing on the console said
so, and a model failing every query looked healthy to whoever watched the frontend's log. One
:class:`ModelErrorLog` per model version logs the first error at once and then at most one line
per ``interval_s``, with how many errors it stood for and the latest message, so a model that
fails thousands of batches a second writes one line every few seconds.
"""

from __future__ import annotations

import logging

from clipper.clock import Clock

__all__ = ["INTERVAL_S", "ModelErrorLog"]

INTERVAL_S = 10.0
_MAX_MESSAGE = 300
log = logging.getLogger("clipper.models")


class ModelErrorLog:
    __slots__ = ("_clock", "_last", "_suppressed", "interval_s", "model")

    def __init__(self, model: str, clock: Clock, *, interval_s: float = INTERVAL_S) -> None:
        self.model = model  # "name:version"
        self.interval_s = interval_s
        self._clock = clock
        self._last = float("-inf")
        self._suppressed = 0

    def failed(self, message: str, batch_size: int) -> None:
        """A batch of ``batch_size`` inputs failed with the model's ``message``."""
        now = self._clock.now()
        self._suppressed += 1
        if now - self._last < self.interval_s:
            return
        text = " ".join(message.split())
        if len(text) > _MAX_MESSAGE:
            text = text[:_MAX_MESSAGE] + "..."
        if self._last == float("-inf"):
            log.warning(
                "model %s raised an error (a batch of %d answered with errors or defaults): %s",
                self.model, batch_size, text,
            )  # fmt: skip
        else:
            log.warning(
                "model %s keeps raising: %d failed batches in the last %.0f s; latest: %s",
                self.model, self._suppressed, now - self._last, text,
            )  # fmt: skip
        self._last = now
        self._suppressed = 0

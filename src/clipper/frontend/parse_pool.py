"""The worker threads that judge large request bodies off the event loop: a Clipper REST
``input_batch`` or a V2 batch dimension over :data:`OFFLOAD_BYTES` is counted here
(:mod:`~clipper.frontend.item_scan`, whose NumPy passes release the GIL), and the request
resumes on the loop when the count is in.

At most :data:`MAX_BODIES` bodies are in the pool at once (counted or waiting for a thread);
one more is refused with 503 (:class:`ParseBusy`) rather than queued: each holds up to
``max_body_bytes`` of memory. The pool is owned by the server: started before its port opens
and stopped after the port closes (threads finish the body in hand; nothing new starts).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from clipper.errors import RequestError

__all__ = ["MAX_BODIES", "OFFLOAD_BYTES", "PARSE_THREADS", "ParseBusy", "ParsePool"]

# Bodies above this are counted in the pool; below it simdjson counts on the loop in a few
# milliseconds (about 10 ms per MiB on a busy machine), which a thread hop would not repay.
OFFLOAD_BYTES = 1024 * 1024
PARSE_THREADS = 2
MAX_BODIES = 4

T = TypeVar("T")


class ParseBusy(RequestError):
    """Every place in the parse pool is taken (503)."""

    status = 503
    error = "Service unavailable"


class ParsePool:
    """A bounded pool of threads; :meth:`submit` runs a function there and hands its result
    (or its exception) to a callback on the loop."""

    def __init__(self, threads: int = PARSE_THREADS, max_bodies: int = MAX_BODIES) -> None:
        if threads < 1 or max_bodies < 1:
            raise ValueError("a parse pool needs at least one thread and one place")
        self.threads = threads
        self.max_bodies = max_bodies
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self.busy = 0  # bodies refused because every place was taken

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    def start(self) -> None:
        if self._executor is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            self.threads, thread_name_prefix="clipper-parse"
        )

    async def stop(self) -> None:
        """No new work; wait (without blocking the loop) for the bodies in hand, then let the
        threads go. Callbacks of work that finishes meanwhile still run."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        executor.shutdown(wait=False, cancel_futures=True)
        pending = [asyncio.wrap_future(f) for f in list(self._futures)]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        self._futures.clear()

    def submit(
        self,
        fn: Callable[[], T],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """Run ``fn`` in a thread; ``done(result, None)`` or ``done(None, error)`` runs on the
        loop afterwards. :class:`ParseBusy` when every place is taken or the pool is stopped."""
        executor, loop = self._executor, self._loop
        if executor is None or loop is None:
            raise ParseBusy("the server is stopping: it parses no more large bodies")
        if len(self._futures) >= self.max_bodies:
            self.busy += 1
            raise ParseBusy(
                f"{self.max_bodies} request bodies over {OFFLOAD_BYTES} bytes are being "
                "parsed already (the most at once): retry later, or send smaller requests"
            )
        future = executor.submit(fn)
        self._futures.add(future)

        def finished(f: concurrent.futures.Future[T]) -> None:  # in the worker thread
            try:
                loop.call_soon_threadsafe(self._finish, f, done)
            except RuntimeError:  # the loop is closed: nobody is left to answer
                self._futures.discard(f)

        future.add_done_callback(finished)

    def _finish(
        self,
        future: concurrent.futures.Future[T],
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        self._futures.discard(future)
        if future.cancelled():
            done(None, ParseBusy("the server stopped before this request body was parsed"))
            return
        err = future.exception()
        done(None, err) if err is not None else done(future.result(), None)

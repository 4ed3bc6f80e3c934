"""A frontend on a background thread, driven with plain (blocking) calls: for notebooks,
scripts and synchronous tests.

::

    with ClipperThread(query_port=0, rpc_port=0) as c:
        c.register_application("sum", "doubles", "-1", 20_000)
        c.deploy_model("summer", "1", lambda xs: [float(x.sum()) for x in xs], input_type="doubles")
        c.link_model_to_app("sum", "summer")
        print(c.predict("sum", [1.0, 2.0]))
"""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import orjson

from clipper.config import FrontendConfig
from clipper.errors import ClipperError, RequestError
from clipper.registry import Application, ModelVersion
from clipper.server import Clipper

__all__ = ["ClipperThread"]

T = TypeVar("T")


class ClipperThread:
    """Runs a :class:`Clipper` on its own event loop (uvloop) in a daemon thread."""

    def __init__(self, config: FrontendConfig | None = None, **overrides: Any) -> None:
        self._config = config
        self._overrides = overrides
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._clipper: Clipper | None = None

    @property
    def clipper(self) -> Clipper:
        """The underlying frontend; touch it only through :meth:`call` (it lives on another
        thread's loop)."""
        if self._clipper is None:
            raise ClipperError("the frontend is not running: use start() or a with block")
        return self._clipper

    def start(self) -> ClipperThread:
        import uvloop

        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = uvloop.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                self._clipper = Clipper(self._config, **self._overrides)
                loop.run_until_complete(self._clipper.start())
            except BaseException as e:
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="clipper-frontend", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self.run(self.clipper.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = None
        self._clipper = None

    def __enter__(self) -> ClipperThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the frontend's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a plain function on the frontend's loop and wait for its result."""

        async def invoke() -> T:
            return fn(*args, **kwargs)

        return self.run(invoke())

    # The Clipper API, blocking.
    @property
    def query_url(self) -> str:
        return self.clipper.query_url

    def register_application(self, *args: Any, **kwargs: Any) -> Application:
        return self.run(self.clipper.register_application(*args, **kwargs))

    def delete_application(self, name: str) -> None:
        self.run(self.clipper.delete_application(name))

    def link_model_to_app(self, app_name: str, model_name: str) -> None:
        self.run(self.clipper.link_model_to_app(app_name, model_name))

    def set_model_version(self, name: str, version: str) -> None:
        self.run(self.clipper.set_model_version(name, version))

    def deploy_model(self, *args: Any, **kwargs: Any) -> ModelVersion:
        return self.run(self.clipper.deploy_model(*args, **kwargs))

    def set_num_replicas(self, *args: Any, **kwargs: Any) -> None:
        self.run(self.clipper.set_num_replicas(*args, **kwargs))

    def predict(self, app: str, input: Any, *, timeout: float = 30.0) -> Any:
        """POST one query over HTTP, as any client would; returns the decoded answer."""
        req = urllib.request.Request(
            f"{self.query_url}/{app}/predict",
            data=orjson.dumps({"input": input}),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return orjson.loads(r.read())
        except urllib.error.HTTPError as e:
            body = orjson.loads(e.read() or b"{}")
            err = RequestError(body.get("cause", str(e)))
            err.status = e.code
            raise err from None

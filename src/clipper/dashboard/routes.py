"""The dashboard's routes on the admin port (docs/dashboard.md).

* ``GET /dashboard`` (or ``/dashboard/``): the page; ``/dashboard/dashboard.js``,
  ``/dashboard/dashboard.css`` and ``/dashboard/plotly-<version>.min.js``: what it loads;
  ``/dashboard/auth``: whether a token is needed. These hold no data, and a browser cannot send
  a bearer token when it loads a page: they are served without one.
* ``GET /dashboard/events``: the live data, as server-sent events (a ``snapshot`` of the whole
  history first, then a ``sample`` per interval, and a ``state`` as soon as a replica connects
  or leaves); ``GET /dashboard/state``: the snapshot as one
  JSON document. Both need the admin API's bearer token when one is configured: the page asks
  for it, keeps it in the tab's ``sessionStorage`` and sends it in an ``Authorization`` header
  (it reads the stream with ``fetch``, not ``EventSource``, which cannot send headers), so the
  token never appears in a URL, a log or the browser's history.

With no token configured the admin port is on loopback; the dashboard then also refuses a
request whose ``Host`` is not a loopback name (403): a web page whose name an attacker rebinds
to 127.0.0.1 cannot read it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from clipper.dashboard.assets import Assets, load_assets
from clipper.dashboard.events import EventHub, encode_event
from clipper.dashboard.history import History
from clipper.dashboard.sampler import Sampler
from clipper.dashboard.state import DecisionOf
from clipper.errors import ConfigError
from clipper.frontend.http import JSON, Respond, StreamingRespond
from clipper.frontend.routes import Authorize

if TYPE_CHECKING:
    from clipper.clock import Clock, TimerHandle
    from clipper.managers.base import ContainerManager
    from clipper.metrics import Metrics
    from clipper.metrics_window import MetricsWindow
    from clipper.query.selection import Selection
    from clipper.runtime.catalog import Catalog

__all__ = ["PREFIX", "Dashboard"]

log = logging.getLogger("clipper.dashboard")

PREFIX = "/dashboard"
_EVENTS = b"text/event-stream; charset=utf-8\r\nX-Accel-Buffering: no"
_HTML = b"text/html; charset=utf-8"
# Series beyond which a new one is not recorded (docs/dashboard.md): an application has 4, plus
# one per default reason seen and per linked model under a policy; a model version has 6, plus
# 2 in a traffic split or 3 as a shadow. So hundreds of each fit.
MAX_SERIES = 4000
# What one client may hold unsent before it is dropped: several snapshots' worth.
MAX_CLIENT_BUFFER = 8 * 2**20


def _error(error: str, cause: str) -> bytes:
    return orjson.dumps({"error": error, "cause": cause})


def loopback_host(host: bytes | None) -> bool:
    """Whether a ``Host`` header names this machine by a loopback name or address."""
    if not host:
        return False
    name = host.decode("latin-1").strip().lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Dashboard:
    """Samples the frontend (:class:`Sampler`), keeps the history, serves the page and its
    streams. Its owner calls :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        *,
        clock: Clock,
        metrics: Metrics,
        catalog: Catalog,
        manager: ContainerManager,
        selection: Callable[[str], Selection | None],
        interval_s: float = 1.0,
        history_s: float = 300.0,
        max_clients: int = 8,
        token_required: bool = False,
        max_client_buffer: int = MAX_CLIENT_BUFFER,
        load: Callable[[], Assets] = load_assets,
        window: MetricsWindow | None = None,
        decisions: DecisionOf | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ConfigError(f"the dashboard's sample interval must be > 0 s, got {interval_s}")
        capacity = round(history_s / interval_s)
        self.clock = clock
        self.interval_s = interval_s
        self.history = History(max(capacity, 2), MAX_SERIES)
        self.sampler = Sampler(
            clock=clock, metrics=metrics, catalog=catalog,
            manager=manager, selection=selection, history=self.history, interval_s=interval_s,
            window=window, decisions=decisions,
        )  # fmt: skip
        self.hub = EventHub(max_clients=max_clients, max_buffer_bytes=max_client_buffer)
        self.sampler.on_sample = self._publish
        self.token_required = token_required
        self._load = load
        self._assets: Assets | None = None
        self._loading: asyncio.Task[None] | None = None
        self._waiting: list[tuple[str, Mapping[bytes, bytes], Respond]] = []
        self._state_push: TimerHandle | None = None

    def start(self) -> None:
        self.sampler.start()

    async def stop(self) -> None:
        """Stop sampling, close every stream, and wait for an asset load under way."""
        self.sampler.stop()
        if self._state_push is not None:
            self._state_push.cancel()
            self._state_push = None
        self.hub.close_all()
        task, self._loading = self._loading, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for name, _, respond in self._waiting:
            respond(503, _error("Service Unavailable", "the frontend is stopping"), JSON)
            log.debug("dashboard request for %r answered 503 at stop", name)
        self._waiting.clear()

    # -- data ------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The whole history and the current state (the first event of a stream)."""
        return {
            "interval_s": self.interval_s,
            "capacity": self.history.capacity,
            "now": self.clock.now(),
            "refused_series": self.history.refused_series,
            "history": self.history.snapshot(),
            "state": self.sampler.state,
            "decisions": list(self.sampler.decisions),
        }

    def _publish(self, doc: dict[str, Any]) -> None:
        if len(self.hub):
            self.hub.publish(encode_event("sample", doc))

    def replicas_changed(self) -> None:
        """A replica connected or left (its process exited, it was stopped): push the state
        at once, not at the next sample, so that a replica that restarts in less than an
        interval is still seen restarting. Changes in one loop turn make one event."""
        if self._state_push is None and not self.hub.closed:
            self._state_push = self.clock.call_later(0.0, self._push_state)

    def _push_state(self) -> None:
        self._state_push = None
        if len(self.hub):
            self.hub.publish(encode_event("state", {"state": self.sampler.refresh_state()}))

    # -- routes ----------------------------------------------------------------------------------
    def route(
        self,
        method: bytes,
        path: str,
        headers: Mapping[bytes, bytes],
        respond: Respond,
        authorize: Authorize,
    ) -> None:
        """A request for ``/dashboard`` or below; ``authorize`` is the admin API's token check
        (it answers the refusal itself and returns False)."""
        if not self.token_required and not loopback_host(headers.get(b"host")):
            respond(403, _error("Forbidden", (
                "with no admin token configured the dashboard answers only requests to a "
                "loopback name (127.0.0.1, localhost, [::1]); set --admin-token to serve it "
                "under another name"
            )), JSON)  # fmt: skip
            return
        name = path[len(PREFIX) :].lstrip("/")
        if method != b"GET":
            respond(405, _error("Method Not Allowed", f"use GET {path}"), JSON)
            return
        if name == "auth":  # what the page asks first: whether to ask for a token
            respond(200, orjson.dumps({"token_required": self.token_required}), JSON)
            return
        if name in ("events", "state"):
            if not authorize(headers, respond):
                return
            if name == "state":
                respond(200, orjson.dumps(self.snapshot()), JSON)
            else:
                self._open_stream(respond)
            return
        if self._assets is None:
            self._waiting.append((name, headers, respond))
            if self._loading is None:
                self._loading = asyncio.get_running_loop().create_task(self._load_assets())
            return
        self._serve_asset(name, headers, respond)

    def _open_stream(self, respond: Respond) -> None:
        if not isinstance(respond, StreamingRespond):
            respond(501, _error("Not Implemented", "this server cannot stream"), JSON)
            return
        if self.hub.closed:
            respond(503, _error("Service Unavailable", "the frontend is stopping"), JSON)
            return
        if self.hub.full:
            self.hub.refused += 1
            respond(503, _error("Service Unavailable", (
                f"the dashboard already serves {self.hub.max_clients} live streams "
                "(dashboard_max_clients): close another dashboard tab, or raise "
                "--dashboard-max-clients"
            )), JSON)  # fmt: skip
            return
        stream = respond.stream(200, _EVENTS)
        self.hub.attach(stream, encode_event("snapshot", self.snapshot()))

    async def _load_assets(self) -> None:
        try:
            self._assets = await asyncio.to_thread(self._load)
        except Exception as e:
            log.exception("the dashboard's files could not be read")
            self._assets = Assets({}, f"the dashboard's files could not be read: {e}")
        waiting, self._waiting = self._waiting, []
        for name, headers, respond in waiting:
            self._serve_asset(name, headers, respond)

    def _serve_asset(self, name: str, headers: Mapping[bytes, bytes], respond: Respond) -> None:
        assets = self._assets
        assert assets is not None
        if assets.missing is not None:
            page = (
                "<!doctype html><meta charset='utf-8'><title>clipper-serve dashboard</title>"
                f"<p>The dashboard is not available: {assets.missing}.</p>"
            )
            respond(503, page.encode(), _HTML)
            return
        asset = assets.files.get(name)
        if asset is None:
            respond(404, _error("Not found", (
                f"no dashboard file {name!r}; the page is GET {PREFIX}, its data "
                f"GET {PREFIX}/events (server-sent events) or GET {PREFIX}/state"
            )), JSON)  # fmt: skip
            return
        body, content_type = asset.encoded(headers.get(b"accept-encoding"))
        respond(200, body, content_type)

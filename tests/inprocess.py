"""In-process HTTP for tests: drive a router callable as the HTTP server does, with no socket.

:class:`RouterClient` is to :mod:`clipper.frontend.http` what starlette's ``TestClient`` is to
an ASGI app: ``await client.post("/app/predict", json={...})`` builds what
``_Connection.on_message_complete`` builds from a parsed request (lower-cased header names,
the path without its query string, the query string under the ``:query`` pseudo-header, the
body-size limit answered 413 before any route runs), calls the router with a ``respond``
callback, and returns once ``respond`` has been called: synchronously, or later from a task or
a replica's callback (admin operations, predictions), bounded by a timeout. A
:class:`~clipper.errors.RequestError` raised by the router is rendered as the server renders it
(:func:`clipper.frontend.http.error_body`); any other exception is re-raised into the test
(``raise_server_exceptions=False`` answers 500 as the server does instead).

:func:`in_process_frontend` starts a :class:`~clipper.server.Clipper` on port 0 and hands back
a client over each of its two routers, the very objects its HTTP servers call.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from clipper.errors import PayloadTooLarge, RequestError
from clipper.frontend.http import JSON, HttpServer, Router, error_body
from clipper.server import Clipper

__all__ = [
    "InProcessFrontend",
    "RouterClient",
    "RouterResponse",
    "build_request",
    "in_process_frontend",
]

DEFAULT_LIMIT_S = 10.0
HOST = "testserver"  # the Host header a request carries, as starlette's TestClient sends


@dataclass(frozen=True, slots=True)
class RouterResponse:
    """What the router answered: ``respond(status, body, content_type)``, as the client of a
    real server would read it (``headers`` has lower-cased names, ``content-type`` and
    ``content-length`` always, and the further header lines a route put after the content
    type, such as V2's ``inference-header-content-length``)."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers["content-type"]

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return orjson.loads(self.body)


def _response(status: int, data: bytes, content_type: bytes, extra: bytes = b"") -> RouterResponse:
    # The server writes the content type verbatim into its head: further header lines follow
    # it, CRLF-separated, and then the extra header lines (see clipper.frontend.http.Respond).
    first, *rest = content_type.decode("latin-1").split("\r\n")
    rest += [line for line in extra.decode("latin-1").split("\r\n") if line]
    headers = {"content-type": first, "content-length": str(len(data))}
    for line in rest:
        name, sep, value = line.partition(":")
        assert sep, f"a header line after the content type has no ':': {line!r}"
        headers[name.strip().lower()] = value.strip()
    return RouterResponse(status, headers, bytes(data))


def build_request(
    target: str, headers: Mapping[str, str] | None, body: bytes
) -> tuple[str, dict[bytes, bytes]]:
    """The router's ``path`` and ``headers`` for a request line's ``target`` (path and query
    string), as ``_Connection.on_message_complete`` builds them: header names lower-cased
    (repeated names joined with ", ", as RFC 9110 says), values as sent; ``:query`` holds the
    bytes after the first ``?`` (present, possibly empty, whenever the target has a ``?``). A
    body comes with
    its ``content-length`` and every request with a ``host``, as an HTTP/1.1 client sends."""
    out: dict[bytes, bytes] = {b"host": HOST.encode()}
    if body:
        out[b"content-length"] = str(len(body)).encode()
    for name, value in (headers or {}).items():
        if name.startswith(":"):
            raise ValueError(f"{name!r}: no client can send a header whose name starts with ':'")
        key, raw = name.lower().encode("latin-1"), value.encode("latin-1")
        out[key] = raw if key not in out or key == b"host" else out[key] + b", " + raw
    url = target.encode("utf-8")
    q = url.find(b"?")
    path = (url if q < 0 else url[:q]).decode("utf-8", "replace")
    if q >= 0:
        out[b":query"] = url[q + 1 :]
    return path, out


@dataclass(slots=True)
class RouterClient:
    """Requests to a router callable in process; see the module's docstring.

    ``max_body_bytes`` is the server's body limit (``None``: no limit);
    :meth:`for_server` takes the router and the limit of an :class:`HttpServer`.
    ``double_responds`` collects the answers a router gave after its first one for the same
    request (the server drops them; a router must call ``respond`` exactly once)."""

    router: Router
    max_body_bytes: int | None = None
    limit_s: float = DEFAULT_LIMIT_S
    raise_server_exceptions: bool = True
    double_responds: list[tuple[str, RouterResponse]] = field(default_factory=list)

    @classmethod
    def for_server(cls, server: HttpServer, **options: Any) -> RouterClient:
        return cls(server.router, server.max_body_bytes, **options)

    async def get(
        self, path: str, *, headers: Mapping[str, str] | None = None, limit_s: float | None = None
    ) -> RouterResponse:
        return await self.request("GET", path, headers=headers, limit_s=limit_s)

    async def post(
        self,
        path: str,
        *,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        limit_s: float | None = None,
    ) -> RouterResponse:
        return await self.request(
            "POST", path, json=json, body=body, headers=headers, limit_s=limit_s
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        limit_s: float | None = None,
    ) -> RouterResponse:
        """Call the router and wait (at most ``limit_s``) for its ``respond``; raises
        :class:`TimeoutError` naming the request when it never answers."""
        if json is not None and body is not None:
            raise ValueError("pass json= or body=, not both")
        all_headers = dict(headers or {})
        if json is not None:
            body = orjson.dumps(json)
            all_headers.setdefault("Content-Type", "application/json")
        data = body or b""
        route_path, route_headers = build_request(path, all_headers, data)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[RouterResponse] = loop.create_future()
        loop_thread = threading.get_ident()
        what = f"{method} {path}"

        def respond(
            status: int, data: bytes, content_type: bytes = JSON, extra: bytes = b"", /
        ) -> None:
            if threading.get_ident() != loop_thread:
                err = AssertionError(f"{what}: respond() was called off the event loop's thread")
                loop.call_soon_threadsafe(_settle_exception, answer, err)
                return
            resp = _response(status, data, content_type, extra)
            if answer.done():
                self.double_responds.append((what, resp))
                return
            answer.set_result(resp)

        limit = self.max_body_bytes
        if limit is not None and len(data) > limit:
            # The server answers before any route runs, from Content-Length or the body read.
            err = PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            respond(err.status, error_body(err), JSON)
        else:
            try:
                # As the server does: t0 is when the request arrived (here: when it is sent).
                t0 = time.monotonic()
                self.router(method.encode(), route_path, route_headers, data, respond, t0=t0)
            except RequestError as err:
                if not answer.done():
                    respond(err.status, error_body(err), JSON, err.headers)
            except Exception:
                if self.raise_server_exceptions:
                    raise
                if not answer.done():
                    respond(500, b"An unexpected error occurred!", b"text/plain")
        limit_s = self.limit_s if limit_s is None else limit_s
        try:
            async with asyncio.timeout(limit_s):
                return await asyncio.shield(answer)
        except TimeoutError:
            raise TimeoutError(f"{what}: the router did not respond within {limit_s} s") from None


def _settle_exception(fut: asyncio.Future[RouterResponse], err: BaseException) -> None:
    if not fut.done():
        fut.set_exception(err)


@dataclass(frozen=True, slots=True)
class InProcessFrontend:
    """A started frontend, and a :class:`RouterClient` over each of its ports' routers."""

    clipper: Clipper
    query: RouterClient
    admin: RouterClient


@contextlib.asynccontextmanager
async def in_process_frontend(**settings: Any) -> AsyncIterator[InProcessFrontend]:
    """``Clipper(query_port=0, rpc_port=0, admin_port=0, **settings)``, started, with clients
    over the routers its two HTTP servers call; stopped on exit, after checking that no route
    answered a request twice."""
    ports = {"query_port": 0, "rpc_port": 0, "admin_port": 0}
    async with Clipper(**{**ports, **settings}) as c:
        fe = InProcessFrontend(
            c, RouterClient.for_server(c.http), RouterClient.for_server(c.admin_http)
        )
        yield fe
        doubles = fe.query.double_responds + fe.admin.double_responds
        assert not doubles, f"routes called respond() more than once: {doubles}"

"""The admin API (port 1338): the original Clipper management routes, and extensions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clipper.errors import NotFoundError
from clipper.frontend.http import Respond

if TYPE_CHECKING:
    from clipper.server import Clipper

__all__ = ["AdminApi"]


class AdminApi:
    def __init__(self, clipper: Clipper) -> None:
        self.clipper = clipper

    def route(
        self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes, respond: Respond
    ) -> None:
        if method == b"GET" and path.rstrip("/") == "/admin/ping":
            respond(200, b"PONG", b"text/plain")
            return
        raise NotFoundError(f"no admin route for {method.decode()} {path}")

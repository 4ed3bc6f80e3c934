"""The files the dashboard page is made of: its own HTML, script and style (package data of
``clipper.dashboard``, shipped in the wheel as they are: no build step), and plotly.js, the
charting library, served unmodified from the ``plotly`` Python package (the ``dashboard``
extra) where that package keeps it (``plotly/package_data/plotly.min.js``).

Reading and compressing plotly.js (about 5 MB, 1.5 MB gzipped) takes a fraction of a second:
:func:`load_assets` blocks, and runs in a thread on the first request for the page.
"""

from __future__ import annotations

import gzip
import importlib.util
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

__all__ = ["Asset", "Assets", "load_assets"]

_PLOTLY_VERSION = re.compile(rb"plotly\.js v([0-9][0-9A-Za-z.+-]{0,40})")

# The page runs only scripts from this port; plotly.js writes <style> elements and inline
# style attributes (hence 'unsafe-inline' for styles only). No frames, forms or plugins.
_CSP = (
    b"default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    b"img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
    b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
_PAGE_HEADERS = (
    b"\r\nCache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n"
    b"Referrer-Policy: no-referrer\r\nContent-Security-Policy: " + _CSP
)
_FOREVER = b"\r\nCache-Control: public, max-age=31536000, immutable\r\nVary: Accept-Encoding"
_JS = b"text/javascript; charset=utf-8"

INSTALL_HINT = (
    "the dashboard draws its plots with plotly.js, from the plotly Python package, which is "
    "not installed: pip install 'clipper-serve[dashboard]' (or pip install plotly), then "
    "restart the frontend"
)


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: bytes  # with the further header lines the response carries
    gzipped: bytes | None = None  # sent to clients that accept gzip

    def encoded(self, accept_encoding: bytes | None) -> tuple[bytes, bytes]:
        """(body, content type and header lines) for a client's Accept-Encoding."""
        if self.gzipped is not None and accept_encoding is not None and b"gzip" in accept_encoding:
            return self.gzipped, self.content_type + b"\r\nContent-Encoding: gzip"
        return self.body, self.content_type


@dataclass(frozen=True, slots=True)
class Assets:
    """Path (under ``/dashboard/``) -> asset; ``missing`` says why there is no page."""

    files: dict[str, Asset]
    missing: str | None = None


def plotly_js() -> tuple[Path, str] | None:
    """Where the installed plotly package keeps plotly.min.js, and its version; None when
    plotly is not installed (found without importing it)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "package_data" / "plotly.min.js"
        if path.is_file():
            with path.open("rb") as f:
                found = _PLOTLY_VERSION.search(f.read(512))
            return path, found.group(1).decode() if found else "unknown"
    return None


def load_assets() -> Assets:
    """Read the page's files (blocking: call it in a thread)."""
    static = files("clipper.dashboard") / "static"
    js = plotly_js()
    if js is None:
        return Assets({}, INSTALL_HINT)
    path, version = js
    script = f"plotly-{version}.min.js"
    body = path.read_bytes()
    page = (static / "index.html").read_bytes().replace(b"{{PLOTLY_JS}}", script.encode())
    return Assets(
        {
            "": Asset(page, b"text/html; charset=utf-8" + _PAGE_HEADERS),
            "dashboard.js": Asset((static / "dashboard.js").read_bytes(), _JS + _PAGE_HEADERS),
            "dashboard.css": Asset(
                (static / "dashboard.css").read_bytes(), b"text/css; charset=utf-8" + _PAGE_HEADERS
            ),
            # Versioned name: a browser keeps it until plotly is upgraded.
            script: Asset(body, _JS + _FOREVER, gzip.compress(body, compresslevel=6, mtime=0)),
        }
    )

"""Bridges to the original Clipper's tooling (optional extras).

``clipper.compat.clipper_admin.LocalClipperManager`` lets the original ``clipper_admin``
package (``pip install 'clipper-serve[clipper-admin-compat]'``) drive a clipper-serve frontend.
It is imported on first use, so ``clipper.compat`` itself needs nothing extra.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LocalClipperManager"]


def __getattr__(name: str) -> Any:
    if name == "LocalClipperManager":
        from clipper.compat.clipper_admin import LocalClipperManager

        return LocalClipperManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The package's version and where its source lives: what lower modules need of the package
root, without importing it (``clipper/__init__`` re-exports ``__version__``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["IMPORT_ROOT", "__version__"]

__version__ = "0.1.0"

# The directory that holds the clipper package: on a child process's PYTHONPATH, it imports this
# same clipper, installed or not.
IMPORT_ROOT = str(Path(__file__).resolve().parent.parent)

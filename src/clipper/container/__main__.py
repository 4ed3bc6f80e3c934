"""``python -m clipper.container``: run a model container (see :mod:`clipper.container.runtime`)."""

from __future__ import annotations

import sys

from clipper.container.runtime import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())

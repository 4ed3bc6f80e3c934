"""``python -m clipper.container``: run a model container (see :mod:`clipper.container.runtime`),
or with ``--pool`` a pool process that holds many (:mod:`clipper.container.pool`)."""

from __future__ import annotations

import sys

__all__: list[str] = []

if __name__ == "__main__":
    if "--pool" in sys.argv[1:]:
        from clipper.container.pool import pool_main

        sys.exit(pool_main(sys.argv[1:]))
    from clipper.container.runtime import main

    sys.exit(main())

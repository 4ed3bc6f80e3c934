"""``python -m clipper`` is the ``clipper`` command."""

import sys

from clipper.cli import main

sys.exit(main())

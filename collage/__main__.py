"""``python -m collage``: the ``collage`` command (``collage/cli.py``)."""

import sys

from collage.cli import main

sys.exit(main())

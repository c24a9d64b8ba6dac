"""``python -m nri_balloons_demo [NAME] [--list] [--keep]``: the ``demo`` command."""

import sys

from nri_balloons_demo.harness import main

raise SystemExit(main(sys.argv[1:]))

"""The balloons policy's unit tests: puts this directory on ``sys.path`` so the
test modules import their shared helper modules (:mod:`pct_helpers`, the in-process
SST helper of the PCT tests) by name, as ``--import-mode=importlib`` does not."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

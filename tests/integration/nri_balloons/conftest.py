"""Upstream's balloons e2e tests through the runtime simulator: the helper
module :mod:`balloons_e2e` sits next to this file."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

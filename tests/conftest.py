"""Every tier: progress lines of long first-run steps go to the terminal live
(:mod:`_progress`), around pytest's output capture; a module's shared temp
trees go when the module is done (:mod:`_scratch`)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from _progress import pytest_configure, pytest_unconfigure  # noqa: E402
from _scratch import module_tmp  # noqa: E402

__all__ = ["module_tmp", "pytest_configure", "pytest_unconfigure"]

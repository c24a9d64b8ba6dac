"""Fixtures shared by the framework's unit tests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest


def _python_lines(code: str, *argv: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (``argv`` its arguments); the lines it
    printed with an ``OUT `` prefix (at least one: else its stderr is shown)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [x[4:] for x in out.stdout.splitlines() if x.startswith("OUT ")]
    assert lines, out.stderr[-3000:]
    return lines


@pytest.fixture
def python_lines() -> Callable[..., list[str]]:
    """:func:`_python_lines`: a fresh interpreter's ``OUT`` lines."""
    return _python_lines

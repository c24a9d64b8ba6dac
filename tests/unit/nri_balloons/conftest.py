"""Unit tests of the balloons policy: the helper module :mod:`topologies` sits next
to this file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import topologies  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _cleanup_topologies() -> Iterator[None]:
    yield
    topologies.cleanup()

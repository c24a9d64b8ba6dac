"""The balloons policy's unit tests: puts this directory on ``sys.path`` so the
test modules import their shared helper modules by name (:mod:`topologies`,
:mod:`pct_helpers` with the in-process SST helper of the PCT tests,
:mod:`config_checks`), as ``--import-mode=importlib`` does not."""

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

"""The balloons policy's unit tests: puts this directory on ``sys.path`` so the
test modules import their shared helper modules by name (:mod:`topologies`,
:mod:`pct_helpers` with the in-process SST helper of the PCT tests,
:mod:`config_checks`), as ``--import-mode=importlib`` does not."""

from __future__ import annotations

import logging
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


@pytest.fixture(scope="module", autouse=True)
def _logger_levels() -> Iterator[None]:
    """A configuration's ``log.debug`` sets the level of process-wide loggers
    (``policy``, ``cpuclass``, ``nri_framework``) and a test's plugin is not
    shut down: put them back after each module (set up before the module's own
    fixtures, which may start a plugin), so what a later module's log capture
    sees does not depend on the order the modules ran in."""
    from nri_balloons.plugin import ALL_LOGGERS

    saved = {name: logging.getLogger(name).level for name in ALL_LOGGERS}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)

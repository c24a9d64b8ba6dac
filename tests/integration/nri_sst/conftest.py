"""Fixtures of the helper's integration tests: a Xeon 6776P host root (written
once per session) and a running helper; :mod:`helper_process` and
:mod:`hostile` (beside this file) start the helper and attack it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nri_framework.simulate.sysfs import write_topology

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from helper_process import Helper, start_helper, stop_helper  # noqa: E402


@pytest.fixture(scope="session")
def host_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Xeon 6776P sysfs (only read by the helper tests)."""
    return write_topology(tmp_path_factory.mktemp("xeon") / "host", "xeon-6776p")


@pytest.fixture
def helper(host_root: Path, tmp_path: Path) -> Iterator[Helper]:
    h = start_helper(host_root, tmp_path)
    yield h
    stop_helper(h)

"""Fixtures of the runtime simulator's integration tests (a short socket directory, a
runtime factory); puts this directory on ``sys.path`` for :mod:`runtime_peers`.

Where the neighbouring test modules are: see :mod:`runtime_peers`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nri_framework.simulate.runtime import SimulatedRuntime

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from runtime_peers import MakeRuntime  # noqa: E402


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (unix socket paths are limited to 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="nri-sim-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def make_runtime(sock_dir: Path) -> AsyncIterator[MakeRuntime]:
    started: list[SimulatedRuntime] = []

    async def make(**kw: Any) -> SimulatedRuntime:
        rt = SimulatedRuntime(sock_dir / "nri.sock", **kw)
        await rt.start()
        started.append(rt)
        return rt

    yield make
    for rt in started:
        await rt.stop()

"""Temp trees shared by one module's tests, gone when the module is done."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def module_tmp(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A directory for one module's shared fixtures, removed when the module's
    tests are done unless one of them failed. pytest's own ``tmp_path_factory``
    keeps every directory to the session's end: a 6776P sysfs tree is ~29k
    files (~120 MB of tmpfs), one per module, and a unit tier held 1.7 GB of
    /dev/shm at once, two tiers beside each other more than the CI machine had."""
    failed = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2][:24])
    yield path
    if request.session.testsfailed == failed:
        shutil.rmtree(path, ignore_errors=True)

"""The images tier (``tox -e images``, root): both images of ``docker/`` built here.

* ``images`` (session): ``{"plugin": archive, "sst-helper": archive}`` from
  :func:`build.build_images` (cached; a warm run builds nothing). A build that
  cannot run goes through ``_tier.unavailable("images", ...)``: a loud skip,
  or a failure under CI / ``NRI_IMAGES_REQUIRED=1``.

Every test here carries the ``images`` marker.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
for _p in (_HERE, _HERE.parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import _tier  # noqa: E402
from _progress import sayer  # noqa: E402
from builder import ImagesError, build_images, cache_dir  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "images: builds the docker/ images (root; tox -e images)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(_HERE):
            item.add_marker(pytest.mark.images)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    _tier.summary(terminalreporter)


@pytest.fixture(scope="session")
def images_cache() -> Path:
    return cache_dir()


@pytest.fixture(scope="session")
def images(images_cache: Path) -> dict[str, Path]:
    t0 = time.monotonic()
    try:
        out = build_images(images_cache, say=sayer("[images]"))  # live: tests/_progress.py
    except (ImagesError, OSError, subprocess.SubprocessError) as e:
        _tier.unavailable("images", f"cannot build the images into {images_cache}: {e}",
                          "NRI_IMAGES_REQUIRED")  # fmt: skip
    print(f"\n[images] ready in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return out

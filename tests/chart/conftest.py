"""Shared helpers for the chart tier (``tox -e chart``): render the chart
offline with the Helm Go SDK (helm-python-sdk) and load its CRDs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

import _tier  # noqa: E402

#: the chart tier's own "required" switch (tox -e chart sets it; CI=true implies it)
REQUIRED = "NRI_CHART_TESTS_REQUIRED"
# Only ``tox -e chart`` installs these; elsewhere (a plain ``pytest tests``) the
# chart tests that need them are not collected and test_chart_tier.py says so
# loudly (a failure under CI or NRI_CHART_TESTS_REQUIRED=1); the Dockerfile tests
# still run.
NEEDED = ("helm_python", "kubernetes_validate", "jsonschema")
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]
if MISSING:
    collect_ignore = ["test_chart_render.py", "test_chart_crds.py"]

from .rendering import (  # noqa: E402  (one home: tests/chart/rendering.py)
    CHART,
    NAME,
    NAMESPACE,
    RELEASE,
    ROOT,
    container,
    crd,
    find,
    render,
    set_values,
)

__all__ = ["CHART", "NAME", "NAMESPACE", "RELEASE", "ROOT", "container", "crd", "find",
           "render", "set_values"]  # fmt: skip


@pytest.fixture(scope="session")
def default_docs() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="session")
def pct_docs() -> list[dict[str, Any]]:
    # helm install ... --set allowPCT=true
    return render(set_values("allowPCT=true"))


@pytest.fixture(scope="session")
def balloons_crd() -> dict[str, Any]:
    return crd("config.nri_balloonspolicies.yaml")


@pytest.fixture(scope="session")
def nrt_crd() -> dict[str, Any]:
    return crd("noderesourcetopology.yaml")


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # type: ignore[no-untyped-def]
    _tier.summary(terminalreporter)

"""Shared helpers for the chart tier (``tox -e chart``): render the chart
offline with the Helm Go SDK (helm-python-sdk) and load its CRDs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

# Only ``tox -e chart`` installs these; elsewhere (a plain ``pytest tests``)
# the chart tests that need them are not collected, the Dockerfile tests still run.
_NEEDED = ("helm_python", "kubernetes_validate", "jsonschema")
if all(importlib.util.find_spec(m) for m in _NEEDED):
    pass
elif os.environ.get("NRI_CHART_TESTS_REQUIRED"):  # set by tox -e chart
    raise ImportError(f"tox -e chart needs {', '.join(_NEEDED)}")
else:  # pragma: no cover
    collect_ignore = ["test_chart_render.py", "test_chart_crds.py", "test_chart_kubectl.py"]

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

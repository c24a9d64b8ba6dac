"""The chart tier's prerequisites: present, or a loud skip (a failure under
``CI=true`` or ``NRI_CHART_TESTS_REQUIRED=1``, which ``tox -e chart`` sets)."""

from __future__ import annotations

import _tier

from .conftest import MISSING, REQUIRED


def test_chart_tier_prerequisites() -> None:
    if MISSING:
        _tier.unavailable(
            "chart",
            f"{', '.join(MISSING)} not installed: the chart render and CRD tests were not "
            "collected (pip install helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 "
            "jsonschema pyyaml, or tox -e chart)",
            REQUIRED,
        )

"""The chart rendered offline with the Helm Go SDK (helm-python-sdk), as ``helm
template`` would: one home for the chart tier and for the k8s tier, which serves
the rendered objects to the real kubectl (``tests/k8s/test_spec_kubectl.py``).

Needs ``helm_python`` (imported on first use) and pyyaml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "nri-resource-policy-balloons"
RELEASE = "nri-resource-policy-balloons"
NAMESPACE = "kube-system"
NAME = "nri-resource-policy-balloons"


def render(
    values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """Every object of ``helm template`` with ``values`` (the crds/ are not part of it)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    docs: list[dict[str, Any]] = []
    for _name, text in sorted(out.items()):
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def set_values(*exprs: str) -> dict[str, Any]:
    """``--set a=b --set c=d`` as a values dict (Helm's own parser)."""
    import helm_python as helm

    values: dict[str, Any] = {}
    for expr in exprs:
        values = _merge(values, helm.parse_set_string(expr))
    return values


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(hits) == 1, f"expected one {kind} {name or ''}, got {len(hits)}"
    return hits[0]


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    hits = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(hits) == 1, f"expected one container {name}"
    return hits[0]


def crd(filename: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / "crds" / filename).read_text())

"""The chart's Grafana dashboard as the tests read it: one home for the chart
tier (its shape) and the integration tier (its metric names against a real
``/metrics`` scrape of the plugin).

:func:`metric_names` takes the metric names out of a PromQL expression the
way PromQL reads them: what is left after removing strings, label matchers
(``{...}``), range and subquery selectors (``[...]``), grouping clauses
(``by (...)``, ``on (...)``, ...), Grafana variables (``$x``, ``${x}``),
function calls and keywords. Stdlib only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = (
    Path(__file__).resolve().parents[1]
    / "charts"
    / "nri-resource-policy-balloons"
    / "dashboards"
    / "nri-resource-policy-balloons.json"
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"and", "or", "unless", "offset", "bool", "inf", "nan"}
)
# label_values(metric, label): the template variables' queries
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$")


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects (histogram series keep their suffix)."""
    mt = _LABEL_VALUES.match(expr)
    if mt:
        expr = mt.group(1)
    text = _VARIABLE.sub(" ", _STRING.sub('""', expr))
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for found in _IDENT.finditer(text):
        name = found.group(0)
        rest = text[found.end() :].lstrip()
        before = text[: found.start()]
        if rest.startswith("(") or name.lower() in _KEYWORDS:
            continue  # a function call or a keyword
        if before and (before[-1].isdigit() or before[-1] == "."):
            continue  # part of a number (1e3)
        names.add(name)
    return names


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(where, PromQL)`` of every panel target and every template query."""
    out = []
    for panel in dashboard.get("panels", []):
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            out.append((f"variable {var['name']!r}", query if isinstance(query, str) else ""))
    return out

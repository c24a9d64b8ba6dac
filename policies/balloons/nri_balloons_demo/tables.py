"""The spec's tables, printed as its commands print them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

BUSY_MHZ = "nri_policy_balloons_busy_mhz"
CLOS_MIN_MHZ = "nri_policy_balloons_clos_min_mhz"
CLOS_MAX_MHZ = "nri_policy_balloons_clos_max_mhz"


class BusyRow(NamedTuple):
    balloon: str
    cpus: str
    mhz: float
    source: str


def frequency_metrics(text: str) -> tuple[list[BusyRow], dict[str, dict[int, tuple[float, float]]]]:
    """From a ``/metrics`` text: each balloon's busy MHz, and each punit's
    (``pkg/punit``) CLOS -> (min, max) MHz."""
    busy: list[BusyRow] = []
    lows: dict[tuple[str, int], float] = {}
    highs: dict[tuple[str, int], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            lb = s.labels
            if s.name == BUSY_MHZ:
                busy.append(BusyRow(lb["balloon"], lb["cpus"], s.value, lb["source"]))
            elif s.name in (CLOS_MIN_MHZ, CLOS_MAX_MHZ):
                key = (f"{lb['package']}/{lb['punit']}", int(lb["clos"]))
                (lows if s.name == CLOS_MIN_MHZ else highs)[key] = s.value
    clos: dict[str, dict[int, tuple[float, float]]] = {}
    for (punit, n), low in sorted(lows.items()):
        clos.setdefault(punit, {})[n] = (low, highs.get((punit, n), 0.0))
    return busy, clos


def nrt_tables(state: dict[str, Any]) -> tuple[list[list[str]], list[list[str]]]:
    """The two jq tables of spec step 6.5 from the plugin's zones."""
    balloons: list[list[str]] = []
    containers: list[list[str]] = []
    node = "node-0"
    for z in state.get("zones", []):
        attrs = {a["name"]: a["value"] for a in z.get("attributes", [])}
        if z["type"] == "balloon":
            balloons.append([node, z["name"], attrs.get("cpuset", "")])
        elif z["type"] == "allocation for container":
            containers.append([node, z.get("parent", ""), z["name"], attrs.get("cpuset", "")])
    return balloons, containers


def print_tsv(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def get_assoc_lines(clos: dict[int, int]) -> Iterator[str]:
    """``intel-speed-select core-power get-assoc`` style."""
    for cpu in sorted(clos):
        yield f"  cpu-{cpu}  clos:{clos[cpu]}"

"""The spec's tables, printed as its commands print them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


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

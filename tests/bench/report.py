"""The one table of ``tox -e bench``: every performance target beside what was
measured now.

Reads the figures the bench scripts wrote to ``$NRI_BENCH_OUT`` (see
``_results.py``) and prints each figure that has a target: ``ok`` when the
measured value is within it, ``over`` when not. Being over a target is
reported, not failed: the exit code is 0 then. It is 1 only when a figure the
project has a target for is missing (its bench crashed or was not run), so a
broken benchmark does not go unnoticed. A figure with a base (the Go floor's
value, ``bench_floor.py``) shows its ratio to it beside the value; a bench that
could not set itself up outside CI (``_tier.unavailable``) writes a document
with ``skipped``: its figures show as ``skipped``, not missing.

    python tests/bench/report.py [DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from _results import ENV, Figure, read

#: The targets of the project (key -> where it is measured); every one must
#: have a figure. A bench may report more targets than these (a new PCT
#: row, say): they are shown too, after these.
EXPECTED = {
    "nri.create_rt_p50": ("bench_nri.py", "pinner: CreateContainer round trip p50"),
    "nri.create_rt_p99": ("bench_nri.py", "pinner: CreateContainer round trip p99"),
    "nri.sync_1000": ("bench_nri.py", "pinner: Synchronize of 1000 containers"),
    "balloons.decision_p99": ("bench_balloons.py", "balloons decision p99"),
    "balloons.rt_p99": ("bench_balloons.py", "balloons round trip p99"),
    "balloons.decision_p99_journal": ("bench_balloons.py", "balloons decision p99, journaled"),
    "balloons.sync_1000": ("bench_balloons.py", "balloons Synchronize of 1000 containers"),
    "balloons.plugin_rss": ("bench_balloons.py", "plugin RSS"),
    "cputree.resize_p50_256cpus_target": ("bench_cputree.py", "CPU tree resize at 256 CPUs"),
    "cputree.growth_4096_vs_256": ("bench_cputree.py", "CPU tree resize growth to 4096"),
    "sst.rt_sync_p50": ("bench_sst.py", "helper round trip p50"),
    "sst.associate_256_p50": ("bench_sst.py", "AssociateCpus of 256 CPUs"),
    "sst.helper_rss": ("bench_sst.py", "helper RSS"),
    "sst.flood_rt_p99": ("bench_sst.py", "helper round trip p99 during a flood"),
    **{
        f"floor.create_{q}_{n}": ("bench_floor.py", f"Go peer: create {q} at {n}, x floor")
        for n in (0, 500, 1000)
        for q in ("p50", "p99")
    },
    "floor.create_p50_growth": ("bench_floor.py", "Go peer: create p50 at 1000 vs at 0"),
    "floor.pct_hp_create_p99_500": ("bench_floor.py", "Go peer: HP create p99, PCT vs not"),
    "floor.remove_p99_1000": ("bench_floor.py", "Go peer: remove p99 at 1000, x floor"),
    "floor.update_p99_1000": ("bench_floor.py", "Go peer: update p99 at 1000, x floor"),
    "floor.sync_1000": ("bench_floor.py", "Go peer: Synchronize of 1000 containers"),
    "floor.restart_1000": ("bench_floor.py", "Go peer: restart with 1000 to synchronized"),
    "floor.plugin_rss_1000": ("bench_floor.py", "Go peer: plugin RSS at 1000 containers"),
    "floor.helper_rss": ("bench_floor.py", "Go peer: SST helper RSS"),
}


def fmt(value: float, unit: str) -> str:
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{digits}f} {unit}"


def rows(docs: list[dict[str, Any]]) -> tuple[list[list[str]], list[str]]:
    """Table rows (bench, target, limit, measured, status) and the missing keys."""
    found: dict[str, tuple[str, Figure]] = {}
    skipped = {str(d.get("bench", "")): str(d["skipped"]) for d in docs if d.get("skipped")}
    for doc in docs:
        for fig in doc.get("figures", []):
            if fig.get("target") is not None:
                found[fig["key"]] = (str(doc.get("bench", "")), Figure(**fig))
    out = []
    for key in [*EXPECTED, *(k for k in found if k not in EXPECTED)]:
        bench = key.split(".")[0]
        if key not in found:
            script, label = EXPECTED[key]
            if bench in skipped:
                out.append([bench, label, "", "skipped", skipped[bench].splitlines()[0][:60]])
            else:
                out.append([bench, label, "", "missing", f"no figure from {script}"])
            continue
        bench, f = found[key]
        target = float(f.target or 0)
        limit = f.limit_text() if f.multiple is not None else f"<= {fmt(target, f.unit)}"
        measured = " ".join(filter(None, [fmt(f.value, f.unit), f.ratio_text()]))
        status = "ok" if f.value <= target else "OVER"
        out.append([bench, f.name, limit, measured, status])
    missing = [k for k in EXPECTED if k not in found and k.split(".")[0] not in skipped]
    return out, missing


def render(table: list[list[str]]) -> str:
    head = ["bench", "target", "limit", "measured", "status"]
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    right = {2, 3}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "-" * len(line(head))
    return "\n".join([rule, line(head), rule, *(line(r) for r in table), rule])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", default=os.environ.get(ENV, ""))
    args = parser.parse_args(argv)
    if not args.directory:
        parser.error(f"no directory: give one or set {ENV}")
    directory = Path(args.directory)
    docs = read(directory) if directory.is_dir() else []
    table, missing = rows(docs)
    over = sum(r[4] == "OVER" for r in table)
    skips = sum(r[3] == "skipped" for r in table)
    machines = sorted({str(d.get("machine", "")) for d in docs if d.get("machine")})
    print(f"\nperformance targets ({', '.join(machines) or 'no figures'})")
    print(render(table))
    met = len(table) - over - len(missing) - skips
    print(f"{met} within target, {over} over target, {len(missing)} missing, {skips} skipped")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

"""Figures of the benchmark scripts, and where they go for ``report.py``.

Each bench script prints its own figures and, when ``NRI_BENCH_OUT`` names a
directory (``tox -e bench`` sets it), also writes them there as
``<bench>.json``; ``tests/bench/report.py`` reads every such file and prints
the one table of targets. A figure with a ``target`` is a performance target
(met when ``value <= target``, both in ``unit``); the others are context.
Rows are data: a new measurement (a PCT path, say) is one more
:class:`Figure` and appears in the report without touching it. A figure may
name a ``base`` (the floor's value, say): it is shown as a ratio to it, and
:meth:`Figure.relative` makes a target that is a multiple of it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ENV = "NRI_BENCH_OUT"


@dataclass(frozen=True)
class Figure:
    key: str
    """Stable id, ``<bench>.<what>`` (``nri.create_rt_p50``)."""
    name: str
    """What was measured, for people."""
    value: float
    unit: str
    """``us``, ``ms``, ``MB``..."""
    target: float | None = None
    """Upper bound in ``unit``; ``None``: context only."""
    note: str = ""
    base: float | None = None
    """What the value is compared with (the floor's), in ``unit``; shown as a ratio."""
    base_name: str = ""
    """What ``base`` is (``floor``, ``p50 at 0 containers``)."""
    multiple: float | None = None
    """The target as a multiple of ``base`` (then ``target == multiple * base``)."""

    @classmethod
    def relative(
        cls,
        key: str,
        name: str,
        value: float,
        unit: str,
        base: float,
        multiple: float,
        base_name: str = "floor",
        note: str = "",
    ) -> Figure:
        """A figure whose target is ``multiple`` times ``base``."""
        return cls(key, name, value, unit, multiple * base, note, base, base_name, multiple)

    @property
    def ratio(self) -> float | None:
        """``value / base``; ``None`` without a (non-zero) base."""
        return self.value / self.base if self.base else None

    def limit_text(self) -> str:
        """The target for people: ``<= 3x floor (0.48 ms)`` or ``<= 60 ms``."""
        if self.target is None:
            return ""
        if self.multiple is not None:
            return f"<= {self.multiple:g}x {self.base_name} ({self.target:.3g} {self.unit})"
        return f"<= {self.target:g} {self.unit}"

    def ratio_text(self) -> str:
        """``(3.05x floor)``; empty without a base."""
        ratio = self.ratio
        return f"({ratio:.2f}x {self.base_name})" if ratio is not None else ""


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``samples``, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def write(
    bench: str, figures: list[Figure], context: str = "", *, skipped: str = ""
) -> Path | None:
    """``$NRI_BENCH_OUT/<bench>.json``; nothing when the variable is unset.

    ``skipped``: why the bench could not run (outside CI, see ``_tier``):
    ``report.py`` shows its figures as skipped, not missing."""
    out = os.environ.get(ENV)
    if not out:
        return None
    path = Path(out) / f"{bench}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": bench,
        "context": context,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        ),
        "figures": [asdict(f) for f in figures],
    }
    if skipped:
        doc["skipped"] = skipped
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def read(directory: Path) -> list[dict[str, object]]:
    """Every bench document in ``directory``, by file name."""
    return [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]


def show(title: str, figures: list[Figure]) -> None:
    """Print ``figures`` under ``title``: name, value, target (or note)."""
    print(f"\n{title}")
    width = max(len(f.name) for f in figures)
    for f in figures:
        target = "  ".join(text for text in (f.limit_text(), f.note) if text)
        ratio = f" {f.ratio_text()}" if f.base else ""
        print(f"{f.name.ljust(width)}  {f.value:>8.2f} {f.unit:<2}{ratio}  {target}")

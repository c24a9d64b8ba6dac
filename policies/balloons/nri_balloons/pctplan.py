"""The PCT plan: what the cpuClasses ask of Speed Select (reference §13.1,
§13.2; upstream ``planClasses``).

A cpuClass with ``pctPriority`` asks for managed mode (the plugin programs
SST-CP/TF; ``high`` is :data:`HP_CLOS`, ``low`` :data:`LP_CLOS`), one with
``sstClosID`` for assoc-only mode (the operator programmed SST; the plugin
only associates CPUs with that CLOS). :func:`plan_classes` turns the classes
into one :class:`Plan` each; :class:`Punit` is a punit as the helper's
discovery reported it. The PCT allocator (:mod:`nri_balloons.pct`) keeps the
plan; :mod:`nri_balloons.sstprogram` programs it, :mod:`nri_balloons.closassoc`
associates CPUs with its CLOS, :mod:`nri_balloons.pcthints` places balloons by it.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from nri_balloons.config import CPUClass
from nri_balloons.frequency import Frequency
from nri_balloons.gofmt import quote

HP_CLOS = 0
LP_CLOS = 3
CLOS_COUNT = 4


class PctError(Exception):
    """A PCT plan that cannot be applied (upstream ``cpuclass: pct configure``)."""


class Plan(msgspec.Struct, frozen=True):
    """What one PCT cpuClass asks for."""

    clos: int
    min_khz: int = 0
    max_khz: int = 0
    managed: bool = True
    priority: str = ""
    """``high``/``low`` in managed mode"""


class Punit(msgspec.Struct):
    package: int
    punit: int
    cpus: int
    """its CPUs among the allowed ones"""
    level: int = 0
    max_hp: int = 0
    guaranteed_hp: int = 0
    tf_supported: bool = False
    tf_enabled: bool = False
    bf_supported: bool = False

    @property
    def key(self) -> tuple[int, int]:
        return self.package, self.punit


def plan_classes(
    classes: Sequence[CPUClass], turbo: tuple[int, int, int] | None
) -> tuple[str, dict[str, Plan]]:
    """Upstream ``planClasses``: ``(mode, plans)``; mode "" when no class asks
    for PCT. ``turbo``: (min, base, max) kHz of the platform, for symbolic
    frequencies (no arbitration: ``turbo`` is the hardware maximum)."""

    def khz(f: Frequency) -> int:
        if turbo is None:
            return int(f)
        return f.resolve(turbo[0], turbo[1], turbo[2])

    plans: dict[str, Plan] = {}
    managed = assoc = False
    for cc in classes:
        if cc.pct_priority:
            if cc.pct_priority not in ("high", "low"):
                raise PctError(
                    f"cpuClass {quote(cc.name)}: invalid pctPriority {quote(cc.pct_priority)}"
                )
            managed = True
            plans[cc.name] = Plan(
                clos=HP_CLOS if cc.pct_priority == "high" else LP_CLOS,
                min_khz=khz(cc.pct_min_freq or cc.min_freq),
                max_khz=khz(cc.pct_max_freq or cc.max_freq),
                priority=cc.pct_priority,
            )
        elif cc.sst_clos_id is not None:
            assoc = True
            plans[cc.name] = Plan(clos=cc.sst_clos_id, managed=False)
    if managed and assoc:
        raise PctError("pct: cannot mix managed (pctPriority) and assoc-only (sstClosID) modes")
    if managed:
        return "managed", plans
    if assoc:
        return "assoc-only", plans
    return "", {}

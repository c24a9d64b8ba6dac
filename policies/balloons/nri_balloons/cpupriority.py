"""CPU priorities of the allocator (upstream ``cpuallocator``'s ``CPUPriority``,
``cpuPriorities`` and ``cmpCPUSet``).

A balloon type's ``allocatorPriority`` asks the final pick
(:mod:`nri_balloons.cpuallocator`) for CPUs of one priority. The priorities are
an input of the allocator: upstream discovers them once from SST (TF/CP/BF) or
cpufreq; SST status is the helper's business here, so the policy passes what it
learned. :func:`cpufreq_priorities` ports the cpufreq source except the
``energy_performance_preference`` bins (the topology does not read EPP).

Every CPU set is an ``int`` bitmask (see :mod:`nri_framework.cpuset`).
"""

from __future__ import annotations

import enum

from nri_framework import cpuset
from nri_framework.topology import Topology

__all__ = ["PRIOS", "CpuPriority", "Priorities", "cpufreq_priorities"]


class CpuPriority(enum.IntEnum):
    """``cpuallocator.CPUPriority``; ``NONE`` disables priority preferences."""

    HIGH = 0
    NORMAL = 1
    LOW = 2
    NONE = 3

    @classmethod
    def parse(cls, value: str) -> CpuPriority:
        """``allocatorPriority`` text -> priority: ``high``, ``normal`` and ``low``
        (any case); anything else, including ``""``, is ``NONE`` (as upstream)."""
        return _PRIORITY_NAMES.get(value.lower(), cls.NONE)

    def __str__(self) -> str:
        return self.name.lower()


_PRIORITY_NAMES = {p.name.lower(): p for p in CpuPriority if p is not CpuPriority.NONE}
PRIOS = (CpuPriority.HIGH, CpuPriority.NORMAL, CpuPriority.LOW)


def cpufreq_priorities(topology: Topology) -> dict[CpuPriority, int]:
    """CPU priorities from cpufreq (``discoverCpufreqPriority``), per package: when
    the package's CPUs have more than one base frequency, those above the lowest are
    ``HIGH`` and the rest ``LOW``; otherwise all are ``NORMAL``. Efficient cores are
    always ``LOW``."""
    prios = dict.fromkeys(PRIOS, 0)
    for pkg_cpus in topology.package_masks.values():
        ids = cpuset.ids(pkg_cpus)
        freqs = sorted({topology.cpus[c].freq.base for c in ids} - {0})
        for c in ids:
            info = topology.cpus[c]
            if topology.efficient_cpus >> c & 1:
                p = CpuPriority.LOW
            elif len(freqs) > 1:
                p = CpuPriority.HIGH if info.freq.base > freqs[0] else CpuPriority.LOW
            else:
                p = CpuPriority.NORMAL
            prios[p] |= 1 << c
    return prios


class Priorities:
    """``cpuPriorities`` with ``cmpCPUSet``."""

    __slots__ = ("masks",)

    def __init__(self, masks: tuple[int, int, int]) -> None:
        self.masks = masks

    def cmp(self, a: int, b: int, prefer: CpuPriority, cnt: int) -> int:
        """> 0 when ``a`` is preferred, < 0 when ``b`` is, 0 when equal."""
        if prefer is CpuPriority.NONE:
            return 0
        c = self.masks
        if cnt > 0 and prefer is CpuPriority.LOW:
            pa, pb = (a & c[prefer]).bit_count(), (b & c[prefer]).bit_count()
            if pa >= cnt and pb >= cnt:
                return pb - pa
            if pa >= cnt or pb >= cnt:
                return pa - pb
        if cnt > 0 and prefer is CpuPriority.HIGH:
            pa, pb = (a & c[prefer]).bit_count(), (b & c[prefer]).bit_count()
            if pa == 0 and pb == 0:
                normal = c[CpuPriority.NORMAL]
                pa, pb = (a & normal).bit_count(), (b & normal).bit_count()
            if pa >= cnt and pb >= cnt:
                return pb - pa
            if pa >= cnt or pb >= cnt:
                return pa - pb
        for prio in range(prefer, len(PRIOS)):
            pa, pb = (a & c[prio]).bit_count(), (b & c[prio]).bit_count()
            if cnt > 0 and prio == prefer and pa >= cnt and pb >= cnt:
                return pb - pa
            if pa != pb:
                return pa - pb
        for prio in range(prefer):
            na, nb = (a & c[prio]).bit_count(), (b & c[prio]).bit_count()
            if na != nb:
                return nb - na
        return 0

    def key(self, mask: int, prefer: CpuPriority) -> tuple[int, ...]:
        """A sort key (smaller = preferred) equal to ``cmp(.., cnt <= 0)``."""
        if prefer is CpuPriority.NONE:
            return ()
        c = self.masks
        return tuple(-(mask & c[p]).bit_count() for p in range(prefer, len(PRIOS))) + tuple(
            (mask & c[p]).bit_count() for p in range(prefer)
        )

"""CPU priorities of the allocator (upstream ``cpuallocator``'s ``CPUPriority``,
``cpuPriorities`` and ``cmpCPUSet``).

A balloon type's ``allocatorPriority`` asks the final pick
(:mod:`nri_balloons.cpuallocator`) for CPUs of one priority. The priorities are
an input of the allocator, discovered once at start (reference §7.2,
``discoverCPUPriorities``), per package: from SST when SST prioritises that
package's CPUs (:func:`sst_priorities`: SST-TF, then SST-CP, then SST-BF),
otherwise from cpufreq (:func:`cpufreq_priorities`: base-frequency bins, then
EPP bins; E-cores always low). SST status is the privileged helper's business
here: :func:`discover_steps` reads it through the helper (``Discover`` and
``GetAssociation``) and :func:`discover` runs them, off the reply path.
What differs from upstream: a CPU on a CLOS the SST-CP mapping does not know
is ``normal`` (upstream's map lookup gives ``high``), and the helper's CPU ids
are taken only within the topology's online CPUs.

Every CPU set is an ``int`` bitmask (see :mod:`nri_framework.cpuset`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from nri_framework import cpuset
from nri_framework.topology import Topology
from nri_sst import messages as m

from nri_balloons.sstlink import (
    Ask,
    Budget,
    BudgetSpent,
    Steps,
    Writer,
    WriteRefused,
    WriterUnavailable,
    exchange,
    exchange_async,
)

log = logging.getLogger("nri_balloons.cpus")  # the allocator's logger

__all__ = [
    "PRIOS",
    "CpuPriority",
    "Priorities",
    "cpu_priorities",
    "cpufreq_priorities",
    "discover",
    "discover_at_start",
    "discover_steps",
    "rediscover",
    "sst_priorities",
]

DISCOVER_BUDGET = 2.0
"""Seconds the start-up waits for the helper's SST status, both requests
together (the helper absent: the cpufreq source after that)."""
DISCOVER_RETRY = 0.1
"""Seconds between attempts while the helper is not connected (its sidecar
starts beside the plugin)."""
LATE_RETRY_MIN = 0.5
LATE_RETRY_MAX = 10.0
"""Seconds between the attempts of :func:`rediscover` (doubling)."""


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


EPP_RANKS = {"performance": 0, "balance_performance": 1, "balance_power": 2, "power": 3}
"""``energy_performance_preference`` names in upstream's ``sysfs.EPP`` order
(a higher rank prefers energy); any other value is unknown and not a bin."""
_EPP_UNKNOWN = len(EPP_RANKS)


def cpufreq_priorities(topology: Topology) -> dict[CpuPriority, int]:
    """CPU priorities from cpufreq (``discoverCpufreqPriority``) of every package."""
    prios = dict.fromkeys(PRIOS, 0)
    for pkg_cpus in topology.package_masks.values():
        for p, cpus in _cpufreq_package(topology, pkg_cpus).items():
            prios[p] |= cpus
    return prios


def _cpufreq_package(topology: Topology, pkg_cpus: int) -> dict[CpuPriority, int]:
    """One package: when its CPUs have more than one base frequency, those above
    the lowest are ``HIGH`` and the rest ``LOW``, otherwise all ``NORMAL``; then
    efficient cores are ``LOW`` and, when the other CPUs have more than one known
    EPP, those below the most energy-preferring EPP are ``HIGH`` and the rest
    ``LOW`` (an unknown EPP counts as the most energy-preferring)."""
    prios = dict.fromkeys(PRIOS, 0)
    ids = cpuset.ids(pkg_cpus)
    freqs = sorted({topology.cpus[c].freq.base for c in ids} - {0})
    epps = sorted({EPP_RANKS[e] for c in ids if (e := topology.cpus[c].epp) in EPP_RANKS})
    for c in ids:
        info = topology.cpus[c]
        p = CpuPriority.NORMAL
        if len(freqs) > 1:
            p = CpuPriority.HIGH if info.freq.base > freqs[0] else CpuPriority.LOW
        if topology.efficient_cpus >> c & 1:
            p = CpuPriority.LOW
        elif len(epps) > 1:
            rank = EPP_RANKS.get(info.epp, _EPP_UNKNOWN)
            p = CpuPriority.HIGH if rank < epps[-1] else CpuPriority.LOW
        prios[p] |= 1 << c
    return prios


def _clos_priority(punit: m.PunitInfo) -> dict[int, CpuPriority]:
    """``sstClosPriority``: CLOS id -> priority. Ordered SST-CP ranks the CLOS by id,
    proportional by their proportional priority (one CLOS per value, the last
    wins); the first is ``HIGH``, the last ``LOW``, the others ``NORMAL``."""
    if punit.cp.priority == "ordered":
        ranked = sorted({c.clos for c in punit.clos})
    else:
        by_pp = {c.proportional_priority: c.clos for c in punit.clos}
        ranked = [by_pp[pp] for pp in sorted(by_pp)]
    out = dict.fromkeys(ranked, CpuPriority.NORMAL)
    if len(ranked) > 1:
        out[ranked[0]] = CpuPriority.HIGH
        out[ranked[-1]] = CpuPriority.LOW
    return out


def sst_priorities(
    package: m.PackageInfo, clos_of: Mapping[int, int], online: int
) -> tuple[dict[CpuPriority, int], bool]:
    """CPU priorities of one package from SST (``discoverSstCPUPriority``) and
    whether SST prioritises its CPUs at all. Per punit: SST-TF enabled, CPUs on
    CLOS 0-1 are ``HIGH`` and the others ``LOW``; else SST-CP enabled, each CPU
    gets its CLOS's priority (:func:`_clos_priority`; active when some CPU is not
    ``NORMAL``); else, when nothing was active so far and SST-BF is enabled,
    its high-priority CPUs are ``HIGH`` (the rest of such a punit has no
    priority, as upstream). ``clos_of`` is the helper's CPU -> CLOS association;
    only CPUs of ``online`` are taken."""
    prio_of: dict[int, CpuPriority] = {}
    active = False
    for pu in package.punits:
        cpus = _online_ids(pu.cpus, online)
        if pu.tf.enabled:
            log.debug(
                "package #%d punit #%d: using SST-TF based CPU prioritization",
                package.package,
                pu.punit,
            )
            for c in cpus:
                prio_of[c] = CpuPriority.HIGH if clos_of.get(c, 0) < 2 else CpuPriority.LOW
            active = True
        elif pu.cp.enabled:
            closes = _clos_priority(pu)
            log.debug(
                "package #%d punit #%d: using SST-CP based CPU prioritization with CLOS mapping %s",
                package.package,
                pu.punit,
                "map[" + " ".join(f"{k}:{v}" for k, v in sorted(closes.items())) + "]",
            )
            for c in cpus:
                p = closes.get(clos_of.get(c, 0), CpuPriority.NORMAL)
                active = active or p is not CpuPriority.NORMAL
                prio_of[c] = p
        if not active and pu.pp.supported and pu.bf.enabled:
            log.debug(
                "package #%d punit #%d: using SST-BF based CPU prioritization",
                package.package,
                pu.punit,
            )
            for c in _online_ids(pu.bf.hp_cpus, online):
                prio_of[c] = CpuPriority.HIGH
            active = True
    prios = dict.fromkeys(PRIOS, 0)
    for c, p in prio_of.items():
        prios[p] |= 1 << c
    return prios, active


def _online_ids(ids: Iterable[int], online: int) -> list[int]:
    """The ids of ``ids`` that are online CPUs (a peer's ids are never shifted
    into a mask unchecked: ``1 << 10**12`` would not fit in memory)."""
    return [
        c for c in ids if isinstance(c, int) and 0 <= c < online.bit_length() and online >> c & 1
    ]


SstStatus = tuple[m.DiscoverReply, dict[int, int]]
"""What the helper reports of SST: its discovery and the CPU -> CLOS association."""


def cpu_priorities(topology: Topology, sst: SstStatus | None = None) -> dict[CpuPriority, int]:
    """``discoverCPUPriorities``: per package, SST's priorities when SST prioritises
    the package's CPUs, otherwise cpufreq's. (That E-cores are never ``HIGH``
    or ``NORMAL`` when the system has other cores is the allocator's rule, for
    every priority input: :class:`~nri_balloons.cpuallocator.CpuAllocator`.)"""
    packages = (
        {p.package: p for p in sst[0].packages} if sst is not None and sst[0].supported else {}
    )
    prios = dict.fromkeys(PRIOS, 0)
    for pkg_id, pkg_cpus in topology.package_masks.items():
        source, active = "cpufreq", False
        info = packages.get(pkg_id)
        if info is not None and sst is not None:
            got, active = sst_priorities(info, sst[1], pkg_cpus)
            source = "sst"
        if not active:
            got, source = _cpufreq_package(topology, pkg_cpus), "cpufreq"
        for p in PRIOS:
            cpus = got[p]
            log.debug(
                "package #%d (%s): %d %s priority cpus (%s)",
                pkg_id,
                source,
                cpus.bit_count(),
                p,
                cpuset.format(cpus),
            )
            prios[p] |= cpus
    return prios


def discover_steps() -> Steps[SstStatus | None]:
    """Read SST through the helper: ``Discover``, then the association of every
    CPU of its punits; None when the helper reports no SST."""
    reply = yield Ask(m.Discover(), DISCOVER_BUDGET)
    if not isinstance(reply, m.DiscoverReply) or not reply.supported:
        return None
    cpus = sorted({c for pkg in reply.packages for pu in pkg.punits for c in pu.cpus})
    assoc = yield Ask(m.GetAssociation(cpus=cpus), DISCOVER_BUDGET)
    if not isinstance(assoc, m.GetAssociationReply):
        return None
    return reply, dict(assoc.clos)


def discover(
    topology: Topology,
    writer: Writer,
    budget: Budget | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> dict[CpuPriority, int]:
    """The CPU priorities of this node at start (:func:`discover_at_start`)."""
    return discover_at_start(topology, writer, budget, pause)[0]


def discover_at_start(
    topology: Topology,
    writer: Writer,
    budget: Budget | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> tuple[dict[CpuPriority, int], bool]:
    """The CPU priorities of this node, once at start: SST through the helper
    when there is one, otherwise, or when it is away or refuses, cpufreq; and
    whether the helper was away all along (its SST status may come later:
    :func:`rediscover`).

    The helper is a sidecar started beside the plugin, so its socket may not
    be there yet: a helper not connected is asked again every
    :data:`DISCOVER_RETRY` seconds while ``budget`` lasts (:data:`DISCOVER_BUDGET`
    by default); ``pause`` waits between the attempts."""
    sst: SstStatus | None = None
    away = False
    if writer.endpoint:
        budget = budget or Budget(DISCOVER_BUDGET)
        while True:
            try:
                sst = exchange(discover_steps(), writer, budget)
            except WriterUnavailable as exc:
                if isinstance(exc, BudgetSpent) or budget.left() <= DISCOVER_RETRY:
                    _no_sst(exc)
                    away = True
                    break
                pause(DISCOVER_RETRY)
                continue
            except WriteRefused as exc:
                _no_sst(exc)
            break
    return cpu_priorities(topology, sst), away


async def rediscover(
    topology: Topology,
    writer: Writer,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[CpuPriority, int] | None:
    """SST's CPU priorities from a helper that was away at start, off the reply
    path: asked every :data:`LATE_RETRY_MIN` seconds, doubling up to
    :data:`LATE_RETRY_MAX`, until it answers; None when it then reports no SST
    that prioritises CPUs, or refuses (the start's cpufreq priorities stay).
    ``pause`` awaits between the attempts (the plugin's is cut short by its
    periodic probe: :class:`nri_balloons.sstlink.Backoff`)."""
    delay = LATE_RETRY_MIN
    while True:
        try:
            sst = await exchange_async(discover_steps(), writer)
        except WriterUnavailable as exc:
            log.debug(
                "CPU priorities: SST helper still away (%s); asking again in %.1fs", exc, delay
            )
            await pause(delay)
            delay = min(delay * 2, LATE_RETRY_MAX)
            continue
        except WriteRefused as exc:
            log.warning("CPU priorities: the SST helper refused its SST status (%s)", exc)
            return None
        break
    if sst is None:
        log.info("CPU priorities: the SST helper is there now and reports no SST")
        return None
    prios = cpu_priorities(topology, sst)
    if prios == cpu_priorities(topology):
        log.info(
            "CPU priorities: the SST helper is there now and reports no SST that "
            "prioritises CPUs; using cpufreq base frequencies and EPP"
        )
        return None
    log.info(
        "CPU priorities: SST status read from the SST helper after start; "
        "allocations from now on use them (existing balloons keep their CPUs)"
    )
    return prios


def _no_sst(exc: Exception) -> None:
    log.warning(
        "CPU priorities: cannot read SST status from the SST helper (%s); "
        "using cpufreq base frequencies and EPP",
        exc,
    )


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

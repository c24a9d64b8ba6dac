"""CPU priorities of the allocator (nri_balloons.cpupriority): upstream
cpuallocator's ``discoverCPUPriorities`` with its SST source (TF, CP, BF) and
cpufreq source (base-frequency and EPP bins; E-cores always low).

The SST cases feed :func:`sst_priorities` the helper's own reply Structs
(``DiscoverReply``'s punits), written out here as the data a helper sends."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.cpuallocator import CpuAllocator
from nri_balloons.cpupriority import (
    CpuPriority,
    cpu_priorities,
    cpufreq_priorities,
    discover,
    sst_priorities,
)
from nri_balloons.devices import EFFICIENT_CORES, PERFORMANCE_CORES, DeviceResolver
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.sstlink import Budget, HelperWriter, NullWriter
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.simulate.topologies import HYBRID12, N4C16, PCT16
from nri_framework.topology import Topology
from nri_sst import messages as m
from topologies import topology

P = cpuset.parse
H, N, L = CpuPriority.HIGH, CpuPriority.NORMAL, CpuPriority.LOW


def fmt(prios: dict[CpuPriority, int]) -> dict[str, str]:
    return {str(p): cpuset.format(prios[p]) for p in (H, N, L)}


# -- cpufreq source -----------------------------------------------------------------


def test_epp_bins_per_package() -> None:
    """CPUs below the package's most energy-preferring EPP are high, the others
    low; a package with one EPP (and one base frequency) is all normal."""
    spec = dataclasses.replace(
        N4C16, name="n4c16-epp", epp_by_cpus=(("0-3", "performance"), ("4-7", "power"))
    )
    topo = topology(spec)
    assert topo.cpus[0].epp == "performance" and topo.cpus[8].epp == "balance_performance"
    assert fmt(cpufreq_priorities(topo)) == {"high": "0-3", "normal": "8-15", "low": "4-7"}


def test_unknown_epp_is_not_a_bin() -> None:
    """An EPP outside upstream's four names (``default``, a raw value) makes no
    bin of its own; with two known bins it counts as the lowest."""
    one_known = dataclasses.replace(
        N4C16, name="n4c16-epp-default", epp_by_cpus=(("0-3", "default"),)
    )
    assert fmt(cpufreq_priorities(topology(one_known))) == {"high": "", "normal": "0-15", "low": ""}
    two_known = dataclasses.replace(
        N4C16,
        name="n4c16-epp-raw",
        epp_by_cpus=(("0-1", "performance"), ("2-3", "128")),
    )
    got = fmt(cpufreq_priorities(topology(two_known)))
    assert got == {"high": "0-1", "normal": "8-15", "low": "2-7"}


def test_hybrid_one_base_frequency() -> None:
    """One base frequency and one EPP: P-cores normal, E-cores low, and the
    allocator keeps a normal-priority pick off the E-cores."""
    topo = topology(HYBRID12)
    assert fmt(cpu_priorities(topo)) == {"high": "", "normal": "0-3", "low": "4-11"}
    alloc = CpuAllocator(topo, cpu_priorities(topo))
    assert alloc.allocate(topo.online, 2, N) & P("4-11") == 0


def test_hybrid_epp_bins_never_raise_e_cores() -> None:
    """EPP bins rank the P-cores; E-cores stay low whatever their EPP."""
    spec = dataclasses.replace(
        HYBRID12,
        name="hybrid12-epp",
        epp_by_cpus=(("0-1", "performance"), ("2-3", "balance_power"), ("4-11", "performance")),
    )
    assert fmt(cpu_priorities(topology(spec))) == {"high": "0-1", "normal": "", "low": "2-11"}


# -- SST source ---------------------------------------------------------------------


def punit(
    cpus: str,
    *,
    tf: bool = False,
    cp: bool = False,
    priority: m.Priority = "ordered",
    bf_cpus: str | None = None,
    pps: tuple[int, ...] = (0, 0, 0, 0),
) -> m.PunitInfo:
    return m.PunitInfo(
        package=0,
        punit=0,
        cpus=cpuset.ids(P(cpus)),
        pp=m.PPInfo(supported=True, current_level=0, levels=[0], locked=False, feature_rev=0),
        cp=m.CPInfo(supported=True, enabled=cp, priority=priority),
        tf=m.TFInfo(supported=True, enabled=tf, buckets=[], lp_clip_mhz=[]),
        bf=m.BFInfo(
            supported=bf_cpus is not None,
            enabled=bf_cpus is not None,
            hp_cpus=cpuset.ids(P(bf_cpus)) if bf_cpus else [],
        ),
        base_mhz=2900,
        max_hp_cpus=0,
        guaranteed_hp_cpus=0,
        clos=[
            m.ClosConfig(clos=c, min_khz=0, max_khz=0, proportional_priority=pp)
            for c, pp in enumerate(pps)
        ],
    )


def package(*punits: m.PunitInfo) -> m.PackageInfo:
    return m.PackageInfo(
        package=0, cpus=sorted({c for p in punits for c in p.cpus}), punits=list(punits)
    )


def discovered(topo: Topology, *packages: m.PackageInfo) -> m.DiscoverReply:
    """What a sim helper's Discover answers for ``topo`` with these packages."""
    return m.DiscoverReply(
        supported=True,
        backend="sim",
        api_version=1,
        online_cpus=cpuset.ids(topo.online),
        packages=list(packages),
        cpufreq=None,
        cstates=[],
        uncore=[],
    )


ONLINE = P("0-7")


def test_sst_tf_clos_below_two_is_high() -> None:
    clos = {0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1, 6: 2, 7: 3}
    prios, active = sst_priorities(package(punit("0-7", tf=True, cp=True)), clos, ONLINE)
    assert active and fmt(prios) == {"high": "0-1,4-5", "normal": "", "low": "2-3,6-7"}


def test_sst_cp_ordered_and_proportional() -> None:
    clos = {0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1, 6: 2, 7: 3}
    prios, active = sst_priorities(package(punit("0-7", cp=True)), clos, ONLINE)
    assert active and fmt(prios) == {"high": "0,4", "normal": "1-2,5-6", "low": "3,7"}
    # proportional: ranked by proportional priority (CLOS 3 first here)
    pu = punit("0-7", cp=True, priority="proportional", pps=(12, 8, 4, 0))
    prios, active = sst_priorities(package(pu), clos, ONLINE)
    assert active and fmt(prios) == {"high": "3,7", "normal": "1-2,5-6", "low": "0,4"}
    # a CLOS the punit does not report is normal (upstream's lookup gives high)
    prios, _ = sst_priorities(package(punit("0-7", cp=True)), {**clos, 4: 7}, ONLINE)
    assert fmt(prios) == {"high": "0", "normal": "1-2,4-6", "low": "3,7"}
    # every CPU on one CLOS of the middle: SST prioritises nothing
    prios, active = sst_priorities(
        package(punit("0-7", cp=True)), dict.fromkeys(range(8), 1), ONLINE
    )
    assert not active and fmt(prios) == {"high": "", "normal": "0-7", "low": ""}


def test_sst_bf_high_priority_cpus() -> None:
    prios, active = sst_priorities(package(punit("0-7", bf_cpus="2,6")), {}, ONLINE)
    assert active and fmt(prios) == {"high": "2,6", "normal": "", "low": ""}


def test_sst_cpu_ids_outside_the_topology_are_ignored() -> None:
    """A helper's CPU ids are taken only within the online CPUs: a huge id is
    never shifted into a mask (``1 << 10**12`` would exhaust memory)."""
    huge = 10**12
    pu = punit("0-7", tf=True)
    pu = m.PunitInfo(
        **{**{f: getattr(pu, f) for f in pu.__struct_fields__}, "cpus": [0, 9, -1, huge]}
    )
    prios, active = sst_priorities(package(pu), {0: 0, 9: 0, huge: 0}, ONLINE)
    assert active and fmt(prios) == {"high": "0", "normal": "", "low": ""}


def test_sst_source_per_package_with_cpufreq_elsewhere() -> None:
    """A package SST prioritises takes SST's priorities; the others cpufreq's."""
    topo = topology(PCT16)  # packages 0-3,8-11 and 4-7,12-15
    pkg0 = m.PackageInfo(
        package=0, cpus=cpuset.ids(P("0-3,8-11")), punits=[punit("0-3,8-11", tf=True)]
    )
    reply = discovered(topo, pkg0)
    clos = {c: 0 if c in (0, 1, 8, 9) else 3 for c in range(16)}
    got = fmt(cpu_priorities(topo, (reply, clos)))
    assert got == {"high": "0-1,8-9", "normal": "4-7,12-15", "low": "2-3,10-11"}


def test_sst_high_e_cores_are_low_for_the_allocator() -> None:
    """Whatever the source says, the allocator never counts E-cores as high or
    normal priority CPUs on a system with other cores."""
    topo = topology(HYBRID12)
    pkg0 = m.PackageInfo(package=0, cpus=cpuset.ids(topo.online), punits=[punit("0-11", tf=True)])
    reply = discovered(topo, pkg0)
    prios = cpu_priorities(topo, (reply, dict.fromkeys(range(12), 0)))
    assert prios[H] == P("0-11")
    assert fmt(CpuAllocator(topo, prios).priorities) == {"high": "0-3", "normal": "", "low": ""}


# -- discovery through the helper ------------------------------------------------------


def test_no_helper_is_the_cpufreq_source() -> None:
    topo = topology(HYBRID12)
    assert discover(topo, NullWriter()) == cpu_priorities(topo)


def test_helper_away_is_the_cpufreq_source_within_the_budget(
    tmp_path: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """No helper answers on the socket: a warning, and cpufreq's priorities once
    the budget is spent (the budget bounds the wait; no process listens)."""
    topo = topology(HYBRID12)
    writer = HelperWriter(f"ipc://{tmp_path}/absent.sock", timeout=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="nri_balloons.cpus"):
            got = discover(topo, writer, Budget(0.2))
    finally:
        writer.close()
    assert got == cpu_priorities(topo)
    assert "CPU priorities: cannot read SST status from the SST helper" in caplog.text


# -- preferCoreType: the virtual devices are the allocator's priorities -----------------

CORE_TYPES = """
reservedResources: {cpu: "1"}
balloonTypes:
- {name: perf, namespaces: [p], preferCoreType: performance, minBalloons: 1, minCPUs: 1}
- {name: eff, namespaces: [e], preferCoreType: efficient, minBalloons: 1, minCPUs: 1}
- {name: default, minBalloons: 1, minCPUs: 1}
"""


def core_type_balloons(topo: Topology, prios: dict[CpuPriority, int] | None) -> dict[str, int]:
    result = validate(load_policy(CORE_TYPES), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    policy = BalloonsPolicy(topo, priorities=prios)
    policy.set_config(result.prepared)
    return {b.bdef.name: b.cpus for b in policy.balloons}


def test_core_type_devices_are_the_high_and_low_priority_cpus() -> None:
    """``performance cores``/``efficient cores`` are the allocator's high/low CPUs
    (upstream's ``GetCPUPriorities``), not the kernel's core type lists: with one
    base frequency the P-cores are normal, so ``performance cores`` is empty."""
    topo = topology(HYBRID12)
    alloc = CpuAllocator(topo, cpu_priorities(topo))
    resolver = DeviceResolver(topo, "/nonexistent", 0, alloc.priorities)
    assert resolver.cpus(PERFORMANCE_CORES) == 0
    assert resolver.cpus(EFFICIENT_CORES) == P("4-11")
    epp = dataclasses.replace(
        HYBRID12,
        name="hybrid12-epp-perf",
        epp_by_cpus=(("0-1", "performance"), ("2-11", "balance_power")),
    )
    topo = topology(epp)
    alloc = CpuAllocator(topo, cpu_priorities(topo))
    resolver = DeviceResolver(topo, "/nonexistent", 0, alloc.priorities)
    assert resolver.cpus(PERFORMANCE_CORES) == P("0-1")
    assert resolver.cpus(EFFICIENT_CORES) == P("2-11")


def test_hybrid_one_base_frequency_keeps_reserved_and_default_on_p_cores() -> None:
    """A type preferring performance cores makes the others avoid them: with the
    kernel's P-core list that pushed the reserved and default balloons onto
    E-cores; with the priorities (P-cores normal, none high) nothing is avoided
    and they stay on the P-cores, as upstream's do."""
    topo = topology(HYBRID12)
    got = core_type_balloons(topo, None)
    assert got["perf"] & topo.efficient_cpus == 0
    assert got["reserved"] & topo.efficient_cpus == 0, cpuset.format(got["reserved"])
    assert got["default"] & topo.efficient_cpus == 0, cpuset.format(got["default"])
    assert got["eff"] & ~topo.efficient_cpus == 0


def test_sst_high_cpus_are_the_performance_cores() -> None:
    """With SST's priorities (TF: CLOS 0-1 high) ``preferCoreType: performance``
    takes a high-priority CPU and the other balloons avoid those CPUs."""
    topo = topology(HYBRID12)
    pkg0 = m.PackageInfo(package=0, cpus=cpuset.ids(topo.online), punits=[punit("0-11", tf=True)])
    clos = {c: (0 if c in (2, 3) else 2) for c in range(12)}
    prios = cpu_priorities(topo, (discovered(topo, pkg0), clos))
    assert cpuset.format(prios[H]) == "2-3"
    got = core_type_balloons(topo, prios)
    assert got["perf"] & ~P("2-3") == 0, cpuset.format(got["perf"])
    assert (got["reserved"] | got["default"]) & P("2-3") == 0


HYBRID12_E_LOW = dataclasses.replace(HYBRID12, name="hybrid12-e-low", efficient_cpus="0-7")
"""hybrid12 with its E-cores at the low CPU ids (0-7) and the P-cores at 8-11,
so that a pick that merely takes the lowest free ids lands on E-cores."""


def test_hybrid_e_cores_first_keeps_reserved_and_default_on_p_cores() -> None:
    """No second cause of reserved/default on E-cores: with the E-cores first
    the reserved and default balloons still take P-cores next to a
    ``preferCoreType`` type (they avoid ``efficient cores``, the low CPUs; the
    empty ``performance cores`` pushes them nowhere), as upstream's do."""
    topo = topology(HYBRID12_E_LOW)
    assert cpuset.format(topo.efficient_cpus) == "0-7"
    assert fmt(CpuAllocator(topo, cpu_priorities(topo)).priorities) == {
        "high": "",
        "normal": "8-11",
        "low": "0-7",
    }
    got = core_type_balloons(topo, None)
    p_cores = P("8-11")
    assert got["reserved"] & ~p_cores == 0, cpuset.format(got["reserved"])
    assert got["default"] & ~p_cores == 0, cpuset.format(got["default"])
    assert got["perf"] & ~p_cores == 0, cpuset.format(got["perf"])
    assert got["eff"] & p_cores == 0, cpuset.format(got["eff"])


def test_hybrid_e_cores_first_implicit_low_priority_types_take_e_cores() -> None:
    """Without a ``preferCoreType`` type nothing is avoided, and the implicit
    reserved and default types (``allocatorPriority: low``, reference §8) take
    the low priority CPUs, the E-cores, as upstream's cpuallocator does."""
    topo = topology(HYBRID12_E_LOW)
    result = validate(load_policy('reservedResources: {cpu: "1"}\n'), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    policy = BalloonsPolicy(topo)
    policy.set_config(result.prepared)
    got = {b.bdef.name: b.cpus for b in policy.balloons}
    assert got["reserved"] & ~topo.efficient_cpus == 0, cpuset.format(got["reserved"])
    assert got["default"] & ~topo.efficient_cpus == 0, cpuset.format(got["default"])

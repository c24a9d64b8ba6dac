"""The final CPU pick (nri_balloons.cpuallocator) and CPU priorities
(nri_balloons.cpupriority).

Ports the ``TestAllocatorHelper`` cases of upstream's
``pkg/cpuallocator/cpuallocator_test.go``; the machines are generated as sysfs
trees and discovered.
"""

from __future__ import annotations

import dataclasses

import pytest
from nri_balloons.cpuallocator import CpuAllocator, ResizeError
from nri_balloons.cpupriority import CpuPriority, cpufreq_priorities
from nri_framework import cpuset
from nri_framework.simulate.topologies import N4C16, XEON_6776P, CpuFreqSpec, TopologySpec
from topologies import topology

P = cpuset.parse
F = cpuset.format

# ---------------------------------------------------------------------------
# cpuallocator_test.go: TestAllocatorHelper

# "2-socket-4-node-40-core": packages 0-19,40-59 and 20-39,60-79.
TWO_SOCKET_40 = TopologySpec(
    name="2-socket-4-node-40-core",
    packages=2,
    nodes_per_die=2,
    cores_per_node=10,
    threads_per_core=2,
    numbering="smt-last",
)


@pytest.mark.parametrize(
    ("from_", "prefer", "cnt", "expected"),
    [
        ("2,3,10-14,20", CpuPriority.NORMAL, 9, None),  # too few available CPUs
        ("2,3,10-14,20", CpuPriority.NORMAL, 8, "2,3,10-14,20"),  # all available CPUs
        ("2,3,10-25", CpuPriority.HIGH, 4, "2-3,15,17"),  # prefer high priority CPUs
    ],
)
def test_allocator_helper(from_: str, prefer: CpuPriority, cnt: int, expected: str | None) -> None:
    topo = topology(TWO_SOCKET_40)
    # Fake CPU priorities: 5 cores of package 0 are high priority.
    prios = {
        CpuPriority.HIGH: P("2,5,8,15,17,42,45,48,55,57"),
        CpuPriority.NORMAL: P("20-39,60-79"),
        CpuPriority.LOW: P("0,1,3,4,6,7,9-14,16,18,19,40,41,43,44,46,47,49-54,56,58,59"),
    }
    alloc = CpuAllocator(topo, prios)
    if expected is None:
        with pytest.raises(ResizeError, match=f"does not have {cnt} CPUs"):
            alloc.allocate(P(from_), cnt, prefer)
    else:
        assert F(alloc.allocate(P(from_), cnt, prefer)) == F(P(expected))


def test_allocator_prefers_idle_packages_then_cores() -> None:
    topo = topology(N4C16)
    alloc = CpuAllocator(topo)
    # a whole idle package first
    assert F(alloc.allocate(P("0-7,9-15"), 8)) == "0-7"
    # then idle cores (lowest first), then a single thread from the package
    # already used, preferring the CPU whose core has fewer free threads
    assert alloc.allocate(P("1,2-3,5,8-9"), 3) == P("1-3")
    assert alloc.allocate(P("1,2-3,5,8-9"), 4) == P("2-3,8-9")
    # release keeps a whole core and gives up the rest
    released = alloc.release(P("0-3"), 2)
    assert released in (P("0-1"), P("2-3"))


def test_allocator_priority_low_and_cpufreq_priorities() -> None:
    spec = dataclasses.replace(
        N4C16,
        name="n4c16-ecores",
        efficient_cpus="12-15",
        cpufreq=CpuFreqSpec(800_000, 2_000_000, 3_000_000),
    )
    topo = topology(spec)
    prios = cpufreq_priorities(topo)
    assert prios[CpuPriority.LOW] == P("12-15")
    assert prios[CpuPriority.NORMAL] == P("0-11")
    alloc = CpuAllocator(topo)
    # low priority requests take E-cores first, others avoid them
    assert alloc.allocate(P("0-15"), 2, CpuPriority.LOW) & ~P("12-15") == 0
    assert alloc.allocate(P("6-15"), 2, CpuPriority.NORMAL) & P("12-15") == 0
    assert CpuPriority.parse("HIGH") is CpuPriority.HIGH
    assert CpuPriority.parse("") is CpuPriority.NONE
    assert str(CpuPriority.NORMAL) == "normal"


def test_cache_groups_on_l3_per_numa() -> None:
    """SNC: L3 per NUMA node gives the allocator cache groups; a 4-CPU pick from a
    system with one partly used group takes an idle one."""
    spec = dataclasses.replace(XEON_6776P, name="xeon-snc-l3", l3_scope="numa")
    topo = topology(spec)
    alloc = CpuAllocator(topo)
    assert len(alloc._cache_groups) == 4
    node0, node1 = topo.node_masks[0], topo.node_masks[1]
    free = (node0 & ~P("0")) | node1
    got = alloc.allocate(free, 4)
    assert got & ~node1 == 0  # the idle group, not the fragmented one


def test_hybrid_clusters() -> None:
    """takeIdleClusters: on a hybrid CPU, low priority requests take a whole idle
    E-core cluster (an L2 group), others a P-core cluster."""
    spec = TopologySpec(
        name="hybrid",
        packages=1,
        cores_per_node=12,
        threads_per_core=1,
        cores_per_l2=4,
        efficient_cpus="4-11",
    )
    topo = topology(spec)
    alloc = CpuAllocator(topo)
    assert alloc.hybrid
    assert alloc.priorities[CpuPriority.LOW] == P("4-11")
    assert alloc.allocate(topo.online, 4, CpuPriority.LOW) == P("4-7")
    assert alloc.allocate(topo.online & ~P("4"), 4, CpuPriority.LOW) == P("8-11")
    assert alloc.allocate(topo.online, 4, CpuPriority.NORMAL) == P("0-3")
    assert alloc.allocate(topo.online, 4, CpuPriority.HIGH) == P("0-3")

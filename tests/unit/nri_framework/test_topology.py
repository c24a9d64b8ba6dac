"""Topology discovery from generated sysfs trees and from this machine's /sys."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nri_framework import cpuset
from nri_framework.simulate.sysfs import write_cpu_tree, write_topology
from nri_framework.simulate.topologies import N4C16, S8C4K, XEON_6776P, TopologySpec
from nri_framework.topology import (
    LEVELS,
    MAX_SIBLING_SHIFTS,
    CoreType,
    CpuFreq,
    CpuInfo,
    NumaNode,
    Topology,
    TreeNode,
    shift_siblings,
    sibling_shifts,
)

P = cpuset.parse
F = cpuset.format
CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


@pytest.fixture(scope="module")
def n4c16(module_tmp: Path) -> Topology:
    return Topology.from_sysfs(write_topology(module_tmp / "n4c16", N4C16))


@pytest.fixture(scope="module")
def xeon(module_tmp: Path) -> Topology:
    return Topology.from_sysfs(write_topology(module_tmp / "xeon", XEON_6776P))


@pytest.fixture(scope="module")
def s8c4k(module_tmp: Path) -> Topology:
    return Topology.from_sysfs(write_topology(module_tmp / "s8c4k", S8C4K))


def masks(d: dict[int, int]) -> dict[int, str]:
    return {k: F(v) for k, v in d.items()}


def names(tree: TreeNode, level: str) -> list[str]:
    return [n.name for n in tree.walk() if n.level == level]


def assert_partition(parts: tuple[int, ...], whole: int) -> None:
    union = 0
    for part in parts:
        assert part, "empty group"
        assert not part & union, f"{F(part)} overlaps {F(union)}"
        union |= part
    assert union == whole


def check_invariants(topo: Topology) -> None:
    """What must hold for any discovered topology."""
    for level in LEVELS:
        assert_partition(topo.level_masks(level), topo.online)
    for cpu, info in topo.cpus.items():
        bit = 1 << cpu
        assert [p for p, m in topo.package_masks.items() if m & bit] == [info.package]
        assert [n for n, m in topo.node_masks.items() if m & bit] == [info.node]
        assert [c for c, m in topo.core_masks.items() if m & bit] == [info.core]
        assert topo.core_masks[info.core] & ~topo.package_masks[info.package] == 0
        assert topo.die_masks[info.die_key] & ~topo.package_masks[info.package] == 0
    # The tree holds every online CPU exactly once, in leaves whose names are unique.
    tree = topo.tree()
    leaves = [n for n in tree.walk() if n.level == "thread"]
    assert sorted(cpuset.ids(n.cpus)[0] for n in leaves) == sorted(topo.cpus)
    all_names = [n.name for n in tree.walk()]
    assert len(all_names) == len(set(all_names))
    for node in tree.walk():
        if node.children:
            assert_partition(tuple(c.cpus for c in node.children), node.cpus)
    assert [n.level for n in _first_path(tree)] == [
        "system",
        "package",
        "die",
        "numa",
        "l2cache",
        "core",
        "thread",
    ]


def _first_path(tree: TreeNode) -> Iterator[TreeNode]:
    node: TreeNode | None = tree
    while node is not None:
        yield node
        node = node.children[0] if node.children else None


# ---------------------------------------------------------------------------
# n4c16


def test_n4c16_counts_and_masks(n4c16: Topology) -> None:
    t = n4c16
    assert (t.online, t.possible, t.isolated) == (P("0-15"), P("0-15"), 0)
    assert masks(t.package_masks) == {0: "0-7", 1: "8-15"}
    assert masks(t.node_masks) == {0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15"}
    assert {k: F(v) for k, v in t.die_masks.items()} == {(0, 0): "0-7", (1, 0): "8-15"}
    assert len(t.core_masks) == 8
    assert [F(m) for m in t.level_masks("core")] == [f"{i}-{i + 1}" for i in range(0, 16, 2)]
    assert masks(t.l3_masks) == {0: "0-7", 1: "8-15"}
    assert t.level_masks("l2cache") == t.level_masks("core")
    assert t.nodes[0].distances == {0: 10, 1: 11, 2: 21, 3: 21}
    assert t.nodes[3].mem_total_kb == 2 * 1024 * 1024
    assert t.memory_nodes == P("0-3")
    info = t.cpus[13]
    assert (info.package, info.die, info.node, info.core, info.thread, info.core_id) == (
        1,
        0,
        3,
        12,
        1,
        2,
    )
    assert {c.freq for c in t.cpus.values()} == {t.cpus[0].freq}
    assert (t.cpus[0].freq.min, t.cpus[0].freq.base, t.cpus[0].freq.max) == (
        800_000,
        2_900_000,
        3_800_000,
    )
    assert t.performance_cpus == t.online and t.efficient_cpus == 0
    check_invariants(t)


def test_n4c16_tree_names(n4c16: Topology) -> None:
    tree = n4c16.tree()
    assert (tree.name, tree.level, tree.cpus) == ("system", "system", P("0-15"))
    assert names(tree, "package") == ["p0", "p1"]
    assert names(tree, "die") == ["p0d0", "p1d0"]
    assert names(tree, "numa") == ["p0d0n0", "p0d0n1", "p1d0n2", "p1d0n3"]
    assert names(tree, "l2cache")[:3] == ["p0d0n0$0", "p0d0n0$1", "p0d0n1$2"]
    assert names(tree, "core") == [
        "p0d0n0cpu0",
        "p0d0n0cpu2",
        "p0d0n1cpu4",
        "p0d0n1cpu6",
        "p1d0n2cpu8",
        "p1d0n2cpu10",
        "p1d0n3cpu12",
        "p1d0n3cpu14",
    ]
    assert names(tree, "thread")[:4] == [
        "p0d0n0cpu0t0",
        "p0d0n0cpu0t1",
        "p0d0n0cpu2t2",
        "p0d0n0cpu2t3",
    ]
    node = tree.find("p1d0n3cpu14")
    assert node is not None and node.cpus == P("14-15")
    assert tree.find("nope") is None
    assert "p1d0n3cpu14t15 (thread): 15" in str(tree)
    assert n4c16.tree() is tree


def test_helpers(n4c16: Topology) -> None:
    t = n4c16
    assert t.siblings(P("0,5,9")) == P("0-1,4-5,8-9")
    assert t.siblings(0) == 0
    assert t.single_thread(P("0-5")) == P("0,2,4")
    assert t.single_thread(P("1,3-4,7")) == P("1,3-4,7")
    assert t.single_thread(P("1,3-5,7")) == P("1,3-4,7")
    assert t.closest_nodes(P("0,15")) == P("0,3")
    assert t.closest_nodes(0) == 0
    assert t.node_cpus(P("1-2")) == P("4-11")
    assert t.nodes_by_distance(0) == [(11, P("1")), (21, P("2-3"))]
    assert t.expand(P("3"), "numa") == P("0-3")
    assert t.expand(P("3,9"), "package") == P("0-15")
    assert t.expand(P("3"), "thread") == P("3")
    assert t.expand(P("3"), "system") == P("0-15")
    assert t.expand(P("3"), "l3cache") == P("0-7")
    # CPUs the topology does not know (offline, beyond possible) pass through.
    assert t.siblings(P("2,20,5000")) == P("2-3,20,5000")
    assert t.single_thread(P("2-3,20,5000")) == P("2,20,5000")
    with pytest.raises(ValueError, match="unknown topology level"):
        t.level_masks("socket")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown topology level"):
        t.expand(1, "socket")  # type: ignore[arg-type]
    assert "16 CPUs 0-15" in repr(t)


# ---------------------------------------------------------------------------
# Xeon 6776P


def test_xeon_6776p(xeon: Topology) -> None:
    t = xeon
    assert t.online == P("0-255")
    assert len(t.cpus) == 256 and len(t.core_masks) == 128
    assert all(t.core_masks[c] == 1 << c | 1 << (c + 128) for c in range(128))
    assert all(t.cpus[c + 128].core == c and t.cpus[c + 128].thread == 1 for c in range(128))
    assert masks(t.package_masks) == {0: "0-63,128-191", 1: "64-127,192-255"}
    assert {k: F(v) for k, v in t.die_masks.items()} == {
        (0, 0): "0-63,128-191",
        (1, 1): "64-127,192-255",
    }
    # sst.md §5.1: CPU -> punit table, SNC2 node = 2*pkg + punit.
    assert masks(t.node_masks) == {
        0: "0-31,128-159",
        1: "32-63,160-191",
        2: "64-95,192-223",
        3: "96-127,224-255",
    }
    assert len(t.l2_masks) == 128 and t.l2_masks == t.core_masks
    assert masks(t.l3_masks) == {0: "0-63,128-191", 1: "64-127,192-255"}
    assert all(t.cpus[c].core_id == c % 64 for c in range(256))
    freq = t.cpus[255].freq
    assert (freq.min, freq.base, freq.max) == (800_000, 2_300_000, 4_600_000)
    assert t.nodes[1].distances == {0: 12, 1: 10, 2: 21, 3: 21}
    # The nri quickstart log: CPUs 32,160 -> mems 1; 64,192 -> mems 2.
    assert t.closest_nodes(P("32,160")) == P("1")
    assert t.closest_nodes(P("64,192")) == P("2")
    assert t.single_thread(t.online) == P("0-127")
    assert t.siblings(P("5")) == P("5,133")
    check_invariants(t)


def test_xeon_6776p_tree(xeon: Topology) -> None:
    tree = xeon.tree()
    assert names(tree, "die") == ["p0d0", "p1d1"]
    assert names(tree, "numa") == ["p0d0n0", "p0d0n1", "p1d1n2", "p1d1n3"]
    core = tree.find("p1d1n3cpu96")
    assert core is not None and core.level == "core"
    assert [c.name for c in core.children] == ["p1d1n3cpu96t96", "p1d1n3cpu96t224"]
    l2 = tree.find("p1d1n3$96")
    assert l2 is not None and l2.cpus == P("96,224")
    assert len(names(tree, "thread")) == 256


def test_xeon_l3_per_snc_domain(tmp_path: Path) -> None:
    spec = dataclasses.replace(XEON_6776P, l3_scope="numa", cstates=(), cpufreq=None, uncore=None)
    t = Topology.from_sysfs(write_topology(tmp_path, spec))
    assert list(t.l3_masks.values()) == list(t.node_masks.values())
    assert t.cpus[0].freq.max == 0


# ---------------------------------------------------------------------------
# s8c4k


def test_s8c4k_sparse(s8c4k: Topology) -> None:
    t = s8c4k
    assert t.online == P("0-2,511,1535,4095")
    assert t.possible == P("0-4095")
    assert masks(t.package_masks) == {0: "0-2,511", 2: "1535", 7: "4095"}
    assert sorted(t.nodes) == list(range(8))
    assert masks(t.node_masks) == {
        0: "0-2,511",
        1: "",
        2: "1535",
        3: "",
        4: "",
        5: "",
        6: "",
        7: "4095",
    }
    for n in (1, 3, 4, 5, 6):
        assert t.nodes[n].cpus == 0 and t.nodes[n].mem_total_kb == 2 * 1024 * 1024
    assert t.memory_nodes == P("0-7")
    assert len(t.level_masks("numa")) == 3
    assert t.cpus[4095].core_id == 511 and t.cpus[1535].package == 2
    assert t.node_cpus(P("7")) == P("4095")
    assert t.closest_nodes(P("1535,4095")) == P("2,7")
    assert t.siblings(P("4095")) == P("4095")
    assert t.cpus[0].freq.max == 0
    tree = t.tree()
    assert names(tree, "package") == ["p0", "p2", "p7"]
    assert names(tree, "thread")[-1] == "p7d0n7cpu4095t4095"
    check_invariants(t)


# ---------------------------------------------------------------------------
# variants of the generated trees


def test_cpus_n_tree(tmp_path: Path) -> None:
    # No caches, no distances, no meminfo: cores are L2 groups, the die is the L3 group.
    t = Topology.from_sysfs(write_cpu_tree(tmp_path, 4))
    assert t.l2_masks == t.core_masks == {c: 1 << c for c in range(4)}
    assert masks(t.l3_masks) == {0: "0-3"}
    assert t.nodes[0].distances == {0: 10} and t.nodes[0].mem_total_kb == 0
    assert t.memory_nodes == 1
    check_invariants(t)


def test_offline_and_isolated(tmp_path: Path) -> None:
    spec = dataclasses.replace(N4C16, online="0-14", present="0-15", isolated="0-1,15")
    root = write_topology(tmp_path, spec)
    assert not (root / CPU / "cpu15/topology").exists()
    t = Topology.from_sysfs(root)
    assert t.online == P("0-14") and t.possible == P("0-15")
    assert t.isolated == P("0-1")
    assert t.cpus[0].isolated and not t.cpus[2].isolated
    assert t.core_masks[14] == P("14") and t.cpus[14].thread == 0
    assert t.node_masks[3] == P("12-14")
    check_invariants(t)


def test_hybrid_core_types(tmp_path: Path) -> None:
    spec = TopologySpec(cores_per_node=8, threads_per_core=1, efficient_cpus="4-7")
    root = write_topology(tmp_path, spec)
    t = Topology.from_sysfs(root)
    assert (t.performance_cpus, t.efficient_cpus) == (P("0-3"), P("4-7"))
    assert t.cpus[5].core_type is CoreType.EFFICIENT
    assert t.cpus[0].core_type == "performance"
    # Only cpu_atom: the rest are performance cores.
    (root / "sys/devices/cpu_core/cpus").unlink()
    assert Topology.from_sysfs(root).efficient_cpus == P("4-7")
    (root / "sys/devices/cpu_atom/cpus").unlink()
    (root / "sys/devices/cpu_core/cpus").write_text("0-5\n")
    assert Topology.from_sysfs(root).efficient_cpus == P("6-7")


def test_base_frequency_fallback(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_topology(tmp_path, N4C16)
    for cpu in (3, 4):
        (root / CPU / f"cpu{cpu}/cpufreq/base_frequency").unlink()
    shutil.rmtree(root / CPU / "cpu5/cpufreq")
    with caplog.at_level(logging.WARNING, "nri_framework.topology"):
        t = Topology.from_sysfs(root)
    assert t.cpus[3].freq.base == t.cpus[3].freq.max == 3_800_000
    assert t.cpus[2].freq.base == 2_900_000
    assert t.cpus[5].freq.max == 0
    assert "base_frequency for CPUs 3-4" in caplog.text


def test_no_numa_and_missing_optional_files(tmp_path: Path) -> None:
    root = write_topology(tmp_path, N4C16)
    shutil.rmtree(root / NODE)
    for cpu in range(16):
        (root / CPU / f"cpu{cpu}/topology/die_id").unlink()
        (root / CPU / f"cpu{cpu}/topology/thread_siblings_list").unlink()
    (root / CPU / "possible").unlink()
    t = Topology.from_sysfs(root)
    assert masks(t.node_masks) == {0: "0-15"}
    assert t.possible == t.online
    assert list(t.die_masks) == [(0, 0), (1, 0)]
    assert t.core_masks[0] == P("0-1")  # from core_cpus_list
    assert names(t.tree(), "numa") == ["p0d0n0", "p1d0n0"]
    check_invariants(t)


def test_cache_without_id_groups_by_shared_cpus(tmp_path: Path) -> None:
    spec = TopologySpec(cores_per_node=4, threads_per_core=2, cores_per_l2=2)
    root = write_topology(tmp_path, spec)
    for cpu in range(8):
        (root / CPU / f"cpu{cpu}/cache/index2/id").unlink()
    t = Topology.from_sysfs(root)
    assert masks(t.l2_masks) == {0: "0-3", 4: "4-7"}
    assert names(t.tree(), "l2cache") == ["p0d0n0$0", "p0d0n0$4"]
    assert names(t.tree(), "core") == ["p0d0n0cpu0", "p0d0n0cpu2", "p0d0n0cpu4", "p0d0n0cpu6"]


# ---------------------------------------------------------------------------
# property tests


@st.composite
def specs(draw: st.DrawFn) -> TopologySpec:
    dies = draw(st.integers(1, 2))
    cores = draw(st.integers(1, 4))
    spec = TopologySpec(
        packages=draw(st.integers(1, 3)),
        dies_per_package=dies,
        nodes_per_die=draw(st.integers(1, 2)),
        cores_per_node=cores,
        threads_per_core=draw(st.integers(1, 3)),
        numbering=draw(st.sampled_from(["qemu", "smt-last"])),
        die_id_is_package=dies == 1 and draw(st.booleans()),
        cores_per_l2=draw(st.sampled_from([d for d in range(1, cores + 1) if cores % d == 0])),
        l3_scope=draw(st.sampled_from(["package", "die", "numa"])),
    )
    online = draw(st.sets(st.integers(0, spec.ncpus - 1), min_size=1))
    return dataclasses.replace(spec, online=F(cpuset.from_ids(online)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_generated_trees_round_trip(spec: TopologySpec) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t = Topology.from_sysfs(write_topology(Path(tmp), spec))
    online = spec.online_mask
    assert t.online == online and t.possible == spec.possible_mask
    sims = {c.cpu: c for c in spec.cpus() if online >> c.cpu & 1}
    for cpu, sim in sims.items():
        info = t.cpus[cpu]
        assert (info.package, info.die, info.node, info.core_id) == (
            sim.package,
            sim.die,
            sim.node,
            sim.core_id,
        )
        same_core = cpuset.from_ids(c for c, s in sims.items() if s.core == sim.core)
        assert t.core_masks[info.core] == same_core == t.siblings(1 << cpu)
        same_l2 = cpuset.from_ids(c for c, s in sims.items() if s.l2 == sim.l2)
        assert t.l2_masks[info.l2] == same_l2
    assert len(t.package_masks) == len({s.package for s in sims.values()})
    assert len(t.level_masks("numa")) == len({s.node for s in sims.values()})
    assert len(t.nodes) == spec.packages * spec.dies_per_package * spec.nodes_per_die
    check_invariants(t)


def touched_cores(cores: list[int], mask: int) -> int:
    """The reference: ``mask`` and every core it touches."""
    out = mask
    for core in cores:
        if core & mask:
            out |= core
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(), st.data())
def test_siblings_are_the_cores_a_mask_touches(spec: TopologySpec, data: st.DataObject) -> None:
    """By shifts (the generated numberings are regular) or CPU by CPU, with
    CPUs that are not online (or beyond every core) kept as they are."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Topology.from_sysfs(write_topology(Path(tmp), spec))
    cores = list(t.core_masks.values())
    assert sibling_shifts(cores) is not None
    mask = cpuset.from_ids(data.draw(st.sets(st.integers(0, spec.ncpus + 8))))
    assert t.siblings(mask) == touched_cores(cores, mask)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 11), min_size=1, max_size=48), st.data())
def test_sibling_shifts_of_any_core_layout(owner: list[int], data: st.DataObject) -> None:
    """CPU i in core owner[i]: any layout the shifts take gives each mask
    exactly its cores; past MAX_SIBLING_SHIFTS distances there are none."""
    cores = [
        m for k in set(owner) if (m := cpuset.from_ids(i for i, o in enumerate(owner) if o == k))
    ]
    shifts = sibling_shifts(cores)
    distances = {
        b - a for core in cores for a in cpuset.ids(core) for b in cpuset.ids(core) if a != b
    }
    assert (shifts is None) == (len(distances) > MAX_SIBLING_SHIFTS)
    if shifts is not None:
        mask = cpuset.from_ids(data.draw(st.sets(st.integers(0, len(owner) + 4))))
        assert shift_siblings(shifts, mask) == touched_cores(cores, mask)


def test_siblings_of_an_irregular_layout_walk_the_cpus() -> None:
    """A layout with more thread distances than shifts are kept for (CPU i
    in core i % 5, 8 threads each, and a core of two): the CPU-by-CPU walk,
    the same answer."""
    owner = [i % 5 for i in range(40)] + [7, 7]
    cpus = {
        i: CpuInfo(id=i, package=0, die=0, node=0, core_id=o, core=owner.index(o), thread=0,
                   l2=0, l3=0, core_type=CoreType.PERFORMANCE, isolated=False, freq=CpuFreq())
        for i, o in enumerate(owner)
    }  # fmt: skip
    t = Topology(cpus, {0: NumaNode(id=0, cpus=(1 << 42) - 1, distances={0: 10}, mem_total_kb=1)})
    cores = list(t.core_masks.values())
    assert len(cores) == 6 and sibling_shifts(cores) is None
    for mask in (0, 1, 1 << 41, 0b1011 << 20, 1 << 50 | 1 << 3, (1 << 45) - 1):
        assert t.siblings(mask) == touched_cores(cores, mask)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 96), st.data())
def test_cpus_n_round_trip(ncpus: int, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t = Topology.from_sysfs(write_cpu_tree(Path(tmp), ncpus))
    assert t.online == (1 << ncpus) - 1
    assert len(t.core_masks) == ncpus and list(t.package_masks) == [0]
    check_invariants(t)
    mask = cpuset.from_ids(data.draw(st.sets(st.integers(0, ncpus - 1))))
    assert t.siblings(mask) == t.single_thread(mask) == mask
    assert t.closest_nodes(mask) == (1 if mask else 0)


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 300)))
def test_helper_properties(xeon: Topology, ids: set[int]) -> None:
    mask = cpuset.from_ids(ids)
    sib = xeon.siblings(mask)
    one = xeon.single_thread(mask)
    assert mask & ~sib == 0 and one & ~mask == 0
    assert xeon.siblings(one) == sib
    for core in xeon.level_masks("core"):
        assert (one & core).bit_count() == (1 if mask & core else 0)
        assert sib & core in (0, core)
    nodes = xeon.closest_nodes(mask)
    assert xeon.node_cpus(nodes) & mask == mask & xeon.online


# ---------------------------------------------------------------------------
# this machine


def test_this_machine() -> None:
    t = Topology.from_sysfs("/")
    online = P(Path("/sys/devices/system/cpu/online").read_text())
    assert t.online == online
    assert cpuset.from_ids(os.sched_getaffinity(0)) & ~online == 0
    for cpu in cpuset.ids(online):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        siblings = P((topo / "thread_siblings_list").read_text()) & online
        assert t.siblings(1 << cpu) == siblings
        assert t.cpus[cpu].package == int((topo / "physical_package_id").read_text())
    check_invariants(t)

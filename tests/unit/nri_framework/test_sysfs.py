"""Reading sysfs (:mod:`nri_framework.sysfs`): a broken tree is a TopologyError naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import CpuFreqSpec, TopologySpec
from nri_framework.topology import Topology, TopologyError

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


@pytest.fixture
def small(tmp_path: Path) -> Path:
    spec = TopologySpec(packages=2, nodes_per_die=1, cores_per_node=2, threads_per_core=2)
    return write_topology(tmp_path, spec)


def _expect(root: Path, rel: str, match: str) -> None:
    with pytest.raises(TopologyError, match=match) as info:
        Topology.from_sysfs(root)
    assert info.value.path == root / rel
    assert str(root / rel) in str(info.value)


def test_missing_online(small: Path) -> None:
    (small / CPU / "online").unlink()
    _expect(small, f"{CPU}/online", "missing")


def test_invalid_online(small: Path) -> None:
    (small / CPU / "online").write_text("0-x\n")
    _expect(small, f"{CPU}/online", "invalid list")


def test_empty_online(small: Path) -> None:
    (small / CPU / "online").write_text("\n")
    _expect(small, f"{CPU}/online", "no online CPUs")


def test_missing_package_id(small: Path) -> None:
    (small / CPU / "cpu3/topology/physical_package_id").unlink()
    _expect(small, f"{CPU}/cpu3/topology/physical_package_id", "missing")


def test_missing_cpu_directory(small: Path) -> None:
    shutil.rmtree(small / CPU / "cpu6")
    _expect(small, f"{CPU}/cpu6/topology/physical_package_id", "missing")


def test_invalid_core_id(small: Path) -> None:
    (small / CPU / "cpu2/topology/core_id").write_text("two\n")
    _expect(small, f"{CPU}/cpu2/topology/core_id", "invalid integer")


def test_missing_siblings(small: Path) -> None:
    for name in ("thread_siblings_list", "core_cpus_list"):
        (small / CPU / f"cpu1/topology/{name}").unlink()
    _expect(small, f"{CPU}/cpu1/topology/core_cpus_list", "missing")


def test_cpu_not_in_own_siblings(small: Path) -> None:
    (small / CPU / "cpu1/topology/thread_siblings_list").write_text("2-3\n")
    _expect(small, f"{CPU}/cpu1/topology/thread_siblings_list", "not in its own thread siblings")


def test_asymmetric_siblings(small: Path) -> None:
    (small / CPU / "cpu0/topology/thread_siblings_list").write_text("0-2\n")
    _expect(small, f"{CPU}/cpu1/topology/thread_siblings_list", "CPU 0 lists thread siblings")


def test_inconsistent_cache_id(small: Path) -> None:
    (small / CPU / "cpu2/cache/index2/id").write_text("0\n")
    _expect(small, f"{CPU}/cpu2/cache/index2/shared_cpu_list", "L2 cache id 0 is shared by")


def test_partly_missing_cache(small: Path) -> None:
    shutil.rmtree(small / CPU / "cpu5/cache/index3")
    _expect(small, f"{CPU}/cpu5/cache", "no L3 cache for CPUs 5")


def test_cache_level_garbage(small: Path) -> None:
    (small / CPU / "cpu4/cache/index2/level").write_text("L2\n")
    _expect(small, f"{CPU}/cpu4/cache/index2/level", "invalid integer")


def test_missing_node_cpulist(small: Path) -> None:
    (small / NODE / "node1/cpulist").unlink()
    _expect(small, f"{NODE}/node1/cpulist", "missing")


def test_cpu_in_no_node(small: Path) -> None:
    (small / NODE / "node1/cpulist").write_text("4-6\n")
    _expect(small, NODE, "CPUs 7 are in no NUMA node")


def test_cpu_in_two_nodes(small: Path) -> None:
    (small / NODE / "node1/cpulist").write_text("3-7\n")
    _expect(small, f"{NODE}/node1/cpulist", "CPU 3 is in NUMA node 0 and in node 1")


def test_bad_distances(small: Path) -> None:
    (small / NODE / "node0/distance").write_text("10\n")
    _expect(small, f"{NODE}/node0/distance", "1 distances")
    (small / NODE / "node0/distance").write_text("10 far\n")
    _expect(small, f"{NODE}/node0/distance", "invalid distances")


def test_bad_meminfo(small: Path) -> None:
    (small / NODE / "node1/meminfo").write_text("Node 1 MemTotal: lots kB\n")
    _expect(small, f"{NODE}/node1/meminfo", "MemTotal")


def test_no_online_nodes(small: Path) -> None:
    (small / NODE / "online").write_text("\n")
    _expect(small, f"{NODE}/online", "no online NUMA nodes")


def test_hybrid_overlap(small: Path) -> None:
    for kind, cpus in (("core", "0-3"), ("atom", "2-7")):
        path = small / f"sys/devices/cpu_{kind}/cpus"
        path.parent.mkdir(parents=True)
        path.write_text(cpus)
    _expect(small, "sys/devices/cpu_atom/cpus", "listed in both")
    (small / "sys/devices/cpu_atom/cpus").write_text("5-6")
    _expect(small, "sys/devices/cpu_atom/cpus", "in neither")
    (small / "sys/devices/cpu_core/cpus").write_text("0-4,7")
    _expect(small, "sys/devices/cpu_atom/cpus", "only partly listed")


def test_unreadable_file(small: Path) -> None:
    path = small / CPU / "cpu0/topology/core_id"
    path.unlink()
    path.mkdir()
    _expect(small, f"{CPU}/cpu0/topology/core_id", "cannot read")


def test_energy_performance_preference(tmp_path: Path) -> None:
    """Each CPU's EPP is read as it is; a CPU without cpufreq has none; an
    over-long or multi-word file is an error naming it."""
    spec = TopologySpec(
        packages=1,
        cores_per_node=2,
        threads_per_core=1,
        cpufreq=CpuFreqSpec(800_000, 2_000_000, 3_000_000),
        epp_by_cpus=(("1", "power"),),
    )
    root = write_topology(tmp_path, spec)
    topo = Topology.from_sysfs(root)
    assert [topo.cpus[c].epp for c in (0, 1)] == ["balance_performance", "power"]
    rel = f"{CPU}/cpu1/cpufreq/energy_performance_preference"
    (root / rel).write_text("x" * 100_000)
    _expect(root, rel, "invalid energy performance preference")
    (root / rel).write_text("balance power\n")
    _expect(root, rel, "invalid energy performance preference")
    shutil.rmtree(root / f"{CPU}/cpu1/cpufreq")
    assert Topology.from_sysfs(root).cpus[1].epp == ""

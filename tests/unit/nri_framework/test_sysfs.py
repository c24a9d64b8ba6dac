"""Reading sysfs (:mod:`nri_framework.sysfs`): a broken tree is a TopologyError naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from nri_framework import sysfs
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import (
    GNR_CSTATES,
    HYBRID12,
    N4C16,
    N6_HBM_CXL,
    S8C4K,
    XEON_6776P,
    CpuFreqSpec,
    TopologySpec,
)
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


# -- a CPU an earlier cache list names takes that group without its own list ----------


def _read_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Discovery as before lists named CPUs and shared C-state names: every CPU reads
    each cache index and each C-state name it has."""
    monkeypatch.setattr(sysfs._CacheGroups, "take_named", lambda self, cpu: False)
    names = sysfs._cstate_names
    monkeypatch.setattr(sysfs, "_cstate_names", lambda cpuidle, known=None: names(cpuidle))


@pytest.mark.parametrize(
    "spec",
    [
        XEON_6776P,
        HYBRID12,
        N4C16,
        S8C4K,
        N6_HBM_CXL,
        TopologySpec(packages=2, dies_per_package=2, cores_per_node=4, cores_per_l2=2),
        TopologySpec(packages=2, cores_per_node=4, l3_scope="numa", online="0-5,7,9-15"),
        TopologySpec(packages=1, nodes_per_die=2, cores_per_node=2, numbering="linux"),
    ],
    ids=lambda s: s.name if s.name != "custom" else None,
)
def test_named_cpus_same_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: TopologySpec
) -> None:
    root = write_topology(tmp_path, spec)
    got = Topology.from_sysfs(root)
    _read_everything(monkeypatch)
    want = Topology.from_sysfs(root)
    assert got.cpus == want.cpus
    assert got.l2_masks == want.l2_masks and got.l3_masks == want.l3_masks


def test_cpu_named_by_two_lists_reads_its_own(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CPU 0's L2 names 0 and 2, CPU 1's names 1 and 2: which is CPU 2's? Its own files
    # say it has an L2 of its own (id 102), as discovery read it before lists named CPUs.
    index2 = small / CPU / "cpu{}/cache/index2"
    for cpu, shared, cache_id in ((0, "0,2", 100), (1, "1-2", 101), (2, "2", 102), (3, "3", 103)):
        (Path(str(index2).format(cpu)) / "shared_cpu_list").write_text(f"{shared}\n")
        (Path(str(index2).format(cpu)) / "id").write_text(f"{cache_id}\n")
    got = Topology.from_sysfs(small)
    assert got.cpus[2].l2 == 102
    _read_everything(monkeypatch)
    assert Topology.from_sysfs(small).cpus == got.cpus


def test_named_cpu_files_not_read(small: Path) -> None:
    # CPU 1 is in CPU 0's L2 list and CPUs 1-3 in its L3 list: sysfs says which cache
    # they share, so their own lists are not read (an unreadable one goes unnoticed)
    for cpu in (1, 3):
        for index in (2, 3):
            (small / CPU / f"cpu{cpu}/cache/index{index}/shared_cpu_list").write_text("x\n")
    topology = Topology.from_sysfs(small)
    assert topology.l2_masks[topology.cpus[1].l2] == 0b11
    assert topology.cpus[3].l3 == topology.cpus[0].l3


def test_file_past_one_read_read_whole(small: Path) -> None:
    # one read(2) of READ_SIZE is a whole sysfs attribute; a longer file is read to its end
    meminfo = small / NODE / "node1/meminfo"
    filler = "".join(f"Node 1 Filler{i}: 0 kB\n" for i in range(sysfs.READ_SIZE // 20))
    assert len(filler) > sysfs.READ_SIZE
    meminfo.write_text(filler + "Node 1 MemTotal:       1234567 kB\n")
    assert Topology.from_sysfs(small).nodes[1].mem_total_kb == 1234567


# -- C-state names: CPUs of one idle driver with the same state directories share them ---


@pytest.fixture
def idle(tmp_path: Path) -> Path:
    spec = TopologySpec(packages=1, cores_per_node=2, threads_per_core=2, cstates=GNR_CSTATES)
    return write_topology(tmp_path, spec)


def _name(root: Path, cpu: int, state: int) -> Path:
    return root / CPU / f"cpu{cpu}/cpuidle/state{state}/name"


def test_cstate_names_read_once_per_state_directories(
    idle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one driver (no cpuidle/driver under a CPU), the same state directories: the
    # names are those of the first CPU read, the others' name files are not opened
    opened: list[str] = []
    text = sysfs._text
    monkeypatch.setattr(sysfs, "_text", lambda path, *a: opened.append(path) or text(path, *a))
    topology = Topology.from_sysfs(idle)
    names = {"POLL", *(s.name for s in GNR_CSTATES)}
    assert all(topology.cpus[cpu].cstates == names for cpu in range(4))
    assert sorted(p for p in opened if "/cpuidle/" in p) == sorted(
        str(_name(idle, 0, i)) for i in range(len(names))
    )


def test_cpu_with_other_states_reads_its_own(idle: Path) -> None:
    # CPU 2 has a state fewer (its last removed): its state directories are not
    # those read before, so it reads its own names (C1X where the others have C1)
    last = len(GNR_CSTATES)
    shutil.rmtree(_name(idle, 2, last).parent)
    _name(idle, 2, 1).write_text("C1X\n")
    topology = Topology.from_sysfs(idle)
    assert topology.cpus[2].cstates == {"POLL", "C1X", *(s.name for s in GNR_CSTATES[1:-1])}
    assert topology.cpus[1].cstates == topology.cpus[0].cstates
    assert "C1X" not in topology.cpus[0].cstates


def test_cpu_with_its_own_driver_reads_its_own(idle: Path) -> None:
    # per-CPU idle drivers (cpuidle/driver, CONFIG_CPU_IDLE_MULTIPLE_DRIVERS) may share a
    # name and not their states: a CPU showing one reads its own names
    for cpu in range(4):
        (idle / CPU / f"cpu{cpu}/cpuidle/driver").mkdir()
        (idle / CPU / f"cpu{cpu}/cpuidle/driver/name").write_text("arm_idle\n")
    _name(idle, 1, 1).write_text("C1X\n")
    topology = Topology.from_sysfs(idle)
    assert "C1X" in topology.cpus[1].cstates and "C1X" not in topology.cpus[0].cstates


def test_cstate_names_partly_unreadable_not_shared(idle: Path) -> None:
    # CPU 0's state 1 name cannot be read: it is left out of CPU 0's names only
    path = _name(idle, 0, 1)
    path.unlink()
    path.mkdir()
    topology = Topology.from_sysfs(idle)
    want = {"POLL", *(s.name for s in GNR_CSTATES)}
    assert topology.cpus[0].cstates == want - {GNR_CSTATES[0].name}
    assert all(topology.cpus[cpu].cstates == want for cpu in (1, 2, 3))

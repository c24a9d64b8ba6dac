"""Memory-only NUMA nodes from sysfs (:mod:`nri_framework.sysfs`): each node's memory
type, size, distances and normal memory, read from the files a kernel writes, on
upstream's ``n6-hbm-cxl`` fixture; machines with CPUs on every node are unchanged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N4C16, N6_HBM_CXL, S8C4K
from nri_framework.topology import MemoryType, Topology

NODE = "sys/devices/system/node"
DRAM, PMEM, HBM = MemoryType.DRAM, MemoryType.PMEM, MemoryType.HBM


@pytest.fixture
def n6(tmp_path: Path) -> Path:
    return write_topology(tmp_path, N6_HBM_CXL)


def test_n6_hbm_cxl_nodes(n6: Path) -> None:
    topo = Topology.from_sysfs(n6)
    assert topo.online == 0xFF and len(topo.nodes) == 6
    kinds = {n.id: n.memory_type for n in topo.nodes.values()}
    assert kinds == {0: DRAM, 1: DRAM, 2: HBM, 3: HBM, 4: PMEM, 5: PMEM}
    assert [n.cpus for n in topo.nodes.values()] == [0x0F, 0xF0, 0, 0, 0, 0]
    assert [n.mem_total_kb >> 20 for n in topo.nodes.values()] == [2, 2, 1, 1, 4, 4]
    # upstream's node-dist, symmetric; node 0-1 at the script's default
    assert topo.nodes[0].distances == {0: 10, 1: 21, 2: 15, 3: 30, 4: 60, 5: 70}
    assert topo.nodes[5].distances == {0: 70, 1: 60, 2: 72, 3: 62, 4: 75, 5: 10}
    assert topo.memory_type_masks == {DRAM: 0b11, HBM: 0b1100, PMEM: 0b110000}
    assert topo.memory_nodes == topo.normal_memory_nodes == 0b111111
    # a memory-only node has no CPU tree node
    assert [n.name for n in topo.tree().walk() if n.level == "numa"] == ["p0d0n0", "p1d0n1"]


def test_the_memory_type_follows_the_size_not_a_file(n6: Path) -> None:
    # upstream: a memory-only node smaller than the average DRAM node is HBM
    (n6 / NODE / "node4" / "meminfo").write_text("Node 4 MemTotal: 1024 kB\n")
    assert Topology.from_sysfs(n6).nodes[4].memory_type is HBM


def test_movable_only_memory(n6: Path) -> None:
    (n6 / NODE / "has_normal_memory").write_text("0-3\n")
    topo = Topology.from_sysfs(n6)
    assert topo.normal_memory_nodes == 0b1111
    assert not topo.nodes[4].normal_memory and topo.nodes[3].normal_memory


def test_without_has_files(n6: Path) -> None:
    for name in ("has_memory", "has_normal_memory"):
        (n6 / NODE / name).unlink()
    topo = Topology.from_sysfs(n6)
    assert topo.memory_nodes == topo.normal_memory_nodes == 0b111111  # from MemTotal
    assert topo.nodes[2].memory_type is HBM


def test_a_node_without_cpus_or_memory_is_no_memory_node(n6: Path) -> None:
    (n6 / NODE / "has_memory").write_text("0-4\n")
    topo = Topology.from_sysfs(n6)
    assert topo.memory_nodes == 0b11111
    assert topo.nodes[5].memory_type is DRAM  # not a memory node: never chosen
    assert topo.memory_type_masks[PMEM] == 0b10000


def test_machines_with_cpus_on_every_node_are_all_dram(tmp_path: Path) -> None:
    topo = Topology.from_sysfs(write_topology(tmp_path / "a", N4C16))
    assert topo.memory_type_masks == {DRAM: 0b1111}
    # s8c4k: nodes 1, 3-6 have memory and no CPUs, as large as the others: PMEM
    topo = Topology.from_sysfs(write_topology(tmp_path / "b", S8C4K))
    assert topo.memory_type_masks == {DRAM: 0b10000101, PMEM: 0b01111010}


def test_a_kernel_without_numa_has_one_normal_dram_node(tmp_path: Path) -> None:
    root = write_topology(tmp_path, dataclasses.replace(N4C16, name="no-numa", numa=False))
    topo = Topology.from_sysfs(root)
    assert topo.memory_type_masks == {DRAM: 1}
    assert topo.normal_memory_nodes == 1  # no has_* files, no meminfo: still normal memory

"""The sysfs fixture writer: file contents of the preset topologies."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from nri_framework import cpuset
from nri_framework.simulate.sysfs import (
    TopologyError,
    _hexmask,
    online,
    prepare_host_root,
    write_topology,
)
from nri_framework.simulate.topologies import (
    S8C4K,
    XEON_6776P,
    TopologySpec,
    UncoreSpec,
)

CPU = "sys/devices/system/cpu"
NODE = "sys/devices/system/node"


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text().removesuffix("\n")


@pytest.fixture(scope="module")
def xeon(module_tmp: Path) -> Path:
    return write_topology(module_tmp / "xeon", "xeon-6776p")


def test_xeon_files(xeon: Path) -> None:
    for name, value in (
        ("online", "0-255"),
        ("possible", "0-255"),
        ("present", "0-255"),
        ("offline", ""),
        ("isolated", ""),
    ):
        assert read(xeon, f"{CPU}/{name}") == value
    topo = f"{CPU}/cpu130/topology"
    assert read(xeon, f"{topo}/thread_siblings_list") == "2,130"
    assert read(xeon, f"{topo}/physical_package_id") == "0"
    assert read(xeon, f"{topo}/die_id") == "0"
    assert read(xeon, f"{topo}/core_id") == "2"
    assert read(xeon, f"{topo}/cluster_id") == "2"
    assert read(xeon, f"{topo}/package_cpus_list") == "0-63,128-191"
    assert read(xeon, f"{CPU}/cpu64/topology/package_cpus_list") == "64-127,192-255"
    assert read(xeon, f"{CPU}/cpu64/topology/die_id") == "1"
    assert read(xeon, f"{topo}/thread_siblings") == (
        "00000000,00000000,00000000,00000004,00000000,00000000,00000000,00000004"
    )
    cache = f"{CPU}/cpu200/cache"
    assert [read(xeon, f"{cache}/index{i}/type") for i in range(4)] == [
        "Data",
        "Instruction",
        "Unified",
        "Unified",
    ]
    assert read(xeon, f"{cache}/index2/shared_cpu_list") == "72,200"
    assert read(xeon, f"{cache}/index3/shared_cpu_list") == "64-127,192-255"
    assert read(xeon, f"{cache}/index3/id") == "1"
    assert (xeon / CPU / "cpu200/node2").resolve() == (xeon / NODE / "node2").resolve()


def test_xeon_cpufreq_cpuidle(xeon: Path) -> None:
    f = f"{CPU}/cpu77/cpufreq"
    for name, value in (
        ("cpuinfo_min_freq", "800000"),
        ("cpuinfo_max_freq", "4600000"),
        ("base_frequency", "2300000"),
        ("scaling_min_freq", "800000"),
        ("scaling_max_freq", "4600000"),
        ("scaling_governor", "powersave"),
        ("scaling_available_governors", "performance powersave"),
        ("scaling_driver", "intel_pstate"),
        ("energy_performance_preference", "balance_performance"),
    ):
        assert read(xeon, f"{f}/{name}") == value
    idle = f"{CPU}/cpu255/cpuidle"
    states = sorted((xeon / idle).iterdir())
    assert [read(xeon, f"{idle}/{s.name}/name") for s in states] == [
        "POLL",
        "C1",
        "C1E",
        "C6",
        "C6P",
    ]
    assert {read(xeon, f"{idle}/{s.name}/disable") for s in states} == {"0"}
    assert read(xeon, f"{idle}/state3/latency") == "170"
    assert read(xeon, f"{idle}/state4/residency") == "1000"
    assert read(xeon, f"{CPU}/cpuidle/current_driver") == "intel_idle"
    assert read(xeon, f"{CPU}/intel_pstate/no_turbo") == "0"


def test_xeon_uncore(xeon: Path) -> None:
    base = xeon / CPU / "intel_uncore_frequency"
    assert sorted(p.name for p in base.iterdir()) == [
        "package_00_die_00",
        "package_01_die_00",
        *(f"uncore{i:02d}" for i in range(8)),
    ]
    u = f"{CPU}/intel_uncore_frequency"
    assert [read(xeon, f"{u}/uncore{i:02d}/package_id") for i in range(8)] == list("00001111")
    assert [read(xeon, f"{u}/uncore{i:02d}/domain_id") for i in range(8)] == list("01230123")
    assert read(xeon, f"{u}/uncore01/agent_types") == "core cache memory"
    assert read(xeon, f"{u}/uncore03/agent_types") == "io"
    for name in ("initial_min_freq_khz", "initial_max_freq_khz", "min_freq_khz", "max_freq_khz"):
        assert (base / "package_01_die_00" / name).is_file()
        assert (base / "uncore07" / name).is_file()
    assert not (base / "package_00_die_00" / "current_freq_khz").exists()


def test_xeon_nodes(xeon: Path) -> None:
    assert read(xeon, f"{NODE}/online") == "0-3"
    assert read(xeon, f"{NODE}/has_cpu") == "0-3"
    assert read(xeon, f"{NODE}/node1/cpulist") == "32-63,160-191"
    assert read(xeon, f"{NODE}/node1/distance") == "12 10 21 21"
    assert read(xeon, f"{NODE}/node1/meminfo").startswith("Node 1 MemTotal:       268435456 kB")


def test_n4c16_files(tmp_path: Path) -> None:
    root = write_topology(tmp_path, "N4C16")
    assert read(root, f"{CPU}/cpu5/topology/thread_siblings_list") == "4-5"
    assert read(root, f"{CPU}/cpu5/topology/thread_siblings") == "0030"
    assert read(root, f"{CPU}/cpu5/cpufreq/base_frequency") == "2900000"
    assert read(root, f"{CPU}/cpu5/cpufreq/cpuinfo_max_freq") == "3800000"
    assert read(root, f"{NODE}/node2/cpulist") == "8-11"
    assert read(root, f"{NODE}/node0/distance") == "10 11 21 21"
    assert read(root, f"{CPU}/cpu0/cpuidle/state1/name") == "C1E"
    assert not (root / CPU / "intel_uncore_frequency").exists()


def test_s8c4k_files(tmp_path: Path) -> None:
    root = write_topology(tmp_path, S8C4K)
    assert read(root, f"{CPU}/possible") == "0-4095"
    assert read(root, f"{CPU}/online") == "0-2,511,1535,4095"
    assert read(root, f"{CPU}/present") == "0-2,511,1535,4095"
    assert sorted(int(p.name[3:]) for p in (root / CPU).glob("cpu[0-9]*")) == [
        0,
        1,
        2,
        511,
        1535,
        4095,
    ]
    assert read(root, f"{CPU}/cpu4095/topology/physical_package_id") == "7"
    assert read(root, f"{CPU}/cpu4095/topology/core_id") == "511"
    assert read(root, f"{CPU}/cpu1535/topology/thread_siblings_list") == "1535"
    assert read(root, f"{NODE}/online") == "0-7"
    assert read(root, f"{NODE}/has_cpu") == "0,2,7"
    assert read(root, f"{NODE}/node3/cpulist") == ""
    assert read(root, f"{NODE}/node0/cpulist") == "0-2,511"
    assert not (root / CPU / "cpu0/cpufreq").exists()
    mask = read(root, f"{CPU}/cpu4095/topology/thread_siblings")
    assert mask.split(",")[0] == "80000000" and len(mask.split(",")) == 128


def test_offline_cpu_keeps_cpuidle(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        XEON_6776P, online="0-254", present="0-255", uncore=UncoreSpec(io_domains=0)
    )
    root = write_topology(tmp_path, spec)
    assert read(root, f"{CPU}/cpu255/online") == "0"
    assert read(root, f"{CPU}/offline") == "255"
    assert not (root / CPU / "cpu255/topology").exists()
    assert not (root / CPU / "cpu255/cpufreq").exists()
    assert read(root, f"{CPU}/cpu255/cpuidle/state4/name") == "C6P"
    assert read(root, f"{CPU}/cpu127/topology/thread_siblings_list") == "127"
    assert len(list((root / CPU / "intel_uncore_frequency").glob("uncore*"))) == 4


def test_hexmask() -> None:
    assert _hexmask(1, 2) == "1"
    assert _hexmask(3, 2) == "3"
    assert _hexmask(0x30, 16) == "0030"
    assert _hexmask(1 << 32, 40) == "01,00000000"
    assert _hexmask(0, 64) == "00000000,00000000"


def test_prepare_host_root(tmp_path: Path) -> None:
    root = prepare_host_root("s8c4k", tmp_path / "a")
    assert root == tmp_path / "a" / "host"
    assert online(root) == "0-2,511,1535,4095" and online(root, "node") == "0-7"
    assert online(prepare_host_root("cpus:3", tmp_path / "b")) == "0-2"
    assert prepare_host_root(str(root), tmp_path / "unused") == root
    with pytest.raises(TopologyError, match="xeon-6776p"):
        prepare_host_root("n9c99", tmp_path)
    with pytest.raises(TopologyError, match="expected cpus:N"):
        prepare_host_root("cpus:many", tmp_path)
    with pytest.raises(TopologyError, match="unknown topology"):
        write_topology(tmp_path, "n9c99")
    assert online(write_topology(tmp_path / "c", "cpus:2")) == "0-1"


def test_hybrid_files(tmp_path: Path) -> None:
    spec = TopologySpec(cores_per_node=6, threads_per_core=1, efficient_cpus="2-5")
    root = write_topology(tmp_path, spec)
    assert read(root, "sys/devices/cpu_core/cpus") == "0-1"
    assert read(root, "sys/devices/cpu_atom/cpus") == "2-5"
    assert cpuset.parse(read(root, f"{CPU}/online")) == 0x3F

"""Memory placement (:mod:`nri_balloons.memplacement`, reference §9, upstream
libmem): the nodes of each requested memory type closest to a balloon's CPUs, on
upstream's ``n6-hbm-cxl`` machine (DRAM 0-1, HBM 2-3, PMEM 4-5)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from nri_balloons import annotations as ann
from nri_balloons import memplacement
from nri_balloons.configyaml import load_policy
from nri_balloons.memplacement import MemoryPlacer, parse_types, place
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.model import Container, Pod
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N4C16, N6_HBM_CXL, MemoryNodeSpec
from nri_framework.topology import MemoryType, Topology
from topologies import topology

NODE = "sys/devices/system/node"
PKG0, PKG1 = cpuset.parse("0-3"), cpuset.parse("4-7")


def nodes(topo: Topology, cpus: int, types: str = "") -> str:
    return cpuset.format(place(topo, cpus, parse_types(types) if types else ()).nodes)


def test_parse_types() -> None:
    assert parse_types("hbm, DRAM") == {MemoryType.HBM, MemoryType.DRAM}
    for bad in ("hbmx,dram", "", "hbm,"):
        with pytest.raises(ValueError) as info:
            parse_types(bad)
        assert str(info.value) == f'libmem: invalid type: "{bad}"'


def test_a_huge_type_list_is_refused_with_a_short_error() -> None:
    with pytest.raises(ValueError) as info:
        parse_types("hbm," * 50_000)
    assert len(str(info.value)) < 120 and "(too long)" in str(info.value)


@pytest.mark.parametrize(
    ("types", "pkg0", "pkg1"),
    [
        ("", "0", "1"),  # the types of the CPUs' nodes: DRAM
        ("hbm", "2", "3"),
        ("dram", "0", "1"),
        ("pmem", "4", "5"),
        ("hbm,dram", "0,2", "1,3"),
        ("dram,pmem", "0,4", "1,5"),
        ("hbm,dram,pmem", "0,2,4", "1,3,5"),
        ("hbm,pmem", "2,4", "3,5"),
    ],
)
def test_closest_nodes_of_each_type(types: str, pkg0: str, pkg1: str) -> None:
    topo = topology(N6_HBM_CXL)
    assert nodes(topo, PKG0, types) == pkg0
    assert nodes(topo, PKG1, types) == pkg1
    # CPUs on both packages: the closest of each type to either node
    assert nodes(topo, PKG0 | PKG1, types) == cpuset.format(cpuset.parse(pkg0) | cpuset.parse(pkg1))


def test_the_distance_decides_not_the_node_id() -> None:
    # HBM node 3 next to node 0, node 2 next to node 1: the ids say nothing
    swapped = dataclasses.replace(
        N6_HBM_CXL,
        name="n6-swapped",
        memory_nodes=(
            MemoryNodeSpec(1 << 20, ((0, 30), (1, 15), (3, 35))),
            MemoryNodeSpec(1 << 20, ((0, 15), (1, 30), (2, 35))),
            *N6_HBM_CXL.memory_nodes[2:],
        ),
    )
    topo = topology(swapped)
    assert nodes(topo, PKG0, "hbm") == "3"
    assert nodes(topo, PKG1, "hbm") == "2"


def test_a_type_the_node_lacks_is_dropped() -> None:
    topo = topology(N4C16)
    got = place(topo, cpuset.parse("0-3"), parse_types("hbm,dram"))
    assert (cpuset.format(got.nodes), got.missing) == ("0", {MemoryType.HBM})
    got = place(topo, cpuset.parse("0-3"), parse_types("pmem"))
    assert (cpuset.format(got.nodes), got.missing) == ("0", {MemoryType.PMEM})


def n6_with_normal(tmp_path: Path, normal: str) -> Topology:
    root = write_topology(tmp_path, N6_HBM_CXL)
    (root / NODE / "has_normal_memory").write_text(normal + "\n")
    return Topology.from_sysfs(root)


def test_the_zone_grows_until_it_has_normal_memory(tmp_path: Path) -> None:
    # HBM node 2 has movable memory only: the next HBM node is added
    topo = n6_with_normal(tmp_path, "0-1,3-5")
    assert nodes(topo, PKG0, "hbm") == "2-3"
    assert nodes(topo, PKG0, "dram") == "0"


def test_no_normal_memory_falls_back_to_the_cpus_nodes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = n6_with_normal(tmp_path, "")
    placer = MemoryPlacer(topo)
    with caplog.at_level(logging.INFO):
        got = placer.mems("c0", "ns/pod0/c0", PKG1, parse_types("hbm"), None)
    assert cpuset.format(got) == "1"
    assert (
        "allocMem: falling back to 1, failed to allocate memory for ns/pod0/c0: "
        "no normal memory (of any type)"
    ) in caplog.messages


def test_placer_annotation_overrides_and_warnings(caplog: pytest.LogCaptureFixture) -> None:
    placer = MemoryPlacer(topology(N4C16))
    balloon = parse_types("dram")
    with caplog.at_level(logging.INFO):
        for _ in range(3):  # pinned again and again: one warning
            assert placer.mems("c0", "ns/p/c0", 0b1111, balloon, "hbm,dram") == 0b1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "memory type(s) HBM not present" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert placer.mems("c1", "ns/p/c1", 0b1111, balloon, "hbmx") == 0b1
    assert (
        'container ns/p/c1 has invalid effective "memory-type.resource-policy.nri.io" '
        'annotation ("hbmx"): libmem: invalid type: "hbmx"'
    ) in caplog.messages
    placer.keep_only(["c1"])
    assert list(placer._last) == ["c1"]


CONFIG = """
reservedResources: {cpu: "1"}
pinMemory: true
balloonTypes:
- {name: mem-types, minCPUs: 2, maxCPUs: 2, preferNewBalloons: true, memoryTypes: [HBM, PMEM]}
- {name: no-pin-mem, minCPUs: 1, maxCPUs: 1, preferNewBalloons: true, pinMemory: false}
"""


def test_policy_pins_memory_by_type_annotation_and_pin_memory() -> None:
    topo = topology(N6_HBM_CXL)
    result = validate(load_policy(CONFIG), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    policy = BalloonsPolicy(topo)
    policy.set_config(result.prepared)
    key = ann.BALLOON
    pod = Pod(
        id="p",
        name="pod0",
        namespace="default",
        cgroup_parent="/kubepods/podp",
        annotations={
            f"{key}/container.c0": "mem-types",
            f"{key}/container.c1": "mem-types",
            f"{key}/container.c2": "no-pin-mem",
            f"{ann.MEMORY_TYPE}/container.c0": "hbm",
        },
    )
    for name in ("c0", "c1", "c2"):
        policy.allocate(pod, Container(id=name, pod_sandbox_id="p", name=name))
    got = policy.pinning(lambda _pid: pod)
    c0_cpus = cpuset.parse(got["c0"][0])
    pkg = "0" if c0_cpus & PKG0 else "1"
    hbm, pmem = {"0": ("2", "4"), "1": ("3", "5")}[pkg]
    assert got["c0"][1] == hbm  # the annotation overrides the type's memoryTypes
    assert got["c1"][1] == f"{hbm},{pmem}"  # the type's memoryTypes
    assert got["c2"][1] == ""  # pinMemory: false sets no mems


def test_a_farther_node_of_the_type_is_not_added() -> None:
    # libmem newCloseNodesOfType: node 0's nearest HBM (2, at 15) is kept; node
    # 1's nearest (3, at 30) is farther than that, so it is not added
    lopsided = dataclasses.replace(
        N6_HBM_CXL,
        name="n6-lopsided",
        memory_nodes=(
            MemoryNodeSpec(1 << 20, ((0, 15), (1, 40), (3, 35))),
            MemoryNodeSpec(1 << 20, ((0, 35), (1, 30), (2, 35))),
            *N6_HBM_CXL.memory_nodes[2:],
        ),
    )
    topo = topology(lopsided)
    assert nodes(topo, PKG0 | PKG1, "hbm") == "2"
    assert nodes(topo, PKG1, "hbm") == "3"


def test_memory_types_validation_texts() -> None:
    # stage 1, the CRD's XValidation (case-sensitive), then setConfig's libmem parse
    result = validate(
        load_policy(
            "reservedResources: {cpu: '1'}\n"
            "balloonTypes:\n- {name: a, memoryTypes: [dram, XPOINT, HBM]}\n"
        ),
        online_cpus=0xFF,
    )
    assert result.errors[:2] == [
        'spec.balloonTypes[0].memoryTypes[0]: Invalid value: "dram": invalid memory type:'
        " dram, expected DRAM, HBM, or PMEM",
        'spec.balloonTypes[0].memoryTypes[1]: Invalid value: "XPOINT": invalid memory type:'
        " XPOINT, expected DRAM, HBM, or PMEM",
    ]
    assert any(
        e.endswith('invalid memoryTypes: libmem: invalid type: "XPOINT"') for e in result.errors
    ), result.errors
    ok = validate(
        load_policy(
            "reservedResources: {cpu: '1'}\nballoonTypes:\n- {name: a, memoryTypes: [HBM, PMEM]}\n"
        ),
        online_cpus=0xFF,
    )
    assert ok.errors == [] and ok.prepared is not None


def test_the_nodes_of_cpu_sets_are_remembered_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each balloon CPU set asked for gets the nodes holding it (debug lines
    too), and no more than AFFINITIES_MAX sets are remembered."""
    monkeypatch.setattr(memplacement, "AFFINITIES_MAX", 4)
    topo = topology(N6_HBM_CXL)
    placer = MemoryPlacer(topo)
    for i, cpus in enumerate(list(range(1, 256, 7)) * 2):
        with_debug = i % 3 == 0
        with pytest.MonkeyPatch.context() as m:
            if with_debug:
                m.setattr(memplacement.log, "level", logging.DEBUG)
            placer.mems(f"c{i}", f"ns/p/c{i}", cpus, frozenset(), None)
        assert placer.allocator.requests[f"c{i}"].affinity == topo.closest_nodes(cpus)
        assert len(placer._affinity) <= 4

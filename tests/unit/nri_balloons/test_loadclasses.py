"""Load classes (reference §7.3, upstream e2e test15): balloons carrying a
core-level load never share physical cores; with overloadsLevelInBalloon a
balloon does not put two of its own CPUs on one core either."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.topology import Topology

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
allocatorTopologyBalancing: false
loadClasses:
- {name: avx, level: core, overloadsLevelInBalloon: true}
- {name: membw, level: l2cache}
balloonTypes:
- name: avx
  matchExpressions: [{key: pod/labels/load, operator: Equals, values: [avx]}]
  loads: %s
  preferNewBalloons: true
- name: plain
  matchExpressions: [{key: pod/labels/load, operator: Equals, values: [none]}]
  preferNewBalloons: true
"""


_TREES = tempfile.TemporaryDirectory(prefix="loadclasses-")
"""The cached topology's sysfs tree; removed when the test process exits."""


@functools.cache
def n4c16() -> Topology:
    root = Path(tempfile.mkdtemp(prefix="n4c16-", dir=_TREES.name))
    write_topology(root, "n4c16")
    return Topology.from_sysfs(str(root))


def policy(loads: str) -> BalloonsPolicy:
    topo = n4c16()
    result = validate(load_policy(CONFIG % loads), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    p = BalloonsPolicy(topo)
    p.set_config(result.prepared)
    return p


def place(p: BalloonsPolicy, i: int, load: str, cpus: int) -> int:
    pod = Pod(id=f"p{i}", name=f"p{i}", namespace="default", labels={"load": load},
              cgroup_parent=f"/kubepods/pod{i}")  # fmt: skip
    cpu = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
    bln = p.allocate(pod, Container(id=f"c{i}", pod_sandbox_id=pod.id, name="c",
                                    resources=Resources(cpu=cpu)))  # fmt: skip
    assert bln is not None
    return bln.cpus


def cores(topo: Topology, mask: int) -> list[int]:
    return [topo.siblings(1 << c) for c in cpuset.ids(mask)]


def test_avx_balloons_never_share_cores() -> None:
    p = policy("[avx]")
    topo = p.topology
    sets = [place(p, i, "avx", 1) for i in range(4)]
    touched = [topo.siblings(s) for s in sets]
    for i, a in enumerate(touched):
        for b in touched[i + 1 :]:
            assert a & b == 0, f"avx balloons share a core: {[cpuset.format(s) for s in sets]}"


def test_without_loads_balloons_pack_onto_sibling_threads() -> None:
    """The control: the same placements without the load share cores."""
    p = policy("[]")
    topo = p.topology
    touched = [topo.siblings(place(p, i, "avx", 1)) for i in range(4)]
    assert any(a & b for i, a in enumerate(touched) for b in touched[i + 1 :])


def test_overloads_level_in_balloon_spreads_own_cpus() -> None:
    p = policy("[avx]")
    topo = p.topology
    cpus = place(p, 0, "avx", 3)
    assert len({topo.siblings(1 << c) for c in cpuset.ids(cpus)}) == 3, cpuset.format(cpus)


def test_l2cache_loads_use_separate_l2s() -> None:
    p = policy("[membw]")
    topo = p.topology
    a = place(p, 0, "avx", 1)
    b = place(p, 1, "avx", 1)
    assert topo.expand(a, "l2cache") & b == 0, "l2cache loads share an L2"


def test_pin_cpu_false_leaves_cpus_alone() -> None:
    topo = n4c16()
    text = (CONFIG % "[]") + "pinCPU: false\n"
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None
    p = BalloonsPolicy(topo)
    p.set_config(result.prepared)
    place(p, 0, "none", 2)
    ((cpus, mems),) = p.pinning(lambda _pid: None).values()
    assert cpus == "" and mems != ""

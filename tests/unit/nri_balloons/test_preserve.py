"""Preserved containers (reference §5, §9; upstream ``PreserveCpuResources``,
``PreserveMemoryResources``): ``cpu.preserve`` and ``preserve.matchExpressions``
leave a container alone; ``memory.preserve`` keeps its own ``cpuset.mems``
while its CPUs are still its balloon's."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_balloons import annotations as ann
from nri_balloons.configyaml import load_policy
from nri_balloons.plugin import Balloons
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import PreparedConfig, validate
from nri_framework.host import PolicyHost
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.simulate.topologies import N4C16
from nri_framework.topology import Topology
from topologies import topology

CONFIG = """
reservedResources: {cpu: "cpuset:0"}
pinMemory: true
showContainersInNrt: true
balloonTypes:
- {name: ns, namespaces: ["*"], minCPUs: 2, maxCPUs: 4}
preserve:
  matchExpressions:
  - {key: name, operator: In, values: [kept]}
"""


def prepared(text: str, topo: Topology) -> PreparedConfig:
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


def pod_with(annotations: dict[str, str]) -> Pod:
    return Pod(
        id="p", name="p", namespace="ns", cgroup_parent="/kubepods/podp", annotations=annotations
    )


def ctr(name: str) -> Container:
    cpu = CpuResources(shares=102, quota=10_000, period=100_000, mems="0-3")
    return Container(id=name, pod_sandbox_id="p", name=name, resources=Resources(cpu=cpu))


def pins(
    annotations: dict[str, str], *names: str, text: str = CONFIG
) -> dict[str, tuple[str, str]]:
    topo = topology(N4C16)
    policy = BalloonsPolicy(topo)
    policy.set_config(prepared(text, topo))
    pod = pod_with(annotations)
    for name in names:
        policy.allocate(pod, ctr(name))
    return policy.pinning(lambda _pid: pod)


def test_memory_preserve_keeps_the_mems_and_pins_the_cpus() -> None:
    got = pins({ann.MEMORY_PRESERVE: "true"}, "c0", "c1")
    for name in ("c0", "c1"):
        cpus, mems = got[name]
        assert cpus and mems == "", got  # no mems in the adjustment: its own stay
    plain = pins({}, "c0")
    assert plain["c0"][0] == got["c0"][0]  # the same balloon CPUs either way
    assert plain["c0"][1] != ""  # without the annotation: the balloon's node


def test_memory_preserve_for_one_container_of_the_pod() -> None:
    got = pins({f"{ann.MEMORY_PRESERVE}/container.c1": "true"}, "c0", "c1")
    assert got["c0"][1] != ""
    assert got["c1"][1] == ""
    assert got["c0"][0] == got["c1"][0]


@pytest.mark.parametrize("value", ["false", "yes", ""])
def test_memory_preserve_not_true_pins_memory(value: str) -> None:
    """Go's ParseBool: only its true spellings preserve."""
    got = pins({ann.MEMORY_PRESERVE: value}, "c0")
    assert got["c0"][1] != ""


def test_cpu_preserve_and_preserve_expressions_leave_the_container_alone() -> None:
    got = pins({f"{ann.CPU_PRESERVE}/container.c1": "true"}, "c0", "c1", "kept")
    assert set(got) == {"c0"}  # c1 and kept are in no balloon: nothing is pinned


@pytest.fixture
def host(tmp_path: Path) -> PolicyHost:
    root = write_topology(tmp_path / "host", N4C16)
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(CONFIG)
    host = PolicyHost(
        "balloons", Balloons(), options={"config_file": str(cfg)}, host_root=str(root)
    )
    host.synchronize([], [])
    return host


def test_memory_preserved_container_through_the_hooks(host: PolicyHost) -> None:
    """Creation sets no mems, a resource update re-asserts the CPUs and not the
    mems, and a sibling moving the balloon updates its CPUs only."""
    pod = pod_with({f"{ann.MEMORY_PRESERVE}/container.c0": "true"})
    made = host.create_container(pod, ctr("c0"))
    assert made.adjustment is not None and made.adjustment.resources is not None
    cpu = made.adjustment.resources.cpu
    assert cpu is not None and cpu.cpus and cpu.mems == ""
    updates = host.update_container(pod, ctr("c0"), Resources(cpu=CpuResources(shares=204)))
    assert [u.container_id for u in updates] == ["c0"]
    upd = updates[0].resources.cpu
    assert upd is not None and upd.cpus == cpu.cpus and upd.mems == ""
    big = Container(
        id="c1",
        pod_sandbox_id="p",
        name="c1",
        resources=Resources(cpu=CpuResources(shares=3072, quota=300_000, period=100_000)),
    )
    made = host.create_container(pod, big)  # inflates the balloon c0 is in
    assert made.adjustment is not None and made.adjustment.resources is not None
    sibling = made.adjustment.resources.cpu
    assert sibling is not None and sibling.mems != ""
    moved = {u.container_id: u.resources.cpu for u in made.updates}
    assert moved["c0"] is not None and moved["c0"].cpus == sibling.cpus
    assert moved["c0"].mems == ""


def test_memory_preserved_container_zone_has_no_memory_set(host: PolicyHost) -> None:
    """Upstream n6-hbm-cxl/test04: a memory-preserved container's NRT subzone
    shows an empty ``memory set``; its siblings' show the balloon's nodes."""
    pod = pod_with({f"{ann.MEMORY_PRESERVE}/container.c0": "true"})
    host.create_container(pod, ctr("c0"))
    host.create_container(pod, ctr("c1"))
    zones = {
        z.name: {a.name: a.value for a in z.attributes}
        for z in host.hook.policy_topology_zones() or []
        if z.type == "allocation for container"
    }
    assert zones["ns/p/c0"]["memory set"] == ""
    assert zones["ns/p/c1"]["memory set"] != ""
    assert zones["ns/p/c0"]["cpuset"] == zones["ns/p/c1"]["cpuset"]

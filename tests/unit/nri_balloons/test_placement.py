"""The running allocation state as one value (nri_balloons.placement): a
reconfiguration that cannot be set up leaves the running placement as it was."""

from __future__ import annotations

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.placement import Placement, changes_placement
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.validation import PreparedConfig, validate
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.topologies import N4C16
from nri_framework.topology import Topology
from topologies import topology

RUNNING = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- {name: big, namespaces: [big], minBalloons: 1, minCPUs: 2}
"""
IMPOSSIBLE = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- {name: big, namespaces: [big], minBalloons: 2, minCPUs: 10}
"""


def prepared(text: str, topo: Topology) -> PreparedConfig:
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


def test_failed_reconfigure_keeps_the_running_placement() -> None:
    topo = topology(N4C16)
    policy = BalloonsPolicy(topo)
    policy.set_config(prepared(RUNNING, topo))
    pod = Pod(id="p", name="p", namespace="big", cgroup_parent="/kubepods/podp")
    cpu = CpuResources(shares=3072, quota=300_000, period=100_000)
    c = Container(id="c", pod_sandbox_id="p", name="c", resources=Resources(cpu=cpu))
    policy.allocate(pod, c)
    running = policy.placement
    before = (list(running.balloons), running.free, dict(running.owner), running.config)
    pins = policy.pinning(lambda _pid: pod)
    with pytest.raises(BalloonsError, match=r"^balloons: config update failed: "):
        policy.reconfigure(prepared(IMPOSSIBLE, topo), [(pod, c)])
    assert policy.placement is running
    assert (list(running.balloons), running.free, dict(running.owner), running.config) == before
    assert policy.pinning(lambda _pid: pod) == pins
    # and it goes on deciding on the running placement
    policy.release("c")
    assert policy.owner == {}


def test_a_new_configuration_gets_a_new_placement() -> None:
    topo = topology(N4C16)
    policy = BalloonsPolicy(topo)
    assert policy.placement == Placement() and policy.balloons == []
    policy.set_config(prepared(RUNNING, topo))
    first = policy.placement
    first_balloons = list(first.balloons)
    assert policy.reconfigure(prepared(RUNNING.replace("2}", "3}"), topo), []) == "placement"
    assert policy.placement is not first
    assert first.balloons == first_balloons  # the old value was not changed
    assert [b.cpus.bit_count() for b in policy.balloons if b.bdef.name == "big"] == [3]


def test_changes_placement_ignores_classes() -> None:
    topo = topology(N4C16)
    a = prepared(RUNNING, topo).spec
    b = prepared(RUNNING.replace("minCPUs: 2}", "minCPUs: 2, cpuClass: x}"), topo).spec
    assert a != b and not changes_placement(a, b)
    assert changes_placement(a, prepared(IMPOSSIBLE, topo).spec)

"""Invariants of the balloons policy over random create/remove sequences, on
every fixture topology: no CPU in two balloons, the reserved cpuset only in the
reserved balloon, sizes within min/max, nothing left after all containers are
gone, and a restart (export, new policy, restore) reproduces the assignment."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nri_balloons.configyaml import load_policy
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.validation import PreparedConfig, validate
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.topology import Topology

CONFIG = """
reservedResources: {cpu: "cpuset:%(reserved)s"}
allocatorTopologyBalancing: %(balancing)s
balloonTypes:
- name: reserved
  maxCPUs: %(reserved_max)d
- name: dedicated
  matchExpressions: [{key: qosclass, operator: In, values: [Guaranteed]}]
  preferNewBalloons: true
  preferSpreadingPods: true
  maxCPUs: 8
- name: small
  matchExpressions: [{key: pod/labels/kind, operator: Equals, values: [small]}]
  minCPUs: 1
  maxCPUs: 2
  minBalloons: 1
  maxBalloons: 3
- name: shared
  matchExpressions: [{key: qosclass, operator: In, values: [BestEffort, Burstable]}]
  shareIdleCPUsInSame: package
  maxBalloons: 2
"""

TOPOLOGIES = ["n4c16", "xeon-6776p", "s8c4k", "cpus:3"]


_TREES = tempfile.TemporaryDirectory(prefix="topo-")
"""Every cached topology's sysfs tree; removed when the test process exits."""


@functools.cache
def topology(name: str) -> Topology:
    root = Path(tempfile.mkdtemp(prefix=f"{name.replace(':', '-')}-", dir=_TREES.name))
    write_topology(root, name)
    return Topology.from_sysfs(str(root))


def prepared(topo: Topology, balancing: bool) -> PreparedConfig:
    lowest = cpuset.lowest(topo.online, 2 if topo.online.bit_count() > 4 else 1)
    text = CONFIG % {
        "reserved": cpuset.format(lowest),
        "balancing": str(balancing).lower(),
        "reserved_max": 4,
    }
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


KINDS = ("guaranteed", "burstable", "besteffort", "small", "kube-system")


def make(kind: str, i: int, cpus: int) -> tuple[Pod, Container]:
    ns = "kube-system" if kind == "kube-system" else "default"
    labels = {"kind": "small"} if kind == "small" else {}
    parent = {"guaranteed": "/kubepods/pod%d", "besteffort": "/kubepods/besteffort/pod%d"}.get(
        kind, "/kubepods/burstable/pod%d"
    ) % i
    pod = Pod(
        id=f"pod{i}",
        name=f"pod{i}",
        uid=f"uid{i}",
        namespace=ns,
        labels=labels,
        cgroup_parent=parent,
    )
    if kind == "guaranteed":
        cpu = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
    elif kind == "besteffort":
        cpu = CpuResources(shares=2)
    else:
        cpu = CpuResources(shares=256 * cpus)
    return pod, Container(
        id=f"c{i}", pod_sandbox_id=pod.id, name="ctr", resources=Resources(cpu=cpu)
    )


def check_invariants(policy: BalloonsPolicy) -> None:
    seen = 0
    for bln in policy.balloons:
        assert bln.cpus & seen == 0, f"CPU in two balloons: {bln}"
        seen |= bln.cpus
        assert bln.cpus & ~policy.allowed == 0
        n = bln.cpus.bit_count()
        assert n >= bln.bdef.min_cpus
        if bln.bdef.max_cpus:
            assert n <= bln.bdef.max_cpus
        if bln.bdef.name != "reserved":
            assert bln.cpus & policy.reserved == 0, f"reserved CPUs outside reserved: {bln}"
        if bln.members:
            assert n * 1000 >= min(bln.requested, (bln.bdef.max_cpus or 10**9) * 1000)
    assert seen & policy.free == 0
    assert seen | policy.free == policy.allowed


ops = st.lists(
    st.tuples(st.sampled_from(["add", "add", "remove"]), st.sampled_from(KINDS), st.integers(1, 3)),
    min_size=1,
    max_size=40,
)


@pytest.mark.parametrize("name", TOPOLOGIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, balancing=st.booleans(), data=st.data())
def test_random_churn(
    name: str, ops: list[tuple[str, str, int]], balancing: bool, data: st.DataObject
) -> None:
    topo = topology(name)
    cfg = prepared(topo, balancing)
    policy = BalloonsPolicy(topo)
    policy.set_config(cfg)
    check_invariants(policy)

    def sizes() -> list[tuple[str, int]]:
        return sorted((b.bdef.name, b.cpus.bit_count()) for b in policy.balloons)

    baseline = sizes()
    alive: list[str] = []
    for i, (op, kind, n) in enumerate(ops):
        if op == "add":
            pod, ctr = make(kind, i, n)
            try:
                policy.allocate(pod, ctr)
            except BalloonsError as exc:
                assert "no suitable balloon instance available" in str(exc) or "resizing" in str(
                    exc
                )
            else:
                alive.append(ctr.id)
        elif alive:
            victim = alive.pop(data.draw(st.integers(0, len(alive) - 1)))
            policy.release(victim)
        check_invariants(policy)

    # restart: export, a fresh policy, restore -> the same balloons and pins
    saved = policy.export()
    pins = policy.pinning(lambda _pid: None)
    again = BalloonsPolicy(topo)
    again.set_config(cfg)
    assert again.restore(saved, set(alive)) == set(alive)
    check_invariants(again)
    assert again.pinning(lambda _pid: None) == pins
    assert sorted((b.name, b.cpus) for b in again.balloons) == sorted(
        (b.name, b.cpus) for b in policy.balloons
    )

    for cid in alive:
        policy.release(cid)
        check_invariants(policy)
    assert not policy.owner
    # back to the pre-created balloons (which instance survives depends on the order)
    assert sizes() == baseline


def test_full_balloons_are_never_offered_the_reserved_cpus(tmp_path: Path) -> None:
    """The reserved cpuset is free (nothing runs in the reserved balloon) and
    every other CPU is taken: a balloon that wants one more CPU is offered
    none, and the container is refused as unplaceable (not by a resize that
    tried the reserved CPUs)."""
    write_topology(tmp_path, "cpus:8")
    topo = Topology.from_sysfs(str(tmp_path))
    text = """
reservedResources: {cpu: "cpuset:0-3"}
balloonTypes:
- name: dedicated
  matchExpressions: [{key: qosclass, operator: In, values: [Guaranteed]}]
"""
    result = validate(load_policy(text), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    policy = BalloonsPolicy(topo)
    policy.set_config(result.prepared)
    for i in range(2):
        policy.allocate(*make("guaranteed", i, 2))
    (dedicated,) = [b for b in policy.balloons if b.bdef.name == "dedicated"]
    assert dedicated.cpus == cpuset.parse("4-7")
    assert policy.free == policy.reserved == cpuset.parse("0-3")
    for bln in policy.balloons:
        offered = policy.available(bln.bdef)
        assert offered == (policy.reserved if bln.bdef.name == "reserved" else 0), bln
    with pytest.raises(BalloonsError) as refused:
        policy.allocate(*make("guaranteed", 2, 1))
    assert str(refused.value) == (
        "balloons: balloon allocation for container default/pod2/ctr failed: "
        "no suitable balloon instance available"
    )
    check_invariants(policy)

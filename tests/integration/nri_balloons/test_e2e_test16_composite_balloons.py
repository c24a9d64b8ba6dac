"""Upstream e2e balloons/n4c16/test16-composite-balloons: a composite of
composites balanced over the 4 NUMA nodes (equal CPUs per node, also after
deflating), composite balloons deleted when emptied, ``componentCreation:
balance-balloons`` choosing the least used component (node order 2-3-0-1 and
reuse), and a composite reserved balloon next to a CPU's L1 cache.

The NRT ``excess cpus`` check (3000m) reads :func:`nri_balloons.nrt.zones` of a
policy given the same configuration and pod0 (no NRT agent in the simulator).
"""

from __future__ import annotations

from balloons_e2e import Node, disjoint, node
from nri_balloons.balloon import Member
from nri_balloons.configyaml import load_policy
from nri_balloons.nrt import zones
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework.topology import Topology

TEST = "test16-composite-balloons"
NODE_CPUS = [set(range(4 * i, 4 * i + 4)) for i in range(4)]


def per_node(cpus: set[int]) -> list[int]:
    return [len(cpus & node_cpus) for node_cpus in NODE_CPUS]


def excess_cpus_after_pod0(n: Node) -> str:
    topo = Topology.from_sysfs(n.host_root)
    prepared = validate(load_policy(n.config.read_text()), online_cpus=topo.online).prepared
    assert prepared is not None
    policy = BalloonsPolicy(topo, str(n.host_root))
    policy.set_config(prepared)
    (bln,) = policy.instances(policy.types["balance-all-nodes"])
    for i in range(2):
        bln.members[f"c{i}"] = Member(f"c{i}", "p", "default", "pod0", f"pod0c{i}", 500, 500)
    zone = next(z for z in zones(policy, lambda cid: ("", "")) if z.name == "balance-all-nodes[0]")
    attrs = {a.name: a.value for a in zone.attributes}
    assert attrs["component cpusets"].count("{") == 7  # {{{a}, {b}}, {{c}, {d}}}
    return attrs["excess cpus"]


async def test_composite_balloons() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: the pre-created balance-all-nodes[0], 1 CPU on every node
        await n.create("pod0.yaml")
        assert len(n.cpus("pod0c0")) == 4
        assert len(n.cpus("pod0c1")) == 4
        assert n.nodes("pod0c0") == n.nodes("pod0c1") == {"node0", "node1", "node2", "node3"}
        assert n.balloon("pod0c0") == "balance-all-nodes[0]"
        assert excess_cpus_after_pod0(n) == "3000m"

        # pod1: a large workload balanced on all NUMA nodes
        await n.create("pod1.yaml")
        assert len(n.cpus("pod1c0")) == 12
        assert n.cpus("pod0c0") == n.cpus("pod0c1") == n.cpus("pod1c0")
        assert per_node(n.cpus("pod1c0")) == [3, 3, 3, 3]
        assert len(n.cpus("pod1c0") & {6, 7}) == 1  # cpu6 or cpu7 is reserved

        # pod2: kube-system on the composite reserved balloon, next to cpu6's L1
        await n.create("pod2.yaml")
        assert n.cpus("pod2c0") <= {6, 7}
        assert n.balloon("pod2c0") == "reserved[0]"

        # without pod1 the balloon deflates to 4 CPUs, still balanced
        await n.delete("pod1")
        assert len(n.cpus("pod0c0")) == 4
        assert n.cpus("pod0c0") == n.cpus("pod0c1")
        assert per_node(n.cpus("pod0c0")) == [1, 1, 1, 1]

        # balance-all-nodes[0] stays (minBalloons: 1)
        await n.delete("pod0", "pod2")
        # two balance-pkg1-nodes balloons use all 3+3 free CPUs of node2+node3
        await n.create("pod3.yaml")
        assert len(n.cpus("pod3c0")) == 2
        assert per_node(n.cpus("pod3c0"))[2:] == [1, 1]
        assert n.balloon("pod3c0") == "balance-pkg1-nodes[0]"
        await n.create("pod4.yaml")
        assert len(n.cpus("pod4c0")) == 4
        assert per_node(n.cpus("pod4c0"))[2:] == [2, 2]
        assert disjoint(n.cpus("pod4c0"), n.cpus("pod3c0"))
        assert n.balloon("pod4c0") == "balance-pkg1-nodes[1]"

        # emptied composites are deleted: balance-all-nodes[0] can grow to the max
        await n.delete("pod3", "pod4")
        await n.create("pod5.yaml")
        assert len(n.cpus("pod5c0")) == 12
        assert per_node(n.cpus("pod5c0")) == [3, 3, 3, 3]
        await n.delete_all()

        # componentCreation: balance-balloons assigns nodes in order 2-3-0-1
        # (balance-all-nodes[0] holds one balloon of each node type)
        for i, want in enumerate(["node2", "node3", "node0", "node1"]):
            await n.create(f"nodes2301-pod{i}.yaml")
            assert n.nodes(f"pod{i}c0") == {want}
        await n.delete("pod1")  # was on node3
        await n.create("nodes2301-pod4.yaml")
        assert n.nodes("pod4c0") == {"node3"}
        await n.delete_all()

        await n.create("new-on-node-1-pod5.yaml")
        assert n.nodes("pod5c0") == {"node1"}
        # node1 now has one more instance (new-on-node-1's component), so
        # balance-pkg1-nodes (node2+node3) is the less used component first
        await n.create("either-pkg-pod6.yaml")
        assert n.nodes("pod6c0") == {"node2", "node3"}
        await n.create("either-pkg-pod7.yaml")
        assert n.nodes("pod7c0") == {"node0", "node1"}
        await n.create("either-pkg-pod8.yaml")
        assert n.nodes("pod8c0") == {"node2", "node3"}

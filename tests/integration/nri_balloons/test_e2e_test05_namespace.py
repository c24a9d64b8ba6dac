"""Upstream e2e balloons/n4c16/test05-namespace: ``preferPerNamespaceBalloon``
with ``namespaces: ["*"]``, minCPUs 2 / maxCPUs 4: one balloon per namespace,
a fallback to balanced filling when CPUs run out, and the preserve
annotations leaving a container unpinned (``cpu.preserve``) or on its own
memory nodes (``memory.preserve``, also through a resource update)."""

from __future__ import annotations

from balloons_e2e import disjoint, node
from nri_framework.model import CpuResources, Resources

TEST = "test05-namespace"


async def test_namespace() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: default namespace -> nsballoon[0]
        await n.create("pod0.yaml")
        assert n.cpus("pod0c0") == n.cpus("pod0c1")
        assert len(n.cpus("pod0c0")) == 2
        assert n.balloon("pod0c0") == "nsballoon[0]"
        # pod1: e2e-a -> a balloon of its own
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0") == n.cpus("pod1c1")
        assert len(n.cpus("pod0c0")) == 2
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod1c0"))
        assert n.balloon("pod1c0") == "nsballoon[1]"
        # pod2: default namespace again -> nsballoon[0] inflates to 4 CPUs
        await n.create("pod2.yaml")
        assert n.cpus("pod2c0") == n.cpus("pod2c1")
        assert len(n.cpus("pod2c0")) == 4
        assert n.cpus("pod2c0") == n.cpus("pod0c0") == n.cpus("pod0c1")
        assert disjoint(n.cpus("pod2c0"), n.cpus("pod1c0"))
        assert n.balloon("pod2c0") == "nsballoon[0]"
        # pod3: nsballoon[0] is at maxCPUs -> a new balloon
        await n.create("pod3.yaml")
        assert n.cpus("pod3c0") == n.cpus("pod3c1")
        assert len(n.cpus("pod3c0")) == 2
        assert disjoint(n.cpus("pod3c0"), n.cpus("pod2c0"), n.cpus("pod1c0"))
        assert n.balloon("pod3c0") == "nsballoon[2]"
        # pod4: e2e-b -> a new balloon of 4 CPUs
        await n.create("pod4.yaml")
        assert n.cpus("pod4c0") == n.cpus("pod4c1")
        assert len(n.cpus("pod4c0")) == 4
        assert disjoint(*(n.cpus(f"pod{i}c0") for i in (4, 3, 2, 1)))
        # pod5: e2e-c -> a new balloon
        await n.create("pod5.yaml")
        assert n.cpus("pod5c0") == n.cpus("pod5c1")
        assert len(n.cpus("pod5c0")) == 2
        assert disjoint(*(n.cpus(f"pod{i}c0") for i in (5, 4, 3, 2, 1)))
        # pod6: e2e-d, but every CPU is in a balloon: balanced filling
        await n.create("pod6.yaml")
        assert not n.errors
        assert n.cpus("pod6c0") == n.cpus("pod6c1")
        # pod7: cpu.preserve for pod7c1 leaves it unpinned (all 16 CPUs)
        await n.create("pod7.yaml")
        assert n.cpus("pod6c0") == n.cpus("pod7c0")
        assert len(n.cpus("pod7c1")) > len(n.cpus("pod7c0"))
        assert len(n.cpus("pod7c1")) == 16
        await n.plugin.wait_output(
            "not handling resources of container e2e-d/pod7/pod7c1, preserving CPUs"
        )
        # memory.preserve for the whole pod: pod7c0 and pod7c2 run on their
        # balloon's CPUs but keep their own mems (the runtime's: every node),
        # where pod6c0 in the same balloon is pinned to the balloon's nodes
        every_node = set(range(4))
        assert n.cpus("pod7c2") == n.cpus("pod7c0")
        assert n.mems("pod6c0") < every_node
        assert n.mems("pod7c0") == n.mems("pod7c1") == n.mems("pod7c2") == every_node
        # the kubelet updates pod7c0's resources: the plugin re-asserts its
        # CPUs and leaves its mems alone
        cpus = n.cpus("pod7c0")
        await n.rt.update_container(
            n.ids["pod7c0"][1], Resources(cpu=CpuResources(shares=204, quota=20_000))
        )
        assert n.cpus("pod7c0") == cpus
        assert n.mems("pod7c0") == every_node

"""Upstream e2e balloons/n4c16/test03-reserved: ``reservedResources:
cpuset:0-2``, reservedPoolNamespaces globs, the balloon annotation moving a
kube-system pod out of and a default pod into the reserved balloon, which
inflates beyond its cpuset and deflates below it when emptied (reference
§8.1, §20.6).

Skipped: the cpuClass/idleCPUClass settings (cpuClass work item).
"""

from __future__ import annotations

from balloons_e2e import disjoint, node

TEST = "test03-reserved"
RESERVED = {0, 1, 2}


async def test_reserved() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: kube-system
        await n.create("pod0.yaml")
        assert n.cpus("pod0c0") <= RESERVED
        assert n.balloon("pod0c0") == "reserved[0]"
        # pod1: the first reservedPoolNamespaces glob ("monitor-*"), 2 containers
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0") == n.cpus("pod0c0")
        assert n.cpus("pod1c1") == n.cpus("pod0c0")
        # pod2: the last glob ("*-log*")
        await n.create("pod2.yaml")
        assert n.cpus("pod2c0") == n.cpus("pod0c0")
        assert n.balloon("pod2c0") == "reserved[0]"
        # pod3: a kube-system pod annotated to full-core
        await n.create("pod3.yaml")
        assert len(n.cpus("pod3c0")) == 2
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod3c0"))
        assert n.balloon("pod3c0") in ("full-core[0]", "full-core[1]")
        # pod4: the default balloon inflates (no maxCPUs)
        await n.create("pod4.yaml")
        assert len(n.cpus("pod4c0")) == 3
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod3c0"), n.cpus("pod4c0"))
        assert n.balloon("pod4c0") == "default[0]"
        # pod5: a default pod annotated to reserved: the reserved balloon
        # inflates beyond and keeps its cpuset
        await n.create("pod5.yaml")
        assert n.cpus("pod5c0") >= RESERVED
        assert len(n.cpus("pod5c0")) > 4
        assert disjoint(n.cpus("pod5c0"), n.cpus("pod3c0"), n.cpus("pod4c0"))
        assert n.balloon("pod5c0") == "reserved[0]"
        await n.delete_all()

        # pod6: the emptied default balloon is back to one CPU
        await n.create("pod6.yaml")
        assert len(n.cpus("pod6c0")) == 1
        # pod7: the emptied reserved balloon deflated below the reserved
        # cpuset (its minCPUs is 1) and stays inside it
        await n.create("pod7.yaml")
        assert n.cpus("pod7c0") <= RESERVED
        assert len(n.cpus("pod7c0")) < 3
        # (not upstream) the reserved type's own namespaces
        await n.create("pod8.yaml")
        assert n.balloon("pod8c0") == "reserved[0]"
        assert n.cpus("pod8c0") == n.cpus("pod7c0")

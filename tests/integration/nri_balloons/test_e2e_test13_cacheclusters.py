"""Upstream e2e balloons/n4c16/test13-cacheclusters: ``shareIdleCPUsInSame:
l2cache`` with the L2 layouts upstream sets through ``OVERRIDE_SYS_CACHES``
(here: the simulated sysfs with 2 cores, or 1 core, per L2 cache); balancing
vs packing relative to L2 groups; shared idle CPUs shrink when the reserved
balloon inflates."""

from __future__ import annotations

import dataclasses

from balloons_e2e import disjoint, node
from nri_framework.simulate.topologies import TOPOLOGIES

TEST = "test13-cacheclusters"
# L2 groups 0-3, 4-7, 8-11, 12-15 (4 CPUs, 2 cores each)
N4C16_L2_4CPU = dataclasses.replace(TOPOLOGIES["n4c16"], cores_per_l2=2)
# L2 groups 0-1, 2-3, ... (one core each): n4c16 as is
N4C16_L2_2CPU = TOPOLOGIES["n4c16"]


async def test_4cpu_cacheclusters() -> None:
    async with node(TEST, "balloons-4cpu.yaml", topology=N4C16_L2_4CPU) as n:
        # the e2e cluster's kube-system pods: 750m in the 1-CPU reserved
        # balloon, so that pod3c0 (500m) below inflates it
        await n.start_system_pods()
        # pod0c{0,1,2}: one container per free L2 group
        await n.create("pod0.yaml")
        for c in ("pod0c0", "pod0c1", "pod0c2"):
            assert len(n.cpus(c)) == 4
        assert disjoint(n.nodes("pod0c0"), n.nodes("pod0c1"), n.nodes("pod0c2"))
        # pod1c0: the last L2 group, shared with the 1-CPU reserved balloon
        await n.create("pod1.yaml")
        assert len(n.cpus("pod1c0")) == 3
        assert disjoint(n.cpus("pod1c0"), n.cpus("pod0c0"), n.cpus("pod0c1"), n.cpus("pod0c2"))

        # pod2c{0..3}: two per l2pack balloon, both packed in the reserved
        # balloon's L2 group and sharing its one idle CPU
        await n.delete_all()
        await n.create("pod2.yaml")
        pod2 = [n.cpus(f"pod2c{i}") for i in range(4)]
        assert all(len(c) == 2 for c in pod2)
        assert len(set.intersection(*pod2)) == 1
        assert len(set.union(*pod2)) == 3
        assert len({frozenset(n.nodes(f"pod2c{i}")) for i in range(4)}) == 1

        # pod3c0: the reserved balloon inflates from 1 to 2 CPUs and takes
        # the idle CPU the l2pack balloons shared
        await n.create("pod3.yaml")
        assert n.balloon("pod3c0") == "reserved[0]"
        together = ["pod3c0"] + [f"pod2c{i}" for i in range(4)]
        assert len({frozenset(n.nodes(c)) for c in together}) == 1
        assert len(n.cpus("pod3c0")) == 2
        for i in range(4):
            assert len(n.cpus(f"pod2c{i}")) == 1
            assert disjoint(n.cpus("pod3c0"), n.cpus(f"pod2c{i}"))
        assert len(n.cpus("pod3c0").union(*(n.cpus(f"pod2c{i}") for i in range(4)))) == 4


async def test_2cpu_cacheclusters() -> None:
    async with node(TEST, "balloons-2cpu.yaml", topology=N4C16_L2_2CPU) as n:
        # pod4c{0..3}: one container per free L2 group (single cores now),
        # balanced over the NUMA nodes
        await n.create("pod4.yaml")
        pod4 = [f"pod4c{i}" for i in range(4)]
        for c in pod4:
            assert len(n.cpus(c)) == 2
        assert disjoint(*(n.cpus(c) for c in pod4))
        assert disjoint(*(n.nodes(c) for c in pod4))
        # pod5c{0,1,2}: more free L2 groups
        await n.create("pod5.yaml")
        pod5 = [f"pod5c{i}" for i in range(3)]
        for c in pod5:
            assert len(n.cpus(c)) == 2
        assert disjoint(*(n.cpus(c) for c in pod5 + pod4))

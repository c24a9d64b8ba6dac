"""Upstream e2e balloons/n4c16/test30-numa-disabled: a kernel built without
NUMA (here: n4c16's simulated sysfs without ``sys/devices/system/node``);
preferCloseToDevices with a cache index path, the hide-hyperthreads
annotation, and minBalloons 2 of the default type with preferSpreadingPods."""

from __future__ import annotations

import dataclasses

from balloons_e2e import disjoint, node
from nri_framework.simulate.topologies import TOPOLOGIES

TEST = "test30-numa-disabled"
N4C16_NO_NUMA = dataclasses.replace(TOPOLOGIES["n4c16"], numa=False)


async def test_numa_disabled() -> None:
    async with node(TEST, "balloons.yaml", topology=N4C16_NO_NUMA) as n:
        assert not (n.host_root / "sys/devices/system/node").exists()
        # pod0: the single-thread-own-core balloon close to cpu7's L2 (CPUs
        # 6-7), one thread of it with hide-hyperthreads
        await n.create("pod0.yaml")
        pod0 = n.cpus("pod0c0") | n.cpus("pod0c1")
        assert len(pod0) == 1
        assert len(pod0 & {6, 7}) == 1
        # pod1: spread over the two pre-created 5-CPU default balloons
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0").isdisjoint({6, 7})
        assert n.cpus("pod1c1").isdisjoint({6, 7})
        assert len(n.cpus("pod1c0")) == 5
        assert len(n.cpus("pod1c1")) == 5
        assert disjoint(n.cpus("pod1c0"), n.cpus("pod1c1"))

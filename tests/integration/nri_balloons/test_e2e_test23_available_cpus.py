"""Upstream e2e balloons/n4c16/test23-available-cpus: ``exclude-cpuset:`` for
both availableResources and reservedResources.

Skipped: idleCPUClass / cpuClass (cpuClass work item).
"""

from __future__ import annotations

from balloons_e2e import node

TEST = "test23-available-cpus"
AVAILABLE = {2, 3, 6, 7, 10, 11, 14, 15}  # all but 0-1,4-5,8-9,12-13
RESERVED = {2, 3}  # available but 4-15


async def test_available_cpus() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: kube-system on the reserved CPUs
        await n.create("pod0.yaml")
        assert n.cpus("pod0c0") <= RESERVED
        assert n.balloon("pod0c0") == "reserved[0]"
        # pod1: a reservedPoolNamespaces namespace
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0") <= RESERVED
        assert n.balloon("pod1c0") == "reserved[0]"
        # (not upstream) a default pod: available, not reserved CPUs
        await n.create("pod2.yaml")
        assert n.cpus("pod2c0") <= AVAILABLE - RESERVED
        assert n.balloon("pod2c0") == "default[0]"

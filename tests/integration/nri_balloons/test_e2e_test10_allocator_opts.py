"""Upstream e2e balloons/n4c16/test10-allocator-opts: allocatorTopologyBalancing
x preferSpreadOnPhysicalCores (how many cores a balloon's CPUs are on), and
``preferCloseToDevices: /sys/devices/system/node/node2`` keeping node2 free
for that type and being ignored when the request does not fit there."""

from __future__ import annotations

from balloons_e2e import node

TEST = "test10-allocator-opts"


async def test_allocator_opts() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # pod0: policy defaults (balancing, spread on physical cores)
        await n.create("pod0.yaml")
        assert len(n.cores("pod0c0")) == 2
        assert len(n.cpus("pod0c0")) == 2
        assert "node2" not in n.nodes("pod0c0")
        # pod1: no spreading on physical cores: both threads of a core
        await n.create("pod1.yaml")
        assert len(n.cores("pod1c0")) == 1
        assert len(n.cpus("pod1c0")) == 2
        assert "node2" not in n.nodes("pod1c0")
        # pod2: grows 0 -> 1 -> 2 CPUs, on two cores
        await n.create("pod2.yaml")
        assert len(n.cores("pod2c0")) == 2
        assert len(n.cpus("pod2c0")) == 2
        assert n.cpus("pod2c0") == n.cpus("pod2c1")
        assert "node2" not in n.nodes("pod2c0")
        await n.delete("pod0", "pod1", "pod2")
        # pod3: grows 0 -> 1 -> 2 CPUs packed on one core
        await n.create("pod3.yaml")
        assert len(n.cores("pod3c0")) == 1
        assert len(n.cpus("pod3c0")) == 2
        assert n.cpus("pod3c0") == n.cpus("pod3c1")
        assert "node2" not in n.nodes("pod3c0")
        # pod4: the device-node2 type gets node2, kept free so far
        await n.create("pod4.yaml")
        assert n.nodes("pod4c0") == {"node2"}
        assert len(n.cores("pod4c0")) == 2
        assert len(n.cpus("pod4c0")) == 3
        # pod5: a second device-node2 balloon does not fit on node2
        await n.create("pod5.yaml")
        assert "node2" not in n.nodes("pod5c0")
        assert len(n.cores("pod5c0")) == 2
        assert len(n.cpus("pod5c0")) == 2

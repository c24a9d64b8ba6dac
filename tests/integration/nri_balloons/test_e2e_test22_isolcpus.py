"""Upstream e2e balloons/n4c16/test22-isolcpus: ``preferIsolCpus`` with the
kernel booted with ``isolcpus=0,1`` (here: n4c16's simulated sysfs with
``cpu/isolated`` = ``0-1``). The isolcpus balloon gets the isolated CPUs;
others avoid them.

Beyond upstream: the allocator picks CPUs 0-1 for the first balloon even
without isolated CPUs, so the same steps also run with ``isolcpus=14,15``,
which only ``preferIsolCpus`` (and the default balloon avoiding isolated
CPUs) explains."""

from __future__ import annotations

import dataclasses

import pytest
from balloons_e2e import node
from nri_framework.simulate.topologies import TOPOLOGIES

TEST = "test22-isolcpus"


@pytest.mark.parametrize("isolcpus", ["0,1", "14,15"])
async def test_isolcpus(isolcpus: str) -> None:
    isolated = {int(c) for c in isolcpus.split(",")}
    topology = dataclasses.replace(TOPOLOGIES["n4c16"], isolated=isolcpus)
    async with node(TEST, "balloons.yaml", topology=topology) as n:
        assert n.topology.isolated == sum(1 << c for c in isolated)
        # pod0: should run on non-isolated CPUs
        await n.create("pod0.yaml")
        assert (n.cpus("pod0c0") | n.cpus("pod0c1")).isdisjoint(isolated)
        # pod1: runs on system isolated CPUs
        await n.create("pod1.yaml")
        assert n.cpus("pod1c0") == isolated
        assert n.cpus("pod1c1") == isolated

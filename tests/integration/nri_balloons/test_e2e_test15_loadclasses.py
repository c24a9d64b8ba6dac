"""Upstream e2e balloons/n4c16/test15-loadclasses: balloons associated with the
loads they generate (``avx`` on cores with overloadsLevelInBalloon, ``membw``
on L2 caches); CPU allocation, tightly packed (allocatorTopologyBalancing
false), still avoids overloading a core or an L2 cache. The L2 layout of
upstream's ``OVERRIDE_SYS_CACHES`` (0-3, 4-7, 8-11, 12-15) is the simulated
sysfs with 2 cores per L2 cache.

Upstream's NRT zone listing there is a debug print, not a check."""

from __future__ import annotations

import dataclasses

from balloons_e2e import disjoint, node
from nri_framework.simulate.topologies import TOPOLOGIES

TEST = "test15-loadclasses"
N4C16_L2_4CPU = dataclasses.replace(TOPOLOGIES["n4c16"], cores_per_l2=2)


async def test_loadclasses() -> None:
    async with node(TEST, "balloons.yaml", topology=N4C16_L2_4CPU) as n:
        # One of pod0's two containers finds its CPUs on the node of both
        # pre-reserved-avx balloons and reserved[0]; the other does not fit
        # there, but packing keeps it on the same package.
        await n.create("pod0.yaml")
        assert len(n.cpus("pod0c0")) == 1
        assert len(n.cpus("pod0c1")) == 1
        assert disjoint(n.nodes("pod0c0"), n.nodes("pod0c1"))
        assert n.packages("pod0c0") == n.packages("pod0c1")

        # pod1: a noload balloon packed on the package of pod0
        await n.create("pod1.yaml")
        assert n.packages("pod1c0") == n.packages("pod0c0")

        # pod2: another noload balloon, on the other package (package0 is full)
        await n.create("pod2.yaml")
        assert n.packages("pod2c0") != n.packages("pod1c0")

        # pod3c0 (membw and avx loads) packed on the node of pod2c0 (no load)
        await n.create("pod3.yaml")
        assert len(n.cpus("pod3c0")) == 1
        assert n.nodes("pod3c0") == n.nodes("pod2c0")

        # pod4c0 not on the node of pod3c0: both load the L2 cache
        await n.create("pod4.yaml")
        assert len(n.cpus("pod4c0")) == 1
        assert disjoint(n.nodes("pod3c0"), n.nodes("pod4c0"))

        # pod5: the avx CPUs of pre-reserved-avx[0] as they are; both containers fit
        await n.create("pod5.yaml")
        assert len(n.cores("pod5c0")) == 2
        assert len(n.cpus("pod5c0")) == 2
        assert n.cpus("pod5c0") == n.cpus("pod5c1")

        # pod6 fills pre-reserved-avx[1], which resizes from 2 to 4 CPUs,
        # still on no sibling threads
        await n.create("pod6.yaml")
        assert len(n.cores("pod6c0")) == 4
        assert len(n.cpus("pod6c0")) == 4
        assert n.cpus("pod6c0") == n.cpus("pod6c1")
        assert disjoint(n.cores("pod6c0"), n.cores("pod5c0"))

        # virtual devices freed and recreated: delete the l2 and avx pods,
        # then an l2htload container of 4 CPUs gets 4 cores
        await n.delete("pod0", "pod3", "pod4", "pod5", "pod6")
        await n.create("pod7.yaml")
        assert len(n.cpus("pod7c0")) == 4
        assert len(n.cores("pod7c0")) == 4

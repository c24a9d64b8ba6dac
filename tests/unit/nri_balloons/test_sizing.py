"""Balloon capacity and shared idle CPUs (nri_balloons.sizing)."""

from __future__ import annotations

import dataclasses

import pytest
from nri_balloons.sizing import max_avail_milli_cpus, share_idle
from nri_framework import cpuset
from nri_framework.simulate.topologies import N4C16
from topologies import topology

P = cpuset.parse


def test_max_avail_milli_cpus() -> None:
    cpus, free = P("0-1"), P("4-9")
    assert max_avail_milli_cpus(cpus, free, 0) == 8000
    assert max_avail_milli_cpus(cpus, free, 7) == 8000  # maxCPUs > free: upstream quirk
    assert max_avail_milli_cpus(cpus, free, 4) == 4000
    assert max_avail_milli_cpus(cpus, free, -1) == -1000  # §20.15
    # composite: min(component) x #components caps the free count
    assert max_avail_milli_cpus(cpus, free, 0, components=[2000, 3000]) == 6000
    assert max_avail_milli_cpus(cpus, free, 0, components=[9000, 9000]) == 8000


def test_share_idle() -> None:
    """test13-cacheclusters: shareIdleCPUsInSame l2cache with two cores per L2."""
    spec = dataclasses.replace(N4C16, name="n4c16-l2x2-iso", cores_per_l2=2, isolated="3")
    topo = topology(spec)
    idle = P("2-15")
    assert share_idle(P("0"), idle, "l2cache", topo) == P("2")  # 3 is isolated
    assert share_idle(P("0"), idle, "numa", topo) == P("2")
    assert share_idle(P("0"), idle, "package", topo) == P("2,4-7")
    assert share_idle(P("0,9"), idle & ~P("9"), "numa", topo) == P("2,8,10-11")
    assert share_idle(P("0"), idle, "system", topo) == idle & ~P("3")
    assert share_idle(P("0"), idle, "core", topo) == 0
    assert share_idle(P("0"), idle, "", topo) == 0
    assert share_idle(P("0"), idle, "l3cache", topo) == P("2,4-7")
    with pytest.raises(ValueError, match="unknown topology level"):
        share_idle(P("0"), idle, "rack", topo)

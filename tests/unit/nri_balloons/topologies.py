"""Machines for the unit tests of the balloons policy: a topology spec written as a
sysfs tree under a temporary directory and discovered, once per spec (see
``conftest.py``, which puts this directory on ``sys.path`` and cleans up)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from nri_framework.simulate.sysfs import write_topology as _write_topology
from nri_framework.simulate.topologies import TopologySpec
from nri_framework.topology import Topology

_CACHE: dict[TopologySpec, Topology] = {}
_TMP: list[tempfile.TemporaryDirectory[str]] = []


def topology(spec: TopologySpec) -> Topology:
    """Write ``spec`` as a sysfs tree under a temporary directory and discover it
    (once per spec until :func:`cleanup`)."""
    if spec not in _CACHE:
        tmp = tempfile.TemporaryDirectory(prefix="cputree-")
        _TMP.append(tmp)
        _CACHE[spec] = Topology.from_sysfs(_write_topology(Path(tmp.name), spec))
    return _CACHE[spec]


def int5(p: int, d: int, n: int, c: int, t: int) -> TopologySpec:
    """Upstream's ``newCpuTreeFromInt5``: packages, dies, NUMA nodes, cores, threads,
    CPU ids thread-fastest in that order."""
    return TopologySpec(
        name=f"int5-{p}{d}{n}{c}{t}",
        packages=p,
        dies_per_package=d,
        nodes_per_die=n,
        cores_per_node=c,
        threads_per_core=t,
        numbering="qemu",
    )


def cleanup() -> None:
    """Remove every tree :func:`topology` wrote."""
    for tmp in _TMP:
        tmp.cleanup()
    _TMP.clear()
    _CACHE.clear()

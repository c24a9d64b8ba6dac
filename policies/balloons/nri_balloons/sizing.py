"""Balloon capacity and shared idle CPUs: how far a balloon may grow
(``MaxAvailMilliCpus``) and which idle CPUs its containers may also run on
(``shareIdleCPUsInSame``, reference §9).

Every CPU set is an ``int`` bitmask (see :mod:`nri_framework.cpuset`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import cast

from nri_framework import cpuset
from nri_framework.topology import Level, Topology, expand_groups

__all__ = ["max_avail_milli_cpus", "share_idle", "tree_level_groups"]


def max_avail_milli_cpus(
    cpus: int, free: int, max_cpus: int, components: Sequence[int] = ()
) -> int:
    """``Balloon.MaxAvailMilliCpus``: the mCPUs a balloon holding ``cpus`` could
    reach from ``free`` under its type's ``maxCPUs`` (0 = no limit).

    ``components`` are the results of this function for the components of a
    composite balloon: the smallest of them times their number caps the free count.
    Upstream quirks kept: when ``max_cpus`` exceeds the free count the result is
    ``(|cpus| + |free|) * 1000`` even if that is more than ``max_cpus``; a negative
    ``max_cpus`` gives ``max_cpus * 1000``."""
    available = free.bit_count()
    if components:
        smallest = min(components)
        total = smallest * len(components)
        # Go integer division truncates toward zero.
        available = min(-(-total // 1000) if total < 0 else total // 1000, available)
    if max_cpus == 0 or max_cpus > available:
        return (cpus.bit_count() + available) * 1000
    return max_cpus * 1000


_SHARE_LEVELS = frozenset(
    ("system", "package", "die", "numa", "l3cache", "l2cache", "core", "thread")
)

_TREE_GROUPS: weakref.WeakKeyDictionary[Topology, dict[str, list[int]]] = (
    weakref.WeakKeyDictionary()
)


def tree_level_groups(topology: Topology, level: Level) -> list[int]:
    """CPU id -> the CPUs of its node at ``level`` of the CPU tree (0 for ids not in
    the topology). Tree nodes are intersected with their parents (a NUMA node with
    its die, an L2 group with its NUMA node), as upstream's tree walk sees them.
    ``l3cache`` is not a tree level; its groups are the topology's L3 groups."""
    per_topology = _TREE_GROUPS.setdefault(topology, {})
    table = per_topology.get(level)
    if table is None:
        table = [0] * (topology.online.bit_length())
        if level == "l3cache":
            masks: Iterable[int] = topology.level_masks("l3cache")
        else:
            masks = [n.cpus for n in topology.tree().walk() if n.level == level]
        for mask in masks:
            for c in cpuset.ids(mask):
                table[c] = mask
        per_topology[level] = table
    return table


def share_idle(balloon_cpus: int, idle: int, level: str, topology: Topology) -> int:
    """The idle CPUs a balloon shares for ``shareIdleCPUsInSame: level``: the CPUs of
    ``idle``, minus isolated CPUs, in the ``level`` nodes of the CPU tree that hold
    any of ``balloon_cpus`` (``shareIdleCpus``). ``""`` shares nothing.

    Deviation: upstream accepts ``l3cache`` but its CPU tree has no such level, so it
    silently shares nothing; here L3 groups are used."""
    if not level or not balloon_cpus:
        return 0
    idle &= ~topology.isolated
    if not idle:
        return 0
    if level not in _SHARE_LEVELS:
        raise ValueError(f"unknown topology level {level!r}")
    table = tree_level_groups(topology, cast(Level, level))
    touched = expand_groups(table, balloon_cpus & topology.online)
    return touched & idle

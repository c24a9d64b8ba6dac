"""NodeResourceTopology zones of the balloons policy (reference §14): what the
agent publishes about the balloons of this node."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from nri_framework import cpuset
from nri_framework.zones import Zone, ZoneAttribute, ZoneResource, milli_quantity

if TYPE_CHECKING:
    from nri_balloons.policy import BalloonsPolicy

__all__ = ["zones"]


def zones(policy: BalloonsPolicy, cpus_of: Callable[[str], tuple[str, str]]) -> list[Zone]:
    """The NRT zones of the balloons (reference §14): one ``balloon`` zone per
    balloon, and with ``showContainersInNrt`` one ``allocation for container`` zone
    per container in it; ``cpus_of`` gives a container's pinned (cpus, mems)."""
    capacity = milli_quantity(policy.topology.online.bit_count() * 1000)
    zones: list[Zone] = []
    for bln in policy.balloons:
        bdef = bln.bdef
        alloc_cpus = policy.initial_free.bit_count() + (
            bdef.min_cpus if bdef.min_balloons > 0 else 0
        )
        if 0 < bdef.max_cpus < alloc_cpus:
            alloc_cpus = bdef.max_cpus
        zones.append(
            Zone(
                name=bln.name,
                type="balloon",
                resources=[
                    ZoneResource(
                        name="cpu",
                        capacity=capacity,
                        allocatable=milli_quantity(alloc_cpus * 1000),
                        available=milli_quantity(bln.max_free_milli(policy.available(bdef))),
                    )
                ],
                attributes=[
                    ZoneAttribute(name="cpuset", value=cpuset.format(bln.cpus)),
                    ZoneAttribute(name="shared cpuset", value=cpuset.format(bln.shared_idle)),
                    ZoneAttribute(name="excess cpus", value=f"{bln.free_milli}m"),
                ]
                + (
                    [ZoneAttribute(name="component cpusets", value=bln.component_cpusets())]
                    if bln.components
                    else []
                ),
            )
        )
        if not policy.options[bdef.name].show_in_nrt:
            continue
        for m in bln.members.values():
            cpus, mems = cpus_of(m.id)
            ncpus = cpuset.parse(cpus).bit_count() if cpus else policy.topology.online.bit_count()
            cap = m.limit if m.limit and m.limit <= ncpus * 1000 else ncpus * 1000
            zones.append(
                Zone(
                    name=m.pretty,
                    type="allocation for container",
                    parent=bln.name,
                    resources=[
                        ZoneResource(
                            name="cpu",
                            capacity=milli_quantity(cap),
                            allocatable=milli_quantity(m.request),
                            available="0",
                        )
                    ],
                    attributes=[
                        ZoneAttribute(name="cpuset", value=cpus),
                        ZoneAttribute(name="memory set", value=mems),
                    ],
                )
            )
    return zones

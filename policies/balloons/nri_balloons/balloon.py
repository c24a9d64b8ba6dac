"""Balloons: a set of CPUs that grows and shrinks with the containers in it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec
from nri_framework import cpuset

from nri_balloons.config import BalloonType
from nri_balloons.sizing import max_avail_milli_cpus


class Member(msgspec.Struct):
    """A container assigned to a balloon (saved as it is: :mod:`nri_balloons.state`)."""

    id: str
    pod_id: str
    namespace: str
    pod_name: str
    name: str
    request: int  # mCPU
    limit: int  # mCPU, 0 = none
    group: str = ""

    @property
    def pretty(self) -> str:
        return f"{self.namespace}/{self.pod_name}/{self.name}"


@dataclass
class Balloon:
    """One instance of a balloon type."""

    bdef: BalloonType
    instance: int
    cpus: int = 0
    shared_idle: int = 0
    mems: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    groups: Counter[str] = field(default_factory=Counter)
    #: component balloons of a composite balloon (reference §7); its ``cpus``
    #: is their union. Components are not in the policy's balloon list.
    components: list[Balloon] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.bdef.name}[{self.instance}]"

    @property
    def requested(self) -> int:
        """Total requested mCPU of the containers in the balloon."""
        return sum(m.request for m in self.members.values())

    @property
    def free_milli(self) -> int:
        return self.cpus.bit_count() * 1000 - self.requested

    def max_avail_milli(self, free: int) -> int:
        """mCPU the balloon could have: its CPUs plus what it may still take
        (a composite is capped by its components)."""
        return max_avail_milli_cpus(
            self.cpus,
            free,
            self.bdef.max_cpus,
            [c.max_avail_milli(free) for c in self.components],
        )

    def max_free_milli(self, free: int) -> int:
        return self.max_avail_milli(free) - self.requested

    def walk(self) -> Iterator[Balloon]:
        """This balloon and its components, recursively, depth first."""
        yield self
        for c in self.components:
            yield from c.walk()

    def component_cpusets(self) -> str:
        """The NRT ``component cpusets`` attribute, e.g. ``{{0-1}, {8-9}}``."""
        if not self.components:
            return "{" + cpuset.format(self.cpus) + "}"
        return "{" + ", ".join(c.component_cpusets() for c in self.components) + "}"

    def pod_ids(self) -> set[str]:
        return {m.pod_id for m in self.members.values()}

    def namespaces(self) -> set[str]:
        return {m.namespace for m in self.members.values()}

    def __str__(self) -> str:
        return (
            f'{self.name}{{cpus:"{cpuset.format(self.cpus)}", mems:"{cpuset.format(self.mems)}"}}'
        )

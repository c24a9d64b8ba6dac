"""Balloons: a set of CPUs that grows and shrinks with the containers in it."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

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


#: the order members joined their balloons in, across balloons (saved with each
#: member: the keyed state keeps no list of them)
_joined = itertools.count()


class Members(dict[str, Member]):
    """A balloon's containers by id, with the sum of their requests and the
    members of each pod and namespace kept as they come and go (the fill chain
    asks every balloon's for each container: a Synchronize of 1000 would
    otherwise walk the members for each), and which of them changed since the
    journal's last record (:attr:`changed`, :mod:`nri_balloons.state`)."""

    def __init__(self, members: Mapping[str, Member] | None = None) -> None:
        super().__init__()
        self.requested = 0
        """mCPU: the requests of the members"""
        self.joined: dict[str, int] = {}
        """container id -> when it joined (the members' order, saved)"""
        self.changed: set[str] = set()
        """ids set or removed since the state's last record took them"""
        self.pods: dict[str, int] = {}
        """pod id -> how many members"""
        self.namespaces: dict[str, int] = {}
        """namespace -> how many members"""
        for cid, m in (members or {}).items():
            self[cid] = m

    def __setitem__(self, cid: str, member: Member) -> None:
        old = self.get(cid)
        if old is not None:
            self._count(old, -1)
        else:
            self.joined[cid] = next(_joined)
        super().__setitem__(cid, member)
        self._count(member, 1)
        self.changed.add(cid)

    def _count(self, member: Member, sign: int) -> None:
        self.requested += sign * member.request
        # the pod's count, then the namespace's (written out: no pairs to
        # build and walk per member that comes or goes)
        pods, key = self.pods, member.pod_id
        n = pods.get(key, 0) + sign
        if n:
            pods[key] = n
        else:
            del pods[key]
        namespaces, key = self.namespaces, member.namespace
        n = namespaces.get(key, 0) + sign
        if n:
            namespaces[key] = n
        else:
            del namespaces[key]

    def __delitem__(self, cid: str) -> None:
        self._count(self[cid], -1)
        super().__delitem__(cid)
        del self.joined[cid]
        self.changed.add(cid)

    def pop(self, cid: str, *default: Any) -> Any:
        if cid in self:
            member = super().pop(cid)
            self._count(member, -1)
            del self.joined[cid]
            self.changed.add(cid)
            return member
        return super().pop(cid, *default)

    def popitem(self) -> tuple[str, Member]:
        cid, member = super().popitem()
        self._count(member, -1)
        del self.joined[cid]
        self.changed.add(cid)
        return cid, member

    def clear(self) -> None:
        self.changed.update(self)
        super().clear()
        self.joined.clear()
        self.requested = 0
        self.pods.clear()
        self.namespaces.clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        for cid, m in dict(*args, **kwargs).items():
            self[cid] = m

    def setdefault(self, cid: str, default: Member | None = None) -> Any:
        if cid not in self and default is not None:
            self[cid] = default
        return self.get(cid, default)


class Balloon(msgspec.Struct):
    """One instance of a balloon type."""

    bdef: BalloonType
    instance: int
    cpus: int = 0
    shared_idle: int = 0
    mems: int = 0
    members: Members = msgspec.field(default_factory=Members)
    groups: Counter[str] = msgspec.field(default_factory=Counter)
    #: component balloons of a composite balloon (reference §7); its ``cpus``
    #: is their union. Components are not in the policy's balloon list.
    components: list[Balloon] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.members, Members):
            self.members = Members(self.members)

    @property
    def name(self) -> str:
        return f"{self.bdef.name}[{self.instance}]"

    @property
    def requested(self) -> int:
        """Total requested mCPU of the containers in the balloon."""
        return self.members.requested

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
        return set(self.members.pods)

    def namespaces(self) -> set[str]:
        return set(self.members.namespaces)

    def __str__(self) -> str:
        return (
            f'{self.name}{{cpus:"{cpuset.format(self.cpus)}", mems:"{cpuset.format(self.mems)}"}}'
        )

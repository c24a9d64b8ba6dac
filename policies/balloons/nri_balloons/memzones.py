"""Memory zones: upstream libmem's allocator (``pkg/resmgr/lib/memory``), the
node sets (*zones*) containers' memory is allocated from and the capacity each
zone has left.

- A *zone* is a set of memory nodes; its capacity is the sum of its nodes'
  ``MemTotal``; its usage the memory limits of the containers whose zone lies
  inside it (libmem ``zoneUsage``: a container on nodes 0-1 uses node 0-1's and
  node 0-3's memory, not node 0's).
- :meth:`MemoryAllocator.allocate` (libmem ``Allocate``): the initial zone
  (:func:`initial_zone`: the affinity nodes grown by the closest nodes of each
  requested type, then narrowed to those types, then grown until it has normal
  memory), then the overcommit of every zone it touches is resolved.
- :meth:`MemoryAllocator.realloc` (libmem ``Realloc``): a container's zone is
  kept from its last allocation and only ever grows: new affinity nodes, and the
  closest nodes of requested types it lacks, are added to it (nothing when they
  are in it already). Unlike upstream, which grows ``zone | affinity`` by the
  next-closest nodes of the types even when none is missing (and fails when
  there are none, as for a balloon growing from node 0 to nodes 0-1 of a
  two-node machine), and which also tries the types the node lacks.
- Overcommit (libmem ``defaultHandleOvercommit``): while a zone's usage exceeds
  its capacity, its containers are moved to the zone grown by its closest
  nodes (its own types first, then DRAM, PMEM, HBM), the lowest priority (QoS
  class) and the smallest first, the youngest on a tie; other containers whose
  zones changed are returned to the caller, who must update their
  ``cpuset.mems``. When no move helps, the allocation fails and every zone is
  as it was (libmem's journal).
- A container's request is its memory limit; 0 (no limit: BestEffort, most
  Burstable containers) is allocated a zone but uses none of its capacity.

The allocations are saved with the balloons (:class:`MemoryAllocation`,
:mod:`nri_balloons.state`) and restored after a restart.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import msgspec
from nri_framework import cpuset
from nri_framework.kubelet_cpu import QOSClass
from nri_framework.memo import RecentAnswers
from nri_framework.topology import MemoryType, Topology

from nri_balloons.gofmt import quote

T = TypeVar("T")

log = logging.getLogger("libmem")

__all__ = [
    "ORDER",
    "MemoryAllocation",
    "MemoryAllocator",
    "MemoryPlacementError",
    "Priority",
    "format_types",
    "human_size",
    "initial_zone",
    "parse_types",
    "zone_name",
]

ORDER = (MemoryType.DRAM, MemoryType.PMEM, MemoryType.HBM)
"""libmem's type order (its bit order): expansion and fallbacks go in it."""


MAX_TYPES_TEXT = 64
"""The longest memory-type list parsed (every type, spaced, is under 20 characters):
an annotation is the pod owner's input, as long as the API server allows."""


MEMO_MAX = 4096
"""The most zones (or affinity and types pairs) an allocator remembers the
capacity (initial zone) of: zones are node sets, so a node with many memory
nodes could otherwise have as many as requests ask."""


class MemoryPlacementError(ValueError):
    """No memory zone can be found for a request (upstream libmem's error)."""


def parse_types(text: str) -> frozenset[MemoryType]:
    """libmem ``ParseTypeMask``: comma-separated names, any case, spaces trimmed;
    one unknown name fails the whole text (``libmem: invalid type: "<text>"``;
    a text longer than :data:`MAX_TYPES_TEXT` is quoted cut, never parsed)."""
    if len(text) > MAX_TYPES_TEXT:
        raise ValueError(f"libmem: invalid type: {quote(text[:MAX_TYPES_TEXT])}... (too long)")
    out: set[MemoryType] = set()
    for word in text.split(","):
        name = word.strip().upper()
        if name not in MemoryType.__members__:
            raise ValueError(f"libmem: invalid type: {quote(text)}")
        out.add(MemoryType[name])
    return frozenset(out)


class Priority(enum.IntEnum):
    """libmem's request priorities: the higher, the more reluctant to move."""

    BEST_EFFORT = 0
    BURSTABLE = 1 << 10
    GUARANTEED = 1 << 14
    PRESERVED = (1 << 15) - 2

    @classmethod
    def of(cls, qos: QOSClass) -> Priority:
        """libmem ``WithQosClass``."""
        return _QOS_PRIORITY[qos]


_QOS_PRIORITY = {
    QOSClass.BEST_EFFORT: Priority.BEST_EFFORT,
    QOSClass.BURSTABLE: Priority.BURSTABLE,
    QOSClass.GUARANTEED: Priority.GUARANTEED,
}


def format_types(types: Iterable[MemoryType]) -> str:
    """Types in libmem's order, comma-separated (``DRAM,HBM``)."""
    return _format_types(types if isinstance(types, frozenset) else frozenset(types))


@functools.lru_cache(maxsize=16)  # a few type sets, each formatted per allocation
def _format_types(kept: frozenset[MemoryType]) -> str:
    return ",".join(t.value for t in ORDER if t in kept)


def human_size(size: int) -> str:
    """libmem ``HumanReadableSize``: ``300M``, ``1.5G``, ``512``."""
    if size >= 1024:
        d = 1024
        for unit in "kMGT":
            val = size // d
            if 1 <= val < 1024:
                f = size / d
                if math.floor(f) != f:
                    return f"{f:.3f}".rstrip("0") + unit
                return f"{val}{unit}"
            d <<= 10
    return str(size)


def zone_name(zone: int) -> str:
    """libmem ``zoneName``."""
    return f"zone<{cpuset.format(zone)}>" if zone else "zone<without nodes>"


# -- zone expansion (libmem defaultExpand, findInitialZone, ensureNormalMemory) ----------


def zone_types(topology: Topology, zone: int) -> frozenset[MemoryType]:
    """The memory types of the nodes of ``zone``."""
    return frozenset(t for t, mask in topology.memory_type_masks.items() if mask & zone)


def nodes_of(topology: Topology, types: Iterable[MemoryType]) -> int:
    """The memory nodes of any of ``types``."""
    out = 0
    for t in types:
        out |= topology.memory_type_masks.get(t, 0)
    return out


def _close_nodes_of_type(topology: Topology, zone: int, t: MemoryType) -> int:
    """libmem ``newCloseNodesOfType``: for each node of ``zone`` its nearest
    nodes of type ``t`` outside ``zone``, kept while no farther than the nearest
    found so far."""
    of_type = topology.memory_type_masks.get(t, 0) & ~zone
    close, best = 0, None
    for node in topology.nodes:
        if not zone >> node & 1:
            continue
        for dist, nodes in topology.nodes_by_distance(node):
            nodes &= of_type
            if not nodes:
                continue
            if best is None or dist <= best:
                best = dist
                close |= nodes
            break
    return close


def expand(topology: Topology, zone: int, types: Iterable[MemoryType]) -> int:
    """libmem ``defaultExpand``: the closest new nodes of each of ``types``."""
    wanted = set(types)
    out = 0
    for t in ORDER:
        if t in wanted:
            out |= _close_nodes_of_type(topology, zone, t)
    if out:
        log.debug(
            "  + %s expanded by %s %s to %s",
            zone_name(zone),
            format_types(zone_types(topology, out)),
            cpuset.format(out),
            cpuset.format(zone | out),
        )
    return out


def initial_zone(
    topology: Topology, affinity: int, types: Iterable[MemoryType]
) -> tuple[int, frozenset[MemoryType]]:
    """libmem ``validateRequest``, ``findInitialZone`` and ``ensureNormalMemory``
    for a request with preferred (not strict) types: the zone and the request's
    effective types (types the node lacks dropped; none left: the affinity's).
    Raises :class:`MemoryPlacementError` when no zone has normal memory."""
    if not affinity:
        raise MemoryPlacementError("libmem: invalid NodeMask: request without affinity")
    wanted = frozenset(types) & frozenset(topology.memory_type_masks)
    if not wanted:
        wanted = zone_types(topology, affinity)
    zone = affinity
    miss = wanted - zone_types(topology, zone)
    if miss:
        log.debug(
            "- find initial zone (start at %s, expand with %s)",
            cpuset.format(zone),
            format_types(miss),
        )
        zone |= expand(topology, zone, miss)
    prefer = zone & nodes_of(topology, wanted)
    if prefer:
        zone = prefer
    return _ensure_normal(topology, zone, wanted)


def _ensure_normal(
    topology: Topology, zone: int, wanted: frozenset[MemoryType]
) -> tuple[int, frozenset[MemoryType]]:
    normal = topology.normal_memory_nodes
    if zone & normal:
        return zone, wanted
    normal_types = zone_types(topology, normal)
    types = wanted & normal_types
    if not types:
        first = next((t for t in ORDER if t in normal_types), None)
        if first is None:
            raise MemoryPlacementError("no normal memory (of any type)")
        types = frozenset({first})
    log.debug(
        "- ensure normal memory for %s (with %s types)", cpuset.format(zone), format_types(types)
    )
    while True:
        new = expand(topology, zone, types)
        if not new:
            raise MemoryPlacementError(f"no normal memory (of any type {format_types(types)})")
        zone |= new
        if zone & normal:
            return zone, wanted | types


# -- the allocator ----------------------------------------------------------------------


class MemoryAllocation(msgspec.Struct, kw_only=True):
    """One container's memory allocation as saved (:mod:`nri_balloons.state`)."""

    id: str
    name: str = ""
    limit: int = 0
    """bytes: the container's memory limit (0: none, no capacity used)"""
    affinity: str
    """the nodes the request started from (its CPUs' nodes), a node list"""
    types: str = ""
    """its effective memory types, libmem order (``DRAM,HBM``)"""
    priority: int = Priority.BURSTABLE
    zone: str
    """the nodes allocated, a node list"""
    created: int = 0
    """allocation order (the younger is moved first on a tie)"""


class _Request(msgspec.Struct):
    id: str
    name: str
    limit: int
    affinity: int
    types: frozenset[MemoryType]
    priority: int
    zone: int
    created: int

    def __str__(self) -> str:
        kind = (
            Priority(self.priority).name.lower().replace("_", "")
            if self.priority in Priority._value2member_map_
            else f"priority {self.priority}"
        )
        size = f", size {human_size(self.limit)}" if self.limit else ""
        if self.affinity:
            size += f"{',' if size else ''} affine to nodes{{{cpuset.format(self.affinity)}}}"
        return f"{kind} workload<{self.name or 'ID:#' + self.id}{size}>"


def _created(r: _Request | MemoryAllocation) -> int:
    return r.created


class _Parsed(Generic[T]):
    """The texts of a saved state parsed by ``parse``, each distinct text
    once (a thousand allocations hold a few zones and type lists), with
    whether a text is as ``format`` writes its value (a saved allocation in
    that form is the one :func:`_allocation` would make). A text ``parse``
    rejects raises again each time."""

    def __init__(self, parse: Callable[[str], T], format: Callable[[T], str]) -> None:
        self._parse, self._format = parse, format
        self._seen: dict[str, tuple[T, bool]] = {}

    def __call__(self, text: str) -> tuple[T, bool]:
        """The value of ``text``, and whether ``text`` is its canonical form."""
        seen = self._seen.get(text)
        if seen is None:
            value = self._parse(text)
            seen = self._seen[text] = (value, self._format(value) == text)
        return seen


def _allocation(r: _Request) -> MemoryAllocation:
    return MemoryAllocation(
        id=r.id,
        name=r.name,
        limit=r.limit,
        affinity=cpuset.format(r.affinity),
        types=format_types(r.types),
        priority=r.priority,
        zone=cpuset.format(r.zone),
        created=r.created,
    )


class MemoryAllocator:
    """libmem's ``Allocator`` over the memory nodes of ``topology``."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.capacity = {
            n.id: n.mem_total_kb * 1024
            for n in topology.nodes.values()
            if topology.memory_nodes >> n.id & 1
        }
        """node id -> bytes (``MemTotal``)"""
        self.nodes = cpuset.from_ids(self.capacity)
        self._known_nodes = cpuset.from_ids(self.topology.nodes)
        """every node of the topology (memory or not)"""
        self.requests: dict[str, _Request] = {}
        self._created = 0
        self._exported: dict[str, MemoryAllocation] = {}
        """request id -> its export, oldest first, kept as requests change"""
        self._exported_stale = False
        """a request came out of order (restore): sort on the next export"""
        self.changed: set[str] = set()
        """request ids whose export changed since :meth:`take_changes`"""
        self._in_use: dict[int, list[int]] = {}
        """zone -> [requests, their limits] of the zones requests have (kept as
        they change: an allocation looks at zones, not at every request)"""
        self._journal: dict[str, int] | None = None
        """request id -> its zone before the allocation under way changed it"""
        self._usage_version = 0
        """counts the zones coming into use and the changes of their usage (a
        request without a limit joining or leaving a zone in use changes
        neither; a zone going out of use only lowers usage)"""
        self._fits: tuple[int, int] | None = None
        """(nodes, usage version) of the last overcommit check of ``nodes`` that
        found none: the same check at the same version finds none"""
        self._capacity: RecentAnswers[int, int] = RecentAnswers(MEMO_MAX)
        """zone -> its capacity, as computed (the nodes' capacities do not
        change; zones are the few node sets requests have)"""
        self._initial: RecentAnswers[
            tuple[int, frozenset[MemoryType]], tuple[int, frozenset[MemoryType]]
        ] = RecentAnswers(MEMO_MAX)
        """(affinity, types) -> :func:`initial_zone` of them (a function of the
        topology alone), as computed while DEBUG (its lines) is off"""
        self._types = frozenset(topology.memory_type_masks)
        """the memory types the node has"""
        self._zone_types: RecentAnswers[int, frozenset[MemoryType]] = RecentAnswers(MEMO_MAX)
        """zone -> :func:`zone_types` of it (a function of the topology alone)"""

    # -- zones ---------------------------------------------------------------------

    def types_of(self, zone: int) -> frozenset[MemoryType]:
        """:func:`zone_types`, computed once per zone (every realloc asks)."""
        types = self._zone_types.get(zone)
        if types is None:
            types = zone_types(self.topology, zone)
            self._zone_types.keep(zone, types)
        return types

    def zone_capacity(self, zone: int) -> int:
        capacity = self._capacity.get(zone)
        if capacity is None:
            capacity = sum(c for n, c in self.capacity.items() if zone >> n & 1)
            self._capacity.keep(zone, capacity)
        return capacity

    def zone_usage(self, zone: int) -> int:
        """The limits of the requests whose zone lies inside ``zone``."""
        return sum(use[1] for z, use in self._in_use.items() if z and not z & ~zone)

    def zone_free(self, zone: int) -> int:
        return self.zone_capacity(zone) - self.zone_usage(zone)

    def zone_users(self, zone: int) -> list[_Request]:
        return [r for r in self.requests.values() if r.zone == zone]

    def _account(self, r: _Request, sign: int) -> None:
        use = self._in_use.get(r.zone)
        if use is None:
            use = self._in_use[r.zone] = [0, 0]
            self._usage_version += 1  # a zone in use more
        elif r.limit:
            self._usage_version += 1
        use[0] += sign
        use[1] += sign * r.limit
        if not use[0]:
            del self._in_use[r.zone]  # less in use: no check that found none would find one

    def _insert(self, r: _Request, export: MemoryAllocation | None = None) -> None:
        """Add ``r``; ``export``: its :func:`_allocation`, when at hand (a
        restore's saved one, in the canonical form)."""
        self.requests[r.id] = r
        self._account(r, 1)
        last = next(reversed(self._exported.values()), None)
        if last is not None and last.created >= r.created:
            self._exported_stale = True
        self._exported[r.id] = _allocation(r) if export is None else export
        self.changed.add(r.id)

    def _remove(self, request_id: str) -> _Request | None:
        r = self.requests.pop(request_id, None)
        if r is not None:
            self._account(r, -1)
            self._exported.pop(request_id, None)
            self.changed.add(request_id)
        return r

    def _set_zone(self, r: _Request, zone: int) -> None:
        """Move request ``r`` (one of :attr:`requests`) to ``zone``, journaled."""
        if self._journal is not None:
            self._journal.setdefault(r.id, r.zone)
        self._account(r, -1)
        r.zone = zone
        self._account(r, 1)
        self._exported[r.id] = _allocation(r)
        self.changed.add(r.id)

    def assigned(self, request_id: str) -> int | None:
        """The zone of ``request_id``; ``None`` when it has no allocation."""
        r = self.requests.get(request_id)
        return r.zone if r is not None else None

    # -- allocation ----------------------------------------------------------------

    def allocate(
        self,
        request_id: str,
        name: str,
        limit: int,
        affinity: int,
        types: Iterable[MemoryType],
        priority: int,
    ) -> tuple[int, dict[str, int]]:
        """libmem ``Allocate``: the zone of a new request and the other requests
        it moved (id -> new zone). Raises :class:`MemoryPlacementError`; nothing
        changes then."""
        if request_id in self.requests:
            raise MemoryPlacementError("libmem: allocation already exists")
        if affinity & ~self._known_nodes:
            raise MemoryPlacementError(
                f"libmem: invalid node: unknown nodes requested ({cpuset.format(affinity)})"
            )
        types = frozenset(types)
        req = _Request(request_id, name, max(0, limit), affinity, types, priority, 0, 0)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("allocate %s memory for %s", format_types(types), req)
            req.zone, req.types = initial_zone(self.topology, affinity, types)
        else:
            req.zone, req.types = self._initial_zone(affinity, types)
        self._created += 1
        req.created = self._created
        zone = req.zone
        self._journal = {}
        self._insert(req)
        try:
            self._handle_overcommit(zone)
        except MemoryPlacementError:
            self._remove(request_id)
            self._revert()
            raise
        return req.zone, self._updates(request_id)

    def _initial_zone(
        self, affinity: int, types: frozenset[MemoryType]
    ) -> tuple[int, frozenset[MemoryType]]:
        """:func:`initial_zone`, computed once per affinity and types (it logs
        only at DEBUG, where it is not memoized)."""
        key = (affinity, types)
        zone = self._initial.get(key)
        if zone is None:
            zone = initial_zone(self.topology, affinity, types)
            self._initial.keep(key, zone)
        return zone

    def realloc(
        self, request_id: str, affinity: int, types: Iterable[MemoryType]
    ) -> tuple[int, dict[str, int]]:
        """libmem ``Realloc``: grow ``request_id``'s zone by ``affinity`` and
        ``types`` (nothing when they are in it already); its zone and the other
        requests it moved. Raises :class:`MemoryPlacementError` (``KeyError``
        for an unknown request); nothing changes then."""
        req = self.requests[request_id]
        # unlike upstream, types the node lacks are dropped as allocate drops them
        # (upstream then fails every later Realloc of the container: it cannot
        # find new nodes of a type the node has none of)
        wanted = self._types.intersection(types)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "reallocate to add %s memory affine to %s for %s",
                format_types(wanted),
                cpuset.format(affinity),
                req,
            )
        if not affinity and not wanted:
            return req.zone, {}
        if req.affinity == affinity and req.types == wanted:
            return req.zone, {}
        if affinity & ~req.zone == 0 and wanted <= self.types_of(req.zone):
            return req.zone, {}
        if not wanted:
            wanted = self.types_of(affinity)
        else:
            affinity &= nodes_of(self.topology, wanted)
        self._journal = {}
        # unlike upstream, which always expands req.zone | affinity by the next
        # closest nodes of the types (and fails when there are none: a balloon
        # growing from node 0 to nodes 0-1 of a two-node machine), the zone
        # grows by the new affinity nodes, and by the closest nodes only of the
        # types it still lacks
        grown = req.zone | affinity
        miss = wanted - self.types_of(grown)
        new = (affinity & ~req.zone) | (expand(self.topology, grown, miss) if miss else 0)
        if not new:
            raise MemoryPlacementError(
                "libmem: insufficient available memory: failed to reallocate, "
                f"can't find new {format_types(wanted)} nodes"
            )
        self._set_zone(req, req.zone | affinity | new)
        try:
            self._handle_overcommit(req.zone)
        except MemoryPlacementError as exc:
            self._revert()
            raise MemoryPlacementError(
                f"libmem: insufficient available memory: failed to reallocate: {exc}"
            ) from None
        req.types |= zone_types(self.topology, new)
        self._exported[req.id] = _allocation(req)
        self.changed.add(req.id)
        return req.zone, self._updates(request_id)

    def release(self, request_id: str) -> bool:
        """libmem ``Release``; ``False`` when ``request_id`` has no allocation."""
        req = self._remove(request_id)
        if req is None:
            return False
        log.debug("release memory for %s", req)
        return True

    # -- overcommit (libmem defaultHandleOvercommit) -------------------------------

    def _revert(self) -> None:
        """Put the requests the allocation under way moved back where they were."""
        log.debug("reverting journal...")
        journal, self._journal = self._journal or {}, None
        for rid, zone in journal.items():
            r = self.requests.get(rid)
            if r is not None:
                self._set_zone(r, zone)

    def _updates(self, own: str) -> dict[str, int]:
        """The requests other than ``own`` the allocation under way moved (in
        the order of :attr:`requests`); ends the journal."""
        journal, self._journal = self._journal or {}, None
        if len(journal) <= (own in journal):  # no request but ``own`` was moved
            return {}
        return {
            r.id: r.zone
            for r in self.requests.values()
            if r.id != own and r.id in journal and journal[r.id] != r.zone
        }

    def _overcommit(self, nodes: int) -> tuple[list[int], dict[int, int]]:
        """libmem ``checkOvercommit``: the zones in use touching ``nodes`` whose
        usage exceeds their capacity (most users first, subzones first, larger
        first) and by how much."""
        spill: dict[int, int] = {}
        if self._fits == (nodes, self._usage_version):
            return [], spill
        for z in self._in_use:
            if not nodes or z & nodes:
                free = self.zone_free(z)
                if free < 0:
                    spill[z] = -free
        if not spill:
            self._fits = (nodes, self._usage_version)
            return [], spill
        users = {z: use[0] for z, use in self._in_use.items()}
        # libmem ZonesByUsersSubzonesFirst: a total order is enough for its use
        zones = sorted(spill, key=lambda z: (-users[z], z.bit_count(), -z))
        return zones, spill

    def _handle_overcommit(self, nodes: int) -> None:
        oc, spill = self._overcommit(nodes)
        if not oc:
            return
        present = set(self.topology.memory_type_masks)
        while True:
            log.debug("- resolving overcommit for zones:")
            for z in oc:
                log.debug("  %s: %s", zone_name(z), human_size(spill[z]))
            moved = 0
            for prio in (Priority.BURSTABLE, Priority.GUARANTEED, Priority.PRESERVED):
                extra: set[MemoryType] = set()
                for t in (None, *ORDER):
                    if t is not None:
                        if t not in present:
                            continue
                        extra.add(t)
                    for z in oc:
                        if z in spill:
                            moved += self._shrink(z, spill[z], prio, extra)
                    oc, spill = self._overcommit(nodes)
                    if not oc:
                        return
            if not moved:
                break
        total = sum(spill.values())
        raise MemoryPlacementError(
            "libmem: insufficient available memory: failed to resolve overcommit, zones "
            f"{','.join('nodes{' + cpuset.format(z) + '}' for z in spill)} overcommit by "
            f"{human_size(total)}"
        )

    def _shrink(self, zone: int, amount: int, limit: int, extra: set[MemoryType]) -> int:
        """libmem ``zoneShrinkUsage``: move requests of ``zone`` (priority up to
        ``limit``, lowest priority, smallest and youngest first) to ``zone``
        grown by its closest nodes of its types and ``extra`` until ``amount``
        bytes are freed; the bytes moved."""
        users = self.zone_users(zone)
        if not users:
            return 0
        new = expand(self.topology, zone, zone_types(self.topology, zone) | extra)
        if not new:
            log.debug("  - %s: couldn't expand by %s types", zone_name(zone), format_types(extra))
            return 0
        moved = 0
        for r in sorted(
            (r for r in users if r.priority <= limit),
            key=lambda r: (r.priority, r.limit, -r.created),
        ):
            log.debug("  - %s: remove %s", zone_name(zone), r)
            self._set_zone(r, zone | new)
            log.debug("  + %s: assign %s", zone_name(r.zone), r)
            moved += r.limit
            if moved >= amount:
                break
        log.debug("  - %s: freed up %s bytes of memory", zone_name(zone), human_size(moved))
        return moved

    # -- saved state ---------------------------------------------------------------

    def export(self) -> list[MemoryAllocation]:
        """Every allocation, oldest first (kept as they change: each decision
        exports)."""
        if self._exported_stale:
            order = sorted(self._exported.values(), key=_created)
            self._exported = {m.id: m for m in order}
            self._exported_stale = False
        return list(self._exported.values())

    def take_changes(self) -> dict[str, MemoryAllocation | None]:
        """The exports changed since the last call, by request id (``None``:
        released), and forget them (the journal's keyed state)."""
        out = {rid: self._exported.get(rid) for rid in self.changed}
        self.changed.clear()
        return out

    def restore(self, saved: Iterable[MemoryAllocation], alive: set[str]) -> list[str]:
        """Take the allocations ``saved`` (by :meth:`export`) of the requests in
        ``alive``; returns why any was dropped (it is allocated anew then)."""
        dropped: list[str] = []
        nodes = _Parsed(cpuset.parse, cpuset.format)
        kinds = _Parsed(parse_types, format_types)
        for s in saved:
            if s.id not in alive or s.id in self.requests:
                continue
            try:
                (zone, zone_ok), (affinity, affinity_ok) = nodes(s.zone), nodes(s.affinity)
                types, types_ok = kinds(s.types) if s.types else (frozenset(), True)
                if not zone or zone & ~self.nodes:
                    raise ValueError(f"zone {s.zone!r} not of this node's memory nodes")
                if s.limit < 0:
                    raise ValueError(f"negative limit {s.limit}")
            except ValueError as exc:
                dropped.append(f"{s.id}: {exc}")
                continue
            r = _Request(s.id, s.name, s.limit, affinity, types, s.priority, zone, s.created)
            self._insert(r, s if zone_ok and affinity_ok and types_ok else None)
            self._created = max(self._created, s.created)
        return dropped

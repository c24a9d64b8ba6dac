"""Memory placement: the NUMA nodes a container's ``cpuset.mems`` gets (reference
§9, upstream libmem's ``Allocate`` for a new container request).

The request is the nodes of the balloon's CPUs (libmem ``CPUSetAffinity``) and a
set of memory types: the container's ``memory-type.resource-policy.nri.io``
annotation (``hbm,dram``) when set, else its balloon type's ``memoryTypes``.
As libmem does for a request with preferred (not strict) types:

- types the node does not have are dropped (we also warn, naming them); no
  type left means the types of the affinity nodes themselves (DRAM), so a
  balloon without ``memoryTypes`` gets the nodes of its CPUs;
- the zone starts at the affinity nodes and, for each requested type they do
  not hold, grows by the closest nodes of that type (``defaultExpand``: for
  each zone node in turn its nearest nodes of the type, kept while no farther
  than the nearest found so far);
- the zone is then narrowed to the nodes of the requested types;
- a zone without normal (non-movable) memory grows, a type at a time, until it
  has some (``ensureNormalMemory``); when none can be reached the request fails
  and the caller falls back to the affinity nodes (upstream's ``allocMem:
  falling back to ...`` line).

Not modelled: libmem's per-node capacity accounting (containers' memory limits
spilling to farther nodes on overcommit) and its reallocation history; the
nodes are recomputed from the balloon's CPUs and the types on every pinning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from nri_framework import cpuset
from nri_framework.topology import MemoryType, Topology

from nri_balloons.annotations import MEMORY_TYPE
from nri_balloons.gofmt import quote

log = logging.getLogger("policy")

__all__ = [
    "MemoryPlacementError",
    "MemoryPlacer",
    "MemoryRequest",
    "format_types",
    "parse_types",
    "place",
    "type_set",
]

ORDER = (MemoryType.DRAM, MemoryType.PMEM, MemoryType.HBM)
"""libmem's type order (its bit order): expansion and fallbacks go in it."""


MAX_TYPES_TEXT = 64
"""The longest memory-type list parsed (every type, spaced, is under 20 characters):
an annotation is the pod owner's input, as long as the API server allows."""


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


def type_set(names: Iterable[str]) -> frozenset[MemoryType]:
    """A balloon type's ``memoryTypes`` (validated names) as a set."""
    names = list(names)
    return parse_types(",".join(names)) if names else frozenset()


def format_types(types: Iterable[MemoryType]) -> str:
    """Types in libmem's order, comma-separated (``DRAM,HBM``)."""
    kept = set(types)
    return ",".join(t.value for t in ORDER if t in kept)


@dataclass(frozen=True, slots=True)
class MemoryRequest:
    """The nodes chosen for one request and the requested types the node lacks."""

    nodes: int
    missing: frozenset[MemoryType]


def _zone_types(topology: Topology, zone: int) -> set[MemoryType]:
    return {t for t, mask in topology.memory_type_masks.items() if mask & zone}


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


def _expand(topology: Topology, zone: int, types: Iterable[MemoryType]) -> int:
    """libmem ``defaultExpand``: the closest new nodes of each of ``types``."""
    wanted = set(types)
    out = 0
    for t in ORDER:
        if t in wanted:
            out |= _close_nodes_of_type(topology, zone, t)
    return out


def place(topology: Topology, cpus: int, types: Iterable[MemoryType] = ()) -> MemoryRequest:
    """The memory nodes for a container on ``cpus`` asking for ``types``
    (empty: the types of its CPUs' nodes). Raises :class:`MemoryPlacementError`
    when no zone with normal memory can be found."""
    affinity = topology.closest_nodes(cpus)
    if not affinity:
        raise MemoryPlacementError("request without affinity")
    requested = set(types)
    present = set(topology.memory_type_masks)
    missing = frozenset(requested - present)
    wanted = requested & present or _zone_types(topology, affinity)
    zone = affinity
    miss = wanted - _zone_types(topology, zone)
    if miss:
        zone |= _expand(topology, zone, miss)
    prefer = zone & _nodes_of(topology, wanted)
    if prefer:
        zone = prefer
    zone = _ensure_normal(topology, zone, wanted)
    return MemoryRequest(zone, missing)


def _nodes_of(topology: Topology, types: Iterable[MemoryType]) -> int:
    out = 0
    for t in types:
        out |= topology.memory_type_masks.get(t, 0)
    return out


def _ensure_normal(topology: Topology, zone: int, wanted: set[MemoryType]) -> int:
    """libmem ``ensureNormalMemory`` for a request with preferred types."""
    normal = topology.normal_memory_nodes
    if zone & normal:
        return zone
    normal_types = _zone_types(topology, normal)
    types = wanted & normal_types
    if not types:
        first = next((t for t in ORDER if t in normal_types), None)
        if first is None:
            raise MemoryPlacementError("no normal memory (of any type)")
        types = {first}
    while True:
        new = _expand(topology, zone, types)
        if not new:
            raise MemoryPlacementError(f"no normal memory (of any type {format_types(types)})")
        zone |= new
        if zone & normal:
            return zone


class MemoryPlacer:
    """:func:`place` for the containers of a policy, with upstream's log lines;
    each container's last request is remembered (bounded by the containers in
    balloons: :meth:`keep_only`) so a warning is logged once per new request,
    not on every pinning."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._last: dict[str, tuple[tuple[int, frozenset[MemoryType], str | None], int]] = {}

    def keep_only(self, container_ids: Iterable[str]) -> None:
        """Forget the containers not in ``container_ids``."""
        alive = set(container_ids)
        for cid in [c for c in self._last if c not in alive]:
            del self._last[cid]

    def mems(
        self,
        container_id: str,
        pretty: str,
        cpus: int,
        balloon_types: frozenset[MemoryType],
        annotation: str | None,
    ) -> int:
        """The memory nodes of container ``container_id`` on ``cpus``: types from
        its ``memory-type`` annotation (``annotation``) when set and valid, else
        ``balloon_types``."""
        key = (cpus, balloon_types, annotation)
        last = self._last.get(container_id)
        if last is not None and last[0] == key:
            return last[1]
        types = balloon_types
        if annotation is not None:
            try:
                types = parse_types(annotation)
            except ValueError as exc:
                log.error(
                    "container %s has invalid effective %s annotation (%s): %s",
                    pretty,
                    quote(MEMORY_TYPE),
                    quote(annotation),
                    exc,
                )
            else:
                log.debug(
                    "  - %s memory-type annotation mask %s overrides balloon mask %s",
                    pretty,
                    format_types(types),
                    format_types(balloon_types),
                )
        affinity = self.topology.closest_nodes(cpus)
        log.debug(
            "  - requested %s to memory %s (types %s)",
            pretty,
            cpuset.format(affinity),
            format_types(types),
        )
        try:
            request = place(self.topology, cpus, types)
        except MemoryPlacementError as exc:
            log.error(
                "allocMem: falling back to %s, failed to allocate memory for %s: %s",
                cpuset.format(affinity),
                pretty,
                exc,
            )
            nodes = affinity
        else:
            nodes = request.nodes
            if request.missing:
                log.warning(
                    "container %s: memory type(s) %s not present on this node (it has %s); "
                    "using %s",
                    pretty,
                    format_types(request.missing),
                    format_types(self.topology.memory_type_masks),
                    format_types(types - request.missing) or "the nodes of its CPUs",
                )
            log.debug("  - allocated %s to memory %s", pretty, cpuset.format(nodes))
        self._last[container_id] = (key, nodes)
        return nodes

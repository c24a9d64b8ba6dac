"""Memory placement: the NUMA nodes a container's ``cpuset.mems`` gets (reference
§9, upstream balloons' ``pinCpuMem``/``allocMem`` over libmem).

The request is the nodes of the balloon's CPUs (libmem ``CPUSetAffinity``), a
set of memory types: the container's ``memory-type.resource-policy.nri.io``
annotation (``hbm,dram``) when set, else its balloon type's ``memoryTypes``,
and its memory limit (its size; 0: none). As libmem does for a request with
preferred (not strict) types (:mod:`nri_balloons.memzones`):

- types the node does not have are dropped (we also warn, naming them); no
  type left means the types of the affinity nodes themselves (DRAM), so a
  balloon without ``memoryTypes`` gets the nodes of its CPUs;
- the zone starts at the affinity nodes and, for each requested type they do
  not hold, grows by the closest nodes of that type, is narrowed to the nodes
  of the requested types and grown until it has normal memory;
- a zone whose containers' limits exceed its nodes' capacity spills: its
  containers move to the zone grown by the next-closest nodes (their
  ``cpuset.mems`` are updated with the rest of the pinning);
- the first pinning allocates (libmem ``Allocate``), later ones reallocate
  (``Realloc``: the zone only grows, kept from the last allocation); a container
  that goes releases its memory;
- when no zone can be found the container gets the affinity nodes (upstream's
  ``allocMem: falling back to ...`` line).

Not modelled: a ``memory.preserve`` container's memory is not accounted (it
keeps its own nodes); a container's changed memory limit does not resize its
allocation (upstream's ``Realloc`` does not either).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import msgspec
from nri_framework import cpuset
from nri_framework.kubelet_cpu import QOSClass
from nri_framework.memo import RecentAnswers
from nri_framework.model import Container
from nri_framework.topology import MemoryType, Topology

from nri_balloons.annotations import MEMORY_TYPE
from nri_balloons.gofmt import quote
from nri_balloons.memzones import (
    ORDER,
    MemoryAllocation,
    MemoryAllocator,
    MemoryPlacementError,
    Priority,
    format_types,
    initial_zone,
    parse_types,
)

log = logging.getLogger("policy")

__all__ = [
    "ORDER",
    "MemoryPlacementError",
    "MemoryPlacer",
    "MemoryRequest",
    "format_types",
    "memory_limit",
    "parse_types",
    "place",
    "type_set",
]


def type_set(names: Iterable[str]) -> frozenset[MemoryType]:
    """A balloon type's ``memoryTypes`` (validated names) as a set."""
    names = list(names)
    return parse_types(",".join(names)) if names else frozenset()


def memory_limit(container: Container) -> int:
    """The container's memory limit in bytes, its request's size (upstream
    ``getMemoryLimit``); 0 without one."""
    mem = container.resources.memory if container.resources else None
    return mem.limit if mem is not None and mem.limit and mem.limit > 0 else 0


AFFINITIES_MAX = 1024
"""The most CPU sets a placer remembers the nodes of (balloons' CPUs: each
resize makes a new set)."""


class MemoryRequest(msgspec.Struct, frozen=True):
    """The nodes chosen for one request and the requested types the node lacks."""

    nodes: int
    missing: frozenset[MemoryType]


def place(topology: Topology, cpus: int, types: Iterable[MemoryType] = ()) -> MemoryRequest:
    """The initial zone for a container on ``cpus`` asking for ``types`` (empty:
    the types of its CPUs' nodes), before any capacity accounting. Raises
    :class:`MemoryPlacementError` when no zone with normal memory can be found."""
    requested = frozenset(types)
    zone, _ = initial_zone(topology, topology.closest_nodes(cpus), requested)
    return MemoryRequest(zone, requested - frozenset(topology.memory_type_masks))


class MemoryPlacer:
    """The memory of a policy's containers: their allocations
    (:class:`~nri_balloons.memzones.MemoryAllocator`) and upstream's log lines.

    Each container's last request is remembered (bounded by the containers in
    balloons: :meth:`keep_only`), so an unchanged one asks the allocator nothing
    and logs no warning again."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.allocator = MemoryAllocator(topology)
        self._last: dict[str, tuple[int, frozenset[MemoryType], str | None]] = {}
        self._shown: dict[str, int] = {}
        """container id -> the nodes it was last given (an overcommit moves it)"""
        self._sizes: dict[str, tuple[int, Priority]] = {}
        """container id -> (memory limit, priority) of a container not allocated yet"""
        self._present = frozenset(topology.memory_type_masks)
        """the memory types the node has"""
        self._affinity: RecentAnswers[int, int] = RecentAnswers(AFFINITIES_MAX)
        """CPUs -> the nodes holding them (the balloons' CPU sets, as asked)"""
        self.moves = 0
        """allocations that moved other containers so far (a pinning computed
        before one is stale)"""

    def note(self, container_id: str, limit: int, qos: QOSClass) -> None:
        """A new container's memory limit (bytes) and QoS class, for its first
        allocation."""
        self._sizes[container_id] = (max(0, limit), Priority.of(qos))

    def release(self, container_id: str) -> None:
        """The container is gone: its memory is free (libmem ``Release``)."""
        self._last.pop(container_id, None)
        self._shown.pop(container_id, None)
        self._sizes.pop(container_id, None)
        self.allocator.release(container_id)

    def keep_only(self, container_ids: Iterable[str]) -> None:
        """Release the containers not in ``container_ids``."""
        alive = set(container_ids)
        known = set(self._last) | set(self._sizes) | set(self.allocator.requests)
        for cid in known - alive:
            self.release(cid)

    def current(self, container_id: str, default: int) -> int:
        """The nodes of ``container_id`` now: what :meth:`mems` gave it, or where
        a later allocation moved it."""
        return self._shown.get(container_id, default)

    def export(self) -> list[MemoryAllocation]:
        return self.allocator.export()

    def take_changes(self) -> dict[str, MemoryAllocation | None]:
        """The allocations changed since the last call (``None``: released)."""
        return self.allocator.take_changes()

    def restore(self, saved: Iterable[MemoryAllocation], alive: set[str]) -> None:
        """Take the saved allocations of the containers in ``alive``."""
        for why in self.allocator.restore(saved, alive):
            log.warning("cannot restore the memory allocation of %s, allocating anew", why)

    def nodes_of(self, cpus: int) -> int:
        """The nodes holding ``cpus`` (``Topology.closest_nodes``), remembered
        per CPU set (at most :data:`AFFINITIES_MAX`)."""
        affinity = self._affinity.get(cpus)
        if affinity is None:
            affinity = self.topology.closest_nodes(cpus)
            self._affinity.keep(cpus, affinity)
        return affinity

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
        ``balloon_types``. Other containers the allocation moved get their new
        nodes from :meth:`current`."""
        key = (cpus, balloon_types, annotation)
        if self._last.get(container_id) == key and container_id in self._shown:
            return self._shown[container_id]
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
        affinity = self.nodes_of(cpus)
        debug = log.isEnabledFor(logging.DEBUG)
        if debug:
            log.debug(
                "  - requested %s to memory %s (types %s)",
                pretty,
                cpuset.format(affinity),
                format_types(types),
            )
        try:
            if self.allocator.assigned(container_id) is None:
                limit, prio = self._sizes.get(container_id, (0, Priority.BURSTABLE))
                nodes, updates = self.allocator.allocate(
                    container_id, pretty, limit, affinity, types, prio
                )
            else:
                nodes, updates = self.allocator.realloc(container_id, affinity, types)
        except MemoryPlacementError as exc:
            log.error(
                "allocMem: falling back to %s, failed to allocate memory for %s: %s",
                cpuset.format(affinity),
                pretty,
                exc,
            )
            nodes = affinity
        else:
            self._sizes.pop(container_id, None)
            missing = types - self._present
            if missing:
                log.warning(
                    "container %s: memory type(s) %s not present on this node (it has %s); "
                    "using %s",
                    pretty,
                    format_types(missing),
                    format_types(self.topology.memory_type_masks),
                    format_types(types - missing) or "the nodes of its CPUs",
                )
            if updates:
                self.moves += 1
            for other, zone in updates.items():
                if debug:
                    log.debug("  - moved %s to memory %s", other, cpuset.format(zone))
                self._shown[other] = zone
            if debug:
                log.debug("  - allocated %s to memory %s", pretty, cpuset.format(nodes))
        self._last[container_id] = key
        self._shown[container_id] = nodes
        return nodes

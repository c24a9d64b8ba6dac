"""CPU and memory topology of a host, discovered once from sysfs.

``Topology.from_sysfs(host_root)`` reads ``<host_root>/sys/devices/system/{cpu,node}``
(and ``/sys/devices/cpu_{core,atom}/cpus`` on hybrid CPUs; the reading is
:mod:`nri_framework.sysfs`) and precomputes every
CPU set the policies need as ``int`` bitmasks (see :mod:`nri_framework.cpuset`):
per package, per (package, die), per NUMA node, per L2 and L3 cache group and
per core. Helpers such as :meth:`Topology.siblings` and
:meth:`Topology.single_thread` walk a mask one *group* at a time through
per-CPU lookup tables, so their cost grows with the number of cores touched,
not with the number of CPUs in the system.

Rules (upstream ``pkg/sysfs`` behaviour unless noted):

- Only online CPUs are described; a CPU's ``topology/`` directory is absent
  while it is offline. ``possible`` and ``isolated`` default to ``online`` and
  the empty set when their files are missing.
- ``die_id`` defaults to 0. Dies are keyed by ``(package, die)`` because die
  ids are package-relative on some kernels and global on others.
- A cache group is the cache's ``shared_cpu_list`` (restricted to online CPUs)
  and is keyed by the cache ``id``; without an ``id`` the key is the lowest
  CPU of the group. When no CPU reports an L2 cache, each core is its own L2
  group; when none reports an L3, each (package, die) is. Some CPUs with and
  some without a cache level is an error. A CPU that an earlier CPU's list of a
  level names (sysfs says they share that cache) takes that group when it has an
  index of the level: its own ``type``, ``shared_cpu_list`` and ``id`` there are
  not read (named by two lists of different keys, it reads its own).
- Without ``/sys/devices/system/node`` (a kernel with ``CONFIG_NUMA=n``) there
  is one node 0 holding every online CPU.
- A node with CPUs has DRAM. A node in ``has_memory`` without CPUs (CXL
  memory, Xeon Max HBM, PMEM in memory mode...) is HBM when its ``MemTotal``
  is below the average ``MemTotal`` of the nodes with CPUs, else PMEM, as
  upstream decides (the kernel has no memory-type file). ``has_normal_memory``
  defaults to ``has_memory``; ``has_memory`` to the nodes with a ``MemTotal``.
- Without hybrid core-type files every CPU is a performance core. When only one
  of ``cpu_core``/``cpu_atom`` exists, the remaining online CPUs are of the
  other type.
- ``base_frequency`` falls back to ``cpuinfo_max_freq`` with a warning; CPUs
  without ``cpufreq/`` report 0 for all frequencies and no
  ``energy_performance_preference`` ("").

Every unreadable or malformed file raises :class:`TopologyError` naming the path.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, get_args

import msgspec

from nri_framework import cpuset

Level = Literal["system", "package", "die", "numa", "l2cache", "l3cache", "core", "thread"]
"""Topology levels, widest first. The CPU tree uses all but ``l3cache``."""

LEVELS: tuple[Level, ...] = get_args(Level)

SYS_CPU = "sys/devices/system/cpu"
SYS_NODE = "sys/devices/system/node"
HYBRID_CPUS = {"performance": "sys/devices/cpu_core/cpus", "efficient": "sys/devices/cpu_atom/cpus"}


def expand_groups(table: Sequence[int], mask: int) -> int:
    """Every CPU of the groups ``mask`` touches, ``table[cpu]`` being the group
    mask of ``cpu`` (0 or beyond the table: the CPU alone)."""
    out = 0
    size = len(table)
    while mask:
        low = mask & -mask
        cpu = low.bit_length() - 1
        group = (table[cpu] if cpu < size else 0) or low
        out |= group
        mask &= ~group
    return out


#: most distances between two threads of a core :func:`sibling_shifts` keeps
#: (an SMT node numbered regularly has one per thread pair: 2 for SMT2)
MAX_SIBLING_SHIFTS = 8


def sibling_shifts(core_masks: Sequence[int]) -> tuple[tuple[int, int], ...] | None:
    """``siblings`` by shifts: ``(distance, sources)`` for each distance
    between two threads of one core, ``sources`` the CPUs with a sibling
    that far; ``None`` past :data:`MAX_SIBLING_SHIFTS` distances (then the
    CPU-by-CPU walk of :func:`expand_groups`)."""
    by_distance: dict[int, int] = {}
    for core in core_masks:
        ids = cpuset.ids(core)
        for a in ids if len(ids) > 1 else ():
            for b in ids:
                if b != a:
                    by_distance[b - a] = by_distance.get(b - a, 0) | 1 << a
        if len(by_distance) > MAX_SIBLING_SHIFTS:
            return None
    return tuple(sorted(by_distance.items()))


def shift_siblings(shifts: tuple[tuple[int, int], ...], mask: int) -> int:
    """``mask`` and every thread of a core it touches, by :func:`sibling_shifts`:
    a few big-int operations, whatever the number of CPUs."""
    out = mask
    for distance, sources in shifts:
        if from_ := mask & sources:
            out |= from_ << distance if distance > 0 else from_ >> -distance
    return out


class TopologyError(ValueError):
    """A topology that cannot be described: a missing or malformed sysfs file
    (``path`` names it) or an invalid topology specification."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class CoreType(enum.StrEnum):
    PERFORMANCE = "performance"
    EFFICIENT = "efficient"


class MemoryType(enum.StrEnum):
    """The kind of memory behind a NUMA node (upstream ``sysfs.MemoryType``)."""

    DRAM = "DRAM"
    PMEM = "PMEM"
    HBM = "HBM"


class CpuFreq(msgspec.Struct, frozen=True):
    """``cpufreq`` limits in kHz; 0 when unknown."""

    min: int = 0
    base: int = 0
    max: int = 0


class CpuInfo(msgspec.Struct, frozen=True):
    """One online CPU and its group keys at every level (built once at discovery)."""

    id: int
    package: int
    die: int
    """``die_id``; the die group key is ``(package, die)``."""
    node: int
    core_id: int
    """sysfs ``core_id`` (package-relative, may be sparse)."""
    core: int
    """Core group key: the lowest online thread of the core."""
    thread: int
    """Index of this CPU among its core's online threads (0 = lowest id)."""
    l2: int
    l3: int
    core_type: CoreType
    isolated: bool
    freq: CpuFreq
    epp: str = ""
    """``cpufreq/energy_performance_preference`` ("" when the CPU has none)."""
    cstates: frozenset[str] = frozenset()
    """``cpuidle/state*/name``: the C-states the CPU has (an unreadable one left out)."""

    @property
    def die_key(self) -> tuple[int, int]:
        return (self.package, self.die)


class NumaNode(msgspec.Struct, frozen=True):
    id: int
    cpus: int
    """Online CPUs of the node (0 for a memory-only node)."""
    distances: Mapping[int, int]
    """Node id -> ``distance`` (``nodeN/distance`` lists online nodes in order)."""
    mem_total_kb: int
    """``MemTotal`` from ``nodeN/meminfo``; 0 when unknown."""
    memory_type: MemoryType = MemoryType.DRAM
    """DRAM for a node with CPUs; a memory-only node (CXL, HBM or PMEM) is HBM
    when it has less memory than the average node with CPUs, else PMEM
    (upstream ``pkg/sysfs``: the kernel marks neither)."""
    normal_memory: bool = True
    """In ``node/has_normal_memory`` (not only movable memory)."""


class TreeNode(msgspec.Struct, frozen=True):
    """A node of the CPU tree (balloons ``cputree.go``): name, level, CPUs, children."""

    name: str
    level: Level
    cpus: int
    children: tuple[TreeNode, ...] = ()

    def walk(self) -> Iterator[TreeNode]:
        """This node and all its descendants, depth first, children in order."""
        stack: list[TreeNode] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def find(self, name: str) -> TreeNode | None:
        return next((n for n in self.walk() if n.name == name), None)

    def __str__(self) -> str:
        lines = []
        depth = {id(self): 0}
        for node in self.walk():
            d = depth[id(node)]
            for child in node.children:
                depth[id(child)] = d + 1
            lines.append(f"{'  ' * d}{node.name} ({node.level}): {cpuset.format(node.cpus)}")
        return "\n".join(lines)


def _unknown_level(level: object) -> ValueError:
    return ValueError(f"unknown topology level {level!r}, expected one of {', '.join(LEVELS)}")


class Topology:
    """The discovered topology; all sets are ``int`` bitmasks of CPU (or node) ids."""

    def __init__(
        self,
        cpus: Mapping[int, CpuInfo],
        nodes: Mapping[int, NumaNode],
        *,
        possible: int | None = None,
        isolated: int = 0,
        memory_nodes: int | None = None,
        host_root: Path = Path("/"),
    ) -> None:
        self.host_root = host_root
        self.cpus: Mapping[int, CpuInfo] = dict(sorted(cpus.items()))
        self.nodes: Mapping[int, NumaNode] = dict(sorted(nodes.items()))
        self.online = cpuset.from_ids(self.cpus)
        self.possible = self.online if possible is None else possible | self.online
        self.isolated = isolated & self.online
        self.memory_nodes = (
            memory_nodes
            if memory_nodes is not None
            else cpuset.from_ids(n.id for n in self.nodes.values() if n.mem_total_kb)
            or cpuset.from_ids(self.nodes)
        )
        self.memory_type_masks: dict[MemoryType, int] = {}
        """Memory type -> the memory nodes of that type (types the host has only)."""
        for n in self.nodes.values():
            if self.memory_nodes >> n.id & 1:
                t = n.memory_type
                self.memory_type_masks[t] = self.memory_type_masks.get(t, 0) | 1 << n.id
        self.normal_memory_nodes = self.memory_nodes & cpuset.from_ids(
            n.id for n in self.nodes.values() if n.normal_memory
        )

        self.package_masks: dict[int, int] = {}
        self.die_masks: dict[tuple[int, int], int] = {}
        self.node_masks: dict[int, int] = {n: 0 for n in self.nodes}
        self.l2_masks: dict[int, int] = {}
        self.l3_masks: dict[int, int] = {}
        self.core_masks: dict[int, int] = {}
        self.efficient_cpus = 0
        for c in self.cpus.values():
            bit = 1 << c.id
            self.package_masks[c.package] = self.package_masks.get(c.package, 0) | bit
            self.die_masks[c.die_key] = self.die_masks.get(c.die_key, 0) | bit
            self.node_masks[c.node] = self.node_masks.get(c.node, 0) | bit
            self.l2_masks[c.l2] = self.l2_masks.get(c.l2, 0) | bit
            self.l3_masks[c.l3] = self.l3_masks.get(c.l3, 0) | bit
            self.core_masks[c.core] = self.core_masks.get(c.core, 0) | bit
            if c.core_type is CoreType.EFFICIENT:
                self.efficient_cpus |= bit
        self.package_masks = dict(sorted(self.package_masks.items()))
        self.die_masks = dict(sorted(self.die_masks.items()))
        self.node_masks = dict(sorted(self.node_masks.items()))
        self.l2_masks = dict(sorted(self.l2_masks.items()))
        self.l3_masks = dict(sorted(self.l3_masks.items()))
        self.core_masks = dict(sorted(self.core_masks.items()))
        self.performance_cpus = self.online & ~self.efficient_cpus

        # Per-CPU lookup tables (index = CPU id): the CPU's group at each level.
        size = self.possible.bit_length()
        tables: dict[Level, list[int]] = {level: [0] * size for level in LEVELS}
        for c in self.cpus.values():
            i = c.id
            tables["system"][i] = self.online
            tables["package"][i] = self.package_masks[c.package]
            tables["die"][i] = self.die_masks[c.die_key]
            tables["numa"][i] = self.node_masks[c.node]
            tables["l2cache"][i] = self.l2_masks[c.l2]
            tables["l3cache"][i] = self.l3_masks[c.l3]
            tables["core"][i] = self.core_masks[c.core]
            tables["thread"][i] = 1 << i
        self._group_of = tables
        self._sibling_shifts = sibling_shifts(tuple(self.core_masks.values()))
        self._level_masks: dict[Level, tuple[int, ...]] = {
            "system": (self.online,) if self.online else (),
            "package": tuple(self.package_masks.values()),
            "die": tuple(self.die_masks.values()),
            "numa": tuple(m for m in self.node_masks.values() if m),
            "l2cache": tuple(self.l2_masks.values()),
            "l3cache": tuple(self.l3_masks.values()),
            "core": tuple(self.core_masks.values()),
            "thread": tuple(1 << c for c in self.cpus),
        }
        self._tree: TreeNode | None = None

    # -- discovery ----------------------------------------------------------

    @classmethod
    def from_sysfs(cls, host_root: str | os.PathLike[str] = "/") -> Topology:
        """Discover the topology under ``host_root`` (``/`` or e.g. ``/host``),
        with :func:`nri_framework.sysfs.discover`; the first call of a ``run``
        takes what the launch's child discovered under the same root
        (:mod:`nri_framework.topology_child`), when it did."""
        from nri_framework import topology_child
        from nri_framework.sysfs import discover  # it builds this module's records

        found = topology_child.take(host_root)  # discovered beside the start's imports
        return found if found is not None else discover(host_root)

    # -- queries ------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"Topology({self.online.bit_count()} CPUs {cpuset.format(self.online)}, "
            f"{len(self.package_masks)} packages, {len(self.die_masks)} dies, "
            f"{len(self.nodes)} NUMA nodes, {len(self.core_masks)} cores)"
        )

    def level_masks(self, level: Level) -> tuple[int, ...]:
        """The non-empty CPU groups at ``level``, ordered by group key; they
        partition the online CPUs."""
        if level not in self._level_masks:
            raise _unknown_level(level)
        return self._level_masks[level]

    def expand(self, mask: int, level: Level) -> int:
        """Every CPU of the ``level`` groups that ``mask`` touches. CPUs that are
        not online are kept as they are."""
        if level not in self._group_of:
            raise _unknown_level(level)
        return expand_groups(self._group_of[level], mask)

    def siblings(self, mask: int) -> int:
        """All threads of the cores that ``mask`` touches (CPUs that are not
        online kept as they are)."""
        shifts = self._sibling_shifts
        if shifts is None:
            return expand_groups(self._group_of["core"], mask)
        return shift_siblings(shifts, mask)

    def single_thread(self, mask: int) -> int:
        """The lowest-id CPU of ``mask`` in each core it touches (hideHyperthreads)."""
        table = self._group_of["core"]
        size = len(table)
        out = 0
        while mask:
            low = mask & -mask
            cpu = low.bit_length() - 1
            out |= low
            mask &= ~((table[cpu] if cpu < size else 0) or low)
        return out

    def closest_nodes(self, cpu_mask: int) -> int:
        """The NUMA nodes (as a node-id mask) holding the CPUs of ``cpu_mask``."""
        out = 0
        for n, cpus in self.node_masks.items():
            if cpus & cpu_mask:
                out |= 1 << n
        return out

    def node_cpus(self, node_mask: int) -> int:
        """The online CPUs of the NUMA nodes in ``node_mask``."""
        out = 0
        for n, cpus in self.node_masks.items():
            if node_mask >> n & 1:
                out |= cpus
        return out

    def nodes_by_distance(self, node: int) -> list[tuple[int, int]]:
        """``(distance, node mask)`` from ``node`` to the other nodes, nearest first."""
        by_distance: dict[int, int] = {}
        for other, dist in self.nodes[node].distances.items():
            if other != node:
                by_distance[dist] = by_distance.get(dist, 0) | 1 << other
        return sorted(by_distance.items())

    def tree(self) -> TreeNode:
        """The CPU tree of the balloons allocator (reference §7.1), built once.

        ``system`` -> package ``p<P>`` -> die ``p<P>d<D>`` -> NUMA ``p<P>d<D>n<N>``
        -> L2 ``<numa>$<l2 id>`` -> core ``<numa>cpu<lowest thread>`` -> thread
        ``<core>t<cpu id>``. As upstream, the thread suffix is the CPU id, not the
        thread index. Each level's CPUs are intersected with the parent's, so a
        cache or NUMA node that spans dies or packages still yields a partition.
        """
        if self._tree is None:
            self._tree = self._build_tree()
        return self._tree

    def _build_tree(self) -> TreeNode:
        cpus = self.cpus
        packages: list[TreeNode] = []
        for pkg, pkg_cpus in self.package_masks.items():
            p_name = f"p{pkg}"
            dies: list[TreeNode] = []
            for (dpkg, die), die_cpus in self.die_masks.items():
                if dpkg != pkg:
                    continue
                d_name = f"{p_name}d{die}"
                numas: list[TreeNode] = []
                for node, node_cpus in self.node_masks.items():
                    n_cpus = node_cpus & die_cpus
                    if not n_cpus:
                        continue
                    n_name = f"{d_name}n{node}"
                    l2_keys = sorted({cpus[c].l2 for c in cpuset.ids(n_cpus)})
                    l2s: list[TreeNode] = []
                    for key in l2_keys:
                        l2_cpus = self.l2_masks[key] & n_cpus
                        cores: list[TreeNode] = []
                        rest = l2_cpus
                        while rest:
                            first = (rest & -rest).bit_length() - 1
                            core_cpus = self.core_masks[cpus[first].core] & l2_cpus
                            rest &= ~core_cpus
                            c_name = f"{n_name}cpu{first}"
                            threads = tuple(
                                TreeNode(f"{c_name}t{t}", "thread", 1 << t)
                                for t in cpuset.ids(core_cpus)
                            )
                            cores.append(TreeNode(c_name, "core", core_cpus, threads))
                        l2s.append(TreeNode(f"{n_name}${key}", "l2cache", l2_cpus, tuple(cores)))
                    numas.append(TreeNode(n_name, "numa", n_cpus, tuple(l2s)))
                dies.append(TreeNode(d_name, "die", die_cpus, tuple(numas)))
            packages.append(TreeNode(p_name, "package", pkg_cpus, tuple(dies)))
        return TreeNode("system", "system", self.online, tuple(packages))

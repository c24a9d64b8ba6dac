"""CPU and memory topology of a host, discovered once from sysfs.

``Topology.from_sysfs(host_root)`` reads ``<host_root>/sys/devices/system/{cpu,node}``
(and ``/sys/devices/cpu_{core,atom}/cpus`` on hybrid CPUs) and precomputes every
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
  some without a cache level is an error.
- Without ``/sys/devices/system/node`` (a kernel with ``CONFIG_NUMA=n``) there
  is one node 0 holding every online CPU.
- Without hybrid core-type files every CPU is a performance core. When only one
  of ``cpu_core``/``cpu_atom`` exists, the remaining online CPUs are of the
  other type.
- ``base_frequency`` falls back to ``cpuinfo_max_freq`` with a warning; CPUs
  without ``cpufreq/`` report 0 for all frequencies.

Every unreadable or malformed file raises :class:`TopologyError` naming the path.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from nri_framework import cpuset

log = logging.getLogger("nri_framework.topology")

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


class TopologyError(ValueError):
    """A topology that cannot be described: a missing or malformed sysfs file
    (``path`` names it) or an invalid topology specification."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class CoreType(enum.StrEnum):
    PERFORMANCE = "performance"
    EFFICIENT = "efficient"


@dataclass(frozen=True, slots=True)
class CpuFreq:
    """``cpufreq`` limits in kHz; 0 when unknown."""

    min: int = 0
    base: int = 0
    max: int = 0


@dataclass(frozen=True, slots=True)
class CpuInfo:
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

    @property
    def die_key(self) -> tuple[int, int]:
        return (self.package, self.die)


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: int
    """Online CPUs of the node (0 for a memory-only node)."""
    distances: Mapping[int, int]
    """Node id -> ``distance`` (``nodeN/distance`` lists online nodes in order)."""
    mem_total_kb: int
    """``MemTotal`` from ``nodeN/meminfo``; 0 when unknown."""


@dataclass(frozen=True, slots=True)
class TreeNode:
    """A node of the CPU tree (balloons ``cputree.go``): name, level, CPUs, children."""

    name: str
    level: Level
    cpus: int
    children: tuple[TreeNode, ...] = field(default=())

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


# ---------------------------------------------------------------------------
# sysfs reading


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise TopologyError(f"missing {path}", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read {path}: {exc}", path) from None


def _read_optional(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read {path}: {exc}", path) from None


def _int(path: Path, text: str | None = None) -> int:
    text = _read(path) if text is None else text
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"invalid integer {text!r} in {path}", path) from None


def _mask(path: Path, text: str | None = None) -> int:
    text = _read(path) if text is None else text
    try:
        return cpuset.parse(text)
    except cpuset.CpusetError as exc:
        raise TopologyError(f"invalid list {text!r} in {path}: {exc}", path) from None


def _optional_int(path: Path) -> int | None:
    text = _read_optional(path)
    return None if text is None else _int(path, text)


def _optional_mask(path: Path) -> int | None:
    text = _read_optional(path)
    return None if text is None else _mask(path, text)


def _meminfo_total(path: Path) -> int:
    text = _read_optional(path)
    if text is None:
        return 0
    for line in text.splitlines():
        words = line.split()
        if "MemTotal:" in words:
            i = words.index("MemTotal:")
            try:
                return int(words[i + 1])
            except (IndexError, ValueError):
                break
    raise TopologyError(f"no valid MemTotal line in {path}", path)


# ---------------------------------------------------------------------------
# discovery


@dataclass(slots=True)
class _CacheGroups:
    """The cache groups of one level during discovery: key -> shared CPUs, and the file
    that first defined each key (for error messages)."""

    level: int
    masks: dict[int, int] = field(default_factory=dict)
    paths: dict[int, Path] = field(default_factory=dict)
    of_cpu: dict[int, int] = field(default_factory=dict)

    def add(self, cpu: int, shared: int, cache_id: int | None, path: Path) -> None:
        if not shared >> cpu & 1:
            raise TopologyError(
                f"CPU {cpu} is not in its own L{self.level} shared_cpu_list "
                f"{cpuset.format(shared)!r} in {path}",
                path,
            )
        key = cache_id if cache_id is not None else (shared & -shared).bit_length() - 1
        known = self.masks.get(key)
        if known is None:
            self.masks[key] = shared
            self.paths[key] = path
        elif known != shared:
            raise TopologyError(
                f"L{self.level} cache id {key} is shared by CPUs {cpuset.format(shared)} "
                f"in {path} but by CPUs {cpuset.format(known)} in {self.paths[key]}",
                path,
            )
        self.of_cpu[cpu] = key


def _discover_caches(cpu: int, cpu_dir: Path, online: int, groups: dict[int, _CacheGroups]) -> None:
    cache_dir = cpu_dir / "cache"
    try:
        entries = sorted(
            (e for e in os.scandir(cache_dir) if e.name.startswith("index")),
            key=lambda e: e.name,
        )
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TopologyError(f"cannot list {cache_dir}: {exc}", cache_dir) from None
    for entry in entries:
        index = Path(entry.path)
        level = _int(index / "level")
        if level not in groups or cpu in groups[level].of_cpu:
            continue
        kind = _read(index / "type")
        if kind == "Instruction":
            continue
        shared = _mask(index / "shared_cpu_list") & online
        groups[level].add(cpu, shared, _optional_int(index / "id"), index / "shared_cpu_list")


def _fill_missing_caches(
    group: _CacheGroups, online: int, fallback: Mapping[int, int], sys_cpu: Path
) -> dict[int, int]:
    """CPU -> cache key; every CPU gets ``fallback[cpu]`` as its group when none has the level."""
    missing = online & ~cpuset.from_ids(group.of_cpu)
    if missing and group.of_cpu:
        first = (missing & -missing).bit_length() - 1
        path = sys_cpu / f"cpu{first}" / "cache"
        raise TopologyError(
            f"no L{group.level} cache for CPUs {cpuset.format(missing)} (see {path}) while "
            f"CPUs {cpuset.format(cpuset.from_ids(group.of_cpu))} have one",
            path,
        )
    if missing:
        log.debug("no L%d cache information; grouping CPUs by fallback", group.level)
        for cpu in cpuset.ids(online):
            mask = fallback[cpu]
            group.add(cpu, mask, None, sys_cpu)
    return group.of_cpu


def _discover_core_types(root: Path, online: int, core_of: Mapping[int, int]) -> int:
    """The efficient (Atom) CPUs as a mask; validated to be whole cores."""
    perf_path, eff_path = (root / p for p in HYBRID_CPUS.values())
    perf = _optional_mask(perf_path)
    eff = _optional_mask(eff_path)
    if perf is None and eff is None:
        return 0
    if eff is None:
        assert perf is not None
        eff = online & ~perf
    elif perf is None:
        perf = online & ~eff
    perf &= online
    eff &= online
    both = perf & eff
    if both:
        raise TopologyError(
            f"CPUs {cpuset.format(both)} are listed in both {perf_path} and {eff_path}", eff_path
        )
    neither = online & ~(perf | eff)
    if neither:
        raise TopologyError(
            f"CPUs {cpuset.format(neither)} are in neither {perf_path} nor {eff_path}", eff_path
        )
    for cpu in cpuset.ids(eff):
        if core_of[cpu] & ~eff:
            raise TopologyError(
                f"core of CPU {cpu} ({cpuset.format(core_of[cpu])}) is only partly "
                f"listed in {eff_path}",
                eff_path,
            )
    return eff


def _discover_nodes(root: Path, online: int) -> dict[int, NumaNode]:
    node_dir = root / SYS_NODE
    if not node_dir.is_dir():
        mem = _meminfo_total(root / "proc" / "meminfo") if (root / "proc").is_dir() else 0
        return {0: NumaNode(0, online, {0: 10}, mem)}
    node_ids = _optional_mask(node_dir / "online")
    if node_ids is None:
        try:
            names = [e.name for e in os.scandir(node_dir)]
        except OSError as exc:
            raise TopologyError(f"cannot list {node_dir}: {exc}", node_dir) from None
        node_ids = cpuset.from_ids(
            int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()
        )
    if not node_ids:
        raise TopologyError(f"no online NUMA nodes in {node_dir / 'online'}", node_dir / "online")
    order = cpuset.ids(node_ids)
    nodes: dict[int, NumaNode] = {}
    for n in order:
        d = node_dir / f"node{n}"
        cpus = _mask(d / "cpulist") & online
        dist_text = _read_optional(d / "distance")
        if dist_text is None:
            distances = {m: 10 if m == n else 20 for m in order}
        else:
            try:
                values = [int(v) for v in dist_text.split()]
            except ValueError:
                raise TopologyError(
                    f"invalid distances {dist_text!r} in {d / 'distance'}", d / "distance"
                ) from None
            if len(values) != len(order):
                raise TopologyError(
                    f"{len(values)} distances in {d / 'distance'} for {len(order)} online nodes",
                    d / "distance",
                )
            distances = dict(zip(order, values, strict=True))
        nodes[n] = NumaNode(n, cpus, distances, _meminfo_total(d / "meminfo"))
    return nodes


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
        """Discover the topology under ``host_root`` (``/`` or e.g. ``/host``)."""
        root = Path(host_root)
        sys_cpu = root / SYS_CPU
        online = _mask(sys_cpu / "online")
        if not online:
            raise TopologyError(f"no online CPUs in {sys_cpu / 'online'}", sys_cpu / "online")
        possible = _optional_mask(sys_cpu / "possible")
        isolated = _optional_mask(sys_cpu / "isolated") or 0

        package: dict[int, int] = {}
        die: dict[int, int] = {}
        core_id: dict[int, int] = {}
        core_of: dict[int, int] = {}
        freq: dict[int, CpuFreq] = {}
        no_base = 0
        caches = {2: _CacheGroups(2), 3: _CacheGroups(3)}
        for cpu in cpuset.ids(online):
            cpu_dir = sys_cpu / f"cpu{cpu}"
            topo = cpu_dir / "topology"
            package[cpu] = _int(topo / "physical_package_id")
            die[cpu] = _optional_int(topo / "die_id") or 0
            core_id[cpu] = _int(topo / "core_id")
            siblings_path = topo / "thread_siblings_list"
            siblings = _optional_mask(siblings_path)
            if siblings is None:
                siblings_path = topo / "core_cpus_list"
                siblings = _mask(siblings_path)
            siblings &= online
            if not siblings >> cpu & 1:
                raise TopologyError(
                    f"CPU {cpu} is not in its own thread siblings "
                    f"{cpuset.format(siblings)!r} in {siblings_path}",
                    siblings_path,
                )
            core_of[cpu] = siblings
            _discover_caches(cpu, cpu_dir, online, caches)
            f = cpu_dir / "cpufreq"
            fmin = _optional_int(f / "cpuinfo_min_freq") or 0
            fmax = _optional_int(f / "cpuinfo_max_freq") or 0
            base = _optional_int(f / "base_frequency")
            if base is None:
                if fmax:
                    no_base |= 1 << cpu
                base = fmax
            freq[cpu] = CpuFreq(fmin, base, fmax)
        if no_base:
            log.warning(
                "no cpufreq/base_frequency for CPUs %s; using cpuinfo_max_freq as base",
                cpuset.format(no_base),
            )

        for cpu, siblings in core_of.items():
            for other in cpuset.ids(siblings):
                if core_of[other] != siblings or package[other] != package[cpu]:
                    path = sys_cpu / f"cpu{other}" / "topology" / "thread_siblings_list"
                    raise TopologyError(
                        f"CPU {cpu} lists thread siblings {cpuset.format(siblings)} "
                        f"but CPU {other} (package {package[other]}) lists "
                        f"{cpuset.format(core_of[other])} in {path}",
                        path,
                    )
        die_masks: dict[tuple[int, int], int] = {}
        for cpu in core_of:
            key = (package[cpu], die[cpu])
            die_masks[key] = die_masks.get(key, 0) | 1 << cpu
        l2 = _fill_missing_caches(caches[2], online, core_of, sys_cpu)
        l3 = _fill_missing_caches(
            caches[3], online, {c: die_masks[(package[c], die[c])] for c in core_of}, sys_cpu
        )

        nodes = _discover_nodes(root, online)
        node_of: dict[int, int] = {}
        for n, node in nodes.items():
            for cpu in cpuset.ids(node.cpus):
                if cpu in node_of:
                    path = root / SYS_NODE / f"node{n}" / "cpulist"
                    raise TopologyError(
                        f"CPU {cpu} is in NUMA node {node_of[cpu]} and in node {n} ({path})",
                        path,
                    )
                node_of[cpu] = n
        unplaced = online & ~cpuset.from_ids(node_of)
        if unplaced:
            path = root / SYS_NODE
            raise TopologyError(
                f"CPUs {cpuset.format(unplaced)} are in no NUMA node's cpulist under {path}", path
            )
        memory_nodes = _optional_mask(root / SYS_NODE / "has_memory")

        efficient = _discover_core_types(root, online, core_of)
        infos: dict[int, CpuInfo] = {}
        for cpu, siblings in core_of.items():
            infos[cpu] = CpuInfo(
                id=cpu,
                package=package[cpu],
                die=die[cpu],
                node=node_of[cpu],
                core_id=core_id[cpu],
                core=(siblings & -siblings).bit_length() - 1,
                thread=(siblings & ((1 << cpu) - 1)).bit_count(),
                l2=l2[cpu],
                l3=l3[cpu],
                core_type=CoreType.EFFICIENT if efficient >> cpu & 1 else CoreType.PERFORMANCE,
                isolated=bool(isolated >> cpu & 1),
                freq=freq[cpu],
            )
        return cls(
            infos,
            nodes,
            possible=possible,
            isolated=isolated,
            memory_nodes=memory_nodes,
            host_root=root,
        )

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
        """All threads of the cores that ``mask`` touches."""
        return self.expand(mask, "core")

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

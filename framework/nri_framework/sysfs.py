"""The host's sysfs read into a :class:`~nri_framework.topology.Topology` (upstream ``pkg/sysfs``).

:func:`discover` reads ``<host_root>/sys/devices/system/{cpu,node}`` (and
``/sys/devices/cpu_{core,atom}/cpus`` on hybrid CPUs) once; the rules it follows
are in :mod:`nri_framework.topology`'s docstring. Every unreadable or malformed
file raises :class:`~nri_framework.topology.TopologyError` naming the path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from nri_framework import cpuset
from nri_framework.topology import (
    HYBRID_CPUS,
    SYS_CPU,
    SYS_NODE,
    CoreType,
    CpuFreq,
    CpuInfo,
    MemoryType,
    NumaNode,
    Topology,
    TopologyError,
)

log = logging.getLogger("nri_framework.topology")

# ---------------------------------------------------------------------------
# sysfs reading


READ_SIZE = 65536
"""Bytes asked of one ``read(2)``: a sysfs attribute is at most a page and is
read whole by one call, a regular file comes short only at its end, so a read
that returns less than this is the end of the file (no second call to see it)."""


def _text(path: str, errors: str = "strict") -> str:
    """The whole file as ``Path.read_text`` gives it, without pathlib's and the
    text layer's cost (a 6776P has about 6000 sysfs files to read at start):
    ``open``, one ``read`` (more only for a file of :data:`READ_SIZE` or more), ``close``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, READ_SIZE)
        if len(data) == READ_SIZE:  # a large file: the rest to the end
            chunks = [data]
            while chunk := os.read(fd, READ_SIZE):
                chunks.append(chunk)
            data = b"".join(chunks)
    finally:
        os.close(fd)
    text = data.decode(errors=errors)
    if "\r" in text:  # universal newlines, as read_text
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def _read(path: str) -> str:
    try:
        return _text(path).strip()
    except FileNotFoundError:
        raise TopologyError(f"missing {path}", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read {path}: {exc}", path) from None


def _read_optional(path: str) -> str | None:
    try:
        return _text(path).strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read {path}: {exc}", path) from None


def _int(path: str, text: str | None = None) -> int:
    text = _read(path) if text is None else text
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"invalid integer {text!r} in {path}", path) from None


def _mask(path: str, text: str | None = None) -> int:
    text = _read(path) if text is None else text
    try:
        return cpuset.parse(text)
    except cpuset.CpusetError as exc:
        raise TopologyError(f"invalid list {text!r} in {path}: {exc}", path) from None


def _optional_int(path: str) -> int | None:
    text = _read_optional(path)
    return None if text is None else _int(path, text)


def _optional_mask(path: str) -> int | None:
    text = _read_optional(path)
    return None if text is None else _mask(path, text)


def _meminfo_total(path: str) -> int:
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


MAX_EPP_LENGTH = 64
"""The longest ``energy_performance_preference`` kept (the kernel's names are
at most 19 characters; a raw 0-255 value is 3)."""
MAX_CSTATE_NAME = 64
"""Characters of a C-state name kept (the kernel's are at most 16)."""


def _epp(path: str) -> str:
    """``energy_performance_preference``: "" when missing; an unreadable,
    over-long or multi-word file is a :class:`TopologyError`."""
    text = _read_optional(path)
    if text is None:
        return ""
    if len(text) > MAX_EPP_LENGTH or not text.isprintable() or " " in text:
        raise TopologyError(f"invalid energy performance preference {text[:80]!r} in {path}", path)
    return text


IdleStates = dict[tuple[str, ...], frozenset[str]]
"""The C-state names read so far, by a CPU's ``cpuidle`` state directories (see
:func:`_cstate_names`)."""


def _cstate_names(cpuidle: str, known: IdleStates | None = None) -> frozenset[str]:
    """The cpuidle state names under ``cpuidle`` (each at most
    :data:`MAX_CSTATE_NAME` characters; an unreadable state is left out).

    ``known``: the names of the CPUs read before, by their state directories. A
    ``stateN`` directory of a CPU is the ``N``-th state of the CPU's idle driver and
    its ``name`` that state's name (the kernel's ``cpuidle_add_state_sysfs``), so
    CPUs of one driver with the same state directories have the same names. A
    kernel with one idle driver for every CPU has no ``cpuidle/driver`` under any
    CPU (that directory is made only with ``CONFIG_CPU_IDLE_MULTIPLE_DRIVERS``):
    such a CPU with the state directories of a CPU read before takes its names
    without reading them. A CPU that shows a ``driver`` of its own (per-CPU drivers
    such as ``arm_idle`` share a name, not their states) or new state directories
    reads its own; names of which one was unreadable are not taken by others."""
    try:
        entries = os.listdir(cpuidle)
    except OSError:
        return frozenset()
    states = tuple(sorted(name for name in entries if name.startswith("state")))
    shared = None if "driver" in entries else known
    if shared is not None and (names := shared.get(states)) is not None:
        return names
    found: set[str] = set()
    whole = True
    for state in states:
        try:
            found.add(_text(f"{cpuidle}/{state}/name", "replace").strip()[:MAX_CSTATE_NAME])
        except OSError:
            whole = False
    names = frozenset(found)
    if shared is not None and whole:
        shared[states] = names
    return names


# ---------------------------------------------------------------------------
# discovery


class _CacheGroups(msgspec.Struct):
    """The cache groups of one level during discovery: key -> shared CPUs, and the file
    that first defined each key (for error messages).

    ``named``: the CPUs a group's ``shared_cpu_list`` names besides the CPU it was
    read from, with the group's key: sysfs says they share that cache, so when
    discovery reaches one of them and finds its index of this level, the CPU takes
    the group without reading the index's ``type``, ``shared_cpu_list`` and ``id``
    (on a 6776P a core's second thread and every core after the first of an L3:
    about 1150 of 5900 files). A CPU named by two groups of different keys is in
    ``unsure`` and reads its own files, as does a CPU no group named."""

    level: int
    masks: dict[int, int] = msgspec.field(default_factory=dict)
    paths: dict[int, str] = msgspec.field(default_factory=dict)
    of_cpu: dict[int, int] = msgspec.field(default_factory=dict)
    named: dict[int, int] = msgspec.field(default_factory=dict)
    unsure: set[int] = msgspec.field(default_factory=set)

    def take_named(self, cpu: int) -> bool:
        """``cpu`` joins the group an earlier list named it in; False: it reads its own."""
        key = self.named.get(cpu)
        if key is None:
            return False
        self.of_cpu[cpu] = key
        return True

    def _name(self, cpu: int, shared: int, key: int) -> None:
        named, unsure = self.named, self.unsure
        rest = shared & ~(1 << cpu)
        while rest:
            low = rest & -rest
            rest ^= low
            other = low.bit_length() - 1
            if other in self.of_cpu or other in unsure:
                continue
            prior = named.setdefault(other, key)
            if prior != key:  # two lists name it: its own files say which
                del named[other]
                unsure.add(other)

    def add(self, cpu: int, shared: int, cache_id: int | None, path: str) -> None:
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
            self._name(cpu, shared, key)
        elif known != shared:
            raise TopologyError(
                f"L{self.level} cache id {key} is shared by CPUs {cpuset.format(shared)} "
                f"in {path} but by CPUs {cpuset.format(known)} in {self.paths[key]}",
                path,
            )
        self.of_cpu[cpu] = key


def _discover_caches(cpu: int, cpu_dir: str, online: int, groups: dict[int, _CacheGroups]) -> None:
    cache_dir = f"{cpu_dir}/cache"
    try:
        entries = sorted(n for n in os.listdir(cache_dir) if n.startswith("index"))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TopologyError(f"cannot list {cache_dir}: {exc}", cache_dir) from None
    for entry in entries:
        index = f"{cache_dir}/{entry}"
        level = _int(f"{index}/level")
        group = groups.get(level)
        if group is None or cpu in group.of_cpu or group.take_named(cpu):
            continue
        kind = _read(f"{index}/type")
        if kind == "Instruction":
            continue
        shared_path = f"{index}/shared_cpu_list"
        shared = _mask(shared_path) & online
        group.add(cpu, shared, _optional_int(f"{index}/id"), shared_path)


def _fill_missing_caches(
    group: _CacheGroups, online: int, fallback: Mapping[int, int], sys_cpu: str
) -> dict[int, int]:
    """CPU -> cache key; every CPU gets ``fallback[cpu]`` as its group when none has the level."""
    missing = online & ~cpuset.from_ids(group.of_cpu)
    if missing and group.of_cpu:
        first = (missing & -missing).bit_length() - 1
        path = f"{sys_cpu}/cpu{first}/cache"
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
    perf_path, eff_path = (os.path.join(root, p) for p in HYBRID_CPUS.values())
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
        mem = _meminfo_total(str(root / "proc" / "meminfo")) if (root / "proc").is_dir() else 0
        return {0: NumaNode(0, online, {0: 10}, mem)}
    node_ids = _optional_mask(str(node_dir / "online"))
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
        cpus = _mask(str(d / "cpulist")) & online
        dist_text = _read_optional(str(d / "distance"))
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
        nodes[n] = NumaNode(n, cpus, distances, _meminfo_total(str(d / "meminfo")))
    return nodes


def _memory_types(
    nodes: Mapping[int, NumaNode], has_memory: int | None, has_normal: int | None
) -> dict[int, NumaNode]:
    """Each node with its memory type and normal-memory flag (upstream
    ``pkg/sysfs`` ``discoverNodes``): a node with CPUs is DRAM; a memory-only
    node is HBM when it has less memory than the average DRAM node, else PMEM."""
    if has_memory is None:  # as Topology.memory_nodes: with a MemTotal, else every node
        has_memory = cpuset.from_ids(
            n.id for n in nodes.values() if n.mem_total_kb
        ) or cpuset.from_ids(nodes)
    if has_normal is None:
        has_normal = has_memory
    dram = [n for n in nodes.values() if n.cpus]
    special = [n for n in nodes.values() if not n.cpus and has_memory >> n.id & 1]
    dram_avg = 0
    if special and dram:
        dram_avg = sum(n.mem_total_kb for n in dram) // len(dram)
    out: dict[int, NumaNode] = {}
    for n in nodes.values():
        kind = MemoryType.DRAM
        if not n.cpus and has_memory >> n.id & 1:
            kind = MemoryType.HBM if n.mem_total_kb < dram_avg else MemoryType.PMEM
            log.info("node %d has %s memory", n.id, kind)
        out[n.id] = msgspec.structs.replace(
            n, memory_type=kind, normal_memory=bool(has_normal >> n.id & 1)
        )
    return out


# ---------------------------------------------------------------------------
# the topology


def discover(host_root: str | os.PathLike[str] = "/") -> Topology:
    """Discover the topology under ``host_root`` (``/`` or e.g. ``/host``)."""
    root = Path(host_root)
    sys_cpu = os.path.join(root, SYS_CPU)
    online = _mask(f"{sys_cpu}/online")
    if not online:
        raise TopologyError(f"no online CPUs in {sys_cpu}/online", f"{sys_cpu}/online")
    possible = _optional_mask(f"{sys_cpu}/possible")
    isolated = _optional_mask(f"{sys_cpu}/isolated") or 0

    package: dict[int, int] = {}
    die: dict[int, int] = {}
    core_id: dict[int, int] = {}
    core_of: dict[int, int] = {}
    freq: dict[int, CpuFreq] = {}
    epp: dict[int, str] = {}
    cstates: dict[int, frozenset[str]] = {}
    no_base = 0
    caches = {2: _CacheGroups(2), 3: _CacheGroups(3)}
    idle_states: IdleStates = {}
    for cpu in cpuset.ids(online):
        cpu_dir = f"{sys_cpu}/cpu{cpu}"
        topo = f"{cpu_dir}/topology"
        package[cpu] = _int(f"{topo}/physical_package_id")
        die[cpu] = _optional_int(f"{topo}/die_id") or 0
        core_id[cpu] = _int(f"{topo}/core_id")
        siblings_path = f"{topo}/thread_siblings_list"
        siblings = _optional_mask(siblings_path)
        if siblings is None:
            siblings_path = f"{topo}/core_cpus_list"
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
        f = f"{cpu_dir}/cpufreq"
        fmin = _optional_int(f"{f}/cpuinfo_min_freq") or 0
        fmax = _optional_int(f"{f}/cpuinfo_max_freq") or 0
        base = _optional_int(f"{f}/base_frequency")
        if base is None:
            if fmax:
                no_base |= 1 << cpu
            base = fmax
        freq[cpu] = CpuFreq(fmin, base, fmax)
        epp[cpu] = _epp(f"{f}/energy_performance_preference")
        cstates[cpu] = _cstate_names(f"{cpu_dir}/cpuidle", idle_states)
    if no_base:
        log.warning(
            "no cpufreq/base_frequency for CPUs %s; using cpuinfo_max_freq as base",
            cpuset.format(no_base),
        )

    for cpu, siblings in core_of.items():
        for other in cpuset.ids(siblings):
            if core_of[other] != siblings or package[other] != package[cpu]:
                path = f"{sys_cpu}/cpu{other}/topology/thread_siblings_list"
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
                path = os.path.join(root, SYS_NODE, f"node{n}", "cpulist")
                raise TopologyError(
                    f"CPU {cpu} is in NUMA node {node_of[cpu]} and in node {n} ({path})",
                    path,
                )
            node_of[cpu] = n
    unplaced = online & ~cpuset.from_ids(node_of)
    if unplaced:
        path = os.path.join(root, SYS_NODE)
        raise TopologyError(
            f"CPUs {cpuset.format(unplaced)} are in no NUMA node's cpulist under {path}", path
        )
    memory_nodes = _optional_mask(os.path.join(root, SYS_NODE, "has_memory"))
    normal_nodes = _optional_mask(os.path.join(root, SYS_NODE, "has_normal_memory"))
    nodes = _memory_types(nodes, memory_nodes, normal_nodes)

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
            epp=epp[cpu],
            cstates=cstates[cpu],
        )
    return Topology(
        infos,
        nodes,
        possible=possible,
        isolated=isolated,
        memory_nodes=memory_nodes,
        host_root=root,
    )


# ---------------------------------------------------------------------------
# discovery in a child process (nri_framework.topology_child)


class LogLine(msgspec.Struct, array_like=True):
    """A log line the discovery wrote in the child, written by the parent."""

    level: int
    logger: str
    message: str


class Discovery(msgspec.Struct, forbid_unknown_fields=True):
    """A discovered topology as the child sends it (JSON: CPU masks are wider
    than msgpack's 64-bit integers), and the log lines the discovery wrote."""

    cpus: list[CpuInfo]
    nodes: list[NumaNode]
    possible: int
    isolated: int
    memory_nodes: int
    lines: list[LogLine]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[LogLine] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(LogLine(record.levelno, record.name, record.getMessage()))


def discover_and_encode(host_root: str) -> bytes:
    """:func:`discover` under ``host_root`` as :class:`Discovery` bytes (in the
    child: every line the discovery logs is kept, at any level, for the parent,
    whose configuration decides which are written)."""
    lines = _Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(lines)
    root.setLevel(logging.DEBUG)
    try:
        topo = discover(host_root)
    finally:
        root.removeHandler(lines)
        root.setLevel(level)
    return msgspec.json.encode(
        Discovery(
            cpus=list(topo.cpus.values()),
            nodes=list(topo.nodes.values()),
            possible=topo.possible,
            isolated=topo.isolated,
            memory_nodes=topo.memory_nodes,
            lines=lines.lines,
        )
    )


def decode_discovery(data: bytes, host_root: str | os.PathLike[str]) -> Topology:
    """The topology of :func:`discover_and_encode`'s ``data``, its log lines
    written now. Raises :class:`ValueError` when ``data`` is not one."""
    try:
        found = msgspec.json.decode(data, type=Discovery)
        if not found.cpus:
            raise ValueError("no CPUs")
        shared: dict[frozenset[str], frozenset[str]] = {}  # one set per C-state list, as found
        cpus = {}
        for c in found.cpus:
            names = shared.setdefault(c.cstates, c.cstates)
            cpus[c.id] = c if names is c.cstates else msgspec.structs.replace(c, cstates=names)
        topo = Topology(
            cpus,
            {n.id: n for n in found.nodes},
            possible=found.possible,
            isolated=found.isolated,
            memory_nodes=found.memory_nodes,
            host_root=Path(host_root),
        )
    except (KeyError, TypeError, IndexError) as exc:  # an inconsistent topology
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
    if topo.node_masks != {n: node.cpus for n, node in topo.nodes.items()}:
        raise ValueError("CPUs and NUMA nodes disagree")  # as discover checks them
    for line in found.lines:
        logging.getLogger(line.logger).log(line.level, "%s", line.message)
    return topo

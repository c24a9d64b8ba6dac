"""A host root for the plugin: an existing tree, or a generated sysfs.

``prepare_host_root(spec, workdir)`` takes a directory (used as is), ``cpus:N``
or the name of a preset topology (:data:`TOPOLOGIES`):

``cpus:N`` (:func:`write_cpu_tree`)
    The minimal tree: ``sys/devices/system/cpu/{online,possible,present}`` =
    ``0-(N-1)`` and per CPU ``cpuK/online`` plus ``cpuK/topology/{physical_package_id,
    die_id,core_id,core_cpus_list,thread_siblings_list}`` (one package, one die,
    one thread per core), and one NUMA node ``sys/devices/system/node/node0``.

``n4c16`` (:data:`N4C16`)
    Upstream's e2e VM ``test/e2e/policies.test-suite/balloons/n4c16/topology.var.json``
    = ``[{"mem": "2G", "cores": 2, "nodes": 2, "packages": 2}]`` with the default
    2 threads: 2 packages x 2 NUMA nodes x 2 cores x 2 threads = 16 CPUs.
    Numbering ("qemu"): ``test/e2e/lib/topology2qemuopts.py`` (containers/nri-plugins
    0705acc) passes ``-smp cpus=16,threads=2,sockets=2`` and gives each NUMA node
    the next ``cores*threads`` CPU indexes (``-numa node,nodeid=N,cpus=4N-(4N+3)``).
    QEMU's CPU index runs thread-fastest (index = ((socket*cores)+core)*threads +
    thread) and the guest kernel enumerates CPUs in that (APIC id) order, so the
    threads of a core are adjacent: siblings are 0-1, 2-3, ... The e2e cache
    overrides agree (``test13-cacheclusters`` puts L1 on ``0-1``, ``2-3``, ...).
    Node N holds CPUs 4N..4N+3; CPUs 0-7 are package 0. Distances are the script's
    defaults (10 self, 11 same package, 21 other package), 2 GiB per node, L2 per
    core and L3 per package (QEMU's default cache topology). cpufreq is what the
    PCT e2e tests fake with ``OVERRIDE_SYS_CPUFREQ``: min 0.8, base 2.9, max
    3.8 GHz. C-states are the names ``test17-cstates-scheduling`` fakes with
    ``OVERRIDE_SYS_CSTATES`` (C1E, C2, C4, C8; latencies are made up).

``xeon-6776p`` (:data:`XEON_6776P`)
    The dual-socket Xeon 6776P of ``sst.md`` §5.1-§5.2: 2 packages, SNC2 (2 NUMA
    nodes = 2 punits per package), 32 cores per node, 2 threads, 256 CPUs.
    Numbering ("smt-last", as Linux enumerates bare-metal Intel servers): all
    first threads, then all second threads, so the sibling of CPU n is n+128,
    ``pkg = (c % 128) // 64``, ``core_id = c % 64``, ``node = 2*pkg + core_id//32``.
    ``die_id = pkg``; L1/L2 per core, L3 (``id = pkg``) per package (the L3 id
    under SNC is unverified upstream; ``l3_scope="numa"`` gives one per SNC
    domain). cpufreq: min 0.8, base 2.3, max 4.6 GHz; intel_idle GNR C-states
    C1, C1E, C6, C6P (§4.3); TPMI uncore: ``package_0P_die_00`` root domains and
    ``uncoreNN`` per (package, power domain, fabric cluster), compute domains 0-1
    with ``agent_types`` "core cache memory" and IO domains 2-3 with "io" (§4.4;
    IO domains and all uncore frequencies are synthetic).

``s8c4k`` (:data:`S8C4K`)
    Upstream's ``s8c4k/topology.var.json`` = ``[{"mem": "2G", "threads": 1,
    "cores": 512, "packages": 8, "cpus-present": 3}]``: 8 packages of 512
    single-thread cores (possible CPUs 0-4095, one NUMA node per package) with 3
    CPUs present at boot; ``test01-sparse-4kcpus`` then hot-plugs socket/core
    0/511, 2/511 and 7/511 and onlines them, which Linux numbers 511, 1535 and
    4095 (the test expects ``cpu0511``, ``cpu1535``, ``cpu4095``). So the online
    and present CPUs are ``0-2,511,1535,4095``; nodes 1, 3-6 have memory and no
    CPUs. No cpufreq, as in the VM.

Every number lives in a frozen :class:`TopologySpec`; derive variants with
``dataclasses.replace(XEON_6776P, l3_scope="numa")``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from nri_framework import cpuset
from nri_framework.topology import TopologyError

__all__ = [
    "N4C16",
    "S8C4K",
    "TOPOLOGIES",
    "XEON_6776P",
    "CState",
    "CacheSpec",
    "CpuFreqSpec",
    "TopologyError",
    "TopologySpec",
    "UncoreSpec",
    "online",
    "prepare_host_root",
    "write_cpu_tree",
    "write_topology",
]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_cpu_tree(root: Path, ncpus: int) -> Path:
    """Write a sysfs tree of ``ncpus`` single-threaded cores under ``root``."""
    if ncpus < 1:
        raise TopologyError(f"need at least one CPU, not {ncpus}")
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    all_cpus = cpuset.format((1 << ncpus) - 1)
    for name in ("online", "possible", "present"):
        _write(cpu_dir / name, all_cpus)
    for cpu in range(ncpus):
        _write(cpu_dir / f"cpu{cpu}" / "online", "1")
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        for name, val in (
            ("physical_package_id", "0"),
            ("die_id", "0"),
            ("core_id", str(cpu)),
            ("core_cpus_list", str(cpu)),
            ("thread_siblings_list", str(cpu)),
        ):
            _write(topo / name, val)
    node_dir = root / "sys" / "devices" / "system" / "node"
    _write(node_dir / "online", "0")
    _write(node_dir / "possible", "0")
    _write(node_dir / "node0" / "cpulist", all_cpus)
    return root


def online(root: Path, kind: str = "cpu") -> str:
    """``sys/devices/system/{cpu,node}/online`` under ``root`` ("" when missing)."""
    path = root / "sys" / "devices" / "system" / kind / "online"
    try:
        return cpuset.format(cpuset.parse(path.read_text()))
    except (OSError, cpuset.CpusetError):
        return ""


# ---------------------------------------------------------------------------
# topology specifications

Numbering = Literal["qemu", "smt-last"]
"""``qemu``: threads of a core are adjacent (index = core*threads + thread).
``smt-last``: thread t of global core c is ``t*cores + c`` (bare-metal Intel)."""


@dataclass(frozen=True)
class CState:
    name: str
    desc: str
    latency_us: int
    residency_us: int


POLL = CState("POLL", "CPUIDLE CORE POLL IDLE", 0, 0)
GNR_CSTATES = (
    CState("C1", "MWAIT 0x00", 1, 1),
    CState("C1E", "MWAIT 0x01", 4, 4),
    CState("C6", "MWAIT 0x20", 170, 650),
    CState("C6P", "MWAIT 0x21", 210, 1000),
)


@dataclass(frozen=True)
class CpuFreqSpec:
    """intel_pstate (HWP) cpufreq; frequencies in kHz."""

    min_khz: int
    base_khz: int
    max_khz: int
    driver: str = "intel_pstate"
    governor: str = "powersave"
    governors: tuple[str, ...] = ("performance", "powersave")
    epp: str = "balance_performance"


@dataclass(frozen=True)
class UncoreSpec:
    """TPMI uncore frequency: per package, ``compute_domains`` power domains with
    cores then ``io_domains`` without, each with ``clusters_per_domain`` clusters."""

    min_khz: int = 800_000
    max_khz: int = 2_200_000
    current_khz: int = 1_800_000
    compute_domains: int = 2
    io_domains: int = 2
    clusters_per_domain: int = 1


@dataclass(frozen=True)
class CacheSpec:
    """Cache sizes as sysfs prints them."""

    l1d: str = "32K"
    l1i: str = "32K"
    l2: str = "4096K"
    l3: str = "16384K"


@dataclass(frozen=True)
class TopologySpec:
    """A regular machine: packages x dies x NUMA nodes x cores x threads.

    ``online``/``present``/``isolated``/``efficient_cpus`` are cpuset strings;
    ``online=None`` means every possible CPU, ``present=None`` means ``online``,
    ``efficient_cpus=None`` writes no hybrid core-type files.
    """

    name: str = "custom"
    packages: int = 1
    dies_per_package: int = 1
    nodes_per_die: int = 1
    cores_per_node: int = 1
    threads_per_core: int = 2
    numbering: Numbering = "qemu"
    die_id_is_package: bool = False
    cores_per_l2: int = 1
    l3_scope: Literal["package", "die", "numa"] = "package"
    caches: CacheSpec = field(default_factory=CacheSpec)
    online: str | None = None
    present: str | None = None
    isolated: str = ""
    efficient_cpus: str | None = None
    mem_per_node_kb: int = 2 * 1024 * 1024
    distance_same_die: int = 11
    distance_same_package: int = 21
    distance_other_package: int = 21
    cpufreq: CpuFreqSpec | None = None
    cstates: tuple[CState, ...] = ()
    cpuidle_driver: str = "intel_idle"
    uncore: UncoreSpec | None = None

    def __post_init__(self) -> None:
        for name in (
            "packages",
            "dies_per_package",
            "nodes_per_die",
            "cores_per_node",
            "threads_per_core",
            "cores_per_l2",
        ):
            if getattr(self, name) < 1:
                raise TopologyError(f"topology {self.name}: {name} must be >= 1")
        if self.die_id_is_package and self.dies_per_package != 1:
            raise TopologyError(f"topology {self.name}: die_id_is_package needs 1 die per package")
        if self.cores_per_node % self.cores_per_l2:
            raise TopologyError(f"topology {self.name}: cores_per_l2 must divide cores_per_node")
        possible = self.possible_mask
        if self.online_mask & ~possible or not self.online_mask:
            raise TopologyError(f"topology {self.name}: online CPUs {self.online!r} not possible")
        if self.online_mask & ~self.present_mask or self.present_mask & ~possible:
            raise TopologyError(
                f"topology {self.name}: present CPUs {self.present!r} must be between "
                "online and possible"
            )

    @property
    def ncpus(self) -> int:
        return self.ncores * self.threads_per_core

    @property
    def ncores(self) -> int:
        return self.packages * self.dies_per_package * self.nodes_per_die * self.cores_per_node

    @property
    def possible_mask(self) -> int:
        return (1 << self.ncpus) - 1

    @property
    def online_mask(self) -> int:
        return self.possible_mask if self.online is None else _parse(self.online)

    @property
    def present_mask(self) -> int:
        return self.online_mask if self.present is None else _parse(self.present)

    def cpus(self) -> Iterator[SimCpu]:
        """Every possible CPU with its place in the machine, ascending CPU id."""
        out: list[SimCpu] = []
        cores_per_pkg = self.dies_per_package * self.nodes_per_die * self.cores_per_node
        cores_per_die = self.nodes_per_die * self.cores_per_node
        for gcore in range(self.ncores):
            pkg, in_pkg = divmod(gcore, cores_per_pkg)
            die = in_pkg // cores_per_die
            node = gcore // self.cores_per_node
            for t in range(self.threads_per_core):
                if self.numbering == "qemu":
                    cpu = gcore * self.threads_per_core + t
                else:
                    cpu = t * self.ncores + gcore
                l3 = {"package": pkg, "die": gcore // cores_per_die, "numa": node}[self.l3_scope]
                out.append(
                    SimCpu(
                        cpu=cpu,
                        package=pkg,
                        die=pkg if self.die_id_is_package else die,
                        die_index=gcore // cores_per_die,
                        node=node,
                        core=gcore,
                        core_id=in_pkg,
                        thread=t,
                        l2=gcore // self.cores_per_l2,
                        l3=l3,
                    )
                )
        out.sort(key=lambda c: c.cpu)
        return iter(out)


class SimCpu(NamedTuple):
    cpu: int
    package: int
    die: int
    """``die_id`` as written."""
    die_index: int
    """Global die index (package * dies_per_package + die)."""
    node: int
    core: int
    """Global core index."""
    core_id: int
    """``core_id``: core index within the package."""
    thread: int
    l2: int
    l3: int


def _parse(text: str) -> int:
    try:
        return cpuset.parse(text)
    except cpuset.CpusetError as exc:
        raise TopologyError(str(exc)) from None


N4C16 = TopologySpec(
    name="n4c16",
    packages=2,
    nodes_per_die=2,
    cores_per_node=2,
    threads_per_core=2,
    numbering="qemu",
    cpufreq=CpuFreqSpec(min_khz=800_000, base_khz=2_900_000, max_khz=3_800_000),
    cstates=(
        CState("C1E", "MWAIT 0x01", 10, 20),
        CState("C2", "MWAIT 0x10", 50, 100),
        CState("C4", "MWAIT 0x30", 100, 400),
        CState("C8", "MWAIT 0x60", 200, 800),
    ),
)

XEON_6776P = TopologySpec(
    name="xeon-6776p",
    packages=2,
    nodes_per_die=2,
    cores_per_node=32,
    threads_per_core=2,
    numbering="smt-last",
    die_id_is_package=True,
    l3_scope="package",
    caches=CacheSpec(l1d="48K", l1i="64K", l2="2048K", l3="172032K"),
    mem_per_node_kb=256 * 1024 * 1024,
    distance_same_die=12,
    distance_same_package=12,
    distance_other_package=21,
    cpufreq=CpuFreqSpec(min_khz=800_000, base_khz=2_300_000, max_khz=4_600_000),
    cstates=GNR_CSTATES,
    uncore=UncoreSpec(),
)

PCT16 = TopologySpec(
    name="pct16",
    packages=2,
    nodes_per_die=2,
    cores_per_node=2,
    threads_per_core=2,
    numbering="smt-last",
    die_id_is_package=True,
    l3_scope="package",
    cpufreq=CpuFreqSpec(min_khz=800_000, base_khz=2_900_000, max_khz=3_800_000),
    cstates=GNR_CSTATES,
    uncore=UncoreSpec(),
)
"""n4c16's size and upstream test19's frequencies (base 2.9, min 0.8, max 3.8
GHz) with the 6776P's numbering (SMT sibling = cpu + 8), so the SST helper's
sim backend (``--sim-config`` with 2 packages of one 4-core punit) models it."""

S8C4K = TopologySpec(
    name="s8c4k",
    packages=8,
    cores_per_node=512,
    threads_per_core=1,
    numbering="qemu",
    online="0-2,511,1535,4095",
)

TOPOLOGIES: Mapping[str, TopologySpec] = {t.name: t for t in (N4C16, XEON_6776P, PCT16, S8C4K)}


# ---------------------------------------------------------------------------
# writing


class _Files:
    """Writes many small files, creating each directory once."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.dirs: set[str] = set()

    def write(self, rel: str, text: str | int) -> None:
        path = os.path.join(self.root, rel)
        parent = os.path.dirname(path)
        if parent not in self.dirs:
            os.makedirs(parent, exist_ok=True)
            self.dirs.add(parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, f"{text}\n".encode())
        finally:
            os.close(fd)

    def symlink(self, rel: str, target: str) -> None:
        path = os.path.join(self.root, rel)
        if not os.path.lexists(path):
            os.symlink(target, path)


def _hexmask(mask: int, nbits: int) -> str:
    """A cpumask as the kernel's ``%*pb`` prints it: 32-bit hex words, high first."""
    digits = f"{mask:0{(nbits + 3) // 4}x}"
    head = len(digits) % 8 or 8
    words = [digits[:head]] + [digits[i : i + 8] for i in range(head, len(digits), 8)]
    return ",".join(words)


def write_topology(root: Path, spec: TopologySpec | str) -> Path:
    """Write the sysfs tree of ``spec`` (a :class:`TopologySpec`, a preset name or
    ``cpus:N``) under ``root`` and return ``root``."""
    if isinstance(spec, str):
        if spec.startswith("cpus:"):
            return write_cpu_tree(root, _ncpus(spec))
        try:
            spec = TOPOLOGIES[spec.lower()]
        except KeyError:
            raise TopologyError(
                f"unknown topology {spec!r}: expected cpus:N or one of {', '.join(TOPOLOGIES)}"
            ) from None
    files = _Files(root)
    value: str | int
    cpus = list(spec.cpus())
    possible = spec.possible_mask
    on = spec.online_mask
    present = spec.present_mask
    nbits = possible.bit_length()

    def hexmask(mask: int) -> str:
        return _hexmask(mask, nbits)

    def group_masks(key: str) -> dict[int, int]:
        masks: dict[int, int] = {}
        for c in cpus:
            if on >> c.cpu & 1:
                k = getattr(c, key)
                masks[k] = masks.get(k, 0) | 1 << c.cpu
        return masks

    core = group_masks("core")
    l2 = group_masks("l2")
    l3 = group_masks("l3")
    pkg = group_masks("package")
    die = group_masks("die_index")
    node = group_masks("node")

    base = "sys/devices/system/cpu"
    for name, mask in (
        ("online", on),
        ("possible", possible),
        ("present", present),
        ("offline", possible & ~on),
        ("isolated", _parse(spec.isolated) & on),
        ("enabled", present),
    ):
        files.write(f"{base}/{name}", cpuset.format(mask))
    files.write(f"{base}/kernel_max", 8191)
    if spec.efficient_cpus is not None:
        atom = _parse(spec.efficient_cpus) & on
        files.write("sys/devices/cpu_core/cpus", cpuset.format(on & ~atom))
        files.write("sys/devices/cpu_atom/cpus", cpuset.format(atom))

    for c in cpus:
        if not present >> c.cpu & 1:
            continue
        d = f"{base}/cpu{c.cpu}"
        is_online = bool(on >> c.cpu & 1)
        files.write(f"{d}/online", int(is_online))
        _write_cpuidle(files, f"{d}/cpuidle", spec)
        if not is_online:
            continue  # the kernel removes topology/ and cache/ of offline CPUs
        for name, value in (
            ("physical_package_id", c.package),
            ("die_id", c.die),
            ("cluster_id", c.l2),
            ("core_id", c.core_id),
        ):
            files.write(f"{d}/topology/{name}", value)
        for name, mask in (
            ("thread_siblings", core[c.core]),
            ("core_cpus", core[c.core]),
            ("cluster_cpus", l2[c.l2]),
            ("die_cpus", die[c.die_index]),
            ("core_siblings", pkg[c.package]),
            ("package_cpus", pkg[c.package]),
        ):
            files.write(f"{d}/topology/{name}", hexmask(mask))
            files.write(f"{d}/topology/{name}_list", cpuset.format(mask))
        for index, (level, kind, size, cache_id, mask) in enumerate(
            (
                (1, "Data", spec.caches.l1d, c.core, core[c.core]),
                (1, "Instruction", spec.caches.l1i, c.core, core[c.core]),
                (2, "Unified", spec.caches.l2, c.l2, l2[c.l2]),
                (3, "Unified", spec.caches.l3, c.l3, l3[c.l3]),
            )
        ):
            cd = f"{d}/cache/index{index}"
            files.write(f"{cd}/level", level)
            files.write(f"{cd}/type", kind)
            files.write(f"{cd}/size", size)
            files.write(f"{cd}/id", cache_id)
            files.write(f"{cd}/shared_cpu_list", cpuset.format(mask))
            files.write(f"{cd}/shared_cpu_map", hexmask(mask))
            files.write(f"{cd}/coherency_line_size", 64)
        files.symlink(f"{d}/node{c.node}", f"../../node/node{c.node}")
        if spec.cpufreq is not None:
            _write_cpufreq(files, f"{d}/cpufreq", spec.cpufreq, c.cpu)

    if spec.cpufreq is not None and spec.cpufreq.driver == "intel_pstate":
        for name, value in (
            ("status", "active"),
            ("no_turbo", 0),
            ("max_perf_pct", 100),
            ("min_perf_pct", spec.cpufreq.min_khz * 100 // spec.cpufreq.max_khz),
            ("hwp_dynamic_boost", 0),
        ):
            files.write(f"{base}/intel_pstate/{name}", value)
    if spec.cstates:
        for name, value in (
            ("current_driver", spec.cpuidle_driver),
            ("current_governor", "menu"),
            ("current_governor_ro", "menu"),
            ("available_governors", "ladder menu teo"),
        ):
            files.write(f"{base}/cpuidle/{name}", value)
    if spec.uncore is not None:
        _write_uncore(files, f"{base}/intel_uncore_frequency", spec)
    _write_nodes(files, spec, node, hexmask)
    return root


def _write_cpuidle(files: _Files, d: str, spec: TopologySpec) -> None:
    if not spec.cstates:
        return
    for i, state in enumerate((POLL, *spec.cstates)):
        sd = f"{d}/state{i}"
        for name, value in (
            ("name", state.name),
            ("desc", state.desc),
            ("latency", state.latency_us),
            ("residency", state.residency_us),
            ("disable", 0),
            ("default_status", "enabled"),
            ("usage", 0),
            ("time", 0),
        ):
            files.write(f"{sd}/{name}", value)


def _write_cpufreq(files: _Files, d: str, f: CpuFreqSpec, cpu: int) -> None:
    for name, value in (
        ("cpuinfo_min_freq", f.min_khz),
        ("cpuinfo_max_freq", f.max_khz),
        ("cpuinfo_transition_latency", 0),
        ("base_frequency", f.base_khz),
        ("scaling_min_freq", f.min_khz),
        ("scaling_max_freq", f.max_khz),
        ("scaling_cur_freq", f.base_khz),
        ("scaling_driver", f.driver),
        ("scaling_governor", f.governor),
        ("scaling_available_governors", " ".join(f.governors)),
        ("energy_performance_preference", f.epp),
        (
            "energy_performance_available_preferences",
            "default performance balance_performance balance_power power",
        ),
        ("related_cpus", cpu),
        ("affected_cpus", cpu),
    ):
        files.write(f"{d}/{name}", value)


def _write_uncore(files: _Files, d: str, spec: TopologySpec) -> None:
    u = spec.uncore
    assert u is not None
    limits = (
        ("initial_min_freq_khz", u.min_khz),
        ("initial_max_freq_khz", u.max_khz),
        ("min_freq_khz", u.min_khz),
        ("max_freq_khz", u.max_khz),
    )
    index = 0
    for pkg in range(spec.packages):
        for domain in range(u.compute_domains + u.io_domains):
            compute = domain < u.compute_domains
            for cluster in range(u.clusters_per_domain):
                ud = f"{d}/uncore{index:02d}"
                index += 1
                for name, value in (
                    *limits,
                    ("current_freq_khz", u.current_khz),
                    ("package_id", pkg),
                    ("domain_id", domain),
                    ("fabric_cluster_id", cluster),
                    ("agent_types", "core cache memory" if compute else "io"),
                    ("elc_floor_freq_khz", u.min_khz),
                    ("elc_low_threshold_percent", 10),
                    ("elc_high_threshold_percent", 95),
                    ("elc_high_threshold_enable", 0),
                ):
                    files.write(f"{ud}/{name}", value)
        # The root domain of a package with one die per package; the TPMI
        # driver leaves its die_id at 0.
        if spec.dies_per_package == 1:
            for name, value in limits:
                files.write(f"{d}/package_{pkg:02d}_die_00/{name}", value)


def _write_nodes(
    files: _Files, spec: TopologySpec, node_cpus: Mapping[int, int], hexmask: Callable[[int], str]
) -> None:
    nnodes = spec.packages * spec.dies_per_package * spec.nodes_per_die
    all_nodes = cpuset.format((1 << nnodes) - 1)
    base = "sys/devices/system/node"
    for name in ("online", "possible", "has_memory", "has_normal_memory"):
        files.write(f"{base}/{name}", all_nodes)
    files.write(f"{base}/has_cpu", cpuset.format(cpuset.from_ids(node_cpus)))
    per_pkg = spec.dies_per_package * spec.nodes_per_die
    for n in range(nnodes):
        row = []
        for m in range(nnodes):
            if m == n:
                row.append(10)
            elif m // spec.nodes_per_die == n // spec.nodes_per_die:
                row.append(spec.distance_same_die)
            elif m // per_pkg == n // per_pkg:
                row.append(spec.distance_same_package)
            else:
                row.append(spec.distance_other_package)
        nd = f"{base}/node{n}"
        cpus = node_cpus.get(n, 0)
        files.write(f"{nd}/cpulist", cpuset.format(cpus))
        files.write(f"{nd}/cpumap", hexmask(cpus))
        files.write(f"{nd}/distance", " ".join(map(str, row)))
        kb = spec.mem_per_node_kb
        files.write(
            f"{nd}/meminfo",
            f"Node {n} MemTotal:       {kb:8d} kB\n"
            f"Node {n} MemFree:        {kb:8d} kB\n"
            f"Node {n} MemUsed:        {0:8d} kB",
        )


def _ncpus(spec: str) -> int:
    try:
        return int(spec.removeprefix("cpus:"))
    except ValueError:
        raise TopologyError(f"invalid topology {spec!r}: expected cpus:N") from None


def prepare_host_root(spec: str, workdir: Path) -> Path:
    """``spec`` is a directory (used as is), ``cpus:N`` or a preset topology name
    (:data:`TOPOLOGIES`); generated trees go to ``workdir/host``."""
    if spec.startswith("cpus:"):
        return write_cpu_tree(workdir / "host", _ncpus(spec))
    if spec.lower() in TOPOLOGIES:
        return write_topology(workdir / "host", TOPOLOGIES[spec.lower()])
    path = Path(spec)
    if path.is_dir():
        return path
    raise TopologyError(
        f"invalid topology {spec!r}: not a directory, cpus:N or one of {', '.join(TOPOLOGIES)}"
    )

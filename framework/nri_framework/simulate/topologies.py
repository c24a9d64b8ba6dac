"""The catalogue of named topologies: every number of a simulated host in a frozen spec.

:class:`TopologySpec` describes a machine (packages, dies, NUMA nodes, cores,
threads, caches, cpufreq, C-states, uncore); :func:`nri_framework.simulate.sysfs.write_topology`
writes its sysfs tree. The presets (:data:`TOPOLOGIES`):


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

``n6-hbm-cxl`` (:data:`N6_HBM_CXL`)
    Upstream's ``n6-hbm-cxl/topology.var.json``: 2 packages x 1 NUMA node x 2
    cores x 2 threads (8 CPUs, 2 GiB DRAM per node), plus memory-only nodes
    2-3 (1 GiB, HBM by upstream's size rule) and 4-5 (4 GiB, PMEM), distances
    from the json's ``node-dist`` (node 0-1: the script's default 21).

``hybrid12`` (:data:`HYBRID12`)
    A hybrid part with one base frequency: 4 P-cores, 8 E-cores in two L2
    clusters, one thread each.

Every number lives in a frozen :class:`TopologySpec`; derive variants with
``dataclasses.replace(XEON_6776P, l3_scope="numa")``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from nri_framework import cpuset
from nri_framework.topology import TopologyError

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
class MemoryNodeSpec:
    """A NUMA node with memory and no CPUs (CXL, HBM, PMEM), numbered after the
    nodes with CPUs in the order given."""

    mem_kb: int
    distances: tuple[tuple[int, int], ...] = ()
    """``(node id, distance)`` pairs, symmetric (upstream's ``node-dist``); nodes
    not named are at ``distance_other_package``."""

    def distance(self, node: int) -> int | None:
        return next((d for n, d in self.distances if n == node), None)


@dataclass(frozen=True)
class TopologySpec:
    """A regular machine: packages x dies x NUMA nodes x cores x threads.

    ``online``/``present``/``isolated``/``efficient_cpus`` are cpuset strings;
    ``online=None`` means every possible CPU, ``present=None`` means ``online``,
    ``efficient_cpus=None`` writes no hybrid core-type files. Every CPU has
    ``cpufreq``'s frequencies (one base frequency); ``epp_by_cpus`` varies the
    EPP per CPU.
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
    epp_by_cpus: tuple[tuple[str, str], ...] = ()
    """``(cpuset, preference)`` pairs: the ``energy_performance_preference`` of
    those CPUs instead of ``cpufreq.epp`` (later pairs win)."""
    cstates: tuple[CState, ...] = ()
    cpuidle_driver: str = "intel_idle"
    uncore: UncoreSpec | None = None
    memory_nodes: tuple[MemoryNodeSpec, ...] = ()
    """Memory-only nodes after the nodes with CPUs (``n6-hbm-cxl``)."""
    numa: bool = True
    """``False``: a kernel built without ``CONFIG_NUMA`` (upstream's test30-numa-disabled):
    no ``sys/devices/system/node`` and no ``cpuN/nodeM`` links."""

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
        return self.possible_mask if self.online is None else parse_cpus(self.online)

    @property
    def present_mask(self) -> int:
        return self.online_mask if self.present is None else parse_cpus(self.present)

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


def parse_cpus(text: str) -> int:
    """A cpuset list of a spec field; a malformed one is a :class:`TopologyError`."""
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

HYBRID12 = TopologySpec(
    name="hybrid12",
    packages=1,
    cores_per_node=12,
    threads_per_core=1,
    cores_per_l2=4,
    efficient_cpus="4-11",
    cpufreq=CpuFreqSpec(min_khz=800_000, base_khz=2_000_000, max_khz=4_000_000),
)
"""A hybrid part with one base frequency: P-cores 0-3 (one L2 group), E-cores
4-11 (two L2 clusters of four), every CPU with base 2.0 GHz and the same EPP,
so cpufreq bins tell the core types nothing (CPU priorities: P-cores normal,
E-cores low)."""

S8C4K = TopologySpec(
    name="s8c4k",
    packages=8,
    cores_per_node=512,
    threads_per_core=1,
    numbering="qemu",
    online="0-2,511,1535,4095",
)

N6_HBM_CXL = TopologySpec(
    name="n6-hbm-cxl",
    packages=2,
    cores_per_node=2,
    threads_per_core=2,
    numbering="qemu",
    memory_nodes=(
        MemoryNodeSpec(1024 * 1024, ((0, 15), (1, 30), (3, 35))),
        MemoryNodeSpec(1024 * 1024, ((0, 30), (1, 15), (2, 35))),
        MemoryNodeSpec(4 * 1024 * 1024, ((0, 60), (1, 70), (2, 62), (3, 72), (5, 75))),
        MemoryNodeSpec(4 * 1024 * 1024, ((0, 70), (1, 60), (2, 72), (3, 62), (4, 75))),
    ),
)
"""Upstream's ``balloons/n6-hbm-cxl/topology.var.json``: 2 packages of one
NUMA node each (2 cores x 2 threads, 2 GiB: DRAM nodes 0, 1), then memory-only
nodes 2, 3 (1 GiB: HBM, closest to node 0 and 1) and 4, 5 (4 GiB: PMEM / CXL,
closest to node 0 and 1), with the ``node-dist`` distances of the json."""

TOPOLOGIES: Mapping[str, TopologySpec] = {
    t.name: t for t in (N4C16, XEON_6776P, PCT16, HYBRID12, S8C4K, N6_HBM_CXL)
}

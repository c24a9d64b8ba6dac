"""A host root for the plugin: an existing tree, or a generated sysfs.

``prepare_host_root(spec, workdir)`` takes a directory (used as is), ``cpus:N``
or the name of a preset topology (:data:`TOPOLOGIES`):

``cpus:N`` (:func:`write_cpu_tree`)
    The minimal tree: ``sys/devices/system/cpu/{online,possible,present}`` =
    ``0-(N-1)`` and per CPU ``cpuK/online`` plus ``cpuK/topology/{physical_package_id,
    die_id,core_id,core_cpus_list,thread_siblings_list}`` (one package, one die,
    one thread per core), and one NUMA node ``sys/devices/system/node/node0``.

a preset name (:func:`write_topology`)
    The tree of a :class:`~nri_framework.simulate.topologies.TopologySpec`. The
    named topologies (``n4c16``, ``xeon-6776p``, ...) and their specs are in
    :mod:`nri_framework.simulate.topologies`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from nri_framework import cpuset
from nri_framework.simulate.topologies import (
    POLL,
    TOPOLOGIES,
    CpuFreqSpec,
    TopologySpec,
    parse_cpus,
)
from nri_framework.topology import TopologyError

__all__ = [
    "TopologyError",
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

    epp: dict[int, str] = {}
    for cpus_text, preference in spec.epp_by_cpus:
        for cpu in cpuset.ids(parse_cpus(cpus_text)):
            epp[cpu] = preference

    base = "sys/devices/system/cpu"
    for name, mask in (
        ("online", on),
        ("possible", possible),
        ("present", present),
        ("offline", possible & ~on),
        ("isolated", parse_cpus(spec.isolated) & on),
        ("enabled", present),
    ):
        files.write(f"{base}/{name}", cpuset.format(mask))
    files.write(f"{base}/kernel_max", 8191)
    if spec.efficient_cpus is not None:
        atom = parse_cpus(spec.efficient_cpus) & on
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
        if spec.numa:
            files.symlink(f"{d}/node{c.node}", f"../../node/node{c.node}")
        if spec.cpufreq is not None:
            _write_cpufreq(files, f"{d}/cpufreq", spec.cpufreq, c.cpu, epp.get(c.cpu))

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
    if spec.numa:
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


def _write_cpufreq(files: _Files, d: str, f: CpuFreqSpec, cpu: int, epp: str | None) -> None:
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
        ("energy_performance_preference", f.epp if epp is None else epp),
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


def _node_distance(spec: TopologySpec, n: int, m: int) -> int:
    """The distance from node ``n`` to node ``m`` (memory-only nodes after the others)."""
    if m == n:
        return 10
    cpu_nodes = spec.packages * spec.dies_per_package * spec.nodes_per_die
    if n < cpu_nodes and m < cpu_nodes:
        per_pkg = spec.dies_per_package * spec.nodes_per_die
        if m // spec.nodes_per_die == n // spec.nodes_per_die:
            return spec.distance_same_die
        if m // per_pkg == n // per_pkg:
            return spec.distance_same_package
        return spec.distance_other_package
    for a, b in ((n, m), (m, n)):
        if a >= cpu_nodes and (d := spec.memory_nodes[a - cpu_nodes].distance(b)) is not None:
            return d
    return spec.distance_other_package


def _write_nodes(
    files: _Files, spec: TopologySpec, node_cpus: Mapping[int, int], hexmask: Callable[[int], str]
) -> None:
    cpu_nodes = spec.packages * spec.dies_per_package * spec.nodes_per_die
    nnodes = cpu_nodes + len(spec.memory_nodes)
    all_nodes = cpuset.format((1 << nnodes) - 1)
    base = "sys/devices/system/node"
    for name in ("online", "possible", "has_memory", "has_normal_memory"):
        files.write(f"{base}/{name}", all_nodes)
    files.write(f"{base}/has_cpu", cpuset.format(cpuset.from_ids(node_cpus)))
    for n in range(nnodes):
        row = [_node_distance(spec, n, m) for m in range(nnodes)]
        nd = f"{base}/node{n}"
        cpus = node_cpus.get(n, 0)
        files.write(f"{nd}/cpulist", cpuset.format(cpus))
        files.write(f"{nd}/cpumap", hexmask(cpus))
        files.write(f"{nd}/distance", " ".join(map(str, row)))
        kb = spec.mem_per_node_kb if n < cpu_nodes else spec.memory_nodes[n - cpu_nodes].mem_kb
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

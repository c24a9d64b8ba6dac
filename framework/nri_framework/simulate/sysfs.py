"""A host root for the plugin: an existing tree, or a minimal generated sysfs.

``cpus:N`` writes ``sys/devices/system/cpu/{online,possible,present}`` =
``0-(N-1)`` and per CPU ``cpuK/online`` plus ``cpuK/topology/{physical_package_id,
die_id,core_id,core_cpus_list,thread_siblings_list}`` (one package, one die,
one thread per core), and one NUMA node ``sys/devices/system/node/node0``.
"""

from __future__ import annotations

from pathlib import Path

from nri_framework import cpuset


class TopologyError(ValueError):
    """A ``--topology`` value that is neither a directory nor ``cpus:N``."""


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


def prepare_host_root(spec: str, workdir: Path) -> Path:
    """``spec`` is a directory (used as is) or ``cpus:N`` (generated under ``workdir``)."""
    if spec.startswith("cpus:"):
        try:
            ncpus = int(spec.removeprefix("cpus:"))
        except ValueError:
            raise TopologyError(f"invalid topology {spec!r}: expected cpus:N") from None
        return write_cpu_tree(workdir / "host", ncpus)
    path = Path(spec)
    if path.is_dir():
        return path
    raise TopologyError(f"invalid topology {spec!r}: not a directory and not cpus:N")

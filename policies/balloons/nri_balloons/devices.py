"""Device hints: what ``preferCloseToDevices`` names resolve to, in CPUs.

Also the virtual devices the CPU tree allocator reads at every resize
(:class:`VirtualDevice`), among them the ``loaded-<level>`` devices of load
classes (:class:`LoadedDevice`).

Built-in virtual devices (``reserved CPUs``, ``isolated CPUs``,
``performance cores``, ``efficient cores``) and sysfs device paths, read
under the host root the way upstream's topology hints do: ``cpulist``,
``local_cpulist``, ``cpulistaffinity``, ``shared_cpu_list`` or ``numa_node``,
walking up the path until one is found.

``podresourceapi:<glob>`` hints (reference §7.3) are per container: the
devices the kubelet assigned to it (its pod-resources API, read from the
plugin's cache) whose resource name matches the glob, as the CPUs of their
NUMA nodes (:func:`pod_resource_hints`). Each becomes a virtual device
``__podres_<ctrID>_<glob>`` in the place of its entry; an unresolvable one is
dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

from nri_framework import cpuset
from nri_framework.topology import Topology

from nri_balloons.config import BalloonType
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.globmatch import GlobError, compile_glob
from nri_balloons.gofmt import list_v, quote

log = logging.getLogger("policy")
_load_log = logging.getLogger("nri_balloons.cpus")  # the logger these lines always had

RESERVED_CPUS = "reserved CPUs"
ISOLATED_CPUS = "isolated CPUs"
PERFORMANCE_CORES = "performance cores"
EFFICIENT_CORES = "efficient cores"
PODRES_PREFIX = "podresourceapi:"
PODRES_HINT_PREFIX = "__podres_"
MAX_LOGGED_IDS = 16
"""Device IDs of one device a debug line shows at most (the kubelet's list may be long)."""

_CPU_FILES = ("cpulist", "local_cpulist", "cpulistaffinity", "shared_cpu_list")


def close_devices(bdef: BalloonType, reserved_type: str, reserved_cpuset: bool) -> list[str]:
    """The devices a type prefers to be close to (upstream ``fillCloseToDevices``)."""
    devices = list(bdef.prefer_close_to_devices)
    if bdef.name == reserved_type and reserved_cpuset and RESERVED_CPUS not in devices:
        devices.insert(0, RESERVED_CPUS)
    if bdef.prefer_isol_cpus:
        devices.append(ISOLATED_CPUS)
    if bdef.prefer_core_type == "performance":
        devices.append(PERFORMANCE_CORES)
    elif bdef.prefer_core_type == "efficient":
        devices.append(EFFICIENT_CORES)
    return devices


def far_devices(close: Mapping[str, Sequence[str]], has_isolated: bool) -> dict[str, list[str]]:
    """Automatic anti-affinity (upstream ``fillFarFromDevices``): every device some
    type prefers is avoided by the types that do not prefer it."""
    avoid: list[str] = [ISOLATED_CPUS] if has_isolated else []
    for devices in close.values():
        for dev in devices:
            if not dev.startswith(PODRES_PREFIX) and dev not in avoid:
                avoid.append(dev)
    return {name: [d for d in avoid if d not in devices] for name, devices in close.items()}


class DeviceResolver:
    """Device name -> CPU mask, cached.

    ``performance cores`` and ``efficient cores`` are the CPU allocator's high
    and low priority CPUs (``priorities``, as upstream's ``GetCPUPriorities``),
    not the kernel's core types: on a hybrid part with one base frequency the
    P-cores are normal priority, so ``performance cores`` is empty there."""

    def __init__(
        self,
        topology: Topology,
        host_root: str,
        reserved: int,
        priorities: Mapping[CpuPriority, int],
    ) -> None:
        self.topology = topology
        self.host_root = Path(host_root)
        self.virtual = {
            RESERVED_CPUS: reserved,
            ISOLATED_CPUS: topology.isolated,
            PERFORMANCE_CORES: priorities.get(CpuPriority.HIGH, 0),
            EFFICIENT_CORES: priorities.get(CpuPriority.LOW, 0),
        }
        self._cache: dict[str, int | None] = {}

    def cpus(self, device: str) -> int | None:
        """The CPUs of ``device``; ``None`` when it cannot be resolved (logged once)."""
        if device in self.virtual:
            return self.virtual[device]
        if device not in self._cache:
            self._cache[device] = self._sysfs(device)
        return self._cache[device]

    def _sysfs(self, device: str) -> int | None:
        if device.startswith(PODRES_PREFIX):
            return None
        path = self.host_root / device.lstrip("/")
        try:
            path = path.resolve(strict=True)
        except OSError as exc:
            log.error("failed to find topology of device %r: %s", device, exc)
            return None
        root = self.host_root.resolve()
        while path != root and path != path.parent:
            for name in _CPU_FILES:
                f = path / name
                if f.is_file():
                    return cpuset.parse(f.read_text()) & self.topology.online
            node_file = path / "numa_node"
            if node_file.is_file():
                node = int(node_file.read_text().strip() or -1)
                if node >= 0 and node in self.topology.nodes:
                    return self.topology.nodes[node].cpus
            path = path.parent
        log.error("failed to find topology of device %r: no CPU information", device)
        return None


class VirtualDevice:
    """A named device whose topology hint is a list of alternative CPU sets.

    The CPU tree allocator reads ``cpusets`` at every resize, so updating a device
    in place (load classes, cpuClass hints) steers the next allocation."""

    __slots__ = ("cpusets", "name")

    def __init__(self, name: str, cpusets: Iterable[int] = ()) -> None:
        self.name = name
        self.cpusets: list[int] = list(cpusets)

    def __repr__(self) -> str:
        sets = ", ".join(repr(cpuset.format(m)) for m in self.cpusets)
        return f"{type(self).__name__}({self.name!r}, [{sets}])"


LoadLevel = Literal["core", "l2cache"]


def loaded_cpus(topology: Topology, level: LoadLevel, cpus: int) -> int:
    """The CPUs a load on ``cpus`` affects: all threads of their cores (``core``) or
    all CPUs sharing their L2 caches (``l2cache``)."""
    if level == "core":
        return topology.siblings(cpus)
    if level == "l2cache":
        return topology.expand(cpus, "l2cache")
    raise ValueError(f"internal error: not implemented load level {level!r}")


class LoadedDevice(VirtualDevice):
    """The virtual device ``loaded-<level>`` of a load class (``fillLoadVirtDevices``).

    ``update_on_every_cpu`` is the class's ``overloadsLevelInBalloon``: the policy
    then passes :meth:`add` as the tree allocator's ``on_cpu_pick`` hook."""

    __slots__ = ("level", "topology", "update_on_every_cpu")

    def __init__(self, topology: Topology, level: LoadLevel, update_on_every_cpu: bool = False):
        if level not in ("core", "l2cache"):
            raise ValueError(
                f"internal error: not implemented load level {level!r} "
                f"used in virtual device {'loaded-' + str(level)!r}"
            )
        super().__init__(f"loaded-{level}")
        self.topology = topology
        self.level: LoadLevel = level
        self.update_on_every_cpu = update_on_every_cpu

    def load(self, cpus: int) -> None:
        """Set the loaded CPUs (the union of the CPUs of every balloon that carries
        this device) and compute the affected CPUs (``updateLoadedVirtDev`` with
        overwrite)."""
        self.cpusets = [loaded_cpus(self.topology, self.level, cpus)]
        self._log(cpus)

    def add(self, cpus: int) -> None:
        """Add loaded CPUs to the affected set (``updateLoadedVirtDev`` without
        overwrite): the hook called after each CPU a balloon picks."""
        prev = self.cpusets[0] if self.cpusets else 0
        self.cpusets = [prev | loaded_cpus(self.topology, self.level, cpus)]
        self._log(cpus)

    def _log(self, cpus: int) -> None:
        if _load_log.isEnabledFor(logging.DEBUG):
            _load_log.debug(
                "    loaded virtual device %r on CPUs %r affects CPUs %r",
                self.name,
                cpuset.format(cpus),
                cpuset.format(self.cpusets[0]),
            )


# -- pod-resource device hints (§7.3) ---------------------------------------------


class AssignedDevice(Protocol):
    """Device instances of one resource the kubelet assigned to a container
    (:class:`nri_framework.agent.podresources.DeviceAssignment`)."""

    @property
    def resource(self) -> str: ...
    @property
    def ids(self) -> Sequence[str]: ...
    @property
    def numa(self) -> Sequence[int]: ...


def pod_resource_entries(devices: Iterable[str]) -> list[str]:
    """The ``podresourceapi:`` entries of a close-to list, in order."""
    return [d for d in devices if d.startswith(PODRES_PREFIX)]


def container_device_cpus(
    topology: Topology,
    allowed: int,
    pattern: str,
    devices: Sequence[AssignedDevice] | None,
    pretty: str,
) -> int | None:
    """The allowed CPUs of the NUMA nodes of the container's devices whose
    resource name matches ``pattern`` (upstream ``containerDeviceCpus``);
    ``None`` when there are none."""
    if not devices:
        return None
    try:
        glob = compile_glob(pattern)
    except GlobError as exc:
        log.error("invalid resource glob pattern %s: %s", quote(pattern), exc)
        return None
    numas: set[int] = set()
    for dev in devices:
        if glob.fullmatch(dev.resource) is None:
            continue
        nodes = sorted(set(dev.numa))
        numas.update(nodes)
        log.debug(
            "pod-resource device %s of container %s matches pattern %s, NUMA nodes %s, "
            "device IDs %s",
            quote(dev.resource),
            pretty,
            quote(pattern),
            ",".join(map(str, nodes)),
            list_v(_few(dev.ids)),
        )
    cpus = 0
    for node in sorted(numas):
        if node not in topology.nodes:
            log.error(
                "unknown NUMA node %d in the topology of device %s of container %s",
                node,
                quote(pattern),
                pretty,
            )
            continue
        cpus |= topology.nodes[node].cpus
    if not cpus:
        return None
    return cpus & allowed


def pod_resource_hints(
    entries: Sequence[str],
    topology: Topology,
    allowed: int,
    devices: Sequence[AssignedDevice] | None,
    container_id: str,
    pretty: str,
) -> dict[str, VirtualDevice]:
    """The ``podresourceapi:`` ``entries`` of a type resolved for one container
    (upstream ``resolvePodResourceDevs``): entry -> its virtual device
    ``__podres_<ctrID>_<glob>``. ``devices``: what the kubelet assigned to the
    container (``None``: not known yet, or the API is off). Unresolvable
    entries are left out, with upstream's debug line."""
    out: dict[str, VirtualDevice] = {}
    for entry in entries:
        pattern = entry[len(PODRES_PREFIX) :]
        cpus = container_device_cpus(topology, allowed, pattern, devices, pretty)
        if cpus is None:
            log.debug(
                "dropping pod-resource device %s hint: no device locality for container %s",
                quote(entry),
                pretty,
            )
            continue
        name = f"{PODRES_HINT_PREFIX}{container_id}_{pattern}"
        out[entry] = VirtualDevice(name, [cpus])
        log.debug(
            "pod-resource hint: device %s of container %s prefers CPUs %s",
            quote(pattern),
            pretty,
            cpuset.format(cpus),
        )
    return out


def _few(ids: Sequence[str]) -> list[str]:
    if len(ids) <= MAX_LOGGED_IDS:
        return list(ids)
    return [*ids[:MAX_LOGGED_IDS], f"...({len(ids) - MAX_LOGGED_IDS} more)"]

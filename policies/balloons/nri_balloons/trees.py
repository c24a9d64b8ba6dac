"""The CPU tree allocators of a configuration: one per balloon type, built from
the type's options, its device hints and its load classes (upstream
``newBalloonDef``'s ``cpuTreeAllocator`` options, ``fillCloseToDevices``,
``fillFarFromDevices`` and ``fillLoadVirtDevices``, reference §7.3, §8)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

import msgspec
from nri_framework import cpuset
from nri_framework.topology import Topology

from nri_balloons.balloon import Balloon
from nri_balloons.config import BalloonType
from nri_balloons.cpuallocator import CpuAllocator
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.cputree import CpuTreeAllocator, Hint, ResizeHints
from nri_balloons.devices import (
    PODRES_PREFIX,
    DeviceResolver,
    LoadedDevice,
    LoadLevel,
    VirtualDevice,
    close_devices,
    far_devices,
)
from nri_balloons.gofmt import quote
from nri_balloons.validation import PreparedConfig

if TYPE_CHECKING:
    from nri_balloons.pct import Hints
    from nri_balloons.placement import TypeOptions

log = logging.getLogger("policy")

__all__ = ["TypeTrees", "build_trees", "class_hints"]


class TypeTrees(msgspec.Struct):
    """Balloon type name -> its CPU tree allocator, the load devices
    (``loaded-<level>``) each type carries, and the place of each of its
    ``podresourceapi:`` entries in its close-to list (a virtual device set per
    balloon at each resize: a balloon's pod-resource hints are its own)."""

    trees: dict[str, CpuTreeAllocator] = msgspec.field(default_factory=dict)
    load_devices: dict[str, LoadedDevice] = msgspec.field(default_factory=dict)
    type_loads: dict[str, list[LoadedDevice]] = msgspec.field(default_factory=dict)
    podres_slots: dict[str, dict[str, VirtualDevice]] = msgspec.field(default_factory=dict)

    def for_resize(
        self,
        bdef: BalloonType,
        balloons: Sequence[Balloon],
        pod_resources: Mapping[str, VirtualDevice] | None = None,
    ) -> CpuTreeAllocator:
        """The tree of ``bdef``, its load devices refreshed: the loaded CPUs of each
        are those of every balloon whose type carries the same device; its
        ``podresourceapi:`` entries are the resizing balloon's ``pod_resources``
        (entry -> resolved device; an entry without one is no hint)."""
        for entry, slot in self.podres_slots.get(bdef.name, {}).items():
            dev = (pod_resources or {}).get(entry)
            slot.name = dev.name if dev is not None else entry
            slot.cpusets = list(dev.cpusets) if dev is not None else []
        for dev in self.type_loads.get(bdef.name, ()):
            loaded = 0
            for b in balloons:
                if dev in self.type_loads.get(b.bdef.name, ()):
                    loaded |= b.cpus
            dev.load(loaded)
        return self.trees[bdef.name]


def build_trees(
    topology: Topology,
    host_root: str,
    prepared: PreparedConfig,
    reserved: int,
    options: Mapping[str, TypeOptions],
    priorities: Mapping[CpuPriority, int] | None = None,
) -> TypeTrees:
    """The tree allocators of ``prepared``'s types, sharing one CPU allocator
    (with ``priorities``, None: from cpufreq)."""
    allocator = CpuAllocator(topology, priorities)  # one for the whole policy
    resolver = DeviceResolver(topology, host_root, reserved, allocator.priorities)
    reserved_cpuset = bool(prepared.reserved)
    close = {
        t.name: close_devices(t, prepared.reserved_type.name, reserved_cpuset)
        for t in prepared.balloon_types
    }
    far = far_devices(close, bool(topology.isolated))
    # load classes (§7.3 fillLoadVirtDevices): one virtual device per level,
    # avoided by every balloon of a type that carries it
    classes = {lc.name: lc for lc in prepared.spec.load_classes}
    out = TypeTrees()
    for t in prepared.balloon_types:
        devices: list[LoadedDevice] = []
        for name in t.loads:
            lc = classes[name]
            level = cast(LoadLevel, lc.level)
            dev = out.load_devices.get(level)
            if dev is None:
                dev = out.load_devices[level] = LoadedDevice(topology, level)
            dev.update_on_every_cpu = dev.update_on_every_cpu or lc.overloads_level_in_balloon
            if dev not in devices:
                devices.append(dev)
        out.type_loads[t.name] = devices
    for t in prepared.balloon_types:
        opts = options[t.name]
        loads = out.type_loads[t.name]
        dynamic = [d for d in loads if d.update_on_every_cpu]
        out.trees[t.name] = CpuTreeAllocator(
            topology,
            topology_balancing=opts.topology_balancing,
            prefer_spread_on_physical_cores=opts.spread_on_physical_cores,
            prefer_close_to=_close_hints(resolver, close[t.name], out.podres_slots, t.name),
            prefer_far_from=[*_masks(resolver, far[t.name]), *loads],
            on_cpu_pick=_adder(dynamic) if dynamic else None,
            allocator_priority=CpuPriority.parse(t.allocator_priority),
            cpu_allocator=allocator,
        )
    return out


def class_hints(hints: Hints) -> ResizeHints:
    """A cpuClass's hints for one inflate as the tree's hints of that resize
    (virtual devices named after the class they come from)."""
    prefer: list[Hint] = []
    avoid: list[Hint] = []
    debug = log.isEnabledFor(logging.DEBUG)  # the CPU sets formatted for debug only
    for i, (name, sets) in enumerate(hints.prefer):
        if debug:
            log.debug("cpuclass hint: prefer %s -> %s", quote(name), _sets(sets))
        prefer.append(VirtualDevice(f"__cls_pref_{i}_{name}", sets))
    for i, (name, cpus) in enumerate(hints.avoid):
        if debug:
            log.debug("cpuclass hint: avoid %s -> %s", quote(name), cpuset.format(cpus))
        avoid.append(VirtualDevice(f"__cls_avoid_{i}_{name}", [cpus]))
    return ResizeHints(tuple(prefer), tuple(avoid))


def _sets(sets: Sequence[int]) -> str:
    """CPU sets the way Go prints a slice of them: ``[0-1 4-5]``."""
    return "[" + " ".join(cpuset.format(c) for c in sets) + "]"


def _adder(devices: list[LoadedDevice]) -> Callable[[int], None]:
    """The tree allocator's per-CPU hook for ``overloadsLevelInBalloon`` loads."""

    def add(cpus: int) -> None:
        for dev in devices:
            dev.add(cpus)

    return add


def _close_hints(
    resolver: DeviceResolver,
    devices: list[str],
    slots: dict[str, dict[str, VirtualDevice]],
    type_name: str,
) -> list[Hint]:
    """The close-to hints of a type: masks, and an empty virtual device in the
    place of each ``podresourceapi:`` entry (see :meth:`TypeTrees.for_resize`)."""
    out: list[Hint] = []
    for dev in devices:
        if dev.startswith(PODRES_PREFIX):
            slot = slots.setdefault(type_name, {}).setdefault(dev, VirtualDevice(dev))
            out.append(slot)
            continue
        mask = resolver.cpus(dev)
        if mask is not None:
            out.append(mask)
    return out


def _masks(resolver: DeviceResolver, devices: list[str]) -> list[int]:
    out = []
    for dev in devices:
        mask = resolver.cpus(dev)
        if mask is None:
            continue
        out.append(mask)
    return out

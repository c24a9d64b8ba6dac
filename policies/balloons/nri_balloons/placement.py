"""The running allocation state of the balloons policy, as one value.

A :class:`Placement` is built for one configuration (:meth:`Placement.for_config`):
the configuration, the CPUs it may use, its balloon types with their resolved
options and CPU tree allocators, and then the balloons, the free CPUs and which
balloon holds which container. :class:`~nri_balloons.policy.BalloonsPolicy` runs
on one placement; a reconfiguration builds a new one and keeps the old one to go
back to if the new configuration cannot be set up.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from nri_framework.topology import Topology

from nri_balloons.balloon import Balloon
from nri_balloons.config import BalloonsPolicySpec, BalloonType
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.devices import VirtualDevice
from nri_balloons.trees import TypeTrees, build_trees
from nri_balloons.validation import PreparedConfig

__all__ = ["Placement", "TypeOptions", "changes_placement"]


class TypeOptions(msgspec.Struct, frozen=True):
    """A balloon type with the policy-wide values it inherits resolved."""

    topology_balancing: bool
    spread_on_physical_cores: bool
    pin_memory: bool
    show_in_nrt: bool
    hide_hyperthreads: bool

    @classmethod
    def of(cls, t: BalloonType, spec: BalloonsPolicySpec) -> TypeOptions:
        return cls(
            topology_balancing=_pick(
                t.allocator_topology_balancing, spec.allocator_topology_balancing
            ),
            spread_on_physical_cores=_pick(
                t.prefer_spread_on_physical_cores, spec.prefer_spread_on_physical_cores
            ),
            pin_memory=_pick(t.pin_memory, spec.pin_memory),
            show_in_nrt=_pick(t.show_containers_in_nrt, bool(spec.show_containers_in_nrt)),
            hide_hyperthreads=bool(t.hide_hyperthreads),
        )


class Placement(msgspec.Struct):
    """Balloons, free CPUs and trees of one configuration (empty: none yet)."""

    config: PreparedConfig | None = None
    allowed: int = 0
    reserved: int = 0
    types: dict[str, BalloonType] = msgspec.field(default_factory=dict)
    options: dict[str, TypeOptions] = msgspec.field(default_factory=dict)
    trees: TypeTrees = msgspec.field(default_factory=TypeTrees)
    balloons: list[Balloon] = msgspec.field(default_factory=list)
    free: int = 0
    initial_free: int = 0
    """The free CPUs once the pre-created balloons exist (NRT allocatable)."""
    owner: dict[str, Balloon] = msgspec.field(default_factory=dict)
    device_hints: dict[str, tuple[str, dict[str, VirtualDevice]]] = msgspec.field(
        default_factory=dict
    )
    """Balloon name -> (the container it was created for, that container's
    resolved ``podresourceapi:`` entries): removed when the container leaves."""

    @classmethod
    def for_config(
        cls,
        topology: Topology,
        host_root: str,
        prepared: PreparedConfig,
        priorities: Mapping[CpuPriority, int] | None = None,
    ) -> Placement:
        """A placement of ``prepared`` with no balloons yet: every allowed CPU free.
        ``priorities``: the CPU allocator's (None: from cpufreq)."""
        allowed = (prepared.allowed if prepared.allowed is not None else topology.online) & (
            topology.online
        )
        reserved = (prepared.reserved or 0) & allowed
        options = {t.name: TypeOptions.of(t, prepared.spec) for t in prepared.balloon_types}
        return cls(
            config=prepared,
            allowed=allowed,
            reserved=reserved,
            types={t.name: t for t in prepared.balloon_types},
            options=options,
            trees=build_trees(topology, host_root, prepared, reserved, options, priorities),
            free=allowed,
        )


def changes_placement(old: BalloonsPolicySpec, new: BalloonsPolicySpec) -> bool:
    """Whether going from ``old`` to ``new`` changes more than CPU and scheduling
    classes, policy-wide or per type (upstream ``changesBalloons``). The legacy
    ``control.cpu.classes`` are cpuClasses too."""
    return _placement_view(old) != _placement_view(new)


def _placement_view(spec: BalloonsPolicySpec) -> BalloonsPolicySpec:
    replace = msgspec.structs.replace
    return replace(
        spec,
        idle_cpu_class="",
        turbo_domain="",
        cpu_classes=[],
        scheduling_classes=[],
        control=replace(spec.control, cpu=None),
        balloon_types=[replace(bt, cpu_class="", scheduling_class="") for bt in spec.balloon_types],
    )


def _pick(value: bool | None, default: bool) -> bool:
    return default if value is None else value

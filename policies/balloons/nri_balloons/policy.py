"""The balloons policy proper: balloon types, instances, sizing, pinning.

No NRI and no pluggy here: :mod:`nri_balloons.plugin` adapts the hooks. The
behaviour follows upstream's ``balloons-policy.go`` (reference §3, §5-§9,
§14); section numbers in comments point at ``nri-plugins-balloons.md``.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from nri_framework import cpuset
from nri_framework.kube import quota_to_milli_cpu, shares_to_milli_cpu
from nri_framework.model import Container, Pod
from nri_framework.topology import Topology

from nri_balloons import annotations as ann
from nri_balloons.balloon import Balloon, Member
from nri_balloons.config import DEFAULT, BalloonsPolicySpec, BalloonType
from nri_balloons.cpuallocator import CpuAllocator
from nri_balloons.cpuclass import CpuClassError, CpuClassHandler, Writer
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.cputree import CpuTreeAllocator, Hint, ResizeError
from nri_balloons.devices import (
    DeviceResolver,
    LoadedDevice,
    LoadLevel,
    VirtualDevice,
    close_devices,
    far_devices,
)
from nri_balloons.expression import Subject, resolve_ref
from nri_balloons.fillmethod import FillMethod, fill_chain
from nri_balloons.globmatch import go_match as glob_match
from nri_balloons.gofmt import quote
from nri_balloons.sizing import share_idle
from nri_balloons.state import BalloonsState, decode, rebuild, snapshot
from nri_balloons.validation import PreparedConfig

log = logging.getLogger("policy")

PRIORITY_ORDER = ("high", "normal", "low", "none")


class BalloonsError(Exception):
    """A placement failure; the text goes back to the runtime."""

    def __init__(self, text: str) -> None:
        super().__init__(f"balloons: {text}")


class NotApplicable(Exception):
    """A fill method has no candidate."""


def request_milli(container: Container) -> int:
    """The CPU request in mCPU, from the CFS shares the kubelet derived from it."""
    cpu = container.resources.cpu if container.resources else None
    return shares_to_milli_cpu(cpu.shares or 0) if cpu else 0


def limit_milli(container: Container) -> int:
    cpu = container.resources.cpu if container.resources else None
    return quota_to_milli_cpu(cpu.quota or 0, cpu.period or 0) if cpu else 0


def _sets(sets: Sequence[int]) -> str:
    """CPU sets the way Go prints a slice of them: ``[0-1 4-5]``."""
    return "[" + " ".join(cpuset.format(c) for c in sets) + "]"


_REF = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z0-9_./-]+)")


def expand_group(text: str, subject: Subject, must_resolve: bool) -> str:
    """``groupBy`` with ``${key}``/``$key`` references replaced by their values."""

    def sub(m: re.Match[str]) -> str:
        key = m.group(1) if m.group(1) is not None else m.group(2)
        value, found = resolve_ref(subject, key)
        if not found and must_resolve:
            raise KeyError(f"cannot resolve {key!r}")
        return value

    return _REF.sub(sub, text)


@dataclass(frozen=True)
class TypeOptions:
    """A balloon type with the policy-wide values it inherits resolved."""

    topology_balancing: bool
    spread_on_physical_cores: bool
    pin_memory: bool
    show_in_nrt: bool
    hide_hyperthreads: bool


class BalloonsPolicy:
    """The state of the balloons on one node."""

    def __init__(
        self, topology: Topology, host_root: str = "/", writer: Writer | None = None
    ) -> None:
        self.topology = topology
        self.host_root = host_root
        self.cpu_classes = CpuClassHandler(topology, writer)
        self.config: PreparedConfig | None = None
        self.balloons: list[Balloon] = []
        self.free = 0
        self.initial_free = 0
        self.allowed = 0
        self.reserved = 0
        self.owner: dict[str, Balloon] = {}
        self.options: dict[str, TypeOptions] = {}
        self.trees: dict[str, CpuTreeAllocator] = {}
        self.load_devices: dict[str, LoadedDevice] = {}
        self.type_loads: dict[str, list[LoadedDevice]] = {}
        self.types: dict[str, BalloonType] = {}

    # -- configuration (§3 setConfig) ------------------------------------------------

    def set_config(self, prepared: PreparedConfig) -> None:
        """Start over with ``prepared``: no balloons but the pre-created ones."""
        spec = prepared.spec
        topo = self.topology
        self.config = prepared
        self.allowed = (
            prepared.allowed if prepared.allowed is not None else topo.online
        ) & topo.online
        self.reserved = (prepared.reserved or 0) & self.allowed
        self._configure_classes(spec, strict=True)
        self.types = {t.name: t for t in prepared.balloon_types}
        self.options = {
            t.name: TypeOptions(
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
            for t in prepared.balloon_types
        }
        self._build_trees(prepared)
        self.balloons = []
        self.owner = {}
        self.free = self.allowed
        for prio in PRIORITY_ORDER:
            for bdef in prepared.balloon_types:
                if _priority(bdef) != prio:
                    continue
                for i in range(bdef.min_balloons):
                    try:
                        self.balloons.append(self._new_balloon(bdef))
                    except BalloonsError as exc:
                        raise BalloonsError(
                            f"failed to create balloon '{bdef.name}[{i}]' as required by "
                            f"MinBalloons={bdef.min_balloons}: {exc}"
                        ) from None
        self.initial_free = self.free
        self._share_idle()
        log.info("balloons policy balloons:")
        for i, bln in enumerate(self.balloons):
            log.info("- balloon %d: %s", i, bln)
        self.apply_cpu_classes()

    def reconfigure(
        self, prepared: PreparedConfig, running: Sequence[tuple[Pod, Container]]
    ) -> str:
        """Apply a new configuration to the running policy (upstream
        ``Reconfigure``, reference §3). ``running``: every container the runtime
        runs, in creation order. Returns what happened:

        * ``"none"``: nothing changed;
        * ``"classes"``: only cpuClasses or scheduling classes changed; the
          types are swapped in place and no container moves. Unlike upstream,
          a scheduling-class-only change is applied (§20.7: it drops them);
        * ``"placement"``: every balloon is rebuilt and every container
          allocated again, in order; a container that no longer fits logs
          ``allocating resources for Sync produced an error``.

        Raises :class:`BalloonsError` (``config update failed: ...``) with the
        running state left as it was when the new configuration cannot be set up.
        """
        log.info("configuration update")
        old = self.config
        if old is not None and _placement_view(old.spec) == _placement_view(prepared.spec):
            if old.spec == prepared.spec:
                log.info("no configuration changes")
                return "none"
            log.info("configuration changes only on CPU classes")
            self._swap_types(prepared)
            return "classes"
        saved = dict(self.__dict__)
        try:
            self.set_config(prepared)
        except BalloonsError as exc:
            self.__dict__.update(saved)
            if old is not None:  # the handler is shared: back to the running classes
                self._configure_classes(old.spec, strict=False)
                self.apply_cpu_classes()
            raise BalloonsError(f"config update failed: {exc}") from None
        log.info("config updated successfully")
        for pod, container in running:
            try:
                self.allocate(pod, container)
            except BalloonsError as exc:
                log.warning("allocating resources for Sync produced an error: %s", exc)
        return "placement"

    def _swap_types(self, prepared: PreparedConfig) -> None:
        """The new types (differing in classes only) replace the old ones in
        every balloon; CPUs and containers stay."""
        self.config = prepared
        self.types = {t.name: t for t in prepared.balloon_types}
        for top in self.balloons:
            for bln in top.walk():
                bln.bdef = self.types[bln.bdef.name]
        self._configure_classes(prepared.spec, strict=False)
        self.apply_cpu_classes()

    # -- cpuClasses (§12.1 balloons mapping) -------------------------------------------

    def _configure_classes(self, spec: BalloonsPolicySpec, strict: bool) -> None:
        idle = spec.idle_cpu_class
        if not idle and any(cc.name == DEFAULT for cc in spec.cpu_classes):
            idle = DEFAULT
        try:
            self.cpu_classes.configure(spec.cpu_classes, spec.turbo_domain, self.allowed, idle)
        except CpuClassError as exc:
            if strict:
                raise BalloonsError(f"failed to configure CPU class handler: {exc}") from None
            log.warning("failed to reconfigure CPU class handler: %s", exc)

    def balloon_class(self, bdef: BalloonType) -> str:
        """The type's ``cpuClass``, else ``default`` if defined, else none."""
        if bdef.cpu_class:
            return bdef.cpu_class
        return DEFAULT if self.cpu_classes.known(DEFAULT) else ""

    def _use_class(self, bln: Balloon) -> None:
        for b in bln.walk():
            if b.components or not b.cpus:
                continue
            name = self.balloon_class(b.bdef)
            log.debug(
                "apply CPU class %s on CPUs %s of %s",
                quote(name),
                quote(cpuset.format(b.cpus)),
                quote(b.name),
            )
            self.cpu_classes.use(b.cpus, name)

    def _forget_class(self, cpus: int) -> None:
        if not cpus:
            return
        log.debug(
            "forget class of cpus %s (idle class %s)",
            quote(cpuset.format(cpus)),
            quote(self.cpu_classes.idle_class),
        )
        self.cpu_classes.forget(cpus)

    def apply_cpu_classes(self) -> None:
        """The idle class on every allowed CPU, then each balloon's class
        (upstream ``resetCpuClass`` + ``useCpuClass`` of every balloon):
        ``idleCPUClass``, else ``default`` if defined, else none."""
        log.debug(
            "reset class of available cpus: %s to idle class %s (reserved: %s)",
            quote(cpuset.format(self.allowed)),
            quote(self.cpu_classes.idle_class),
            quote(cpuset.format(self.reserved)),
        )
        self.cpu_classes.reset()
        for bln in self.balloons:
            self._use_class(bln)

    def _build_trees(self, prepared: PreparedConfig) -> None:
        resolver = DeviceResolver(self.topology, self.host_root, self.reserved)
        reserved_cpuset = bool(prepared.reserved)
        close = {
            t.name: close_devices(t, prepared.reserved_type.name, reserved_cpuset)
            for t in prepared.balloon_types
        }
        far = far_devices(close, bool(self.topology.isolated))
        # load classes (§7.3 fillLoadVirtDevices): one virtual device per level,
        # avoided by every balloon of a type that carries it
        classes = {lc.name: lc for lc in prepared.spec.load_classes}
        self.load_devices = {}
        self.type_loads = {}
        for t in prepared.balloon_types:
            devices: list[LoadedDevice] = []
            for name in t.loads:
                lc = classes[name]
                level = cast(LoadLevel, lc.level)
                dev = self.load_devices.get(level)
                if dev is None:
                    dev = self.load_devices[level] = LoadedDevice(self.topology, level)
                dev.update_on_every_cpu = dev.update_on_every_cpu or lc.overloads_level_in_balloon
                if dev not in devices:
                    devices.append(dev)
            self.type_loads[t.name] = devices
        allocator = CpuAllocator(self.topology)  # one for the whole policy
        self.trees = {}
        for t in prepared.balloon_types:
            opts = self.options[t.name]
            loads = self.type_loads[t.name]
            dynamic = [d for d in loads if d.update_on_every_cpu]
            self.trees[t.name] = CpuTreeAllocator(
                self.topology,
                topology_balancing=opts.topology_balancing,
                prefer_spread_on_physical_cores=opts.spread_on_physical_cores,
                prefer_close_to=_masks(resolver, close[t.name]),
                prefer_far_from=[*_masks(resolver, far[t.name]), *loads],
                on_cpu_pick=_adder(dynamic) if dynamic else None,
                allocator_priority=CpuPriority.parse(t.allocator_priority),
                cpu_allocator=allocator,
            )

    def _load_devices_for(self, bdef: BalloonType) -> None:
        """Refresh the loaded CPUs of ``bdef``'s load devices before a resize: the
        CPUs of every balloon whose type carries the same device."""
        for dev in self.type_loads.get(bdef.name, ()):
            loaded = 0
            for b in self.balloons:
                if dev in self.type_loads.get(b.bdef.name, ()):
                    loaded |= b.cpus
            dev.load(loaded)

    # -- choosing the type (§5) ------------------------------------------------------

    def preserved(self, pod: Pod, container: Container) -> bool:
        """Containers the policy leaves alone (annotation or ``preserve``)."""
        if ann.parse_bool(ann.effective(ann.CPU_PRESERVE, pod, container)):
            log.info(
                "not handling resources of container %s, preserving CPUs %r and memory %r",
                _pretty(pod, container),
                container.cpus,
                container.resources.cpu.mems
                if container.resources and container.resources.cpu
                else "",
            )
            return True
        assert self.config is not None
        preserve = self.config.spec.preserve
        if preserve is not None:
            subject = Subject(container, pod)
            for expr in preserve.match_expressions:
                if expr.evaluate_subject(subject):
                    log.debug(
                        "preserve container %s due to matching %s", _pretty(pod, container), expr
                    )
                    return True
        return False

    def choose_type(self, pod: Pod, container: Container) -> BalloonType:
        assert self.config is not None
        name = ann.effective(ann.BALLOON, pod, container)
        if name is not None:
            if name not in self.types:
                raise BalloonsError(f"no balloon for annotation {quote(name)}")
            log.debug("- annotation %r found, using balloon type %r", ann.BALLOON, name)
            return self.types[name]
        subject = Subject(container, pod)
        for bdef in self.config.balloon_types:
            for expr in bdef.match_expressions:
                if expr.evaluate_subject(subject):
                    return bdef
            if any(glob_match(ns, pod.namespace) for ns in bdef.namespaces):
                log.debug(
                    "- namespace %r matches namespaces of balloon type %r", pod.namespace, bdef.name
                )
                return bdef
        log.debug("- no match found, using default balloon type %r", self.config.default_type.name)
        return self.config.default_type

    # -- choosing the instance (§6) --------------------------------------------------

    def instances(self, bdef: BalloonType) -> list[Balloon]:
        return [b for b in self.balloons if b.bdef.name == bdef.name]

    def choose_instance(self, bdef: BalloonType, member: Member) -> Balloon:
        for method in fill_chain(bdef):
            try:
                candidates = self._fills[method](bdef, member)
            except NotApplicable:
                log.debug("fill method %r not applicable", str(method))
                continue
            if candidates:
                log.debug(
                    "fill method %r suggests any of balloon instances %s",
                    str(method),
                    [b.name for b in candidates],
                )
                return self._best(method, candidates)
            log.debug("fill method %r not applicable", str(method))
        raise BalloonsError(
            f"balloon allocation for container {member.pretty} failed: "
            "no suitable balloon instance available"
        )

    def _best(self, method: FillMethod, candidates: list[Balloon]) -> Balloon:
        def key(b: Balloon) -> tuple[int, int]:
            if method is FillMethod.BALANCED_INFLATE:
                free = b.max_free_milli(self.available(b.bdef))
            else:
                free = b.free_milli
            return (-free, len(b.members))

        return min(candidates, key=key)  # min keeps list order among equals

    @functools.cached_property
    def _fills(self) -> dict[FillMethod, Callable[[BalloonType, Member], list[Balloon]]]:
        """Fill method -> its candidates for a container (raises :class:`NotApplicable`)."""
        return {
            FillMethod.SAME_GROUP: self._fill_same_group,
            FillMethod.SAME_POD: lambda bdef, m: self._fill_where(
                bdef, m, lambda b: m.pod_id in b.pod_ids()
            ),
            FillMethod.SAME_NAMESPACE: lambda bdef, m: self._fill_where(
                bdef, m, lambda b: m.namespace in b.namespaces()
            ),
            FillMethod.BALANCED: lambda bdef, m: [
                b for b in self.instances(bdef) if b.free_milli >= m.request
            ],
            FillMethod.BALANCED_INFLATE: lambda bdef, m: self._fill_where(bdef, m, bool),
            FillMethod.NEW_BALLOON: lambda bdef, m: [self._fill_new(bdef, m.request)],
        }

    def _fill_where(
        self, bdef: BalloonType, member: Member, where: Callable[[Balloon], bool]
    ) -> list[Balloon]:
        """The instances ``where`` holds for that can grow to fit ``member``."""
        avail = self.available(bdef)
        return [
            b
            for b in self.instances(bdef)
            if where(b) and b.max_free_milli(avail) >= member.request
        ]

    def _fill_same_group(self, bdef: BalloonType, member: Member) -> list[Balloon]:
        if not member.group:
            raise NotApplicable
        return self._fill_where(bdef, member, lambda b: b.groups[member.group] > 0)

    def _fill_new(self, bdef: BalloonType, req: int) -> Balloon:
        for b in self.instances(bdef):
            if not b.members:
                return b  # a pre-created, empty balloon
        avail = self.available(bdef)
        if not avail or avail.bit_count() < bdef.min_cpus:
            raise NotApplicable
        try:
            bln = self._new_balloon(bdef)
        except BalloonsError as exc:
            log.debug("new-balloon: %s", exc)
            raise NotApplicable from None
        if bln.max_avail_milli(self.available(bdef)) < req:
            self._delete(bln, append=False)
            raise NotApplicable
        self.balloons.append(bln)
        self._share_idle()
        return bln

    def _new_balloon(self, bdef: BalloonType) -> Balloon:
        used = {b.instance for b in self.instances(bdef)}
        if bdef.max_balloons and len(used) >= bdef.max_balloons:
            raise BalloonsError(
                f"cannot create new {quote(bdef.name)} balloon, "
                f"MaxBalloons limit ({bdef.max_balloons}) reached"
            )
        instance = next(i for i in range(len(used) + 1) if i not in used)
        if bdef.components:
            return self._new_composite(bdef, instance)
        bln = Balloon(bdef=bdef, instance=instance)
        if bdef.min_cpus:
            self._resize(bln, bdef.min_cpus * 1000)
        return bln

    def _new_composite(self, bdef: BalloonType, instance: int) -> Balloon:
        """A composite balloon (upstream ``newCompositeBalloon``): one component
        balloon per component type (``componentCreation`` ``""``/``all``), or only
        the component type with the fewest instances (``balance-balloons``).
        Component balloons live only in the composite's ``components``."""
        comp_defs: list[BalloonType] = []
        for comp in bdef.components:
            comp_def = self.types.get(comp.balloon_type)
            if comp_def is None:
                raise BalloonsError(
                    f"unknown balloon definition {quote(comp.balloon_type)} in composite "
                    f"balloon {quote(bdef.name)}"
                )
            comp_defs.append(comp_def)
        if bdef.component_creation == "balance-balloons":
            counts = [len(self._including_components(d)) for d in comp_defs]
            log.debug("instance-components of composite balloon %s: %s", bdef.name, counts)
            comp_defs = [comp_defs[counts.index(min(counts))]]
        elif bdef.component_creation not in ("", "all"):
            raise BalloonsError(
                f"unknown ComponentCreation mode {quote(bdef.component_creation)} in "
                f"composite balloon {quote(bdef.name)}"
            )
        bln = Balloon(bdef=bdef, instance=instance)
        for comp_def in comp_defs:
            try:
                part = self._new_balloon(comp_def)
            except BalloonsError as exc:
                self._delete(bln)
                raise BalloonsError(
                    f"failed to create component balloon {quote(comp_def.name)} for composite "
                    f"balloon {quote(bdef.name)}: {exc}"
                ) from None
            bln.components.append(part)
            bln.cpus |= part.cpus
            log.debug("created component balloon %s of composite balloon %s", part.name, bdef.name)
        try:
            self._resize(bln, bdef.min_cpus * 1000)
        except BalloonsError:
            self._delete(bln)
            raise
        return bln

    def _including_components(self, bdef: BalloonType) -> list[Balloon]:
        """Balloons, top-level or components, of ``bdef`` or of any type in its
        components, recursively (upstream ``balloonsByDefIncludingComponents``)."""
        names: set[str] = set()
        todo = [bdef]
        while todo:
            d = todo.pop()
            names.add(d.name)
            for comp in d.components:
                sub = self.types.get(comp.balloon_type)
                if sub is not None and sub.name not in names:
                    todo.append(sub)
        return [b for top in self.balloons for b in top.walk() if b.bdef.name in names]

    # -- sizing (§7) -----------------------------------------------------------------

    def available(self, bdef: BalloonType) -> int:
        """Free CPUs a balloon of ``bdef`` may take. Stricter than upstream: the
        reserved cpuset is never handed to other balloons, even under pressure
        (upstream only steers them away from it with a soft hint)."""
        assert self.config is not None
        if bdef.name == self.config.reserved_type.name:
            return self.free
        return self.free & ~self.reserved

    def _resize(self, bln: Balloon, milli: int, exclude: int | None = None) -> None:
        """Resize ``bln`` to fit ``milli`` mCPU. ``exclude``: CPUs it may not take
        (by default the reserved cpuset unless it is the reserved balloon; the
        components of a composite inherit the composite's)."""
        if exclude is None:
            assert self.config is not None
            exclude = 0 if bln.bdef.name == self.config.reserved_type.name else self.reserved
        if bln.components:
            self._resize_composite(bln, milli, exclude)
            return
        bdef = bln.bdef
        count = math.ceil(milli / 1000)
        if bdef.max_cpus > 0:
            count = min(count, bdef.max_cpus)
        count = max(count, bdef.min_cpus)
        current = bln.cpus.bit_count()
        delta = count - current
        if delta == 0:
            return
        log.debug("resize %s to fit %d mCPU", bln.name, milli)
        log.debug("- change size from %d to %d full cpus", current, count)
        self._forget_class(bln.cpus)
        try:
            self._resize_cpus(bln, delta, exclude)
        finally:
            self._use_class(bln)
        if delta > 0:
            self.cpu_classes.pct.log_placement(bln.name, self.balloon_class(bdef), bln.cpus)

    def _resize_cpus(self, bln: Balloon, delta: int, exclude: int) -> None:
        bdef = bln.bdef
        tree = self.trees[bdef.name]
        self._load_devices_for(bdef)
        if delta > 0:
            free = self.free & ~exclude
            hints = self.cpu_classes.hints(self.balloon_class(bdef), delta, free, bln.cpus)
            prefer: list[Hint] = []
            avoid: list[Hint] = []
            for i, (name, sets) in enumerate(hints.prefer):
                log.debug("cpuclass hint: prefer %s -> %s", quote(name), _sets(sets))
                prefer.append(VirtualDevice(f"__cls_pref_{i}_{name}", sets))
            for i, (name, cpus) in enumerate(hints.avoid):
                log.debug("cpuclass hint: avoid %s -> %s", quote(name), cpuset.format(cpus))
                avoid.append(VirtualDevice(f"__cls_avoid_{i}_{name}", [cpus]))
            try:
                add = tree.resize(bln.cpus, free, delta, prefer=prefer, avoid=avoid)
            except ResizeError as exc:
                raise BalloonsError(
                    f"resizing balloon {bln.name} failed: resize/inflate: failed to choose a "
                    f"cpuset for allocating additional {delta} CPUs: {exc}"
                ) from None
            self.free &= ~add
            bln.cpus |= add
        else:
            try:
                remove = tree.resize(bln.cpus, self.free, delta)
            except ResizeError as exc:
                raise BalloonsError(
                    f"resizing balloon {bln.name} failed: resize/deflate: failed to choose a "
                    f"cpuset for releasing {-delta} CPUs: {exc}"
                ) from None
            bln.cpus &= ~remove
            self.free |= remove

    def _resize_composite(self, bln: Balloon, milli: int, exclude: int) -> None:
        """Upstream ``resizeCompositeBalloon``: every component gets an equal
        (integer) share of ``milli``; the composite's own min/maxCPUs do not
        clamp it. All or nothing: a failing component rolls every one back."""
        per_component = milli // len(bln.components)
        saved_free = self.free
        saved = [(b, b.cpus) for b in bln.walk()]
        try:
            for comp in bln.components:
                self._resize(comp, per_component, exclude)
        except BalloonsError as exc:
            taken = functools.reduce(operator.or_, (b.cpus for b, _ in saved), 0)
            self.free = saved_free
            for b, cpus in saved:
                b.cpus = cpus
            self._forget_class(taken & saved_free)
            self._use_class(bln)
            raise BalloonsError(f"resize composite balloon {bln.name}: {exc}") from None
        cpus = 0
        for comp in bln.components:
            cpus |= comp.cpus
        bln.cpus = cpus

    def _delete(self, bln: Balloon, append: bool = True) -> None:
        log.debug("deleting balloon %s", bln.name)
        for b in bln.walk():
            self._forget_class(b.cpus)
            self.free |= b.cpus
            b.cpus = 0
        if bln in self.balloons:
            self.balloons.remove(bln)

    def _share_idle(self) -> None:
        """Shared idle CPUs of every balloon (§9)."""
        for bln in self.balloons:
            bln.shared_idle = share_idle(
                bln.cpus, self.free, bln.bdef.share_idle_cpus_in_same, self.topology
            )

    # -- containers ------------------------------------------------------------------

    def member(self, pod: Pod, container: Container, bdef: BalloonType) -> Member:
        group = ""
        if bdef.group_by:
            try:
                group = expand_group(bdef.group_by, Subject(container, pod), must_resolve=True)
            except KeyError as exc:
                log.error(
                    "error choosing balloon for container %r based on groupBy: %s",
                    _pretty(pod, container),
                    exc,
                )
        return Member(
            id=container.id,
            pod_id=pod.id,
            namespace=pod.namespace,
            pod_name=pod.name,
            name=container.name,
            request=request_milli(container),
            limit=limit_milli(container),
            group=group,
        )

    def allocate(self, pod: Pod, container: Container) -> Balloon | None:
        """Place a new container; ``None`` when it is preserved (left alone)."""
        if self.preserved(pod, container):
            return None
        bdef = self.choose_type(pod, container)
        member = self.member(pod, container, bdef)
        log.debug(
            "allocating resources for container %s (request %d mCPU, limit %d mCPU)...",
            member.pretty,
            member.request,
            member.limit,
        )
        bln = self.choose_instance(bdef, member)
        need = member.request + bln.requested
        if bln.cpus.bit_count() * 1000 < max(1, need):
            try:
                self._resize(bln, max(1, need))
            except BalloonsError:
                if not bln.members and len(self.instances(bdef)) > bdef.min_balloons:
                    self._delete(bln)  # created for this container: do not keep it
                    self._share_idle()
                raise
        bln.members[member.id] = member
        if member.group:
            bln.groups[member.group] += 1
        self.owner[member.id] = bln
        self._share_idle()
        log.info("assigning container %s to balloon %s", member.pretty, bln)
        return bln

    def release(self, container_id: str) -> None:
        bln = self.owner.pop(container_id, None)
        if bln is None:
            log.debug(
                "ReleaseResources: balloon-less container %s, nothing to release", container_id
            )
            return
        member = bln.members.pop(container_id)
        if member.group:
            bln.groups[member.group] -= 1
            if bln.groups[member.group] <= 0:
                del bln.groups[member.group]
        try:
            if not bln.members:
                log.debug("all containers removed, free balloon allocation %s", bln.name)
                self._resize(bln, 0)
                if len(self.instances(bln.bdef)) > bln.bdef.min_balloons:
                    self._delete(bln)
            else:
                self._resize(bln, max(1, bln.requested))
        except BalloonsError as exc:
            log.warning("failed to deflate balloon %s: %s", bln.name, exc)
        self._share_idle()

    # -- pinning (§9) ----------------------------------------------------------------

    def pinning(self, pod_of: Callable[[str], Pod | None]) -> dict[str, tuple[str, str]]:
        """Container id -> (cpus, mems) for every container in a balloon; cpus is
        ``""`` (left to the runtime) with ``pinCPU: false``."""
        assert self.config is not None
        pin_cpu = self.config.spec.pin_cpu
        out: dict[str, tuple[str, str]] = {}
        for bln in self.balloons:
            opts = self.options[bln.bdef.name]
            pinnable = bln.cpus | bln.shared_idle
            mems = self.topology.closest_nodes(pinnable) if opts.pin_memory else 0
            bln.mems = mems
            mems_text = cpuset.format(mems)
            texts: dict[bool, str] = {}  # formatted once per balloon, not per container
            for m in bln.members.values():
                hide = opts.hide_hyperthreads
                pod = pod_of(m.pod_id)
                if pod is not None:
                    forced = ann.parse_bool(
                        ann.effective(ann.HIDE_HYPERTHREADS, pod, Container(id=m.id, name=m.name))
                    )
                    if forced is not None:
                        hide = forced
                if hide not in texts:
                    cpus = self.topology.single_thread(pinnable) if hide else pinnable
                    texts[hide] = cpuset.format(cpus)
                out[m.id] = (texts[hide] if pin_cpu else "", mems_text)
        return out

    # -- state -----------------------------------------------------------------------

    def export(self) -> BalloonsState:
        """The state to save (:mod:`nri_balloons.state`)."""
        return snapshot(self.balloons)

    def restore(self, saved: Any, alive: set[str]) -> set[str]:
        """Rebuild the balloons saved by :meth:`export` (this version or an older
        one) for containers still alive.

        Returns the ids restored. Anything inconsistent (an unknown type, CPUs
        outside the allowed set or in two balloons) makes the whole restore
        fail, and the caller places every container afresh.
        """
        try:
            state = decode(saved)
            if state is None:
                return set()
            balloons, taken = rebuild(state, self.types, self.allowed, alive)
        except (KeyError, ValueError, TypeError) as exc:
            log.warning("cannot restore saved balloons, placing containers anew: %s", exc)
            return set()
        # keep the pre-created balloons' places: replace the fresh ones
        self.balloons = balloons
        self.free = self.allowed & ~taken
        self.owner = {m: b for b in balloons for m in b.members}
        for bln in list(self.balloons):
            if not bln.members and len(self.instances(bln.bdef)) > bln.bdef.min_balloons:
                self._delete(bln)
        self._share_idle()
        self.apply_cpu_classes()
        return set(self.owner)

    def __iter__(self) -> Iterator[Balloon]:
        return iter(self.balloons)


def _placement_view(spec: BalloonsPolicySpec) -> BalloonsPolicySpec:
    """The configuration without what does not affect placement (upstream
    ``changesBalloons``): CPU and scheduling classes, policy-wide and per
    type. The legacy ``control.cpu.classes`` are cpuClasses too."""
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


def _adder(devices: list[LoadedDevice]) -> Callable[[int], None]:
    """The tree allocator's per-CPU hook for ``overloadsLevelInBalloon`` loads."""

    def add(cpus: int) -> None:
        for dev in devices:
            dev.add(cpus)

    return add


def _pick(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _priority(bdef: BalloonType) -> str:
    prio = bdef.allocator_priority or "none"
    return prio if prio in PRIORITY_ORDER else "none"


def _masks(resolver: DeviceResolver, devices: list[str]) -> list[int]:
    out = []
    for dev in devices:
        mask = resolver.cpus(dev)
        if mask is None:
            continue
        out.append(mask)
    return out


def _pretty(pod: Pod, container: Container) -> str:
    return f"{pod.namespace}/{pod.name}/{container.name}"

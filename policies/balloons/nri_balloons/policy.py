"""The balloons policy proper: its decisions. Choose a balloon type (§5) and an
instance (§6, :mod:`~nri_balloons.fillmethod`), inflate and deflate balloons
(§7), allocate and release containers, pin them (§9).

No NRI and no pluggy here: :mod:`nri_balloons.plugin` adapts the hooks. The
behaviour follows upstream's ``balloons-policy.go`` (reference §3, §5-§9,
§14); section numbers in comments point at ``nri-plugins-balloons.md``. Beside
it: the running state (:mod:`~nri_balloons.placement`, with the CPU trees of
:mod:`~nri_balloons.trees`), composites (:mod:`~nri_balloons.composite`), the
balloons' cpuClasses (:mod:`~nri_balloons.balloonclass`), the saved state
(:mod:`~nri_balloons.state`), NRT zones (:mod:`~nri_balloons.nrt`) and extended
resources (:mod:`~nri_balloons.extres`).
"""

from __future__ import annotations

import functools
import logging
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import msgspec
from nri_framework import cpuset
from nri_framework.journal import StateChanges
from nri_framework.memo import RecentAnswers
from nri_framework.model import Container, Pod
from nri_framework.topology import Topology

from nri_balloons import annotations as ann
from nri_balloons import balloonclass
from nri_balloons.balloon import Balloon, Member
from nri_balloons.composite import new_composite, resize_composite
from nri_balloons.config import BalloonsPolicySpec, BalloonType
from nri_balloons.containers import limit_milli, pretty_name, qos_class, request_milli
from nri_balloons.cpuclass import CpuClassHandler, Writer
from nri_balloons.cpupriority import CpuPriority
from nri_balloons.cputree import CpuTreeAllocator, ResizeError
from nri_balloons.devices import (
    AssignedDevice,
    VirtualDevice,
    pod_resource_entries,
    pod_resource_hints,
)
from nri_balloons.errors import BalloonsError
from nri_balloons.expression import Subject
from nri_balloons.fillmethod import FillMethod, fill_chain
from nri_balloons.globmatch import go_match as glob_match
from nri_balloons.gofmt import quote
from nri_balloons.groupby import expand_group
from nri_balloons.memplacement import MemoryPlacer, memory_limit, type_set
from nri_balloons.placement import Placement, TypeOptions, changes_placement
from nri_balloons.sizing import share_idle
from nri_balloons.sstlink import DEFAULT_WAIT, Wait
from nri_balloons.state import MemberPart, StateTracker, decode, parts, rebuild
from nri_balloons.trees import build_trees, class_hints
from nri_balloons.validation import PreparedConfig

log = logging.getLogger("policy")

T = TypeVar("T")

__all__ = ["BalloonsError", "BalloonsPolicy"]

PRIORITY_ORDER = ("high", "normal", "low", "none")

NAMESPACE_MATCHES = 4096
"""At most this many (type, namespace) answers of the types' ``namespaces`` kept."""

PodDevices = Callable[[str, str, str], Sequence[AssignedDevice] | None]
"""(namespace, pod, container) -> the container's assigned devices (None: unknown)"""


class NotApplicable(Exception):
    """A fill method has no candidate."""


class _Fill:
    """One container's walk of its type's fill chain: the type's instances and
    the CPUs it may take, computed once for every method that reads them (the
    new-balloon method changes them: it computes them again)."""

    __slots__ = ("_available", "_instances", "bdef", "policy")

    def __init__(self, policy: BalloonsPolicy, bdef: BalloonType) -> None:
        self.policy = policy
        self.bdef = bdef
        self._instances: list[Balloon] | None = None
        self._available: int | None = None

    @property
    def instances(self) -> list[Balloon]:
        if self._instances is None:
            self._instances = self.policy.instances(self.bdef)
        return self._instances

    @property
    def available(self) -> int:
        if self._available is None:
            self._available = self.policy.available(self.bdef)
        return self._available

    def new(self, member: Member) -> Balloon:
        self._instances = self._available = None
        try:
            return self.policy._fill_new(self.bdef, member.request, member)
        finally:
            self._instances = self._available = None


class _Placed(Generic[T]):
    """An attribute of the policy's running :class:`~nri_balloons.placement.Placement`.

    The class gets a property in its place whose getter is C
    (``operator.attrgetter``): a decision reads these ~50 times, and a
    descriptor's ``__get__`` in Python costs ten times a plain read. Its
    methods give the attribute's type."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

        def put(policy: BalloonsPolicy, value: T) -> None:
            setattr(policy.placement, name, value)

        setattr(owner, name, property(operator.attrgetter("placement." + name), put))

    def __get__(self, policy: BalloonsPolicy, owner: type | None = None) -> T:
        return getattr(policy.placement, self.name)  # type: ignore[no-any-return]

    def __set__(self, policy: BalloonsPolicy, value: T) -> None:
        setattr(policy.placement, self.name, value)


class BalloonsPolicy:
    """The state of the balloons on one node: the running :attr:`placement`, the
    decisions that change it, and the cpuClasses of its CPUs."""

    config: _Placed[PreparedConfig | None] = _Placed()
    allowed: _Placed[int] = _Placed()
    reserved: _Placed[int] = _Placed()
    types: _Placed[dict[str, BalloonType]] = _Placed()
    options: _Placed[dict[str, TypeOptions]] = _Placed()
    balloons: _Placed[list[Balloon]] = _Placed()
    free: _Placed[int] = _Placed()
    initial_free: _Placed[int] = _Placed()
    owner: _Placed[dict[str, Balloon]] = _Placed()
    device_hints: _Placed[dict[str, tuple[str, dict[str, VirtualDevice]]]] = _Placed()

    def __init__(
        self,
        topology: Topology,
        host_root: str = "/",
        writer: Writer | None = None,
        priorities: Mapping[CpuPriority, int] | None = None,
    ) -> None:
        self.topology = topology
        self.host_root = host_root
        self.priorities = priorities
        """the CPU priorities discovered at start (None: cpufreq's)"""
        self.cpu_classes = CpuClassHandler(topology, writer)
        self.placement = Placement()
        self.pod_devices: PodDevices | None = None
        """(namespace, pod, container) -> the devices the kubelet assigned to it,
        from the plugin's pod-resources cache (None: ``agent.podResourceAPI`` off)"""
        self.memory = MemoryPlacer(topology)
        self._pinned: dict[int, _PinnedBalloon] = {}
        """id(balloon) -> its pins as the last pinning gave them"""
        self._pinned_memory = self.memory
        self._pinned_moves = 0
        """:attr:`MemoryPlacer.moves` when the pins were computed"""
        self.state_tracker = StateTracker()
        """what changed in the saved state since the journal's last record"""
        self._member_parts: dict[str, MemberPart] = {}
        """the member parts of the last :meth:`export` (reused by the next)"""
        self._pins: dict[str, tuple[str, str]] = {}
        """the last pinning, whole (what :meth:`pinning_changes` changes)"""
        self._entry_of: dict[str, _PinnedBalloon] = {}
        """container id -> the part of the last pinning that pinned it"""
        self._pod_members: dict[str, set[str]] = {}
        """pod id -> the containers of the last pinning in that pod"""
        self._allocated: dict[str, int] = {}
        """container id -> memory nodes the last pinning allocated to it"""
        self._touched: set[str] = set()
        """containers allocated or released since the last pinning"""
        self._namespace_matches: RecentAnswers[tuple[str, str], bool]
        self._namespace_matches = RecentAnswers(NAMESPACE_MATCHES)
        """(type name, namespace) -> whether the type's ``namespaces`` match it"""

    def use_priorities(self, priorities: Mapping[CpuPriority, int]) -> None:
        """CPU priorities found after start (a late SST helper): the allocations
        from now on use them; no balloon moves."""
        self.priorities = priorities
        p = self.placement
        if p.config is not None:
            p.trees = build_trees(
                self.topology, self.host_root, p.config, p.reserved, p.options, priorities
            )

    # -- configuration (§3 setConfig) ------------------------------------------------

    def set_config(self, prepared: PreparedConfig, wait: Wait = DEFAULT_WAIT) -> None:
        """Start over with ``prepared``: no balloons but the pre-created ones.
        ``wait``: how the cpuClasses' SST programming waits for the helper."""
        self.placement = Placement.for_config(
            self.topology, self.host_root, prepared, self.priorities
        )
        self._namespace_matches.clear()
        self.memory = MemoryPlacer(self.topology)  # upstream: a new libmem allocator
        self._configure_classes(prepared.spec, strict=True, wait=wait)
        for prio in PRIORITY_ORDER:
            for bdef in prepared.balloon_types:
                if _priority(bdef) != prio:
                    continue
                for i in range(bdef.min_balloons):
                    try:
                        self.balloons.append(self.new_balloon(bdef))
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
        self,
        prepared: PreparedConfig,
        running: Sequence[tuple[Pod, Container]],
        wait: Wait = DEFAULT_WAIT,
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
        if old is not None and not changes_placement(old.spec, prepared.spec):
            if old.spec == prepared.spec:
                log.info("no configuration changes")
                return "none"
            log.info("configuration changes only on CPU classes")
            self._swap_types(prepared, wait)
            return "classes"
        current, memory = self.placement, self.memory
        try:
            self.set_config(prepared, wait)
        except BalloonsError as exc:
            self.placement = current  # untouched: set_config built a new one
            self.memory = memory
            if old is not None:  # the handler is shared: back to the running classes
                self._configure_classes(old.spec, strict=False, wait=wait)
                self.apply_cpu_classes()
            raise BalloonsError(f"config update failed: {exc}") from None
        log.info("config updated successfully")
        for pod, container in running:
            try:
                self.allocate(pod, container)
            except BalloonsError as exc:
                log.warning("allocating resources for Sync produced an error: %s", exc)
        return "placement"

    def _swap_types(self, prepared: PreparedConfig, wait: Wait = DEFAULT_WAIT) -> None:
        """The new types (differing in classes only) replace the old ones in
        every balloon; CPUs and containers stay."""
        self.config = prepared
        self.types = {t.name: t for t in prepared.balloon_types}
        self._namespace_matches.clear()
        for top in self.balloons:
            for bln in top.walk():
                bln.bdef = self.types[bln.bdef.name]
        self._configure_classes(prepared.spec, strict=False, wait=wait)
        self.apply_cpu_classes()

    # -- cpuClasses (§12.1 balloons mapping: nri_balloons.balloonclass) ----------------

    def _configure_classes(
        self, spec: BalloonsPolicySpec, strict: bool, wait: Wait = DEFAULT_WAIT
    ) -> None:
        balloonclass.configure(self.cpu_classes, spec, self.allowed, strict, wait)

    def balloon_class(self, bdef: BalloonType) -> str:
        """The type's ``cpuClass``, else ``default`` if defined, else none."""
        return balloonclass.class_of(self.cpu_classes, bdef)

    def apply_cpu_classes(self) -> None:
        """The idle class on every allowed CPU, then each balloon's class."""
        balloonclass.reset(self.cpu_classes, self.balloons, self.allowed, self.reserved)

    # -- choosing the type (§5) ------------------------------------------------------

    def preserved(self, pod: Pod, container: Container) -> bool:
        """Containers the policy leaves alone (annotation or ``preserve``)."""
        if ann.parse_bool(ann.effective(ann.CPU_PRESERVE, pod, container)):
            log.info(
                "not handling resources of container %s, preserving CPUs %r and memory %r",
                pretty_name(pod, container),
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
                        "preserve container %s due to matching %s",
                        pretty_name(pod, container),
                        expr,
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
        subject: Subject | None = None
        for bdef in self.config.balloon_types:
            if bdef.match_expressions:
                if subject is None:
                    subject = Subject(container, pod)
                for expr in bdef.match_expressions:
                    if expr.evaluate_subject(subject):
                        return bdef
            if bdef.namespaces and self._in_namespaces(bdef, pod.namespace):
                log.debug(
                    "- namespace %r matches namespaces of balloon type %r", pod.namespace, bdef.name
                )
                return bdef
        log.debug("- no match found, using default balloon type %r", self.config.default_type.name)
        return self.config.default_type

    def _in_namespaces(self, bdef: BalloonType, namespace: str) -> bool:
        """``namespace`` matches one of the type's ``namespaces`` (remembered per
        type name and namespace until the types change, at most
        :data:`NAMESPACE_MATCHES` answers)."""
        key = (bdef.name, namespace)
        got = self._namespace_matches.get(key)
        if got is None:
            got = any(glob_match(ns, namespace) for ns in bdef.namespaces)
            self._namespace_matches.keep(key, got)
        return got

    # -- choosing the instance (§6) --------------------------------------------------

    def instances(self, bdef: BalloonType) -> list[Balloon]:
        return [b for b in self.balloons if b.bdef.name == bdef.name]

    def choose_instance(self, bdef: BalloonType, member: Member) -> Balloon:
        fill = _Fill(self, bdef)
        debug = log.isEnabledFor(logging.DEBUG)  # the lines' arguments for debug only
        for method in fill_chain(bdef):
            try:
                candidates = self._fills[method](fill, member)
            except NotApplicable:
                if debug:
                    log.debug("fill method %r not applicable", str(method))
                continue
            if candidates:
                if debug:
                    log.debug(
                        "fill method %r suggests any of balloon instances %s",
                        str(method),
                        [b.name for b in candidates],
                    )
                return self._best(method, candidates, fill)
            if debug:
                log.debug("fill method %r not applicable", str(method))
        raise BalloonsError(
            f"balloon allocation for container {member.pretty} failed: "
            "no suitable balloon instance available"
        )

    def _best(self, method: FillMethod, candidates: list[Balloon], fill: _Fill) -> Balloon:
        if len(candidates) == 1:  # (a new balloon's method: nothing to compare)
            return candidates[0]

        def key(b: Balloon) -> tuple[int, int]:
            if method is FillMethod.BALANCED_INFLATE:
                free = b.max_free_milli(fill.available)
            else:
                free = b.free_milli
            return (-free, len(b.members))

        return min(candidates, key=key)  # min keeps list order among equals

    @functools.cached_property
    def _fills(self) -> dict[FillMethod, Callable[[_Fill, Member], list[Balloon]]]:
        """Fill method -> its candidates for a container (raises :class:`NotApplicable`)."""
        return {
            FillMethod.SAME_GROUP: self._fill_same_group,
            FillMethod.SAME_POD: lambda fill, m: self._fill_where(
                fill, m, lambda b: m.pod_id in b.members.pods
            ),
            FillMethod.SAME_NAMESPACE: lambda fill, m: self._fill_where(
                fill, m, lambda b: m.namespace in b.members.namespaces
            ),
            FillMethod.BALANCED: lambda fill, m: [
                b for b in fill.instances if b.free_milli >= m.request
            ],
            FillMethod.BALANCED_INFLATE: lambda fill, m: self._fill_where(fill, m, bool),
            FillMethod.NEW_BALLOON: lambda fill, m: [fill.new(m)],
        }

    def _fill_where(
        self, fill: _Fill, member: Member, where: Callable[[Balloon], bool]
    ) -> list[Balloon]:
        """The instances ``where`` holds for that can grow to fit ``member``."""
        avail = fill.available
        return [b for b in fill.instances if where(b) and b.max_free_milli(avail) >= member.request]

    def _fill_same_group(self, fill: _Fill, member: Member) -> list[Balloon]:
        if not member.group:
            raise NotApplicable
        return self._fill_where(fill, member, lambda b: b.groups[member.group] > 0)

    def _fill_new(self, bdef: BalloonType, req: int, member: Member | None = None) -> Balloon:
        for b in self.instances(bdef):
            if not b.members:
                return b  # a pre-created, empty balloon
        avail = self.available(bdef)
        if not avail or avail.bit_count() < bdef.min_cpus:
            raise NotApplicable
        try:
            bln = self.new_balloon(bdef, member)
        except BalloonsError as exc:
            log.debug("new-balloon: %s", exc)
            raise NotApplicable from None
        if bln.max_avail_milli(self.available(bdef)) < req:
            self.delete(bln, append=False)
            raise NotApplicable
        self.balloons.append(bln)
        self._share_idle()
        return bln

    def new_balloon(self, bdef: BalloonType, member: Member | None = None) -> Balloon:
        """A new instance of ``bdef``, at its minCPUs; ``member``: the container it
        is made for, whose ``podresourceapi:`` hints steer it until it leaves."""
        used = {b.instance for b in self.instances(bdef)}
        if bdef.max_balloons and len(used) >= bdef.max_balloons:
            raise BalloonsError(
                f"cannot create new {quote(bdef.name)} balloon, "
                f"MaxBalloons limit ({bdef.max_balloons}) reached"
            )
        instance = 0  # the lowest one not in use
        while instance in used:
            instance += 1
        if bdef.components:
            return new_composite(self, bdef, instance)
        bln = Balloon(bdef=bdef, instance=instance)
        hints = self.device_hints
        if hints:  # (usually none: no name to format)
            hints.pop(bln.name, None)
        if member is not None:
            self._attach_device_hints(bln, member)
        if bdef.min_cpus:
            self.resize(bln, bdef.min_cpus * 1000)
        return bln

    def _attach_device_hints(self, bln: Balloon, member: Member) -> None:
        """Resolve the type's ``podresourceapi:`` entries for ``member`` from the
        pod-resources cache (never the kubelet: nothing here waits)."""
        close = bln.bdef.prefer_close_to_devices
        if not close:  # (most types)
            return
        entries = pod_resource_entries(close)
        if not entries:
            return
        devices = None
        if self.pod_devices is not None:
            devices = self.pod_devices(member.namespace, member.pod_name, member.name)
        hints = pod_resource_hints(
            entries, self.topology, self.allowed, devices, member.id, member.pretty
        )
        if hints:
            self.device_hints[bln.name] = (member.id, hints)

    def _drop_device_hints(self, bln: Balloon, container_id: str, pretty: str) -> None:
        if not self.device_hints:
            return
        got = self.device_hints.get(bln.name)
        if got is not None and got[0] == container_id:
            del self.device_hints[bln.name]
            log.debug(
                "removed pod-resource device hints of container %s from balloon %s",
                pretty,
                bln.name,
            )

    def _tree(self, bln: Balloon) -> CpuTreeAllocator:
        hints = self.device_hints
        got = hints.get(bln.name) if hints else None
        return self.placement.trees.for_resize(
            bln.bdef, self.balloons, got[1] if got is not None else None
        )

    # -- sizing (§7) -----------------------------------------------------------------

    def available(self, bdef: BalloonType) -> int:
        """Free CPUs a balloon of ``bdef`` may take. Stricter than upstream: the
        reserved cpuset is never handed to other balloons, even under pressure
        (upstream only steers them away from it with a soft hint)."""
        assert self.config is not None
        if bdef.name == self.config.reserved_type.name:
            return self.free
        return self.free & ~self.reserved

    def resize(self, bln: Balloon, milli: int, exclude: int | None = None) -> None:
        """Resize ``bln`` to fit ``milli`` mCPU (upstream ``resizeBalloon``): the
        CPU count it needs, clamped to its type's min/maxCPUs, then
        :meth:`inflate` or :meth:`deflate`. ``exclude``: CPUs it may not take
        (by default the reserved cpuset unless it is the reserved balloon; the
        components of a composite inherit the composite's)."""
        if exclude is None:
            assert self.config is not None
            exclude = 0 if bln.bdef.name == self.config.reserved_type.name else self.reserved
        if bln.components:
            resize_composite(self, bln, milli, exclude)
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
        if log.isEnabledFor(logging.DEBUG):
            log.debug("resize %s to fit %d mCPU", bln.name, milli)
            log.debug("- change size from %d to %d full cpus", current, count)
        balloonclass.forget(self.cpu_classes, bln.cpus)
        try:
            if delta > 0:
                self.inflate(bln, delta, exclude)
            else:
                self.deflate(bln, -delta)
        finally:
            balloonclass.use(self.cpu_classes, bln)
        pct = self.cpu_classes.pct
        if delta > 0 and pct.mode:  # (log_placement logs nothing without PCT)
            pct.log_placement(bln.name, self.balloon_class(bdef), bln.cpus)

    def inflate(self, bln: Balloon, count: int, exclude: int) -> None:
        """Give ``bln`` ``count`` more CPUs, free ones but ``exclude`` (upstream
        ``resizeBalloon`` growing): the CPU tree narrows the choice down, steered by
        the type's hints and its cpuClass's hints for this resize."""
        bdef = bln.bdef
        tree = self._tree(bln)
        free = self.free & ~exclude
        hints = self.cpu_classes.hints(self.balloon_class(bdef), count, free, bln.cpus)
        try:
            add = tree.resize(bln.cpus, free, count, class_hints(hints))
        except ResizeError as exc:
            raise BalloonsError(
                f"resizing balloon {bln.name} failed: resize/inflate: failed to choose a "
                f"cpuset for allocating additional {count} CPUs: {exc}"
            ) from None
        self.free &= ~add
        bln.cpus |= add

    def deflate(self, bln: Balloon, count: int) -> None:
        """Take ``count`` CPUs from ``bln`` back to the free ones (upstream
        ``resizeBalloon`` shrinking)."""
        tree = self._tree(bln)
        try:
            remove = tree.resize(bln.cpus, self.free, -count)
        except ResizeError as exc:
            raise BalloonsError(
                f"resizing balloon {bln.name} failed: resize/deflate: failed to choose a "
                f"cpuset for releasing {count} CPUs: {exc}"
            ) from None
        bln.cpus &= ~remove
        self.free |= remove

    def delete(self, bln: Balloon, append: bool = True) -> None:
        if log.isEnabledFor(logging.DEBUG):  # the name formatted for debug only
            log.debug("deleting balloon %s", bln.name)
        hints = self.device_hints
        if hints:
            hints.pop(bln.name, None)
        for b in bln.walk():
            balloonclass.forget(self.cpu_classes, b.cpus)
            self.free |= b.cpus
            b.cpus = 0
        if bln in self.balloons:
            self.balloons.remove(bln)

    def _share_idle(self) -> None:
        """Shared idle CPUs of every balloon (§9)."""
        free, topology = self.free, self.topology
        for bln in self.balloons:
            level = bln.bdef.share_idle_cpus_in_same
            # share_idle shares nothing for no level (most types): not called
            bln.shared_idle = share_idle(bln.cpus, free, level, topology) if level else 0

    # -- containers ------------------------------------------------------------------

    def member(self, pod: Pod, container: Container, bdef: BalloonType) -> Member:
        group = ""
        if bdef.group_by:
            try:
                group = expand_group(bdef.group_by, Subject(container, pod), must_resolve=True)
            except KeyError as exc:
                log.error(
                    "error choosing balloon for container %r based on groupBy: %s",
                    pretty_name(pod, container),
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
        if log.isEnabledFor(logging.DEBUG):
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
                self.resize(bln, max(1, need))
            except BalloonsError:
                if not bln.members and len(self.instances(bdef)) > bdef.min_balloons:
                    self.delete(bln)  # created for this container: do not keep it
                    self._share_idle()
                raise
        bln.members[member.id] = member
        if member.group:
            bln.groups[member.group] += 1
        self.owner[member.id] = bln
        self._touched.add(member.id)
        self.memory.note(member.id, memory_limit(container), qos_class(pod, container))
        self._share_idle()
        log.info("assigning container %s to balloon %s", member.pretty, bln)
        return bln

    def release(self, container_id: str) -> None:
        self.memory.release(container_id)  # upstream dismissContainer: libmem Release
        self._touched.add(container_id)
        bln = self.owner.pop(container_id, None)
        if bln is None:
            log.debug(
                "ReleaseResources: balloon-less container %s, nothing to release", container_id
            )
            return
        member = bln.members.pop(container_id)
        self._drop_device_hints(bln, container_id, member.pretty)
        if member.group:
            bln.groups[member.group] -= 1
            if bln.groups[member.group] <= 0:
                del bln.groups[member.group]
        try:
            if not bln.members:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("all containers removed, free balloon allocation %s", bln.name)
                self.resize(bln, 0)
                if len(self.instances(bln.bdef)) > bln.bdef.min_balloons:
                    self.delete(bln)
            else:
                self.resize(bln, max(1, bln.requested))
        except BalloonsError as exc:
            log.warning("failed to deflate balloon %s: %s", bln.name, exc)
        self._share_idle()

    # -- pinning (§9) ----------------------------------------------------------------

    def pinning(self, pod_of: Callable[[str], Pod | None]) -> dict[str, tuple[str, str]]:
        """Container id -> (cpus, mems) for every container in a balloon; cpus is
        ``""`` (left to the runtime) with ``pinCPU: false``.

        A balloon whose CPUs, options, members and members' pods are those of the
        previous pinning gives the same pins again without being walked, unless
        a memory allocation moved a container since (then every balloon is)."""
        moves = self.memory.moves
        out = self._pinning(pod_of, reuse=True)
        if self.memory.moves != moves:
            out = self._pinning(pod_of, reuse=False)  # an allocation moved someone
        return out

    def pinning_changes(
        self, pod_of: Callable[[str], Pod | None], sent_pods: Iterable[str] | None
    ) -> dict[str, tuple[str, str] | None]:
        """What may have changed since the last pinning (this or :meth:`pinning`),
        computed from what changed alone: container id -> its (cpus, mems) now,
        or ``None`` when it is no longer pinned. It holds every member of each
        balloon whose CPUs, options or members changed or that has a member of
        one of ``sent_pods`` (pods the runtime sent anew since; ``None``: any
        may have been, every balloon is computed again), and every
        container allocated or released since; any other container's pins are
        those of the last pinning. After a memory allocation moved a container,
        every balloon is computed again (as :meth:`pinning` does) and every pin
        is in it."""
        if sent_pods is None or not self._reusable():
            last = self._pins  # pinning() makes a new one
            return _with_gone(self.pinning(pod_of), last)
        assert self.config is not None
        pin_cpu = self.config.spec.pin_cpu
        dirty: set[int] = set()  # id(balloon) of the balloons to compute again
        for cid in self._touched:
            entry = self._entry_of.get(cid)
            if entry is not None:
                dirty.add(id(entry.balloon))
            bln = self.owner.get(cid)
            if bln is not None:
                dirty.add(id(bln))
        for pid in sent_pods:
            for cid in self._pod_members.get(pid, ()):
                dirty.add(id(self._entry_of[cid].balloon))
        moves = self.memory.moves
        before = self._pinned
        pinned: dict[int, _PinnedBalloon] = {}
        fresh: list[_PinnedBalloon] = []
        for bln in self.balloons:
            key = self._balloon_key(bln, pin_cpu)
            prev = before.get(id(bln))
            if (
                prev is not None
                and prev.balloon is bln
                and prev.key == key
                and id(bln) not in dirty
            ):
                pinned[id(bln)] = prev
                continue
            entry = self._pin_balloon(bln, key, pod_of)
            fresh.append(entry)
            pinned[id(bln)] = entry
        changes: dict[str, tuple[str, str] | None] = {}
        for k, entry in before.items():
            if pinned.get(k) is not entry:
                self._unindex(entry, changes)
        for entry in fresh:
            self._index(entry)
        # the containers the last pinning allocated and this one does not
        # release their memory (what keep_only does over every container)
        for cid in (*self._touched, *changes):
            if cid not in self._allocated:
                self.memory.release(cid)
        self._touched.clear()
        self._pinned = pinned
        self._fix_moved(fresh, changes)
        if self.memory.moves != moves:  # an allocation moved someone: all again
            return _with_gone(self.pinning(pod_of), changes)
        self._pinned_moves = self.memory.moves
        return changes

    def _reusable(self) -> bool:
        """The last pinning's parts may be reused: no memory allocation moved a
        container since, and the memory placer is the same."""
        return self._pinned_memory is self.memory and self.memory.moves == self._pinned_moves

    def _balloon_key(self, bln: Balloon, pin_cpu: bool) -> tuple[Any, ...]:
        """What a balloon's pins are computed from besides its members (and
        their pods); sets its ``mems``."""
        opts = self.options[bln.bdef.name]
        pinnable = bln.cpus | bln.shared_idle
        mems = self.memory.nodes_of(pinnable) if opts.pin_memory else 0
        bln.mems = mems
        return (pinnable, mems, opts, type_set(bln.bdef.memory_types), pin_cpu)

    def _pin_balloon(
        self, bln: Balloon, key: tuple[Any, ...], pod_of: Callable[[str], Pod | None]
    ) -> _PinnedBalloon:
        """The pins of ``bln``'s members, computed (memory allocated); their
        ``cpuset.mems`` is set by :meth:`_fix_moved`."""
        pinnable, mems, opts, mem_types, pin_cpu = key
        entry = _PinnedBalloon(bln, key, dict(bln.members))
        texts: dict[bool, str] = {}  # formatted once per balloon, not per container
        for m in bln.members.values():
            hide = opts.hide_hyperthreads
            pod = pod_of(m.pod_id)
            entry.pod_ids.append(m.pod_id)
            entry.pods.append(pod)
            keep_mems = False
            mem_type = None
            if pod is not None:
                last = self._entry_of.get(m.id)
                said = last.annotations.get(m.id) if last is not None else None
                if said is None or said.pod is not pod:
                    said = _MemberAnnotations.read(pod, m.id, m.name)
                entry.annotations[m.id] = said
                if said.hide is not None:
                    hide = said.hide
                keep_mems = bool(mems) and said.memory_preserved
                mem_type = said.memory_type
            if mems and not keep_mems:
                entry.allocated[m.id] = self.memory.mems(
                    m.id, m.pretty, pinnable, mem_types, mem_type
                )
            if hide not in texts:
                cpus = self.topology.single_thread(pinnable) if hide else pinnable
                texts[hide] = cpuset.format(cpus)
            if keep_mems:
                # upstream PreserveMemoryResources: the container keeps its own
                # cpuset.mems; its CPUs are still the balloon's
                log.debug("  - preserving %s pinning to memory", m.pretty)
            entry.pins[m.id] = (texts[hide] if pin_cpu else "", "")
        return entry

    def _unindex(self, entry: _PinnedBalloon, changes: dict[str, tuple[str, str] | None]) -> None:
        """``entry`` is no longer part of the pinning: its containers are not
        pinned (unless a part computed now pins them: :meth:`_index`)."""
        for cid, m in entry.members.items():
            if self._entry_of.get(cid) is not entry:
                continue
            del self._entry_of[cid]
            self._pins.pop(cid, None)
            self._allocated.pop(cid, None)
            pod = self._pod_members.get(m.pod_id)
            if pod is not None:
                pod.discard(cid)
                if not pod:
                    del self._pod_members[m.pod_id]
            changes[cid] = None

    def _index(self, entry: _PinnedBalloon) -> None:
        for cid, m in entry.members.items():
            self._entry_of[cid] = entry
            self._pod_members.setdefault(m.pod_id, set()).add(cid)
        self._allocated.update(entry.allocated)

    def _fix_moved(
        self, fresh: list[_PinnedBalloon], changes: dict[str, tuple[str, str] | None]
    ) -> None:
        """The pins of the parts computed now, with their ``cpuset.mems`` as
        the allocations left them: a later allocation may have moved an earlier
        container (libmem: "other containers whose zones changed are updated");
        a reused part's pins hold this already (nobody moved since)."""
        for entry in fresh:
            for cid, nodes in entry.allocated.items():
                entry.pins[cid] = (
                    entry.pins[cid][0],
                    cpuset.format(self.memory.current(cid, nodes)),
                )
            self._pins.update(entry.pins)
            changes.update(entry.pins)

    def _pinning(
        self, pod_of: Callable[[str], Pod | None], reuse: bool
    ) -> dict[str, tuple[str, str]]:
        assert self.config is not None
        pin_cpu = self.config.spec.pin_cpu
        reuse = reuse and self._reusable()
        before = self._pinned
        pinned: dict[int, _PinnedBalloon] = {}
        fresh: list[_PinnedBalloon] = []
        for bln in self.balloons:
            key = self._balloon_key(bln, pin_cpu)
            prev = before.get(id(bln)) if reuse else None
            if (
                prev is not None
                and prev.balloon is bln
                and prev.key == key
                and prev.members == bln.members
                and all(map(operator.is_, map(pod_of, prev.pod_ids), prev.pods))
            ):
                pinned[id(bln)] = prev
                continue
            entry = self._pin_balloon(bln, key, pod_of)
            fresh.append(entry)
            pinned[id(bln)] = entry
        self._entry_of = {}
        self._pod_members = {}
        self._allocated = {}
        self._pins = {}
        for entry in pinned.values():
            self._index(entry)
            self._pins.update(entry.pins)
        self.memory.keep_only(self._allocated)
        self._touched.clear()
        self._fix_moved(fresh, {})
        self._pinned = pinned
        self._pinned_memory = self.memory
        self._pinned_moves = self.memory.moves
        # in the balloons' order (the runtime's updates follow it)
        return {cid: pin for entry in pinned.values() for cid, pin in entry.pins.items()}

    # -- state -----------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The state to save, keyed (:func:`nri_balloons.state.parts`)."""
        memory = {m.id: m for m in self.memory.export()}
        return parts(self.balloons, memory, self._member_parts)

    def state_changes(self) -> StateChanges:
        """The parts of :meth:`export` changed since the last call."""
        return self.state_tracker.changes(self.balloons, self.owner, self.memory)

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
        self.memory.restore(state.memory, set(self.owner))
        self.state_tracker.reset = True
        for bln in list(self.balloons):
            if not bln.members and len(self.instances(bln.bdef)) > bln.bdef.min_balloons:
                self.delete(bln)
        self._share_idle()
        self.apply_cpu_classes()
        return set(self.owner)

    def __iter__(self) -> Iterator[Balloon]:
        return iter(self.balloons)


class _PinnedBalloon(msgspec.Struct):
    """One balloon's part of a pinning, and what it was computed from."""

    balloon: Balloon
    key: tuple[Any, ...]
    members: dict[str, Member]
    pod_ids: list[str] = msgspec.field(default_factory=list)
    pods: list[Pod | None] = msgspec.field(default_factory=list)
    """the pod of each member (of ``pod_ids``) as the pinning saw it"""
    annotations: dict[str, _MemberAnnotations] = msgspec.field(default_factory=dict)
    allocated: dict[str, int] = msgspec.field(default_factory=dict)
    pins: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)


class _MemberAnnotations(msgspec.Struct, frozen=True):
    """A member's pinning annotations, as read from ``pod`` (the object the
    runtime sent: a pod sent anew is read anew)."""

    pod: Pod
    hide: bool | None
    memory_preserved: bool
    memory_type: str | None

    @classmethod
    def read(cls, pod: Pod, container_id: str, name: str) -> _MemberAnnotations:
        annotations = pod.annotations
        # nothing to look up: no annotations (the container's own are not
        # sent), or a few and none of these keys' (every name effective looks
        # up begins with its key: the pod's, a container's or the key); many
        # are looked up, not scanned (a hostile pod's: a lookup is O(1))
        if not annotations or (
            len(annotations) <= SCAN_ANNOTATIONS and not any(map(_starts_pinning_key, annotations))
        ):
            return cls(pod=pod, hide=None, memory_preserved=False, memory_type=None)
        ctr = Container(id=container_id, name=name)
        return cls(
            pod=pod,
            hide=ann.parse_bool(ann.effective(ann.HIDE_HYPERTHREADS, pod, ctr)),
            memory_preserved=ann.memory_preserved(pod, ctr),
            memory_type=ann.effective(ann.MEMORY_TYPE, pod, ctr),
        )


_PINNING_KEYS = (ann.HIDE_HYPERTHREADS, ann.MEMORY_PRESERVE, ann.MEMORY_TYPE)
"""the annotations a member's pinning reads (:class:`_MemberAnnotations`)"""

SCAN_ANNOTATIONS = 32
"""A pod with at most this many annotations has its names scanned for the
pinning's keys before they are looked up (none: nothing looked up); more
are looked up at once (their scan would cost per annotation)."""


def _starts_pinning_key(name: str) -> bool:
    return name.startswith(_PINNING_KEYS)


def _with_gone(
    pins: dict[str, tuple[str, str]], before: Iterable[str]
) -> dict[str, tuple[str, str] | None]:
    """Every pin of ``pins``, then ``None`` for the containers of ``before`` it
    does not pin."""
    out: dict[str, tuple[str, str] | None] = dict(pins)
    for cid in before:
        if cid not in pins:
            out[cid] = None
    return out


def _priority(bdef: BalloonType) -> str:
    prio = bdef.allocator_priority or "none"
    return prio if prio in PRIORITY_ORDER else "none"

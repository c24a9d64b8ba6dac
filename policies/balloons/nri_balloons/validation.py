"""Validation of a ``BalloonsPolicy``: every error at once, in upstream's words.

Upstream checks a configuration in three places, each stopping at its first
error; :func:`validate` runs them all in the same order and collects every
error, each worded exactly as upstream would report it had it been first:

1. the CRD's schema, as the API server enforces it (enums, minimums,
   durations), in the API server's wording (``spec.x: Unsupported value: ...``);
2. ``BalloonsPolicy.Validate()`` in the agent: ``matchExpressions`` of
   ``preserve`` and of the balloon types, ``irqClaim`` against
   ``controllableInterrupts`` (unprefixed: ``expression: invalid expression, ...``);
3. the policy's ``setConfig``: ``availableResources``, ``controllableInterrupts``
   patterns, the built-in ``reserved``/``default`` balloon types
   (``balloons: ...``) and ``validateConfig`` (``balloons: invalid configuration:
   balloons: ...``; cpuClass errors carry the prefix once).

Deliberate differences (the issue's bug fixes):

* ``MinBalloons (%d) > MaxBalloons (%d)`` prints the balloon counts (upstream
  prints minCPUs/maxCPUs);
* mixing managed and assoc-only PCT classes is reported as
  ``pct: cannot mix managed (pctPriority) and assoc-only (sstClosID) modes:``
  followed by upstream's validation text, so both texts can be grepped;
* ``exactly one "reserved" balloon expected`` checks the user's own
  ``minBalloons``/``maxBalloons`` (upstream forces both to 1 first, so it can
  never fire);
* ``irqMode`` is checked against ``""``, ``sink``, ``isolate`` (the CRD lost
  its enum) and resource names in ``availableResources``/``reservedResources``
  against ``cpu``, ``memory``.

Stage 1 (the CRD's schema and its enumerations) is :mod:`nri_balloons.crdschema`;
the checks of composite balloons' components are :mod:`nri_balloons.composition`;
this module runs every stage, holds stages 2 and 3 (balloon types, the built-in
types, cpuClasses) and builds the :class:`PreparedConfig` the policy applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec
from nri_framework import cpuset
from nri_framework.quantity import QuantityError, milli_value

from nri_balloons.composition import composite_type_errors, composition_errors
from nri_balloons.config import (
    DEFAULT,
    KUBE_SYSTEM,
    RESERVED,
    AmountKind,
    BalloonsPolicy,
    BalloonsPolicySpec,
    BalloonType,
    CPUClass,
    amount,
    cpuset_error,
    merge_legacy_cpu_classes,
)
from nri_balloons.crdschema import (
    COMPONENT_CREATIONS,
    LOAD_LEVELS,
    MEMORY_TYPES,
    PCT_PRIORITIES,
    schema_errors,
)
from nri_balloons.endpoint import endpoint_errors
from nri_balloons.expression import ExpressionError
from nri_balloons.globmatch import BAD_PATTERN, GlobError, check_pattern, go_match
from nri_balloons.gofmt import list_v, map_v, quote, quote_list
from nri_balloons.irqaffinity import claims

__all__ = ["PreparedConfig", "Validation", "validate"]

POLICY = "balloons: "
INVALID = POLICY + "invalid configuration: "
VIRT_DEV_RESERVED_CPUS = "reserved CPUs"
PODRES_PREFIX = "podresourceapi:"


class PreparedConfig(msgspec.Struct, frozen=True):
    """What the policy runs with once a configuration is valid.

    ``spec`` has legacy ``control.cpu.classes`` merged; ``balloon_types`` is
    the match order with the built-in ``reserved`` (first unless the user
    placed it) and ``default`` (last unless defined) types filled in.
    ``allowed`` and ``reserved`` are CPU masks (``None`` when the node's
    online CPUs were not given).
    """

    spec: BalloonsPolicySpec
    balloon_types: list[BalloonType]
    reserved_type: BalloonType
    default_type: BalloonType
    allowed: int | None
    reserved: int | None


class Validation(msgspec.Struct):
    """The outcome of :func:`validate`."""

    errors: list[str] = msgspec.field(default_factory=list)
    warnings: list[str] = msgspec.field(default_factory=list)
    prepared: PreparedConfig | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def primary(self) -> str | None:
        """The first error: the one upstream would have stopped at."""
        return self.errors[0] if self.errors else None


def _go_bool(value: bool) -> str:
    return "true" if value else "false"


class _Validator:
    def __init__(
        self,
        spec: BalloonsPolicySpec,
        online: int | None,
        interrupts: Sequence[tuple[int, str]] | None,
    ) -> None:
        self.spec = spec
        self.online = online
        self.interrupts = interrupts
        self.errors: list[str] = []
        self.warnings: list[str] = []

    # -- 1. CRD schema ---------------------------------------------------------------

    def schema(self) -> None:
        self.errors.extend(schema_errors(self.spec))

    # -- 2. BalloonsPolicy.Validate() ---------------------------------------------------

    def resource_level(self) -> None:
        s = self.spec
        exprs = [*(s.preserve.match_expressions if s.preserve else [])]
        for bt in s.balloon_types:
            exprs.extend(bt.match_expressions)
        for expr in exprs:
            try:
                expr.validate()
            except ExpressionError as exc:
                self.errors.append(str(exc))
        if self.interrupts is None:
            return
        allow = s.controllable_interrupts
        denied = [
            (num, desc)
            for num, desc in sorted(self.interrupts)
            if allow and not any(go_match(p, desc) for p in allow)
        ]
        for bt in s.balloon_types:
            for num, desc in denied:
                for pattern in bt.irq_claim:
                    if go_match(pattern, desc):
                        self.errors.append(
                            f"invalid irqclaim {quote_list(bt.irq_claim)}: denied interrupt:"
                            f" irq {num} ({desc}) denied but matched by user pattern"
                            f" {quote(pattern)}"
                        )
        for bt in s.balloon_types:
            for pattern in bt.irq_claim:
                if not any(claims(pattern, num, desc) for num, desc in self.interrupts):
                    self.warnings.append(
                        f"balloon type {bt.name!r}: irqClaim {quote(pattern)} matches no"
                        " interrupt of this node (/proc/interrupts); it claims nothing"
                    )

    # -- 3. setConfig ------------------------------------------------------------------

    def parse_cpuset(self, amt: str, what: str) -> int | None:
        """The ``cpuset:``/``exclude-cpuset:`` amount of ``what`` resources, or
        ``None`` after reporting upstream's parse error."""
        try:
            return cpuset.parse(amt)
        except cpuset.CpusetError as exc:
            self.errors.append(cpuset_error(amt, what, exc))
            return None

    def allowed_cpus(self) -> int | None:
        amt, kind = amount(self.spec.available_resources)
        if kind is AmountKind.QUANTITY:
            self.errors.append(
                POLICY + f"can't handle CPU resources given as resource.Quantity ({amt})"
            )
            return self.online
        if kind is AmountKind.ABSENT:
            return self.online
        mask = self.parse_cpuset(amt, "available")
        if mask is None:
            return self.online
        if kind is AmountKind.EXCLUDE_CPUSET:
            return None if self.online is None else self.online & ~mask
        return mask if self.online is None else mask & self.online

    def interrupt_patterns(self) -> None:
        for pattern in self.spec.controllable_interrupts:
            try:
                check_pattern(pattern)
            except GlobError:
                self.errors.append(
                    POLICY + "failed to set allowed interrupts: invalid globbing pattern "
                    f"{quote(pattern)}: {BAD_PATTERN}"
                )

    def builtin_types(
        self, allowed: int | None
    ) -> tuple[list[BalloonType], BalloonType, BalloonType, int | None]:
        """Upstream ``fillBuiltinBalloonDefs``: the types with ``reserved`` and
        ``default`` filled in, and the reserved CPUs."""
        types = list(self.spec.balloon_types)
        reserved_i = max((i for i, t in enumerate(types) if t.name == RESERVED), default=None)
        if reserved_i is None:
            types.insert(0, BalloonType(name=RESERVED, min_balloons=1, allocator_priority="low"))
            reserved_i = 0
        if not any(t.name == DEFAULT for t in types):
            types.append(
                BalloonType(name=DEFAULT, min_balloons=1, max_balloons=1, allocator_priority="low")
            )
        default_type = next(t for t in reversed(types) if t.name == DEFAULT)
        rdef = types[reserved_i]
        changes: dict[str, object] = {}
        reserved: int | None = 0
        amt, kind = amount(self.spec.reserved_resources)
        if kind in (AmountKind.CPUSET, AmountKind.EXCLUDE_CPUSET):
            reserved = self._reserved_cpuset(amt, kind, allowed)
            if rdef.min_cpus == 0 and reserved is not None:
                changes["min_cpus"] = min(reserved.bit_count(), rdef.max_cpus)
            changes["allocator_priority"] = "normal"
            changes["prefer_close_to_devices"] = [
                VIRT_DEV_RESERVED_CPUS,
                *rdef.prefer_close_to_devices,
            ]
        elif kind is AmountKind.QUANTITY:
            changes.update(self._reserved_quantity(amt, rdef))
        changes["min_balloons"] = changes["max_balloons"] = 1
        changes["namespaces"] = [
            *rdef.namespaces,
            KUBE_SYSTEM,
            *self.spec.reserved_pool_namespaces,
        ]
        types[reserved_i] = msgspec.structs.replace(rdef, **changes)
        if default_type is rdef:
            default_type = types[reserved_i]
        return types, types[reserved_i], default_type, reserved

    def _reserved_cpuset(self, amt: str, kind: AmountKind, allowed: int | None) -> int | None:
        mask = self.parse_cpuset(amt, "reserved")
        if mask is None:
            return None
        if allowed is None:
            return None if kind is AmountKind.EXCLUDE_CPUSET else mask
        if kind is AmountKind.EXCLUDE_CPUSET:
            mask = allowed & ~mask
        if mask & ~allowed:
            self.errors.append(
                POLICY + f"ReservedResources cpus {cpuset.format(mask)} contains CPUs not in"
                f" AllowedResources {cpuset.format(allowed)},"
                f" namely {cpuset.format(mask & ~allowed)}"
            )
        return mask & allowed

    def _reserved_quantity(self, amt: str, rdef: BalloonType) -> dict[str, object]:
        try:
            milli = milli_value(amt)
        except QuantityError as exc:
            self.errors.append(
                POLICY + f"failed to parse reserved CPU quantity '{amt}': "
                f"failed to parse amount '{amt}' as resource quantity: {exc}"
            )
            return {}
        reserve_cnt = int((milli + 999) / 1000)  # Go's truncating division
        min_cpus = rdef.min_cpus
        if min_cpus == 0:
            min_cpus = reserve_cnt
            if rdef.max_cpus != 0 and rdef.max_cpus < min_cpus:
                self.errors.append(
                    POLICY + f"mismatching reserved balloon maxCpus: {rdef.max_cpus} and "
                    f"ReservedResources cpus: {milli} mCPU (implies minCpu {min_cpus})"
                )
        if min_cpus != reserve_cnt:
            self.errors.append(
                POLICY + f"mismatching reserved balloon minCpus: {min_cpus} and "
                f"ReservedResources cpus: {milli} mCPU"
            )
        return {"min_cpus": min_cpus}

    # -- validateConfig ----------------------------------------------------------------

    def bln(self, text: str) -> None:
        self.errors.append(INVALID + POLICY + text)

    def balloon_type(self, bt: BalloonType, user_reserved: BalloonType | None) -> None:
        name = quote(bt.name)
        if bt.max_cpus != 0 and bt.min_cpus > bt.max_cpus:
            self.bln(f"MinCpus ({bt.min_cpus}) > MaxCpus ({bt.max_cpus}) in balloon type {name}")
        if bt.max_balloons != 0 and bt.min_balloons > bt.max_balloons:
            self.bln(
                f"MinBalloons ({bt.min_balloons}) > MaxBalloons ({bt.max_balloons})"
                f" in balloon type {name}"
            )
        for mem_type in bt.memory_types:
            if mem_type.upper() not in MEMORY_TYPES:
                self.bln(f"invalid memoryTypes: libmem: invalid type: {quote(mem_type)}")
        if bt.name == RESERVED and user_reserved is not None:
            for what, count in (
                ("MinBalloons", user_reserved.min_balloons),
                ("MaxBalloons", user_reserved.max_balloons),
            ):
                if not 0 <= count <= 1:
                    self.bln(
                        f"invalid configuration: exactly one {name} balloon expected"
                        f" but {what}={count}"
                    )
        if bt.prefer_isol_cpus and bt.share_idle_cpus_in_same:
            self.warnings.append(
                "WARNING: using PreferIsolCpus with ShareIdleCpusInSame is highly discouraged"
            )
        if bt.components:
            self.composite(bt)
        if bt.component_creation and not bt.components:
            self.bln(
                f"ComponentCreation mode {quote(bt.component_creation)} specified but no"
                f" components defined in balloon type {name}"
            )
        if bt.component_creation not in COMPONENT_CREATIONS:
            self.bln(
                f"unknown ComponentCreation mode {quote(bt.component_creation)}"
                f" in balloon type {name}"
            )
        devices = sorted(
            {
                d[len(PODRES_PREFIX) :]
                for d in bt.prefer_close_to_devices
                if d.startswith(PODRES_PREFIX)
            }
        )
        if devices and not (bt.prefer_new_balloons and bt.prefer_spreading_pods):
            self.warnings.append(
                f"balloon type {name} prefers affinity container's devices {list_v(devices)},"
                " but the same balloon may contain many containers because"
                f" PreferNewBalloons={_go_bool(bt.prefer_new_balloons)} (suggest: true) and"
                f" PreferSpreadingPods={_go_bool(bt.prefer_spreading_pods)} (suggest: true)"
                " to prefer single container per balloon"
            )

    def composite(self, bt: BalloonType) -> None:
        for text in composite_type_errors(bt):
            self.bln(text)

    def validate_config(self, types: list[BalloonType]) -> None:
        user_reserved = next(
            (t for t in reversed(self.spec.balloon_types) if t.name == RESERVED), None
        )
        seen: set[str] = set()
        loads: dict[str, None] = {}
        sched: dict[str, None] = {}
        composites: dict[str, BalloonType] = {}
        for bt in types:
            if not bt.name:
                self.bln("missing or empty name in a balloon type")
                continue
            if bt.name in seen:
                self.bln(f"two balloon types with the same name: {quote(bt.name)}")
            seen.add(bt.name)
            if bt.components:
                composites.setdefault(bt.name, bt)
            self.balloon_type(bt, user_reserved)
            loads.update(dict.fromkeys(bt.loads))
            if bt.scheduling_class:
                sched[bt.scheduling_class] = None
        for i, lc in enumerate(self.spec.load_classes):
            loads.pop(lc.name, None)
            if not lc.name:
                self.bln(f"missing or empty name in a load classes list, index {i}")
            elif lc.level not in LOAD_LEVELS:
                self.bln(f"missing or invalid level in load class {quote(lc.name)}")
        if loads:
            self.bln(
                f"loads defined in balloonTypes but missing from loadClasses: {map_v(list(loads))}"
            )
        for sc in self.spec.scheduling_classes:
            sched.pop(sc.name, None)
        if sched:
            self.bln(
                "schedulingClass(es) defined in balloonTypes but missing from"
                f" schedulingClasses: {map_v(list(sched))}"
            )
        class_names = self.cpu_classes(self.spec.cpu_classes)
        for bt in types:
            if bt.cpu_class and bt.cpu_class not in class_names:
                self.warnings.append(
                    f"cpuClass {quote(bt.cpu_class)} referenced by balloon type {quote(bt.name)}"
                    " is not defined in cpuClasses"
                )
        for text in composition_errors(composites, seen):
            self.bln(text)

    # -- cpuClasses (policy.ValidateCPUClasses) -----------------------------------------

    def cpu_class(self, cc: CPUClass) -> Iterable[str]:
        """Upstream ``CPUClass.Validate``, every error instead of the first."""
        name = quote(cc.name)
        if cc.pct_priority and cc.sst_clos_id is not None:
            yield f"cpuClass {name}: pctPriority and sstClosID are mutually exclusive"
        if cc.pct_priority not in PCT_PRIORITIES:
            yield (
                f"cpuClass {name}: invalid pctPriority {quote(cc.pct_priority)}"
                ' (allowed: "high", "low")'
            )
        if cc.sst_clos_id is not None and cc.sst_clos_id < 0:
            yield f"cpuClass {name}: sstClosID must be >= 0, got {cc.sst_clos_id}"
        if cc.pct_min_freq or cc.pct_max_freq:
            if cc.sst_clos_id is not None:
                yield (
                    f"cpuClass {name}: pctMinFreq/pctMaxFreq require pctPriority (managed mode);"
                    " they are incompatible with sstClosID, where the SST CLOS is pre-programmed"
                    " by intel-speed-select/BIOS"
                )
            elif not cc.pct_priority:
                yield (
                    f"cpuClass {name}: pctMinFreq/pctMaxFreq require pctPriority (managed mode);"
                    " the cpuClass is currently not a PCT class"
                )
        if cc.publish_extended_resource and not cc.is_pct:
            yield (
                f"cpuClass {name}: publishExtendedResource requires the cpuClass to be a PCT"
                " class (set pctPriority or sstClosID)"
            )

    def cpu_classes(self, classes: Sequence[CPUClass]) -> set[str]:
        names: set[str] = set()
        managed: dict[str, str] = {}
        assoc_only: dict[str, int] = {}
        for cc in classes:
            if not cc.name:
                self.errors.append(INVALID + "missing or empty name in a cpuClasses entry")
                continue
            self.errors.extend(INVALID + e for e in self.cpu_class(cc))
            if cc.name in names:
                self.errors.append(INVALID + f"duplicate cpuClasses name: {quote(cc.name)}")
            if cc.pct_priority:
                managed[cc.name] = cc.pct_priority
            elif cc.sst_clos_id is not None:
                assoc_only[cc.name] = cc.sst_clos_id
            names.add(cc.name)
        if managed and assoc_only:
            self.errors.append(
                INVALID + "pct: cannot mix managed (pctPriority) and assoc-only (sstClosID) modes:"
                " mixing managed (pctPriority) and assoc-only (sstClosID) PCT cpuClasses is not"
                f" allowed: managed={map_v(managed)}, assocOnly={map_v(assoc_only)}"
            )
        for prio in ("high", "low"):
            tier = sorted(n for n, p in managed.items() if p == prio)
            if len(tier) > 1:
                self.errors.append(
                    INVALID + f"at most one managed PCT cpuClass with pctPriority={prio} allowed,"
                    f" got {len(tier)}: {list_v(tier)}"
                )
        return names


def validate(
    config: BalloonsPolicy | BalloonsPolicySpec,
    *,
    online_cpus: int | None,
    interrupts: Sequence[tuple[int, str]] | None = None,
) -> Validation:
    """Check a configuration; every error and warning, and the prepared config
    when there are no errors.

    ``online_cpus`` is the node's online CPU mask; ``None`` skips the checks
    that need it (reserved CPUs inside the allowed ones). ``interrupts`` are the
    ``(number, description)`` pairs of ``/proc/interrupts``; ``None`` skips the
    ``irqClaim`` check against ``controllableInterrupts``.
    """
    spec = config.spec if isinstance(config, BalloonsPolicy) else config
    spec, legacy_warnings = merge_legacy_cpu_classes(spec)
    v = _Validator(spec, online_cpus, interrupts)
    v.warnings.extend(legacy_warnings)
    v.schema()
    v.resource_level()
    allowed = v.allowed_cpus()
    v.interrupt_patterns()
    types, reserved_type, default_type, reserved = v.builtin_types(allowed)
    v.validate_config(types)
    v.errors.extend(endpoint_errors(spec, INVALID))
    result = Validation(errors=v.errors, warnings=v.warnings)
    if result.ok:
        result.prepared = PreparedConfig(
            spec=spec,
            balloon_types=types,
            reserved_type=reserved_type,
            default_type=default_type,
            allowed=allowed,
            reserved=reserved,
        )
    return result

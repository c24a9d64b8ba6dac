"""The ``BalloonsPolicy`` configuration: typed structs and defaults.

Field names are upstream's JSON names (``config.nri/v1alpha1``,
``BalloonsPolicy``), so the YAML operators apply to upstream applies here
unchanged. A document is either the whole custom resource (``apiVersion``,
``kind``, ``metadata``, ``spec``; ``status`` is ignored) or just its ``spec``.
:mod:`nri_balloons.validation` checks the decoded structs.

Defaults are the CRD's (what the API server fills in) and upstream's
``setOmittedDefaults``, the structs' field defaults:

* ``pinCPU``, ``pinMemory``: true; ``reservedPoolNamespaces``: [kube-system];
* ``turboDomain``: package; ``controllableInterrupts``: ["*"];
* ``agent``: ``{nodeResourceTopology: true}`` when the section is omitted;
* ``balloonTypes[].allocatorPriority``: high;
* ``instrumentation.reportPeriod``: 30s; ``instrumentation.metrics``:
  ``{enabled: [policy, buildinfo]}`` when omitted.

Enumerations and ranges are checked by :func:`nri_balloons.validation.validate`,
which reports every error at once.

This module holds the msgspec structs of the spec, their defaults and the
amounts of ``availableResources``/``reservedResources``; the text is parsed
within bounds by :mod:`nri_balloons.configyaml` (:func:`load_policy`) and
decoded strictly, with every problem, by :mod:`nri_balloons.configdecode`.

The structs' annotations are evaluated when their classes are made (no
``from __future__ import annotations``): msgspec reads a struct's annotations
when it first converts to it and again for :func:`msgspec.inspect.type_info`
(the schema walk), and each string annotation is compiled anew each time
(about 300 here: ~2 ms of every start).
"""

import enum
from typing import Annotated, Any

import msgspec
from nri_framework import cpuset
from nri_framework.cpuset import MAX_IDS

from nri_balloons.expression import Expression
from nri_balloons.frequency import Frequency
from nri_balloons.gofmt import list_v, quote

API_VERSION = "config.nri/v1alpha1"
KIND = "BalloonsPolicy"

#: Range of Go's ``int``, what upstream decodes integer fields into.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
#: A count of CPUs or balloons: no node has more CPUs than cpuset ids.
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_IDS)]
#: An upper limit of CPUs or balloons: 0 is "unlimited"; a negative value is
#: upstream's ``MinCpus (0) > MaxCpus (-1)`` error.
Limit = Annotated[int, msgspec.Meta(le=MAX_IDS)]

RESERVED = "reserved"
DEFAULT = "default"
KUBE_SYSTEM = "kube-system"


class _Obj(
    msgspec.Struct, kw_only=True, forbid_unknown_fields=True, rename="camel", omit_defaults=True
):
    """Base of the config structs: camelCase names, unknown fields rejected."""


# --- balloons.Config -------------------------------------------------------------


class BalloonComponent(_Obj):
    balloon_type: str = ""


class BalloonType(_Obj):
    """One ``balloonTypes[]`` entry (upstream ``BalloonDef``)."""

    name: str = ""
    components: list[BalloonComponent] = []
    component_creation: str = ""
    namespaces: list[str] = []
    group_by: str = ""
    match_expressions: list[Expression] = []
    max_cpus: Limit = msgspec.field(default=0, name="maxCPUs")
    min_cpus: Count = msgspec.field(default=0, name="minCPUs")
    memory_types: list[str] = []
    pin_memory: bool | None = None
    allocator_priority: str = "high"
    prefer_spread_on_physical_cores: bool | None = None
    hide_hyperthreads: bool | None = None
    allocator_topology_balancing: bool | None = None
    cpu_class: str = ""
    loads: list[str] = []
    min_balloons: Count = 0
    max_balloons: Limit = 0
    prefer_spreading_pods: bool = False
    prefer_per_namespace_balloon: bool = False
    prefer_new_balloons: bool = False
    share_idle_cpus_in_same: str = msgspec.field(default="", name="shareIdleCPUsInSame")
    prefer_close_to_devices: list[str] = []
    prefer_isol_cpus: bool = False
    prefer_core_type: str = ""
    scheduling_class: str = ""
    show_containers_in_nrt: bool | None = None
    irq_claim: list[str] = []
    irq_mode: str = ""


class LoadClass(_Obj):
    name: str = ""
    level: str = ""
    overloads_level_in_balloon: bool = False


class SchedulingClass(_Obj):
    name: str = ""
    policy: str = ""
    priority: int | None = None
    flags: list[str] = []
    nice: int | None = None
    runtime: int | None = None
    deadline: int | None = None
    period: int | None = None
    io_class: str = msgspec.field(default="", name="ioClass")
    io_priority: int | None = msgspec.field(default=None, name="ioPriority")


class CPUClass(_Obj):
    """One ``cpuClasses[]`` entry (upstream ``policy.CPUClass``)."""

    name: str = ""
    min_freq: Frequency = Frequency(0)
    max_freq: Frequency = Frequency(0)
    energy_performance_preference: int = 0
    uncore_min_freq: Frequency = Frequency(0)
    uncore_max_freq: Frequency = Frequency(0)
    freq_governor: str = ""
    disabled_cstates: list[str] = []
    turbo_priority: int = 0
    pct_priority: str = ""
    sst_clos_id: int | None = msgspec.field(default=None, name="sstClosID")
    pct_min_freq: Frequency = Frequency(0)
    pct_max_freq: Frequency = Frequency(0)
    publish_extended_resource: bool = False

    @property
    def is_pct(self) -> bool:
        return bool(self.pct_priority) or self.sst_clos_id is not None


class ContainerMatch(_Obj):
    match_expressions: list[Expression] = []


# --- control, log, instrumentation, agent ----------------------------------------


class LegacyCPUClass(_Obj):
    """A deprecated ``control.cpu.classes`` entry; frequencies are integer kHz."""

    min_freq: int = 0
    max_freq: int = 0
    energy_performance_preference: int = 0
    uncore_min_freq: int = 0
    uncore_max_freq: int = 0
    freq_governor: str = ""
    disabled_cstates: list[str] = []


class CPUControl(_Obj):
    classes: dict[str, LegacyCPUClass]


class CatOptions(_Obj):
    optional: bool


class RdtOptions(_Obj):
    l2: CatOptions | None = None
    l3: CatOptions | None = None
    mb: CatOptions | None = None


class CacheIdCat(_Obj):
    unified: str = ""
    code: str = ""
    data: str = ""


class RdtClass(_Obj):
    l2_allocation: dict[str, CacheIdCat] = {}
    l3_allocation: dict[str, CacheIdCat] = {}
    mb_allocation: dict[str, list[str]] = {}


class RdtPartition(RdtClass):
    classes: dict[str, RdtClass] = {}


class RdtControl(_Obj):
    enable: bool = False
    use_pod_qos_as_default_class: bool = msgspec.field(
        default=False, name="usePodQoSAsDefaultClass"
    )
    options: RdtOptions | None = None
    partitions: dict[str, RdtPartition] = {}
    force: bool = False


class BlockIOControl(_Obj):
    enable: bool = False
    use_pod_qos_as_default_class: bool = msgspec.field(
        default=False, name="usePodQoSAsDefaultClass"
    )


class Control(_Obj):
    cpu: CPUControl | None = None
    rdt: RdtControl = msgspec.field(default_factory=RdtControl)
    blockio: BlockIOControl = msgspec.field(default_factory=BlockIOControl)


class KlogConfig(_Obj, rename=None):
    """klog flags, by their flag names."""

    add_dir_header: bool | None = None
    alsologtostderr: bool | None = None
    alsologtostderrthreshold: str | None = None
    legacy_stderr_threshold_behavior: bool | None = None
    log_backtrace_at: str | None = None
    log_dir: str | None = None
    log_file: str | None = None
    log_file_max_size: int | None = None
    logtostderr: bool | None = None
    one_output: bool | None = None
    skip_headers: bool | None = None
    skip_log_headers: bool | None = None
    stderrthreshold: str | None = None
    v: int | None = None
    vmodule: str | None = None


class LogConfig(_Obj):
    debug: list[str] = []
    source: bool = False
    klog: KlogConfig = msgspec.field(default_factory=KlogConfig)


class MetricsConfig(_Obj):
    enabled: list[str] = []
    polled: list[str] = []


def _default_metrics() -> MetricsConfig:
    return MetricsConfig(enabled=["policy", "buildinfo"])


class InstrumentationConfig(_Obj):
    sampling_rate_per_million: int = 0
    tracing_collector: str = ""
    metrics_exporter: str = ""
    report_period: str = "30s"
    log_exporter: str = ""
    log_export_period: str = ""
    http_endpoint: str = msgspec.field(default="", name="httpEndpoint")
    prometheus_export: bool = False
    metrics: MetricsConfig = msgspec.field(default_factory=_default_metrics)


class AgentConfig(_Obj):
    node_resource_topology: bool = False
    pod_resource_api: bool = msgspec.field(default=False, name="podResourceAPI")
    #: Not upstream: the least time between two NRT writes (Go duration; "" is 10s).
    node_resource_topology_window: str = ""


def _default_agent() -> AgentConfig:
    return AgentConfig(node_resource_topology=True)


# --- the spec and the resource -----------------------------------------------------


class BalloonsPolicySpec(_Obj):
    """``spec`` of a ``BalloonsPolicy``: upstream ``balloons.Config`` inlined with
    ``control``, ``log``, ``instrumentation`` and ``agent``."""

    reserved_resources: dict[str, str]
    pin_cpu: bool = msgspec.field(default=True, name="pinCPU")
    pin_memory: bool = True
    idle_cpu_class: str = msgspec.field(default="", name="idleCPUClass")
    reserved_pool_namespaces: list[str] = msgspec.field(default_factory=lambda: [KUBE_SYSTEM])
    allocator_topology_balancing: bool = False
    prefer_spread_on_physical_cores: bool = False
    balloon_types: list[BalloonType] = []
    available_resources: dict[str, str] = {}
    preserve: ContainerMatch | None = None
    show_containers_in_nrt: bool | None = None
    load_classes: list[LoadClass] = []
    scheduling_classes: list[SchedulingClass] = []
    cpu_classes: list[CPUClass] = []
    turbo_domain: str = "package"
    controllable_interrupts: list[str] = msgspec.field(default_factory=lambda: ["*"])
    control: Control = msgspec.field(default_factory=Control)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    instrumentation: InstrumentationConfig = msgspec.field(default_factory=InstrumentationConfig)
    agent: AgentConfig = msgspec.field(default_factory=_default_agent)


class BalloonsPolicy(_Obj):
    """The custom resource. ``status`` is accepted and ignored."""

    spec: BalloonsPolicySpec
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = {}
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


# --- amounts (availableResources / reservedResources) ----------------------------


class AmountKind(enum.Enum):
    ABSENT = "absent"
    QUANTITY = "quantity"
    CPUSET = "cpuset"
    EXCLUDE_CPUSET = "exclude-cpuset"


PREFIX_CPUSET = "cpuset:"
PREFIX_EXCLUDE_CPUSET = "exclude-cpuset:"


def amount(constraints: dict[str, str], domain: str = "cpu") -> tuple[str, AmountKind]:
    """Upstream ``Constraints.Get``: the amount without its prefix, and its kind."""
    value = constraints.get(domain)
    if value is None:
        return "", AmountKind.ABSENT
    if value.startswith(PREFIX_CPUSET):
        return value[len(PREFIX_CPUSET) :], AmountKind.CPUSET
    if value.startswith(PREFIX_EXCLUDE_CPUSET):
        return value[len(PREFIX_EXCLUDE_CPUSET) :], AmountKind.EXCLUDE_CPUSET
    return value, AmountKind.QUANTITY


def cpuset_error(amt: str, what: str, exc: cpuset.CpusetError) -> str:
    """Upstream's text for a ``cpuset:`` amount of ``what`` (``reserved``,
    ``available``) CPUs that does not parse."""
    shown = cpuset.clip(amt)
    return (
        f"balloons: failed to parse {what} CPU cpuset '{shown}': "
        f"failed to parse amount '{shown}' as cpuset: {exc}"
    )


# --- legacy control.cpu.classes ------------------------------------------------------


def _from_legacy(name: str, legacy: LegacyCPUClass) -> CPUClass:
    return CPUClass(
        name=name,
        min_freq=Frequency(legacy.min_freq),
        max_freq=Frequency(legacy.max_freq),
        energy_performance_preference=legacy.energy_performance_preference,
        uncore_min_freq=Frequency(legacy.uncore_min_freq),
        uncore_max_freq=Frequency(legacy.uncore_max_freq),
        freq_governor=legacy.freq_governor,
        disabled_cstates=list(legacy.disabled_cstates),
    )


def merge_legacy_cpu_classes(spec: BalloonsPolicySpec) -> tuple[BalloonsPolicySpec, list[str]]:
    """Fold deprecated ``control.cpu.classes`` into ``cpuClasses`` (upstream
    ``mergeLegacyCpuClasses``): names not in ``cpuClasses`` are appended in
    sorted order; an explicit entry with other values wins, with a warning.
    Idempotent. Returns the new spec and the warnings."""
    legacy = spec.control.cpu.classes if spec.control.cpu else {}
    if not legacy:
        return spec, []
    existing = {cc.name: cc for cc in spec.cpu_classes}
    warnings: list[str] = []
    added: list[CPUClass] = []
    for name in sorted(legacy):
        synth = _from_legacy(name, legacy[name])
        prev = existing.get(name)
        if prev is not None:
            if prev != synth:
                warnings.append(
                    f"control.cpu.classes entry {quote(name)} overridden by cpuClasses entry;"
                    " remove the legacy entry to silence this warning"
                )
            continue
        added.append(synth)
        existing[name] = synth
    if added:
        warnings.insert(
            0,
            "control.cpu.classes is deprecated; converted to cpuClasses: "
            + list_v(c.name for c in added),
        )
    merged = msgspec.structs.replace(spec, cpu_classes=[*spec.cpu_classes, *added])
    return merged, warnings


# --- plain data ----------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Frequency):
        return obj.to_json()
    raise NotImplementedError(f"cannot encode {type(obj)}")


def to_builtins(obj: msgspec.Struct) -> Any:
    """The struct as plain data with upstream's JSON names (for dumps and diffs)."""
    return msgspec.to_builtins(obj, enc_hook=_enc_hook)

"""The ``BalloonsPolicy`` configuration: typed structs, defaults, decoding.

Field names are upstream's JSON names (``config.nri/v1alpha1``,
``BalloonsPolicy``), so the YAML operators apply to upstream applies here
unchanged. A document is either the whole custom resource (``apiVersion``,
``kind``, ``metadata``, ``spec``; ``status`` is ignored) or just its ``spec``.
:mod:`nri_balloons.validation` checks the decoded structs.

Decoding (:func:`load_policy`, :func:`decode_policy`) is strict, like
upstream's ``--config-file`` (``yaml.UnmarshalStrict``): an unknown field is an
error, not silently dropped (the API server prunes unknown fields of a custom
resource, which hides an operator's typo until the policy misbehaves). The
document is walked against the schema first and *every* problem is reported,
each with ``SOURCE:LINE:COLUMN:`` and its field path:

* ``unknown field "spec.balloonTypes[0].maxCpus" (did you mean "maxCPUs"?)``
* ``spec.balloonTypes[0].minCPUs: expected int, got str``
* ``missing required field "spec.reservedResources"``
* ``spec.cpuClasses[0].maxFreq: invalid frequency "3GBz": ...``

YAML syntax errors raise :class:`ConfigSyntaxError` with the position.

The text may be hostile: nothing in it can make the loader recurse, allocate
or compute without bound. A document nested deeper than :data:`MAX_DEPTH`,
expanding (through aliases) to more than :data:`MAX_NODES` nodes, holding a
recursive alias, or taking longer than its time budget to parse is a
:class:`ConfigSyntaxError` with the position; a character YAML forbids (a NUL
byte) too. Integers must fit Go's ``int`` (int64) and the counts of CPUs and
balloons lie in ``0..8192`` (``cpuset.MAX_IDS``), reported in the API server's
words with the position::

    x.yaml:4:14: spec.balloonTypes[0].minCPUs: Invalid value: -5:
    spec.balloonTypes[0].minCPUs in body should be greater than or equal to 0

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
"""

from __future__ import annotations

import difflib
import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, NamedTuple

import msgspec
import msgspec.inspect as mi
import yaml
from nri_framework import cpuset
from nri_framework.cpuset import MAX_IDS

from nri_balloons.expression import Expression
from nri_balloons.frequency import Frequency, FrequencyError
from nri_balloons.gofmt import list_v, quote

API_VERSION = "config.nri/v1alpha1"
KIND = "BalloonsPolicy"

#: Nesting levels of a document (a real BalloonsPolicy uses about ten).
MAX_DEPTH = 64
#: Nodes of a text's documents, aliases expanded (a 4 MiB file holds fewer).
MAX_NODES = 1 << 20
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


# --- decoding: YAML -> BalloonsPolicy, strictly, with every problem ---------------------


class ConfigError(ValueError):
    """A document that is not a valid ``BalloonsPolicy``; ``errors`` lists them all."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


class ConfigSyntaxError(ConfigError):
    """Text that is not YAML, or holds no document."""


Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    """``("spec", "balloonTypes", 0, "name")`` -> ``spec.balloonTypes[0].name``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


# --- the schema walk -------------------------------------------------------------------


class Problem(NamedTuple):
    path: Path
    message: str
    at_key: bool = False  # point at the key rather than the value


def _kind(obj: object) -> str:
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, (int, float, str)):
        return type(obj).__name__
    if isinstance(obj, list):
        return "array"
    if isinstance(obj, dict):
        return "object"
    return type(obj).__name__


def _expected(info: mi.Type) -> str:
    if isinstance(info, mi.UnionType):
        return " | ".join(_expected(t) for t in info.types)
    if isinstance(info, mi.CustomType) and info.cls is Frequency:
        return "str | int"
    names: list[tuple[type[mi.Type], str]] = [
        (mi.StrType, "str"),
        (mi.IntType, "int"),
        (mi.BoolType, "bool"),
        (mi.FloatType, "float"),
        (mi.ListType, "array"),
        (mi.DictType, "object"),
        (mi.StructType, "object"),
        (mi.NoneType, "null"),
    ]
    return next((name for cls, name in names if isinstance(info, cls)), "value")


def _accepts(info: mi.Type, obj: object) -> bool:
    """Whether ``obj`` has the right shape for ``info`` (not looking inside)."""
    if isinstance(info, mi.AnyType):
        return True
    if isinstance(info, mi.UnionType):
        return any(_accepts(t, obj) for t in info.types)
    if isinstance(info, mi.CustomType):
        return isinstance(obj, (str, int, float)) and not isinstance(obj, bool)
    if isinstance(info, mi.NoneType):
        return obj is None
    if isinstance(info, mi.BoolType):
        return isinstance(obj, bool)
    if isinstance(info, mi.IntType):
        return isinstance(obj, int) and not isinstance(obj, bool)
    if isinstance(info, mi.FloatType):
        return isinstance(obj, (int, float)) and not isinstance(obj, bool)
    if isinstance(info, mi.StrType):
        return isinstance(obj, str)
    if isinstance(info, mi.ListType):
        return isinstance(obj, list)
    if isinstance(info, (mi.DictType, mi.StructType)):
        return isinstance(obj, dict)
    return True


def _unknown(path: Path, known: list[str]) -> Problem:
    name = str(path[-1])
    guess = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    guess = guess or [k for k in known if k.lower() == name.lower()]
    hint = f" (did you mean {quote(guess[0])}?)" if guess else ""
    return Problem(path, f"unknown field {quote(format_path(path))}{hint}", at_key=True)


def schema_problems(obj: object, info: mi.Type, path: Path = ()) -> Iterator[Problem]:
    """Every place where ``obj`` does not fit the msgspec schema ``info``."""
    if isinstance(info, mi.UnionType):
        fitting = [t for t in info.types if _accepts(t, obj)]
        if fitting:
            yield from schema_problems(obj, fitting[0], path)
            return
    if not _accepts(info, obj):
        where = f"{format_path(path)}: " if path else ""
        yield Problem(path, f"{where}expected {_expected(info)}, got {_kind(obj)}")
    elif isinstance(info, mi.StructType) and isinstance(obj, dict):
        fields = {f.encode_name: f for f in info.fields}
        for key, value in obj.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                yield _unknown((*path, str(key)), sorted(fields))
            else:
                yield from schema_problems(value, field.type, (*path, key))
        for field in info.fields:
            if field.required and field.encode_name not in obj:
                full = format_path((*path, field.encode_name))
                yield Problem(path, f"missing required field {quote(full)}")
    elif isinstance(info, mi.ListType) and isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from schema_problems(item, info.item_type, (*path, i))
    elif isinstance(info, mi.DictType) and isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                yield Problem((*path, key), f"{format_path(path)}: key {key!r} is not a string")
            else:
                yield from schema_problems(value, info.value_type, (*path, key))
    elif isinstance(info, mi.IntType) and isinstance(obj, int):
        yield from _int_problems(obj, info, path)
    elif isinstance(info, mi.CustomType) and info.cls is Frequency:
        try:
            Frequency.from_json(obj)
        except FrequencyError as exc:
            yield Problem(path, f"{format_path(path)}: {exc}")


def _int_problems(value: int, info: mi.IntType, path: Path) -> Iterator[Problem]:
    """An integer outside its field's bounds, or Go's int64, in the API server's words."""
    at = format_path(path)
    shown = str(value) if value.bit_length() < 256 else f"{str(value)[:20]}... (too large)"
    invalid = f"{at}: Invalid value: {shown}: {at} in body"
    if info.le is not None and value > info.le:
        yield Problem(path, f"{invalid} should be less than or equal to {info.le}")
    elif info.ge is not None and value < info.ge:
        yield Problem(path, f"{invalid} should be greater than or equal to {info.ge}")
    elif not INT64_MIN <= value <= INT64_MAX:
        yield Problem(path, f"{invalid} must be of type int64")


# --- positions ------------------------------------------------------------------------


def _locate(node: yaml.Node | None, path: Path, *, at_key: bool) -> tuple[int, int] | None:
    """1-based line and column of ``path`` in a composed YAML tree (of its key
    when ``at_key``), or of the deepest ancestor found."""
    if node is None:
        return None
    at: yaml.Node = node
    for i, part in enumerate(path):
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if pair is None:
                break
            at = pair[0] if at_key and i == len(path) - 1 else pair[1]
            node = pair[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            at = node = node.value[part]
        else:
            break
    return at.start_mark.line + 1, at.start_mark.column + 1


def _amount_problems(spec: object, path: Path) -> Iterator[Problem]:
    """``cpuset:`` amounts of ``reservedResources``/``availableResources`` that
    do not parse, CPU ids out of range included: reported while the positions
    are known, in upstream's words."""
    if not isinstance(spec, dict):
        return
    for key, what in (("reservedResources", "reserved"), ("availableResources", "available")):
        resources = spec.get(key)
        value = resources.get("cpu") if isinstance(resources, dict) else None
        if not isinstance(value, str):
            continue
        amt, kind = amount({"cpu": value})
        if kind in (AmountKind.CPUSET, AmountKind.EXCLUDE_CPUSET):
            try:
                cpuset.parse(amt)
            except cpuset.CpusetError as exc:
                yield Problem((*path, key, "cpu"), cpuset_error(amt, what, exc))


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Frequency:
        try:
            return Frequency.from_json(obj)
        except FrequencyError as exc:
            raise ValueError(str(exc)) from None
    raise NotImplementedError(f"cannot decode {tp}")


def _is_resource(doc: dict[Any, Any]) -> bool:
    return any(k in doc for k in ("apiVersion", "kind", "metadata", "spec"))


def decode_policy(
    doc: object, *, source: str = "", node: yaml.Node | None = None
) -> BalloonsPolicy:
    """A parsed document (a ``BalloonsPolicy`` or just its spec) as a
    :class:`BalloonsPolicy`; :class:`ConfigError` lists every problem.
    ``node``, the composed YAML of the same document, adds positions."""

    def where(problem: Problem) -> str:
        pos = _locate(node, problem.path, at_key=problem.at_key)
        prefix = f"{source}:{pos[0]}:{pos[1]}: " if pos else f"{source}: " if source else ""
        return prefix + problem.message

    if not isinstance(doc, dict):
        raise ConfigError([where(Problem((), "document is not a mapping"))])
    problems: list[Problem] = []
    target: type[BalloonsPolicy | BalloonsPolicySpec] = BalloonsPolicySpec
    if _is_resource(doc):
        target = BalloonsPolicy
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key in doc and doc[key] != want:
                problems.append(Problem((key,), f"{key} {quote(str(doc[key]))} is not {want}"))
    problems.extend(schema_problems(doc, mi.type_info(target)))
    if target is BalloonsPolicy:
        problems.extend(_amount_problems(doc.get("spec"), ("spec",)))
    else:
        problems.extend(_amount_problems(doc, ()))
    if problems:
        raise ConfigError([where(p) for p in problems])
    try:
        decoded = msgspec.convert(doc, target, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:  # the walk should have caught it
        raise ConfigError([where(Problem((), str(exc)))]) from None
    if isinstance(decoded, BalloonsPolicySpec):
        return BalloonsPolicy(spec=decoded)
    assert isinstance(decoded, BalloonsPolicy)
    return decoded


# --- YAML text --------------------------------------------------------------------------


#: Seconds a text may take to parse (a 4 MiB file takes a few on a busy node).
PARSE_TIMEOUT = 10.0
#: Digits of an integer scalar (Python refuses to convert more than 4300).
MAX_INT_DIGITS = 80


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with bounds: its composer recurses once per
    nesting level, so depth is checked before each level; every 512 nodes it
    looks at the clock; integer scalars are refused before conversion when
    longer than :data:`MAX_INT_DIGITS`."""

    def __init__(self, text: str, timeout: float | None, clock: Callable[[], float]) -> None:
        self.timeout = timeout
        self.clock = clock
        self.deadline = None if timeout is None else clock() + timeout
        self.depth = 0
        self.composed = 0
        super().__init__(text)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self.composed += 1
        if self.depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"document nested deeper than {MAX_DEPTH} levels", mark
            )
        if self.deadline is not None and self.composed % 512 == 0 and self.clock() > self.deadline:
            raise yaml.composer.ComposerError(
                None, None, f"document takes longer than {self.timeout:g}s to parse", mark
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if len(node.value) > MAX_INT_DIGITS:
            raise yaml.constructor.ConstructorError(
                None, None, f"integer of more than {MAX_INT_DIGITS} digits", node.start_mark
            )
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node, budget: int) -> int:
    """Aliases share nodes: the document they expand to must stay within
    :data:`MAX_DEPTH` and ``budget`` nodes (a "billion laughs" text is small),
    and must not contain itself; returns its size. Iterative: the check must
    not recurse either."""
    size: dict[int, tuple[int, int]] = {}  # id -> (nodes, depth) once done
    open_: set[int] = set()  # on the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            kids = [size[id(k)] for k in _children(node)]
            nodes = 1 + sum(n for n, _ in kids)
            depth = 1 + max((d for _, d in kids), default=0)
            if nodes > budget or depth > MAX_DEPTH:
                what = f"{MAX_NODES} nodes" if nodes > budget else f"{MAX_DEPTH} levels"
                raise yaml.composer.ComposerError(
                    None, None, f"aliases expand the document beyond {what}", node.start_mark
                )
            size[key] = (nodes, depth)
            continue
        if key in size:
            continue
        if key in open_:
            raise yaml.composer.ComposerError(
                None, None, "recursive alias: a node contains itself", node.start_mark
            )
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in size)
    return size[id(root)][0]


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character ``index``."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def _yaml_error(source: str, exc: yaml.YAMLError, text: str) -> str:
    if isinstance(exc, yaml.reader.ReaderError):  # a forbidden character: no mark
        line, column = _position(text, exc.position)
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        return (
            f"{source}:{line}:{column}: invalid YAML: unacceptable character {char}: {exc.reason}"
        )
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"{where}: invalid YAML: {context + ', ' if context else ''}{problem}"


def parse_yaml(
    text: str,
    *,
    source: str = "<config>",
    timeout: float | None = PARSE_TIMEOUT,
    clock: Callable[[], float] = time.monotonic,
) -> list[tuple[object, yaml.Node]]:
    """The non-empty documents of a YAML text with their composed nodes.

    Raises :class:`ConfigSyntaxError` for text that is not YAML or is beyond
    the bounds (depth, size, ``timeout`` seconds of ``clock``)."""
    docs: list[tuple[object, yaml.Node]] = []
    nodes = 0  # of every document: MAX_NODES is for the whole text
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, timeout, clock)  # checks the characters
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            nodes += _check_expansion(node, MAX_NODES - nodes)
            doc = loader.construct_document(node)
            if doc is not None:
                docs.append((doc, node))
    except yaml.YAMLError as exc:
        raise ConfigSyntaxError([_yaml_error(source, exc, text)]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return docs


def load_policy(
    text: str, *, source: str = "<config>", timeout: float | None = PARSE_TIMEOUT
) -> BalloonsPolicy:
    """Parse and decode a YAML text holding exactly one ``BalloonsPolicy`` (or spec)."""
    docs = parse_yaml(text, source=source, timeout=timeout)
    if len(docs) != 1:
        raise ConfigSyntaxError([f"{source}: expected one YAML document, found {len(docs)}"])
    doc, node = docs[0]
    return decode_policy(doc, source=source, node=node)

"""The helper protocol: a closed set of msgspec tagged-union Structs, msgpack on the wire.

Framing (ZeroMQ): the client (DEALER) sends ``[b"", request_id, payload]``; the
helper (ROUTER) answers ``[b"", request_id, reply]`` with the same 8-byte
``request_id`` so late replies to timed-out requests are recognised and dropped.

Conventions:

* **CPUs are a list of ints** (``list[int]``) everywhere, never list-format
  strings: they are typed, need no parser on either side and are validated one
  by one against the discovered online set.
* Frequencies are **kHz** (as cpufreq sysfs and nri-plugins use them); the
  helper converts to MHz for SST.
* Every request has exactly one typed reply, or :class:`ErrorReply`.
* A client must send :class:`Hello` first; any other request from a peer that
  has not said hello gets ``ErrorReply(code="handshake-required")``.
* Payloads larger than :data:`MAX_MESSAGE_SIZE` are refused before decoding.

The Structs' annotations are evaluated when the classes are made (no ``from
__future__ import annotations``): a decoder reads every message's annotations,
and msgspec would compile each string annotation (~150 here, ~1.4 ms). The
decoders are made at their first use, not at import (~1 ms of a plugin start
without a helper, which decodes no message).
"""

import functools
from typing import Literal

import msgspec

MAX_MESSAGE_SIZE = 64 * 1024
"""Largest request payload the helper decodes (checked before decoding)."""

CLOS_COUNT = 4
MAX_APPLY_ITEMS = 64
"""Most writes one :class:`Apply` may carry (a decision needs a handful: an
association per CLOS, a cpufreq and a C-state write per CPU group, an uncore
write per die, one IRQ write)."""
MAX_IRQ_BATCH = 1024
"""Most IRQs one :class:`SetIrqAffinity` may name (all its groups together)."""
MAX_INTERRUPTS = 4096
"""Most IRQs a :class:`ListInterruptsReply` lists (the lowest numbers)."""
MAX_ERROR_MESSAGE = 1024
"""Characters of an :class:`ErrorReply`'s message at most (a huge hostile
request gets a bounded answer: the rest is cut and marked ``…``)."""
MAX_IRQ_DESCRIPTION = 256
"""Characters of an IRQ's description a :class:`ListInterruptsReply` keeps."""
MAX_RESCTRL_GROUPS = 256
"""Most resctrl control groups one :class:`SetResctrl` may name (the
hardware's ``num_closids`` bounds it further: 16 on most Xeons)."""
MAX_RESCTRL_NAME = 64
"""Characters of a resctrl group name at most."""
CLOS_NO_LIMIT_KHZ = 25_500_000
"""CLOS max of 25500 MHz = "no limit" (intel-speed-select: "Max Turbo frequency")."""

Priority = Literal["proportional", "ordered"]

ErrorCode = Literal[
    "too-large",  # payload over MAX_MESSAGE_SIZE
    "malformed",  # not msgpack / wrong field types
    "unknown-message",  # a tag outside the closed set
    "handshake-required",  # request before Hello
    "protocol-mismatch",  # Hello with an unsupported protocol version
    "invalid-argument",  # a field failed validation against the machine
    "not-supported",  # SST (or the sysfs knob) is not available on this host
    "hardware-error",  # the backend or sysfs refused the operation
    "internal",  # a bug in the helper; it keeps running
]


class _Msg(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type"):
    pass


# --------------------------------------------------------------------------- shared records


class PPInfo(msgspec.Struct, frozen=True):
    """SST-PP of one punit (``PERF_LEVELS``)."""

    supported: bool
    current_level: int
    levels: list[int]
    locked: bool
    feature_rev: int


class CPInfo(msgspec.Struct, frozen=True):
    """SST-CP of one punit (``CORE_POWER_STATE{get}``)."""

    supported: bool
    enabled: bool
    priority: Priority


class TFBucket(msgspec.Struct, frozen=True):
    hp_cores: int
    max_mhz: list[int]
    """HP max frequency per TRL level (level-0 first); zeros dropped."""


class TFInfo(msgspec.Struct, frozen=True):
    supported: bool
    enabled: bool
    buckets: list[TFBucket]
    lp_clip_mhz: list[int]


class BFInfo(msgspec.Struct, frozen=True):
    supported: bool
    enabled: bool
    high_base_mhz: int = 0
    low_base_mhz: int = 0
    hp_cpus: list[int] = []


class ClosConfig(msgspec.Struct, frozen=True):
    clos: int
    min_khz: int
    max_khz: int
    proportional_priority: int


class PunitInfo(msgspec.Struct, frozen=True):
    package: int
    punit: int
    cpus: list[int]
    pp: PPInfo
    cp: CPInfo
    tf: TFInfo
    bf: BFInfo
    base_mhz: int
    max_hp_cpus: int
    """Largest non-zero TF bucket core count (BF HP CPU count as fallback)."""
    guaranteed_hp_cpus: int
    """Smallest non-zero TF bucket core count (BF HP CPU count as fallback)."""
    clos: list[ClosConfig]


class PackageInfo(msgspec.Struct, frozen=True):
    package: int
    cpus: list[int]
    punits: list[PunitInfo]


class CpufreqInfo(msgspec.Struct, frozen=True):
    """cpufreq of the first online CPU that has it (all CPUs alike on Xeon)."""

    min_khz: int
    base_khz: int
    max_khz: int
    governors: list[str]
    epp_preferences: list[str]


class UncoreDomain(msgspec.Struct, frozen=True):
    package: int
    die: int
    min_khz: int
    max_khz: int


class FrequencySample(msgspec.Struct, frozen=True):
    """Raw counters of one CPU; Bzy MHz = tsc_mhz * ΔAPERF / ΔMPERF over two samples."""

    cpu: int
    aperf: int
    mperf: int
    tsc: int


class PunitClos(msgspec.Struct, frozen=True):
    """The CLOS bounds of one punit as the hardware holds them (ReadFrequency)."""

    package: int
    punit: int
    cp_enabled: bool
    clos: list[ClosConfig]


class PunitTF(msgspec.Struct, frozen=True):
    package: int
    punit: int
    supported: bool
    enabled: bool


class Interrupt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One numbered IRQ of ``/proc/interrupts`` (:class:`ListInterrupts`)."""

    number: int
    description: str
    """What follows the per-CPU counters on its ``/proc/interrupts`` line
    (chip, hwirq, trigger, device: ``IR-IO-APIC 4-edge ttyS0``)."""
    affinity: list[int]
    """Its ``smp_affinity_list`` now."""
    writable: bool
    """Controllable: its affinity can be written (not per-CPU, not managed by
    the kernel, not found read-only)."""


class IrqGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """IRQs that get the same CPUs (:class:`SetIrqAffinity`)."""

    irqs: list[int]
    cpus: list[int]


class ResctrlResource(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One resource of ``/sys/fs/resctrl/info`` (:class:`ReadResctrl`): a cache
    level (``L3``, ``L3CODE``, ``L3DATA``, ``L2``...) or memory bandwidth (``MB``)."""

    name: str
    cache_ids: list[int]
    """The domains of its line in the root ``schemata`` (``L3:0=7fff;1=7fff``)."""
    num_closids: int
    cbm_mask: int = 0
    """Caches: every way (``info/L3/cbm_mask``); 0 for MB."""
    min_cbm_bits: int = 0
    bandwidth_gran: int = 0
    """MB: percentages are multiples of it; 0 for caches."""
    min_bandwidth: int = 0
    mbps: bool = False
    """MB in MBps (the ``mba_MBps`` mount option), else percent."""


class ResctrlGroup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One resctrl control group and its ``schemata`` (:class:`SetResctrl`):
    resource name -> cache id -> bitmask (caches) or bandwidth (``MB``).
    The root group is named ``""``."""

    name: str
    schemata: dict[str, dict[int, int]]


# --------------------------------------------------------------------------- requests


class Hello(_Msg, frozen=True, tag="hello"):
    protocol: int
    capabilities: list[str] = []
    client: str = ""


class Discover(_Msg, frozen=True, tag="discover"):
    pass


class PrepareManagedMode(_Msg, frozen=True, tag="prepare-managed-mode"):
    """Per package: CPReset, TFEnable, CPSetPriorityType(ordered) (sst.md §3.5).

    ``keep_programmed``: when every package is already in managed state (CP
    enabled with ordered priority, TF enabled where the level supports it),
    only enter managed mode (SIGTERM then resets SST) and leave CLOS bounds
    and associations as they are: a client that re-programs the same plan
    after a helper restart must not put every core on CLOS 0 meanwhile."""

    keep_programmed: bool = False


class ConfigureClos(_Msg, frozen=True, tag="configure-clos"):
    """CLOS_PARAM set on every punit of every package."""

    clos: int
    min_khz: int
    max_khz: int
    proportional_priority: int = 0


class EnableCP(_Msg, frozen=True, tag="enable-cp"):
    """CPEnable on every punit, keeping the priority type."""


class AssociateCpus(_Msg, frozen=True, tag="associate-cpus"):
    clos: int
    cpus: list[int]


class GetAssociation(_Msg, frozen=True, tag="get-association"):
    cpus: list[int]


class GetClosConfig(_Msg, frozen=True, tag="get-clos-config"):
    """Read from the first package's first punit, as nri assoc-only mode does."""

    clos: int


class TFStatus(_Msg, frozen=True, tag="tf-status"):
    pass


class Teardown(_Msg, frozen=True, tag="teardown"):
    """Per package: CPReset, TFDisable, CPDisable (also what SIGTERM does in managed mode)."""


class SetCstates(_Msg, frozen=True, tag="set-cstates"):
    """Disable exactly the named C-states on ``cpus`` and enable all others."""

    cpus: list[int]
    disabled: list[str]


class SetCpufreq(_Msg, frozen=True, tag="set-cpufreq"):
    """``None`` leaves a knob alone (nri's "0 means no write")."""

    cpus: list[int]
    min_khz: int | None = None
    max_khz: int | None = None
    governor: str | None = None
    epp: str | None = None


class SetUncore(_Msg, frozen=True, tag="set-uncore"):
    package: int
    die: int
    min_khz: int | None = None
    max_khz: int | None = None


class ReadFrequency(_Msg, frozen=True, tag="read-frequency"):
    """APERF/MPERF/TSC of ``cpus``; with ``clos`` also every punit's CLOS
    bounds (:class:`PunitClos`), in the same reply (one request per scrape)."""

    cpus: list[int]
    clos: bool = False


class ListInterrupts(_Msg, frozen=True, tag="list-interrupts"):
    """Every numbered IRQ with its description, affinity and whether it is controllable."""


class SetIrqAffinity(_Msg, frozen=True, tag="set-irq-affinity"):
    """Write ``smp_affinity_list`` of each IRQ of each group: at most
    :data:`MAX_IRQ_BATCH` IRQs in all, each once, each existing and writable,
    each CPU set non-empty and online. A refused request writes nothing."""

    groups: list[IrqGroup]


class ReadResctrl(_Msg, frozen=True, tag="read-resctrl"):
    """resctrl's ``info``, its groups and their ``schemata`` as they are."""


class SetResctrl(_Msg, frozen=True, tag="set-resctrl"):
    """The whole resctrl configuration at once (goresctrl's ``SetConfig``,
    computed by the plugin): every group created or kept and its schemata
    written; the groups this helper created before and no longer named are
    removed when empty (a non-empty one refuses the request, as upstream).
    ``force``: every other group is removed too, tasks or not (upstream's
    ``force``). Validated whole against ``info`` before anything is written."""

    groups: list[ResctrlGroup]
    force: bool = False


ApplyItem = AssociateCpus | SetCpufreq | SetCstates | SetUncore | SetIrqAffinity
"""The writes an :class:`Apply` carries."""


class Apply(_Msg, frozen=True, tag="apply"):
    """The writes of one decision in one round trip (capability ``apply``):
    at most :data:`MAX_APPLY_ITEMS` items, each validated as its standalone
    request is, all of them before anything is written (one invalid item
    refuses the request and nothing is written; the message names the item);
    then written in order. A write the hardware refuses is that item's
    :class:`ErrorReply` and the next items are written all the same, as
    separate requests would be. Each item is validated against the machine
    as it was before the request (the plugin names a CPU, a die and an IRQ
    in one item of each kind at most)."""

    items: list[ApplyItem]


Request = (
    Hello
    | Discover
    | PrepareManagedMode
    | ConfigureClos
    | EnableCP
    | AssociateCpus
    | GetAssociation
    | GetClosConfig
    | TFStatus
    | Teardown
    | SetCstates
    | SetCpufreq
    | SetUncore
    | ReadFrequency
    | ListInterrupts
    | SetIrqAffinity
    | ReadResctrl
    | SetResctrl
    | Apply
)


# --------------------------------------------------------------------------- replies


class HelloReply(_Msg, frozen=True, tag="hello-reply"):
    protocol: int
    backend: str
    sst_supported: bool
    capabilities: list[str]
    instance: str = ""
    """Random per helper process: the same value on a re-handshake (an evicted
    peer, a client's new socket after a timeout) means the helper's SST state
    is still what this client programmed; a new value means a restarted helper."""


class DiscoverReply(_Msg, frozen=True, tag="discover-reply"):
    supported: bool
    backend: str
    api_version: int
    online_cpus: list[int]
    packages: list[PackageInfo]
    cpufreq: CpufreqInfo | None
    cstates: list[str]
    """C-state names of the first online CPU (POLL included)."""
    uncore: list[UncoreDomain]


class PrepareManagedModeReply(_Msg, frozen=True, tag="prepare-managed-mode-reply"):
    punits: int
    reset: bool = True
    """False when ``keep_programmed`` found SST already in managed state."""


class ConfigureClosReply(_Msg, frozen=True, tag="configure-clos-reply"):
    config: ClosConfig
    """As read back from the first punit (MHz floored to 100)."""


class EnableCPReply(_Msg, frozen=True, tag="enable-cp-reply"):
    punits: int


class AssociateCpusReply(_Msg, frozen=True, tag="associate-cpus-reply"):
    clos: int
    cpus: list[int]
    """Every online CPU now on ``clos``: CLOS is per core, so the requested
    CPUs and all their online sibling threads."""


class GetAssociationReply(_Msg, frozen=True, tag="get-association-reply"):
    clos: dict[int, int]
    """CPU -> CLOS id."""


class GetClosConfigReply(_Msg, frozen=True, tag="get-clos-config-reply"):
    config: ClosConfig


class TFStatusReply(_Msg, frozen=True, tag="tf-status-reply"):
    punits: list[PunitTF]


class TeardownReply(_Msg, frozen=True, tag="teardown-reply"):
    punits: int


class SetCstatesReply(_Msg, frozen=True, tag="set-cstates-reply"):
    cpus: list[int]
    disabled: list[str]


class SetCpufreqReply(_Msg, frozen=True, tag="set-cpufreq-reply"):
    cpus: list[int]


class SetUncoreReply(_Msg, frozen=True, tag="set-uncore-reply"):
    package: int
    die: int


class ReadFrequencyReply(_Msg, frozen=True, tag="read-frequency-reply"):
    tsc_mhz: int
    samples: list[FrequencySample]
    backend: str = ""
    """The backend that read the counters (``sim``: the figures are simulated)."""
    punits: list[PunitClos] = []
    """Every punit's CLOS bounds when the request asked for ``clos`` (and SST-CP
    is supported), else empty."""


class ListInterruptsReply(_Msg, frozen=True, tag="list-interrupts-reply"):
    interrupts: list[Interrupt]
    default_affinity: list[int]
    """``/proc/irq/default_smp_affinity`` (for information; never written)."""


class SetIrqAffinityReply(_Msg, frozen=True, tag="set-irq-affinity-reply"):
    affinities: dict[int, list[int]]
    """IRQ -> its ``smp_affinity_list`` as read back after the write."""


class ReadResctrlReply(_Msg, frozen=True, tag="read-resctrl-reply"):
    mounted: bool
    """False: no resctrl under the host root (no RDT, or not mounted)."""
    resources: list[ResctrlResource]
    groups: list[ResctrlGroup]
    """The root (``""``) first, then every control group."""
    managed: list[str]
    """The groups this helper created (the only ones it removes without ``force``)."""


class SetResctrlReply(_Msg, frozen=True, tag="set-resctrl-reply"):
    groups: list[str]
    removed: list[str]


class ErrorReply(_Msg, frozen=True, tag="error"):
    code: ErrorCode
    message: str


ApplyItemReply = (
    AssociateCpusReply
    | SetCpufreqReply
    | SetCstatesReply
    | SetUncoreReply
    | SetIrqAffinityReply
    | ErrorReply
)


class ApplyReply(_Msg, frozen=True, tag="apply-reply"):
    replies: list[ApplyItemReply]
    """One per item, in order: its typed reply or its :class:`ErrorReply`."""


Reply = (
    HelloReply
    | DiscoverReply
    | PrepareManagedModeReply
    | ConfigureClosReply
    | EnableCPReply
    | AssociateCpusReply
    | GetAssociationReply
    | GetClosConfigReply
    | TFStatusReply
    | TeardownReply
    | SetCstatesReply
    | SetCpufreqReply
    | SetUncoreReply
    | ReadFrequencyReply
    | ListInterruptsReply
    | SetIrqAffinityReply
    | ReadResctrlReply
    | SetResctrlReply
    | ApplyReply
    | ErrorReply
)

REPLY_FOR: dict[type[_Msg], type[_Msg]] = {
    Hello: HelloReply,
    Discover: DiscoverReply,
    PrepareManagedMode: PrepareManagedModeReply,
    ConfigureClos: ConfigureClosReply,
    EnableCP: EnableCPReply,
    AssociateCpus: AssociateCpusReply,
    GetAssociation: GetAssociationReply,
    GetClosConfig: GetClosConfigReply,
    TFStatus: TFStatusReply,
    Teardown: TeardownReply,
    SetCstates: SetCstatesReply,
    SetCpufreq: SetCpufreqReply,
    SetUncore: SetUncoreReply,
    ReadFrequency: ReadFrequencyReply,
    ListInterrupts: ListInterruptsReply,
    SetIrqAffinity: SetIrqAffinityReply,
    ReadResctrl: ReadResctrlReply,
    SetResctrl: SetResctrlReply,
    Apply: ApplyReply,
}
"""The one typed reply of each request (besides :class:`ErrorReply`)."""


class HelperError(Exception):
    """A typed failure of a request; carries the :class:`ErrorReply` to send."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        if len(message) > MAX_ERROR_MESSAGE:
            message = message[: MAX_ERROR_MESSAGE - 1] + "…"
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message

    def reply(self) -> ErrorReply:
        return ErrorReply(code=self.code, message=self.message)


_encoder = msgspec.msgpack.Encoder()


@functools.cache
def _request_decoder() -> msgspec.msgpack.Decoder[Request]:
    """Made at the first request (the helper's): building a decoder compiles
    the types of every message, ~1 ms of a plugin start that may decode none."""
    return msgspec.msgpack.Decoder(Request)


@functools.cache
def _reply_decoder() -> msgspec.msgpack.Decoder[Reply]:
    """Made at the first reply (a plugin with a helper)."""
    return msgspec.msgpack.Decoder(Reply)


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def too_large(size: int) -> HelperError:
    """The refusal of a message of ``size`` bytes (over :data:`MAX_MESSAGE_SIZE`)."""
    return HelperError(
        "too-large", f"message of {size} bytes exceeds the limit of {MAX_MESSAGE_SIZE}"
    )


def decode_request(data: bytes) -> Request:
    """Bytes -> one of the closed request set, or :class:`HelperError`.

    The size is checked before any decoding.
    """
    if len(data) > MAX_MESSAGE_SIZE:
        raise too_large(len(data))
    try:
        return _request_decoder().decode(data)
    except RecursionError:
        raise HelperError("malformed", "malformed message: nested too deeply") from None
    except msgspec.ValidationError as exc:
        text = str(exc)
        if "Invalid value" in text and "`$.type`" in text:
            raise HelperError("unknown-message", f"unknown message: {text}") from None
        raise HelperError("malformed", f"malformed message: {text}") from None
    except msgspec.DecodeError as exc:
        raise HelperError("malformed", f"malformed message: {exc}") from None


def decode_reply(data: bytes) -> Reply:
    """Bytes -> a typed reply (client side); raises ``msgspec`` errors on garbage."""
    return _reply_decoder().decode(data)

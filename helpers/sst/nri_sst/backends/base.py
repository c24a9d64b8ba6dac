"""The abstract SST backend: one method per TPMI ioctl the helper uses (sst.md §1.2).

A backend is deliberately low level, addressed by ``(package, power domain)``
and punit core id exactly as the TPMI ioctls are, and fails with ``OSError``
carrying the errno the kernel would give (``ENOTTY`` for every TPMI failure,
sst.md §1.1). The sequences of sst.md §3 (CPReset, TFEnable, ...) live once in
:mod:`nri_sst.sst_platform` on top of this interface, so every backend shares them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from nri_sst.hostfs import Machine
from nri_sst.interrupts import Interrupts, ProcInterrupts
from nri_sst.resctrl import FsResctrl, Resctrl

MSR_TSC = 0x10
MSR_PM_LOGICAL_ID = 0x54
MSR_PLATFORM_INFO = 0xCE
MSR_MPERF = 0xE7
MSR_APERF = 0xE8
MSR_PM_ENABLE = 0x770


@dataclass(frozen=True)
class PerfLevels:
    """``ISST_IF_PERF_LEVELS`` output."""

    max_level: int
    feature_rev: int
    level_mask: int
    current_level: int
    feature_state: int
    """bit0 BF, bit1 TF."""
    locked: bool
    enabled: bool
    tf_support: int
    """API v3: bitmask of levels with TF."""
    bf_support: int


@dataclass(frozen=True)
class LevelInfo:
    """``ISST_IF_GET_PERF_LEVEL_INFO`` (the fields the helper uses), MHz."""

    base_mhz: int
    p0_mhz: int
    pm_mhz: int
    bucket_core_counts: tuple[int, ...]
    trl_freq_mhz: tuple[tuple[int, ...], ...]
    """``[trl_level][bucket]``."""


@dataclass(frozen=True)
class TurboFreqInfo:
    """``ISST_IF_GET_TURBO_FREQ_INFO``, MHz."""

    lp_clip_mhz: tuple[int, ...]
    bucket_core_counts: tuple[int, ...]
    trl_freq_mhz: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class CorePower:
    """``ISST_IF_CORE_POWER_STATE`` get."""

    enable: bool
    supported: bool
    ordered: bool


@dataclass(frozen=True)
class ClosParam:
    """``ISST_IF_CLOS_PARAM`` (MHz; the hardware stores ratios = MHz // 100)."""

    min_mhz: int
    max_mhz: int
    prop_prio: int


class Backend(ABC):
    """One SST access method. ``supported=False`` means every SST call fails."""

    name: str = "abstract"
    supported: bool = True

    def attach(self, machine: Machine) -> None:  # noqa: B027 - optional hook
        """Called with the discovered host before use and after re-discovery."""

    @abstractmethod
    def api_version(self) -> int:
        """``ISST_IF_GET_PLATFORM_INFO.api_version`` (>= 2 is TPMI)."""

    @abstractmethod
    def count_instances(self, package: int) -> int:
        """``COUNT_TPMI_INSTANCES`` -> ``valid_mask`` (bit i = power domain i)."""

    @abstractmethod
    def phy_id(self, cpu: int) -> int:
        """``GET_PHY_ID``: the cached MSR 0x54 of ``cpu``."""

    @abstractmethod
    def perf_levels(self, package: int, punit: int) -> PerfLevels: ...

    @abstractmethod
    def level_cpu_mask(self, package: int, punit: int, level: int) -> int:
        """Punit-core bitmask enabled at ``level`` (``punit_cpu_map=1``)."""

    @abstractmethod
    def level_info(self, package: int, punit: int, level: int) -> LevelInfo: ...

    @abstractmethod
    def turbo_freq_info(self, package: int, punit: int, level: int) -> TurboFreqInfo: ...

    @abstractmethod
    def core_power_get(self, package: int, punit: int) -> CorePower: ...

    @abstractmethod
    def core_power_set(self, package: int, punit: int, enable: bool, ordered: bool) -> None:
        """Writes both fields (sst.md §1.7): callers read first to keep the other."""

    @abstractmethod
    def clos_param_get(self, package: int, punit: int, clos: int) -> ClosParam: ...

    @abstractmethod
    def clos_param_set(self, package: int, punit: int, clos: int, param: ClosParam) -> None: ...

    @abstractmethod
    def clos_assoc_get(self, package: int, punit: int, core: int) -> int: ...

    @abstractmethod
    def clos_assoc_set(self, package: int, punit: int, assoc: list[tuple[int, int]]) -> None:
        """``[(punit_core, clos), ...]``, at most 64 per call (one ioctl)."""

    @abstractmethod
    def perf_set_feature(self, package: int, punit: int, feature: int) -> None:
        """Whole feature byte (bit0 BF, bit1 TF); callers read-modify-write."""

    @abstractmethod
    def read_msr(self, cpu: int, msr: int) -> int:
        """Read-only MSR access (``/dev/cpu/N/msr``): APERF, MPERF, TSC, 0x54, 0x770..."""

    def tsc_mhz(self) -> int:
        """The TSC (= MPERF reference) rate."""
        return 0

    def settle(self) -> None:  # noqa: B027 - optional hook
        """Bring time-dependent state (counters) to now, before a batch of reads."""

    def sync(self) -> None:  # noqa: B027 - optional hook
        """Called before reads and after a request that changed anything."""

    def has_deferred(self) -> bool:
        """Work was deferred to :meth:`idle` (the server then polls sooner)."""
        return False

    def idle(self) -> None:  # noqa: B027 - optional hook
        """No request is waiting: finish deferred work (the sim saves its state)."""

    def catch_up(self) -> None:  # noqa: B027 - optional hook
        """A reply just left and no request is waiting: cheap work deferred
        from the reply path (the sim computes its frequency oracle)."""

    def sysfs_changed(self, cpus: list[int]) -> None:  # noqa: B027 - optional hook
        """The helper wrote cpufreq/cpuidle sysfs of ``cpus`` (the sim re-reads limits)."""

    def interrupts(self, machine: Machine) -> Interrupts:
        """The IRQs the helper lists and writes: the host's procfs under the
        host root (the sim models its own)."""
        return ProcInterrupts(machine.root)

    def resctrl(self, machine: Machine) -> Resctrl:
        """RDT allocation: the host's resctrl under the host root (the sim
        models its own). The groups it created are remembered for the
        process's life only (a restarted helper removes none of them
        without ``force``: it never removes what it cannot tell is its own)."""
        return FsResctrl(machine.root)

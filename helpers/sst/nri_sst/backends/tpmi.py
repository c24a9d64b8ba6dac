"""The ``tpmi`` backend: Xeon 6 (GNR, SRF, ...) through the TPMI ioctls 5..17 (sst.md §1.2).

One :class:`~nri_sst.backends.base.Backend` method is one ioctl on
``<host-root>/dev/isst_interface``, with the struct layouts of
:mod:`nri_sst.backends.ioctl`. The kernel does not check several inputs and
reports every TPMI failure as ``ENOTTY`` (§1.1, §1.7), so the values the
hardware would corrupt are refused here with ``EINVAL`` before any write.

MSRs are read from ``<host-root>/dev/cpu/N/msr`` (the ``msr`` module).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

from nri_sst.backends import ioctl as io
from nri_sst.backends.base import (
    MSR_PLATFORM_INFO,
    Backend,
    ClosParam,
    CorePower,
    LevelInfo,
    PerfLevels,
    TurboFreqInfo,
)
from nri_sst.hostfs import Machine

CLOS_COUNT = 4
PUNIT_CORES_MAX = 64  # 4 CLOS_ASSOC registers x 16 cores (§1.9)
MAX_CLOS_MHZ = 25500  # 8-bit ratio field (§1.7)
MAX_PROP_PRIO = 15

MsrFn = Callable[[int, int], int]
"""``(cpu, msr) -> value``."""


def invalid(what: str) -> OSError:
    """A request the kernel would pass to the hardware unchecked (§1.7)."""
    return OSError(errno.EINVAL, f"refused before the ioctl: {what}")


class MsrFile:
    """``/dev/cpu/N/msr``: ``pread`` of 8 bytes at offset ``msr`` (needs CAP_SYS_RAWIO)."""

    def __init__(self, host_root: Path | str = "/") -> None:
        self.root = Path(host_root) / "dev" / "cpu"

    def __call__(self, cpu: int, msr: int) -> int:
        fd = os.open(self.root / str(cpu) / "msr", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = os.pread(fd, 8, msr)
        finally:
            os.close(fd)
        if len(data) != 8:
            raise OSError(errno.EIO, f"MSR {msr:#x} of cpu {cpu}: short read")
        return int.from_bytes(data, "little")


class DeviceBackend(Backend):
    """What ``tpmi`` and ``mbox`` share: the device, the MSR reader, the host."""

    def __init__(
        self,
        host_root: Path | str = "/",
        ioctl_fn: io.IoctlFn | None = None,
        msr_fn: MsrFn | None = None,
    ) -> None:
        self.device = io.IsstDevice(host_root, ioctl_fn)
        self._msr: MsrFn = msr_fn or MsrFile(host_root)
        self.machine: Machine | None = None
        self._tsc_mhz: int | None = None

    def attach(self, machine: Machine) -> None:
        self.machine = machine
        self._tsc_mhz = None

    def platform_info(self) -> io.Record:
        return self.device.call(io.ISST_IF_GET_PLATFORM_INFO, io.PLATFORM_INFO, {})

    def api_version(self) -> int:
        return self.platform_info()["api_version"]

    def phy_id(self, cpu: int) -> int:
        """``GET_PHY_ID``: the raw punit CPU id (MSR 0x54 on TPMI, 0x53 on legacy)."""
        (rec,) = self.device.multi(io.ISST_IF_GET_PHY_ID, io.CPU_MAPS_CMD, [{"logical_cpu": cpu}])
        return rec["physical_cpu"]

    def read_msr(self, cpu: int, msr: int) -> int:
        return self._msr(cpu, msr)

    def tsc_mhz(self) -> int:
        """The base (= TSC) ratio of ``MSR_PLATFORM_INFO`` [15:8] x 100; 0 when unreadable."""
        if self._tsc_mhz is None:
            cpu = min(self.machine.online) if self.machine and self.machine.online else 0
            try:
                self._tsc_mhz = ((self.read_msr(cpu, MSR_PLATFORM_INFO) >> 8) & 0xFF) * 100
            except OSError:
                self._tsc_mhz = 0
        return self._tsc_mhz


def check_clos(clos: int) -> None:
    if not 0 <= clos < CLOS_COUNT:
        raise invalid(f"clos {clos} (valid: 0-{CLOS_COUNT - 1})")


def check_clos_param(clos: int, param: ClosParam) -> None:
    check_clos(clos)
    if not 0 <= param.min_mhz <= param.max_mhz <= MAX_CLOS_MHZ:
        raise invalid(f"clos {clos}: need 0 <= min {param.min_mhz} <= max {param.max_mhz} <= 25500")
    if not 0 <= param.prop_prio <= MAX_PROP_PRIO:
        raise invalid(f"clos {clos}: proportional priority {param.prop_prio} (0-15)")


def check_assoc(assoc: list[tuple[int, int]]) -> None:
    if not 1 <= len(assoc) <= io.MAX_CMDS_PER_IOCTL:
        raise invalid(f"{len(assoc)} associations in one call (1-64)")
    for core, clos in assoc:
        check_clos(clos)
        if not 0 <= core < PUNIT_CORES_MAX:
            raise invalid(f"punit core {core} (0-{PUNIT_CORES_MAX - 1})")


class TpmiBackend(DeviceBackend):
    name = "tpmi"
    supported = True

    def _key(self, package: int, punit: int) -> dict[str, int]:
        if not (0 <= package <= 0xFF and 0 <= punit <= 0xFF):
            raise invalid(f"package {package} punit {punit}")
        return {"socket_id": package, "power_domain_id": punit}

    def _level(self, package: int, punit: int, level: int) -> None:
        """§1.7: the kernel does not check ``level`` against ``level_mask`` everywhere."""
        pl = self.perf_levels(package, punit)
        if not (0 <= level < 8 and pl.level_mask >> level & 1):
            raise invalid(f"level {level} not in level_mask {pl.level_mask:#x}")

    def count_instances(self, package: int) -> int:
        if not 0 <= package <= 0xFF:
            raise invalid(f"package {package}")
        rec = self.device.call(
            io.ISST_IF_COUNT_TPMI_INSTANCES, io.TPMI_INSTANCE_COUNT, {"socket_id": package}
        )
        return rec["valid_mask"]

    def perf_levels(self, package: int, punit: int) -> PerfLevels:
        r = self.device.call(io.ISST_IF_PERF_LEVELS, io.PERF_LEVEL_INFO, self._key(package, punit))
        return PerfLevels(
            max_level=r["max_level"],
            feature_rev=r["feature_rev"],
            level_mask=r["level_mask"],
            current_level=r["current_level"],
            feature_state=r["feature_state"],
            locked=bool(r["locked"]),
            enabled=bool(r["enabled"]),
            tf_support=r["sst_tf_support"],
            bf_support=r["sst_bf_support"],
        )

    def level_cpu_mask(self, package: int, punit: int, level: int) -> int:
        self._level(package, punit, level)
        r = self.device.call(
            io.ISST_IF_GET_PERF_LEVEL_CPU_MASK,
            io.PERF_LEVEL_CPU_MASK,
            {**self._key(package, punit), "level": level, "punit_cpu_map": 1},
        )
        return r["mask"]

    def level_info(self, package: int, punit: int, level: int) -> LevelInfo:
        self._level(package, punit, level)
        r = self.device.call(
            io.ISST_IF_GET_PERF_LEVEL_INFO,
            io.PERF_LEVEL_DATA_INFO,
            {**self._key(package, punit), "level": level},
        )
        nb = min(r["max_buckets"], io.TRL_MAX_BUCKETS)
        nl = min(r["max_trl_levels"], io.TRL_MAX_LEVELS)
        rows = r.rows("trl_freq_mhz", io.TRL_MAX_BUCKETS)
        return LevelInfo(
            base_mhz=r["base_freq_mhz"],
            p0_mhz=r["p0_freq_mhz"],
            pm_mhz=r["pm_freq_mhz"],
            bucket_core_counts=r.array("bucket_core_counts")[:nb],
            trl_freq_mhz=tuple(row[:nb] for row in rows[:nl]),
        )

    def turbo_freq_info(self, package: int, punit: int, level: int) -> TurboFreqInfo:
        self._level(package, punit, level)
        r = self.device.call(
            io.ISST_IF_GET_TURBO_FREQ_INFO,
            io.TURBO_FREQ_INFO,
            {**self._key(package, punit), "level": level},
        )
        nb = min(r["max_buckets"], io.TRL_MAX_BUCKETS)
        nl = min(r["max_trl_levels"], io.TRL_MAX_LEVELS)
        nc = min(r["max_clip_freqs"], io.TRL_MAX_LEVELS)
        rows = r.rows("trl_freq_mhz", io.TRL_MAX_BUCKETS)
        return TurboFreqInfo(
            lp_clip_mhz=r.array("lp_clip_freq_mhz")[:nc],
            bucket_core_counts=r.array("bucket_core_counts")[:nb],
            trl_freq_mhz=tuple(row[:nb] for row in rows[:nl]),
        )

    def core_power_get(self, package: int, punit: int) -> CorePower:
        r = self.device.call(
            io.ISST_IF_CORE_POWER_STATE, io.CORE_POWER, {**self._key(package, punit), "get_set": 0}
        )
        return CorePower(
            enable=bool(r["enable"]),
            supported=bool(r["supported"]),
            ordered=bool(r["priority_type"]),
        )

    def core_power_set(self, package: int, punit: int, enable: bool, ordered: bool) -> None:
        if int(enable) not in (0, 1) or int(ordered) not in (0, 1):
            raise invalid(f"enable {enable!r} / priority_type {ordered!r} not 0/1")
        self.device.call(
            io.ISST_IF_CORE_POWER_STATE,
            io.CORE_POWER,
            {
                **self._key(package, punit),
                "get_set": 1,
                "enable": int(enable),
                "priority_type": int(ordered),
            },
        )

    def clos_param_get(self, package: int, punit: int, clos: int) -> ClosParam:
        check_clos(clos)
        r = self.device.call(
            io.ISST_IF_CLOS_PARAM,
            io.CLOS_PARAM,
            {**self._key(package, punit), "get_set": 0, "clos": clos},
        )
        return ClosParam(
            min_mhz=r["min_freq_mhz"], max_mhz=r["max_freq_mhz"], prop_prio=r["prop_prio"]
        )

    def clos_param_set(self, package: int, punit: int, clos: int, param: ClosParam) -> None:
        check_clos_param(clos, param)
        self.device.call(
            io.ISST_IF_CLOS_PARAM,
            io.CLOS_PARAM,
            {
                **self._key(package, punit),
                "get_set": 1,
                "clos": clos,
                "min_freq_mhz": param.min_mhz,
                "max_freq_mhz": param.max_mhz,
                "prop_prio": param.prop_prio,
            },
        )

    def _assoc(self, package: int, punit: int, get_set: int, assoc: list[tuple[int, int]]) -> int:
        key = self._key(package, punit)
        recs = self.device.multi(
            io.ISST_IF_CLOS_ASSOC,
            io.CLOS_ASSOC_CMDS_CMD,
            [{**key, "logical_cpu": core, "clos": clos} for core, clos in assoc],
            header={"get_set": get_set, "punit_cpu_map": 1},
        )
        return recs[0]["clos"]

    def clos_assoc_get(self, package: int, punit: int, core: int) -> int:
        check_assoc([(core, 0)])
        return self._assoc(package, punit, 0, [(core, 0)])

    def clos_assoc_set(self, package: int, punit: int, assoc: list[tuple[int, int]]) -> None:
        check_assoc(assoc)
        self._assoc(package, punit, 1, assoc)

    def perf_set_feature(self, package: int, punit: int, feature: int) -> None:
        if not 0 <= feature <= 0b11:
            raise invalid(f"feature {feature:#x} (bit0 BF, bit1 TF)")
        self.device.call(
            io.ISST_IF_PERF_SET_FEATURE,
            io.PERF_FEATURE_CONTROL,
            {**self._key(package, punit), "feature": feature},
        )

    def perf_set_level(self, package: int, punit: int, level: int) -> None:
        """``PERF_SET_LEVEL`` (not used by the helper's requests yet). Disables TF/BF (§1.7)."""
        pl = self.perf_levels(package, punit)
        if not 0 <= level < 8 or level == pl.current_level:
            raise invalid(f"level {level} (current {pl.current_level})")
        self.device.call(
            io.ISST_IF_PERF_SET_LEVEL,
            io.PERF_LEVEL_CONTROL,
            {**self._key(package, punit), "level": level},
        )

"""The ``mbox`` backend: older Xeons (ICX/SPR/EMR) through the legacy mailbox and MMIO (§1.8).

The same :class:`~nri_sst.backends.base.Backend` interface as ``tpmi``, built
from ``ISST_IF_MBOX_COMMAND`` (``CONFIG_TDP 0x7F``, ``CONFIG_CLOS 0xD0``,
``READ/WRITE_PM_CONFIG 0x94/0x95``), ``ISST_IF_IO_CMD`` (the CLOS registers
and the association, as intel-speed-select does on non-SKX parts) and
``ISST_IF_MSR_COMMAND`` (``MSR_TURBO_RATIO_LIMIT1`` bucket core counts).

Mapping onto the TPMI-shaped interface:

* one power domain per package (punit 0); mailbox commands go to the lowest
  online CPU of the package (needs :meth:`attach`);
* :meth:`phy_id` re-encodes the legacy id (MSR 0x53: bit0 thread, [8:1] core)
  in the TPMI layout (``core << 3 | thread``, punit 0) that
  :class:`~nri_sst.sst_platform.SstPlatform` decodes;
* API v1 reports TF/BF support for the current level only; here it becomes a
  bitmask with the current level's bit; ``level_mask`` is levels 0..max;
* Pm (``LevelInfo.pm_mhz``) is the max-efficiency ratio of ``MSR_PLATFORM_INFO``
  [47:40] (``/dev/cpu/N/msr``), for the current level only.

Multi-die legacy parts (CLX-AP) and SKX (mailbox through MSRs, CLOS through the
mailbox) are not handled.
"""

from __future__ import annotations

import errno
from pathlib import Path

from nri_sst.backends import ioctl as io
from nri_sst.backends.base import (
    MSR_PLATFORM_INFO,
    ClosParam,
    CorePower,
    LevelInfo,
    PerfLevels,
    TurboFreqInfo,
)
from nri_sst.backends.tpmi import (
    DeviceBackend,
    MsrFn,
    check_assoc,
    check_clos,
    check_clos_param,
    invalid,
)
from nri_sst.hostfs import Machine

# Mailbox commands and sub-commands (§1.8).
CONFIG_TDP = 0x7F
GET_LEVELS_INFO = 0x00
GET_TDP_CONTROL = 0x01
SET_TDP_CONTROL = 0x02
GET_CORE_MASK = 0x06
GET_TURBO_LIMIT_RATIOS = 0x07
GET_P1_INFO = 0x0A
FACT_HP_TURBO_LIMIT_NUMCORES = 0x10
FACT_HP_TURBO_LIMIT_RATIOS = 0x11
FACT_LP_CLIPPING_RATIO = 0x12
CONFIG_CLOS = 0xD0
CLOS_PM_QOS_CONFIG = 0x02
READ_PM_CONFIG = 0x94
WRITE_PM_CONFIG = 0x95
PM_FEATURE = 0x03
MBOX_WRITE = 1 << 8
"""``parameter`` bit 8: the CONFIG_CLOS write flag."""

# MMIO registers (``ISST_IF_IO_CMD``).
PM_CLOS = 0x08
PQR_ASSOC = 0x20
MSR_TURBO_RATIO_LIMIT1 = 0x1AE

LEGACY_TRL_LEVELS = 3  # sse, avx2, avx512
RATIO_MHZ = 100


def _bytes4(word: int) -> list[int]:
    return [(word >> (8 * i)) & 0xFF for i in range(4)]


class MboxBackend(DeviceBackend):
    name = "mbox"
    supported = True

    def __init__(
        self,
        host_root: Path | str = "/",
        ioctl_fn: io.IoctlFn | None = None,
        msr_fn: MsrFn | None = None,
    ) -> None:
        super().__init__(host_root, ioctl_fn, msr_fn)
        self._cpu_of: dict[int, int] = {}

    def attach(self, machine: Machine) -> None:
        super().attach(machine)
        self._cpu_of = {}
        for cpu in sorted(machine.online):
            pkg = machine.package_of.get(cpu)
            if pkg is not None:
                self._cpu_of.setdefault(pkg, cpu)

    def _cpu(self, package: int, punit: int = 0) -> int:
        if punit != 0 or package not in self._cpu_of:
            raise OSError(errno.ENODEV, f"no online CPU in package {package} punit {punit}")
        return self._cpu_of[package]

    # ------------------------------------------------------------------ transport

    def mbox(self, cpu: int, command: int, sub: int, parameter: int = 0, req: int = 0) -> int:
        (rec,) = self.device.multi(
            io.ISST_IF_MBOX_COMMAND,
            io.MBOX_CMDS_CMD,
            [
                {
                    "logical_cpu": cpu,
                    "command": command,
                    "sub_command": sub,
                    "parameter": parameter,
                    "req_data": req,
                }
            ],
        )
        return rec["resp_data"]

    def _tdp(self, cpu: int, sub: int, req: int = 0) -> int:
        return self.mbox(cpu, CONFIG_TDP, sub, 0, req)

    def mmio(self, cpu: int, regs: list[tuple[int, int | None]]) -> list[int]:
        """``[(reg, None)]`` reads, ``[(reg, value)]`` writes; returns the values."""
        recs = self.device.multi(
            io.ISST_IF_IO_CMD,
            io.IO_REGS_CMD,
            [
                {
                    "read_write": 0 if value is None else 1,
                    "logical_cpu": cpu,
                    "reg": reg,
                    "value": value or 0,
                }
                for reg, value in regs
            ],
            count_field="req_count",
        )
        return [r["value"] for r in recs]

    def msr_cmd(self, cpu: int, msr: int) -> int:
        """``ISST_IF_MSR_COMMAND`` read (allowlisted MSRs only, §1.8)."""
        (rec,) = self.device.multi(
            io.ISST_IF_MSR_COMMAND,
            io.MSR_CMDS_CMD,
            [{"read_write": 0, "logical_cpu": cpu, "msr": msr}],
        )
        return rec["data"]

    # ------------------------------------------------------------------ Backend

    def count_instances(self, package: int) -> int:
        self._cpu(package)
        return 0b1

    def phy_id(self, cpu: int) -> int:
        raw = super().phy_id(cpu)
        return (((raw & 0x1FF) >> 1) << 3) | (raw & 1)

    def perf_levels(self, package: int, punit: int) -> PerfLevels:
        cpu = self._cpu(package, punit)
        info = self._tdp(cpu, GET_LEVELS_INFO)
        max_level = (info >> 8) & 0xFF
        current = (info >> 16) & 0xFF
        ctl = self._tdp(cpu, GET_TDP_CONTROL, current)
        return PerfLevels(
            max_level=max_level,
            feature_rev=info & 0xFF,
            level_mask=(1 << (max_level + 1)) - 1,
            current_level=current,
            feature_state=((ctl >> 17) & 1) | (((ctl >> 16) & 1) << 1),
            locked=bool(info >> 24 & 1),
            enabled=bool(info >> 31 & 1),
            tf_support=(ctl & 1) << current,
            bf_support=((ctl >> 1) & 1) << current,
        )

    def _level(self, package: int, punit: int, level: int) -> int:
        pl = self.perf_levels(package, punit)
        if not (0 <= level < 8 and pl.level_mask >> level & 1):
            raise invalid(f"level {level} not in level_mask {pl.level_mask:#x}")
        return self._cpu(package, punit)

    def level_cpu_mask(self, package: int, punit: int, level: int) -> int:
        cpu = self._level(package, punit, level)
        lo = self._tdp(cpu, GET_CORE_MASK, level)
        hi = self._tdp(cpu, GET_CORE_MASK, level | (1 << 8))
        return lo | (hi << 32)

    def _ratios(self, cpu: int, sub: int, level: int, trl: int) -> tuple[int, ...]:
        words = [self._tdp(cpu, sub, level | (w << 8) | (trl << 16)) for w in range(2)]
        return tuple(r * RATIO_MHZ for w in words for r in _bytes4(w))

    def level_info(self, package: int, punit: int, level: int) -> LevelInfo:
        cpu = self._level(package, punit, level)
        p1 = self._tdp(cpu, GET_P1_INFO, level)
        counts = self.msr_cmd(cpu, MSR_TURBO_RATIO_LIMIT1)
        rows = tuple(
            self._ratios(cpu, GET_TURBO_LIMIT_RATIOS, level, t) for t in range(LEGACY_TRL_LEVELS)
        )
        try:
            pm = ((self.read_msr(cpu, MSR_PLATFORM_INFO) >> 40) & 0xFF) * RATIO_MHZ
        except OSError:
            pm = 0
        return LevelInfo(
            base_mhz=(p1 & 0xFF) * RATIO_MHZ,
            p0_mhz=rows[0][0],
            pm_mhz=pm,
            bucket_core_counts=tuple((counts >> (8 * i)) & 0xFF for i in range(8)),
            trl_freq_mhz=rows,
        )

    def turbo_freq_info(self, package: int, punit: int, level: int) -> TurboFreqInfo:
        cpu = self._level(package, punit, level)
        clip = self._tdp(cpu, FACT_LP_CLIPPING_RATIO, level)
        counts = [self._tdp(cpu, FACT_HP_TURBO_LIMIT_NUMCORES, level | (w << 8)) for w in range(2)]
        return TurboFreqInfo(
            lp_clip_mhz=tuple(r * RATIO_MHZ for r in _bytes4(clip)[:LEGACY_TRL_LEVELS]),
            bucket_core_counts=tuple(c for w in counts for c in _bytes4(w)),
            trl_freq_mhz=tuple(
                self._ratios(cpu, FACT_HP_TURBO_LIMIT_RATIOS, level, t)
                for t in range(LEGACY_TRL_LEVELS)
            ),
        )

    def core_power_get(self, package: int, punit: int) -> CorePower:
        cpu = self._cpu(package, punit)
        pm = self.mbox(cpu, READ_PM_CONFIG, PM_FEATURE)
        qos = self.mbox(cpu, CONFIG_CLOS, CLOS_PM_QOS_CONFIG)
        return CorePower(
            enable=bool(qos >> 1 & 1), supported=bool(pm & 1), ordered=bool(qos >> 2 & 1)
        )

    def core_power_set(self, package: int, punit: int, enable: bool, ordered: bool) -> None:
        """intel-speed-select ``isst_pm_qos_config``: PM_QOS_CONFIG, then WRITE_PM_CONFIG."""
        if int(enable) not in (0, 1) or int(ordered) not in (0, 1):
            raise invalid(f"enable {enable!r} / priority_type {ordered!r} not 0/1")
        cpu = self._cpu(package, punit)
        qos = self.mbox(cpu, CONFIG_CLOS, CLOS_PM_QOS_CONFIG)
        qos = (qos & ~0b110) | (int(enable) << 1) | (int(ordered) << 2)
        self.mbox(cpu, CONFIG_CLOS, CLOS_PM_QOS_CONFIG, MBOX_WRITE, qos)
        self.mbox(cpu, WRITE_PM_CONFIG, PM_FEATURE, 0, int(enable) << 16)

    def clos_param_get(self, package: int, punit: int, clos: int) -> ClosParam:
        check_clos(clos)
        (reg,) = self.mmio(self._cpu(package, punit), [(PM_CLOS + 4 * clos, None)])
        return ClosParam(
            min_mhz=((reg >> 8) & 0xFF) * RATIO_MHZ,
            max_mhz=((reg >> 16) & 0xFF) * RATIO_MHZ,
            prop_prio=(reg >> 4) & 0xF,
        )

    def clos_param_set(self, package: int, punit: int, clos: int, param: ClosParam) -> None:
        """Keeps EPP [3:0] and the desired ratio [31:24], which the interface does not model."""
        check_clos_param(clos, param)
        cpu = self._cpu(package, punit)
        reg_addr = PM_CLOS + 4 * clos
        (old,) = self.mmio(cpu, [(reg_addr, None)])
        reg = (
            (old & 0xFF00000F)
            | (param.prop_prio << 4)
            | ((param.min_mhz // RATIO_MHZ) << 8)
            | ((param.max_mhz // RATIO_MHZ) << 16)
        )
        self.mmio(cpu, [(reg_addr, reg)])

    def clos_assoc_get(self, package: int, punit: int, core: int) -> int:
        check_assoc([(core, 0)])
        (reg,) = self.mmio(self._cpu(package, punit), [(PQR_ASSOC + 4 * core, None)])
        return (reg >> 16) & 0x3

    def clos_assoc_set(self, package: int, punit: int, assoc: list[tuple[int, int]]) -> None:
        check_assoc(assoc)
        regs: list[tuple[int, int | None]] = [
            (PQR_ASSOC + 4 * core, clos << 16) for core, clos in assoc
        ]
        self.mmio(self._cpu(package, punit), regs)

    def perf_set_feature(self, package: int, punit: int, feature: int) -> None:
        """``SET_TDP_CONTROL``: bit16 TF, bit17 BF (TPMI's feature byte: bit0 BF, bit1 TF)."""
        if not 0 <= feature <= 0b11:
            raise invalid(f"feature {feature:#x} (bit0 BF, bit1 TF)")
        req = (((feature >> 1) & 1) << 16) | ((feature & 1) << 17)
        self._tdp(self._cpu(package, punit), SET_TDP_CONTROL, req)

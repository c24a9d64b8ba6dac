"""A FAKE kernel for the ``tpmi`` and ``mbox`` backends (:class:`FakeIsstKernel`).

No machine here has SST hardware or ``/dev/isst_interface``, so
:class:`FakeIsstKernel` stands in for the kernel: it replaces the ioctl
syscall (``IsstDevice(ioctl_fn=...)``), decodes each request buffer with the
layouts of :mod:`nri_sst.backends.ioctl`, answers from a
:class:`~nri_sst.backends.sim.SimBackend` model and writes the reply into the
same buffer, with the kernel's return values and errnos. It is a mock of the
kernel: the layouts themselves are checked against the real UAPI header in
``test_ioctl_uapi.py``; the backends are checked through it in
``test_ioctl_backends.py``.
"""

from __future__ import annotations

import errno
from dataclasses import replace
from typing import Any

from nri_sst.backends import ioctl as io
from nri_sst.backends.base import ClosParam
from nri_sst.backends.sim import SimBackend

from .conftest import SMALL_SIM

MBOX_SIM = replace(SMALL_SIM, punits_per_package=1, cores_per_punit=4)
"""Legacy parts have one power domain per package; the same 16 CPUs as SMALL_SIM."""


def _enotty(what: str) -> OSError:
    return OSError(errno.ENOTTY, f"fake kernel: {what}")


class FakeIsstKernel:
    """``ioctl_fn`` for :class:`~nri_sst.backends.ioctl.IsstDevice` (a kernel mock).

    ``mode="tpmi"``: api_version 3, ioctls 0, 1, 4 and 5..16; the legacy ioctls
    2 and 3 fail with ENOTTY as on HPM platforms. ``mode="mbox"``: api_version 1
    with mailbox and MMIO; ioctls 5..17 fail with ENOTTY (no TPMI driver).
    """

    def __init__(self, sim: SimBackend, mode: str = "tpmi") -> None:
        self.sim = sim
        self.mode = mode
        self.calls: list[str] = []
        self.pm_clos_extra: dict[tuple[int, int], int] = {}
        """EPP and desired ratio of the legacy PM_CLOS registers (not in the sim model)."""
        self.locate = sim.config.locate

    def __call__(self, fd: int, request: int, buf: bytearray) -> int:
        name = io.IOCTL_NAMES.get(request)
        if name is None:
            raise _enotty(f"unknown request {request:#x}")
        self.calls.append(name)
        handler = getattr(self, "_" + name.removeprefix("ISST_IF_").lower(), None)
        nr = request & 0xFF
        if (
            handler is None
            or (self.mode == "mbox" and nr >= 5)
            or (self.mode == "tpmi" and nr in (2, 3))
        ):
            raise _enotty(name)
        ret: int = handler(buf)
        return ret

    @staticmethod
    def _put(layout: io.Layout, buf: bytearray, values: dict[str, Any], offset: int = 0) -> None:
        rec = layout.unpack(buf, offset).asdict()
        rec.update(values)
        buf[offset : offset + layout.size] = layout.pack(rec)

    # ------------------------------------------------------------------ common ioctls

    def _get_platform_info(self, buf: bytearray) -> int:
        legacy = self.mode == "mbox"
        self._put(
            io.PLATFORM_INFO,
            buf,
            {
                "api_version": 1 if legacy else 3,
                "driver_version": 1,
                "max_cmds_per_ioctl": 64,
                "mbox_supported": int(legacy),
                "mmio_supported": int(legacy),
            },
        )
        return 0

    def _elements(self, cmd: io.Multi, buf: bytearray, count_field: str = "cmd_count") -> int:
        n = cmd.header.unpack(buf)[count_field]
        if not 1 <= n <= 64 or len(buf) < cmd.size(n):
            raise OSError(errno.EINVAL, "cmd_count")
        return n

    def _get_phy_id(self, buf: bytearray) -> int:
        cmd = io.CPU_MAPS_CMD
        for i in range(self._elements(cmd, buf)):
            off = cmd.header.size + i * cmd.element.size
            cpu = cmd.element.unpack(buf, off)["logical_cpu"]
            phy = self.sim.phy_id(cpu)  # TPMI layout: MSR 0x54
            if self.mode == "mbox":  # MSR 0x53: bit0 thread, [8:1] core, [13:9] punit
                phy = (phy & 1) | (((phy >> 3) & 0xFF) << 1) | (((phy >> 11) & 0x1F) << 9)
            self._put(cmd.element, buf, {"physical_cpu": phy}, off)
        return i + 1

    def _msr_command(self, buf: bytearray) -> int:
        cmd = io.MSR_CMDS_CMD
        for i in range(self._elements(cmd, buf)):
            off = cmd.header.size + i * cmd.element.size
            e = cmd.element.unpack(buf, off)
            if e["msr"] != 0x1AE or e["read_write"]:
                raise OSError(errno.EINVAL, f"MSR {e['msr']:#x} not allowlisted")
            counts = self.sim.config.trl_buckets
            data = sum(n << (8 * k) for k, n in enumerate(counts))
            self._put(cmd.element, buf, {"data": data}, off)
        return i + 1

    # ------------------------------------------------------------------ TPMI ioctls

    def _count_tpmi_instances(self, buf: bytearray) -> int:
        r = io.TPMI_INSTANCE_COUNT.unpack(buf)
        mask = self.sim.count_instances(r["socket_id"])
        self._put(io.TPMI_INSTANCE_COUNT, buf, {"count": mask.bit_count(), "valid_mask": mask})
        return 0

    def _core_power_state(self, buf: bytearray) -> int:
        r = io.CORE_POWER.unpack(buf)
        key = (r["socket_id"], r["power_domain_id"])
        if r["get_set"]:
            self.sim.core_power_set(*key, bool(r["enable"]), bool(r["priority_type"]))
            return 0
        cp = self.sim.core_power_get(*key)
        self._put(
            io.CORE_POWER,
            buf,
            {
                "enable": int(cp.enable),
                "supported": int(cp.supported),
                "priority_type": int(cp.ordered),
            },
        )
        return 0

    def _clos_param(self, buf: bytearray) -> int:
        r = io.CLOS_PARAM.unpack(buf)
        key = (r["socket_id"], r["power_domain_id"], r["clos"])
        if r["get_set"]:
            self.sim.clos_param_set(
                *key, ClosParam(r["min_freq_mhz"], r["max_freq_mhz"], r["prop_prio"])
            )
            return 0
        p = self.sim.clos_param_get(*key)
        self._put(
            io.CLOS_PARAM,
            buf,
            {"min_freq_mhz": p.min_mhz, "max_freq_mhz": p.max_mhz, "prop_prio": p.prop_prio},
        )
        return 0

    def _clos_assoc(self, buf: bytearray) -> int:
        cmd = io.CLOS_ASSOC_CMDS_CMD
        head = cmd.header.unpack(buf)
        n = self._elements(cmd, buf)
        if head["punit_cpu_map"] != 1:
            raise _enotty("punit_cpu_map must be 1 (EOPNOTSUPP)")
        batch: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for i in range(n):
            off = cmd.header.size + i * cmd.element.size
            e = cmd.element.unpack(buf, off)
            key = (e["socket_id"], e["power_domain_id"])
            if head["get_set"]:  # the kernel loops; one sim call per power domain
                batch.setdefault(key, []).append((e["logical_cpu"], e["clos"]))
            else:
                clos = self.sim.clos_assoc_get(*key, e["logical_cpu"])
                self._put(cmd.element, buf, {"clos": clos}, off)
        for key, assoc in batch.items():
            self.sim.clos_assoc_set(*key, assoc)
        return 0

    def _perf_levels(self, buf: bytearray) -> int:
        r = io.PERF_LEVEL_INFO.unpack(buf)
        pl = self.sim.perf_levels(r["socket_id"], r["power_domain_id"])
        self._put(
            io.PERF_LEVEL_INFO,
            buf,
            {
                "max_level": pl.max_level,
                "feature_rev": pl.feature_rev,
                "level_mask": pl.level_mask,
                "current_level": pl.current_level,
                "feature_state": pl.feature_state,
                "locked": int(pl.locked),
                "enabled": int(pl.enabled),
                "sst_tf_support": pl.tf_support,
                "sst_bf_support": pl.bf_support,
            },
        )
        return 0

    def _perf_set_level(self, buf: bytearray) -> int:
        r = io.PERF_LEVEL_CONTROL.unpack(buf)
        self.sim.perf_set_level(r["socket_id"], r["power_domain_id"], r["level"])
        return 0

    def _perf_set_feature(self, buf: bytearray) -> int:
        r = io.PERF_FEATURE_CONTROL.unpack(buf)
        self.sim.perf_set_feature(r["socket_id"], r["power_domain_id"], r["feature"])
        return 0

    @staticmethod
    def _grid(rows: tuple[tuple[int, ...], ...]) -> list[int]:
        flat: list[int] = []
        for row in rows[: io.TRL_MAX_LEVELS]:
            flat += list(row[: io.TRL_MAX_BUCKETS]) + [0] * (io.TRL_MAX_BUCKETS - len(row))
        return flat

    def _get_perf_level_info(self, buf: bytearray) -> int:
        r = io.PERF_LEVEL_DATA_INFO.unpack(buf)
        li = self.sim.level_info(r["socket_id"], r["power_domain_id"], r["level"])
        self._put(
            io.PERF_LEVEL_DATA_INFO,
            buf,
            {
                "base_freq_mhz": li.base_mhz,
                "p0_freq_mhz": li.p0_mhz,
                "p1_freq_mhz": li.base_mhz,
                "pm_freq_mhz": li.pm_mhz,
                "max_buckets": io.TRL_MAX_BUCKETS,
                "max_trl_levels": io.TRL_MAX_LEVELS,
                "bucket_core_counts": li.bucket_core_counts,
                "trl_freq_mhz": self._grid(li.trl_freq_mhz),
            },
        )
        return 0

    def _get_perf_level_cpu_mask(self, buf: bytearray) -> int:
        r = io.PERF_LEVEL_CPU_MASK.unpack(buf)
        if r["punit_cpu_map"] != 1:
            raise _enotty("punit_cpu_map must be 1")
        mask = self.sim.level_cpu_mask(r["socket_id"], r["power_domain_id"], r["level"])
        self._put(io.PERF_LEVEL_CPU_MASK, buf, {"mask": mask})
        return 0

    def _get_turbo_freq_info(self, buf: bytearray) -> int:
        r = io.TURBO_FREQ_INFO.unpack(buf)
        tf = self.sim.turbo_freq_info(r["socket_id"], r["power_domain_id"], r["level"])
        self._put(
            io.TURBO_FREQ_INFO,
            buf,
            {
                "max_clip_freqs": io.TRL_MAX_LEVELS,
                "max_buckets": io.TRL_MAX_BUCKETS,
                "max_trl_levels": io.TRL_MAX_LEVELS,
                "lp_clip_freq_mhz": tf.lp_clip_mhz,
                "bucket_core_counts": tf.bucket_core_counts,
                "trl_freq_mhz": self._grid(tf.trl_freq_mhz),
            },
        )
        return 0

    # ------------------------------------------------------------------ legacy ioctls

    def _mbox_command(self, buf: bytearray) -> int:
        cmd = io.MBOX_CMDS_CMD
        for i in range(self._elements(cmd, buf)):
            off = cmd.header.size + i * cmd.element.size
            e = cmd.element.unpack(buf, off)
            resp = self._mbox(
                e["logical_cpu"], e["command"], e["sub_command"], e["parameter"], e["req_data"]
            )
            self._put(cmd.element, buf, {"resp_data": resp}, off)
        return i + 1

    def _mbox(self, cpu: int, command: int, sub: int, param: int, req: int) -> int:
        sim = self.sim
        if not 0 <= cpu < sim.config.ncpus:
            raise OSError(errno.EINVAL, f"cpu {cpu}")
        pkg = self.locate(cpu)[0]
        level = req & 0xFF
        word = (req >> 8) & 0xFF
        trl = (req >> 16) & 0xFF

        def ratios(values: tuple[int, ...]) -> int:
            four = list(values[4 * word : 4 * word + 4]) + [0] * 4
            return sum((v // 100) << (8 * k) for k, v in enumerate(four[:4]))

        if command == 0x7F:
            pl = sim.perf_levels(pkg, 0)
            if sub == 0x00:
                return (
                    1
                    | pl.max_level << 8
                    | pl.current_level << 16
                    | int(pl.locked) << 24
                    | int(pl.enabled) << 31
                )
            if sub == 0x01:
                return (
                    (pl.tf_support >> level & 1)
                    | (pl.bf_support >> level & 1) << 1
                    | (pl.feature_state >> 1 & 1) << 16
                    | (pl.feature_state & 1) << 17
                )
            if sub == 0x02:
                sim.perf_set_feature(pkg, 0, (req >> 16 & 1) << 1 | (req >> 17 & 1))
                return 0
            if sub == 0x06:
                return (sim.level_cpu_mask(pkg, 0, level) >> (32 * word)) & 0xFFFFFFFF
            if sub == 0x07:
                li = sim.level_info(pkg, 0, level)
                rows = li.trl_freq_mhz
                return ratios(rows[trl]) if trl < len(rows) else 0
            if sub == 0x0A:
                return sim.level_info(pkg, 0, level).base_mhz // 100
            if sub == 0x10:
                counts = sim.turbo_freq_info(pkg, 0, level).bucket_core_counts
                four = list(counts[4 * word : 4 * word + 4]) + [0] * 4
                return sum(c << (8 * k) for k, c in enumerate(four[:4]))
            if sub == 0x11:
                rows = sim.turbo_freq_info(pkg, 0, level).trl_freq_mhz
                return ratios(rows[trl]) if trl < len(rows) else 0
            if sub == 0x12:
                clip = sim.turbo_freq_info(pkg, 0, level).lp_clip_mhz
                return sum((v // 100) << (8 * k) for k, v in enumerate(clip[:3]))
        if command == 0xD0 and sub == 0x02:
            cp = sim.core_power_get(pkg, 0)
            if param & (1 << 8):
                sim.core_power_set(pkg, 0, bool(req >> 1 & 1), bool(req >> 2 & 1))
                return 0
            return int(cp.enable) << 1 | int(cp.ordered) << 2
        if command == 0x94 and sub == 0x03:
            return 1 | int(sim.core_power_get(pkg, 0).enable) << 16
        if command == 0x95 and sub == 0x03:
            cp = sim.core_power_get(pkg, 0)
            sim.core_power_set(pkg, 0, bool(req >> 16 & 1), cp.ordered)
            return 0
        raise OSError(errno.EINVAL, f"mbox {command:#x}/{sub:#x} not in the allowlist")

    def _io_cmd(self, buf: bytearray) -> int:
        cmd = io.IO_REGS_CMD
        for i in range(self._elements(cmd, buf, "req_count")):
            off = cmd.header.size + i * cmd.element.size
            e = cmd.element.unpack(buf, off)
            pkg = self.locate(e["logical_cpu"])[0]
            reg, value = e["reg"], e["value"]
            if reg % 4 or not 0x04 <= reg <= 0x11C:
                raise OSError(errno.EINVAL, f"MMIO reg {reg:#x}")
            if 0x08 <= reg < 0x18:
                clos = (reg - 0x08) // 4
                if e["read_write"]:
                    p = ClosParam(
                        (value >> 8 & 0xFF) * 100, (value >> 16 & 0xFF) * 100, value >> 4 & 0xF
                    )
                    self.sim.clos_param_set(pkg, 0, clos, p)
                    self.pm_clos_extra[(pkg, clos)] = value & 0xFF00000F
                else:
                    p = self.sim.clos_param_get(pkg, 0, clos)
                    value = (
                        self.pm_clos_extra.get((pkg, clos), 0)
                        | p.prop_prio << 4
                        | (p.min_mhz // 100) << 8
                        | (p.max_mhz // 100) << 16
                    )
            elif reg >= 0x20:
                core = (reg - 0x20) // 4
                if e["read_write"]:
                    self.sim.clos_assoc_set(pkg, 0, [(core, value >> 16 & 0x3)])
                else:
                    value = self.sim.clos_assoc_get(pkg, 0, core) << 16
            else:
                raise OSError(errno.EINVAL, f"MMIO reg {reg:#x} not modelled")
            self._put(cmd.element, buf, {"value": value}, off)
        return i + 1

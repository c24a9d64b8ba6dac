"""The ``tpmi`` and ``mbox`` backends against a FAKE kernel.

No machine here has SST hardware or ``/dev/isst_interface``, so
:class:`FakeIsstKernel` stands in for the kernel: it replaces the ioctl
syscall (``IsstDevice(ioctl_fn=...)``), decodes each request buffer with the
layouts of :mod:`nri_sst.backends.ioctl`, answers from a
:class:`~nri_sst.backends.sim.SimBackend` model and writes the reply into the
same buffer, with the kernel's return values and errnos. It is a mock of the
kernel: the layouts themselves are checked against the real UAPI header in
``test_ioctl_uapi.py``; what this file checks is that each backend method is
the right ioctl with the right fields, so that ``backend -> fake ioctl -> sim``
gives the same results and the same model state as calling the sim directly,
through the whole managed-mode sequence.
"""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from nri_sst import messages as m
from nri_sst.backends import detect, make_backend
from nri_sst.backends import ioctl as io
from nri_sst.backends.base import Backend, ClosParam
from nri_sst.backends.mbox import MboxBackend
from nri_sst.backends.none import NoneBackend
from nri_sst.backends.sim import SimBackend
from nri_sst.backends.tpmi import TpmiBackend
from nri_sst.handler import RequestHandler

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


# ---------------------------------------------------------------------- helpers


def _pair(mode: str, root: Path) -> tuple[RequestHandler, RequestHandler, FakeIsstKernel]:
    """The same model twice: the sim directly, and ``mode`` -> fake kernel -> sim."""
    config = SMALL_SIM if mode == "tpmi" else MBOX_SIM
    direct = SimBackend(config)
    kernel = FakeIsstKernel(SimBackend(config), mode)
    backend: Backend = (TpmiBackend if mode == "tpmi" else MboxBackend)(
        root, ioctl_fn=kernel, msr_fn=kernel.sim.read_msr
    )
    handlers = RequestHandler(direct, root), RequestHandler(backend, root)
    for h in handlers:
        h.peers.add(b"")
    return handlers[0], handlers[1], kernel


def _state(sim: SimBackend) -> dict[str, Any]:
    return {k: {f: v for f, v in pu.items()} for k, pu in sim.state["punits"].items()}


def _ops(sim: SimBackend) -> list[tuple[str, ...]]:
    return [(e["op"], str(e.get("pkg")), str(e.get("punit"))) for e in sim.state["log"]]


MANAGED: list[m.Request] = [
    m.PrepareManagedMode(),
    m.ConfigureClos(clos=0, min_khz=2_300_000, max_khz=4_600_000),
    m.ConfigureClos(clos=3, min_khz=800_000, max_khz=2_300_000),
    m.EnableCP(),
    m.AssociateCpus(clos=0, cpus=[0, 1, 8, 9]),
    m.AssociateCpus(clos=3, cpus=[2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]),
    m.GetAssociation(cpus=list(range(16))),
    m.GetClosConfig(clos=0),
    m.GetClosConfig(clos=3),
    m.TFStatus(),
    m.Teardown(),
    m.TFStatus(),
    m.GetAssociation(cpus=list(range(16))),
]


# ---------------------------------------------------------------------- tests


@pytest.mark.parametrize("mode", ["tpmi", "mbox"])
def test_discover_round_trips(mode: str, small_root: Path) -> None:
    direct, via, kernel = _pair(mode, small_root)
    d1, d2 = direct.discover(), via.discover()
    assert via.platform.warnings == [] and via.platform.supported
    assert d2.backend == mode
    if mode == "tpmi":
        assert d2.packages == d1.packages
    else:  # legacy levels have 3 TRL rows (sse/avx2/avx512) and 3 LP clips; the rest is equal
        for p1, p2 in zip(d1.packages, d2.packages, strict=True):
            assert p1.cpus == p2.cpus
            for a, b in zip(p1.punits, p2.punits, strict=True):
                assert (a.cpus, a.cp, a.tf, a.pp, a.clos, a.base_mhz, a.max_hp_cpus) == (
                    b.cpus,
                    b.cp,
                    b.tf,
                    b.pp,
                    b.clos,
                    b.base_mhz,
                    b.max_hp_cpus,
                )
    assert kernel.calls, "the backend went through the ioctl"


@pytest.mark.parametrize("mode", ["tpmi", "mbox"])
def test_managed_mode_round_trips(mode: str, small_root: Path) -> None:
    """tpmi/mbox -> fake ioctl -> sim gives the replies and the state of the sim itself."""
    direct, via, kernel = _pair(mode, small_root)
    assert isinstance(direct.backend, SimBackend)
    for req in MANAGED:
        r1, r2 = direct.dispatch(req), via.dispatch(req)
        assert r2 == r1, req
        assert _state(kernel.sim) == _state(direct.backend), req
    assoc = via.dispatch(m.GetAssociation(cpus=list(range(16))))
    assert isinstance(assoc, m.GetAssociationReply)
    assert set(assoc.clos.values()) == {0}
    assert not any(pu["cp_enable"] for pu in kernel.sim.state["punits"].values())
    if mode == "tpmi":
        assert _ops(kernel.sim) == _ops(direct.backend)
        assert "ISST_IF_MBOX_COMMAND" not in kernel.calls
    else:
        assert not any(
            c.startswith("ISST_IF_C") and c != "ISST_IF_GET_PHY_ID" for c in kernel.calls
        )


def test_managed_state_midway(small_root: Path) -> None:
    """After Prepare+Configure+Enable+Associate the fake's model is PCT-on."""
    _, via, kernel = _pair("tpmi", small_root)
    for req in MANAGED[:6]:
        via.dispatch(req)
    pu = kernel.sim.state["punits"]["0/0"]
    assert pu["cp_enable"] and pu["cp_ordered"] and pu["feature_state"] == 0b10
    assert pu["clos"][0] == [23, 46, 0] and pu["clos"][3] == [8, 23, 0]
    assert pu["assoc"][:2] == [0, 0]  # cpus 0, 1 (and SMT siblings 8, 9)
    assert kernel.sim.state["punits"]["0/1"]["assoc"][:2] == [3, 3]  # cpus 2, 3
    tf = via.dispatch(m.TFStatus())
    assert isinstance(tf, m.TFStatusReply) and all(p.enabled for p in tf.punits)


def test_tpmi_one_ioctl_per_call_and_errors() -> None:
    kernel = FakeIsstKernel(SimBackend(SMALL_SIM))
    b = TpmiBackend("/nonexistent", ioctl_fn=kernel)
    assert b.api_version() == 3
    assert b.count_instances(1) == 0b11
    kernel.calls.clear()
    b.clos_assoc_set(0, 1, [(0, 3), (1, 3)])
    assert kernel.calls == ["ISST_IF_CLOS_ASSOC"]
    assert b.clos_assoc_get(0, 1, 1) == 3
    with pytest.raises(OSError) as exc:  # the kernel's ENOTTY comes through, named
        b.perf_levels(7, 0)
    assert exc.value.errno == errno.ENOTTY and "ISST_IF_PERF_LEVELS" in str(exc.value)
    kernel.calls.clear()
    for call in (
        lambda: b.clos_param_set(0, 0, 4, ClosParam(0, 25500, 0)),
        lambda: b.clos_param_set(0, 0, 0, ClosParam(0, 25600, 0)),
        lambda: b.clos_param_set(0, 0, 0, ClosParam(900, 800, 0)),
        lambda: b.clos_param_set(0, 0, 0, ClosParam(0, 800, 16)),
        lambda: b.clos_assoc_set(0, 0, [(64, 0)]),
        lambda: b.clos_assoc_set(0, 0, [(1, 4)]),
        lambda: b.clos_assoc_set(0, 0, [(1, 0)] * 65),
        lambda: b.level_cpu_mask(0, 0, 5),
        lambda: b.perf_set_feature(0, 0, 4),
    ):
        with pytest.raises(OSError) as exc:
            call()
        assert exc.value.errno == errno.EINVAL
    assert all(c == "ISST_IF_PERF_LEVELS" for c in kernel.calls), "refused before any write"


def test_tpmi_unprivileged_and_hwp_off_enotty() -> None:
    for cfg in (replace(SMALL_SIM, privileged=False), replace(SMALL_SIM, hwp=False)):
        b = TpmiBackend("/", ioctl_fn=FakeIsstKernel(SimBackend(cfg)))
        with pytest.raises(OSError) as exc:
            b.core_power_set(0, 0, True, True)
        assert exc.value.errno == errno.ENOTTY


def test_tpmi_level_info_and_set_level() -> None:
    sim = SimBackend(replace(SMALL_SIM, locked=False))
    b = TpmiBackend("/", ioctl_fn=FakeIsstKernel(sim))
    assert b.level_info(0, 0, 0) == replace(
        sim.level_info(0, 0, 0),
        trl_freq_mhz=(SMALL_SIM.trl_mhz,) + ((0,) * 8,) * (io.TRL_MAX_LEVELS - 1),
    )
    assert b.level_cpu_mask(1, 1, 1) == sim.level_cpu_mask(1, 1, 1)
    b.perf_set_feature(0, 0, 0b10)
    b.perf_set_level(0, 0, 1)
    pl = b.perf_levels(0, 0)
    assert (pl.current_level, pl.feature_state) == (1, 0)  # a level change clears TF (§1.7)


def test_multi_short_count_is_an_error() -> None:
    def short(fd: int, request: int, buf: bytearray) -> int:
        return 0

    dev = io.IsstDevice("/", ioctl_fn=short)
    with pytest.raises(OSError) as exc:
        dev.multi(io.ISST_IF_GET_PHY_ID, io.CPU_MAPS_CMD, [{"logical_cpu": 0}])
    assert exc.value.errno == errno.EIO
    with pytest.raises(OSError) as exc:
        dev.multi(io.ISST_IF_GET_PHY_ID, io.CPU_MAPS_CMD, [])
    assert exc.value.errno == errno.EINVAL


def test_real_ioctl_path_on_a_non_isst_file(tmp_path: Path) -> None:
    """Without ``ioctl_fn`` the real syscall runs: /dev/null-like files give ENOTTY."""
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "isst_interface").write_bytes(b"")
    b = TpmiBackend(tmp_path)
    with pytest.raises(OSError) as exc:
        b.api_version()
    assert exc.value.errno == errno.ENOTTY
    name, why = detect(tmp_path)
    assert name == "none" and "GET_PLATFORM_INFO failed" in why
    backend, note = make_backend("auto", tmp_path)
    assert isinstance(backend, NoneBackend) and note == why
    with pytest.raises(OSError) as exc:
        TpmiBackend(tmp_path / "absent").api_version()
    assert exc.value.errno == errno.ENOENT


def test_auto_detection(tmp_path: Path) -> None:
    tpmi, note = make_backend("auto", tmp_path, ioctl_fn=FakeIsstKernel(SimBackend(SMALL_SIM)))
    assert isinstance(tpmi, TpmiBackend) and note == ""
    mbox, note = make_backend(
        "auto", tmp_path, ioctl_fn=FakeIsstKernel(SimBackend(MBOX_SIM), "mbox")
    )
    assert isinstance(mbox, MboxBackend) and note == ""

    def old(fd: int, request: int, buf: bytearray) -> int:
        io.PLATFORM_INFO.pack({"api_version": 1})
        buf[:] = io.PLATFORM_INFO.pack({"api_version": 1})
        return 0

    none, note = make_backend("auto", tmp_path, ioctl_fn=old)
    assert isinstance(none, NoneBackend) and "no usable SST interface" in note
    none, note = make_backend("auto", tmp_path)
    assert isinstance(none, NoneBackend) and "SST not supported" in note
    assert isinstance(make_backend("tpmi", tmp_path)[0], TpmiBackend)
    assert isinstance(make_backend("mbox", tmp_path)[0], MboxBackend)


def test_mbox_refuses_tpmi_only_punits(small_root: Path) -> None:
    _, via, _ = _pair("mbox", small_root)
    b = via.backend
    assert isinstance(b, MboxBackend)
    with pytest.raises(OSError) as exc:
        b.perf_levels(0, 1)
    assert exc.value.errno == errno.ENODEV
    assert b.phy_id(9) == SimBackend(MBOX_SIM).phy_id(9)


def test_layout_pack_unpack() -> None:
    buf = io.CLOS_PARAM.pack({"get_set": 1, "clos": 3, "min_freq_mhz": 800, "max_freq_mhz": 2300})
    assert len(buf) == 10 and buf[3] == 3 and buf[4:6] == (800).to_bytes(2, "little")
    rec = io.PERF_LEVEL_DATA_INFO.unpack(
        io.PERF_LEVEL_DATA_INFO.pack({"trl_freq_mhz": list(range(48))})
    )
    assert rec.rows("trl_freq_mhz", 8)[1] == tuple(range(8, 16))
    with pytest.raises(KeyError):
        io.CORE_POWER.pack({"nope": 1})
    with pytest.raises(ValueError):
        io.TURBO_FREQ_INFO.pack({"lp_clip_freq_mhz": [1] * 7})
    with pytest.raises(TypeError):
        _ = rec["trl_freq_mhz"]

"""The ``tpmi`` and ``mbox`` backends against a FAKE kernel.

No machine here has SST hardware or ``/dev/isst_interface``, so
:class:`~fake_isst_kernel.FakeIsstKernel` (in ``fake_isst_kernel.py``, next to
this file) stands in for the kernel: it replaces the ioctl syscall, decodes each
request with the layouts of :mod:`nri_sst.backends.ioctl` and answers from a
:class:`~nri_sst.backends.sim.SimBackend` model, with the kernel's return values
and errnos. It is a mock of the kernel: the layouts themselves are checked against
the real UAPI header in ``test_ioctl_uapi.py``; what this file checks is that each backend method is
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
from .fake_isst_kernel import MBOX_SIM, FakeIsstKernel

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

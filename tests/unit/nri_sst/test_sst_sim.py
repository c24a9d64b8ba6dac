"""The sim backend against the invariants of sst.md §5.5 (one test per invariant)."""

from __future__ import annotations

import errno
import itertools
import json
from pathlib import Path

import pytest
from nri_sst.backends.base import MSR_APERF, MSR_MPERF, MSR_TSC, ClosParam
from nri_sst.backends.sim import SimBackend, SimConfig, journal_path, read_state
from nri_sst.handler import RequestHandler
from nri_sst.hostfs import discover_machine
from nri_sst.sst_platform import SstPlatform

from .conftest import SMALL_SIM


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def enotty(exc: pytest.ExceptionInfo[OSError]) -> bool:
    return exc.value.errno == errno.ENOTTY


def pct_on(sim: SimBackend, hp_modules: range, lp_clos: int = 3) -> None:
    """Program like nri managed mode on punit 0/0: HP modules CLOS 0, others ``lp_clos``."""
    for pkg in range(2):
        for pd in range(2):
            sim.perf_set_feature(pkg, pd, 0b10)
            sim.core_power_set(pkg, pd, True, True)
            sim.clos_param_set(pkg, pd, 0, ClosParam(2300, 4600, 0))
            sim.clos_param_set(pkg, pd, 3, ClosParam(800, 2300, 0))
            sim.clos_assoc_set(pkg, pd, [(m, 0 if m in hp_modules else lp_clos) for m in range(32)])


def test_inv1_error_model_tpmi_enotty_common_real_errno() -> None:
    """§5.5.1: TPMI ioctls fail only with ENOTTY; GET_PHY_ID (common) gives EINVAL."""
    sim = SimBackend()
    with pytest.raises(OSError) as e1:
        sim.clos_param_get(0, 0, 7)
    assert enotty(e1)
    with pytest.raises(OSError) as e2:
        sim.perf_levels(5, 0)
    assert enotty(e2)
    with pytest.raises(OSError) as e3:
        sim.phy_id(256)
    assert e3.value.errno == errno.EINVAL
    unprivileged = SimBackend(SimConfig(privileged=False))
    with pytest.raises(OSError) as e4:
        unprivileged.clos_assoc_set(0, 0, [(0, 3)])
    assert enotty(e4)


def test_inv2_range_checks_strict_rejects_faithful_corrupts() -> None:
    """§5.5.2: strict rejects clos>3, MHz>25500, core>=64; kernel-faithful corrupts."""
    strict = SimBackend()
    for call in (
        lambda: strict.clos_param_set(0, 0, 4, ClosParam(0, 25500, 0)),
        lambda: strict.clos_param_set(0, 0, 0, ClosParam(0, 25600, 0)),
        lambda: strict.clos_param_set(0, 0, 0, ClosParam(0, 25500, 16)),
        lambda: strict.clos_assoc_set(0, 0, [(64, 0)]),
        lambda: strict.clos_assoc_set(0, 0, [(1, 4)]),
    ):
        with pytest.raises(OSError) as exc:
            call()
        assert enotty(exc)
    faithful = SimBackend(SimConfig(strict=False))
    # min 25600 MHz = ratio 256: spills one bit into the max field.
    faithful.clos_param_set(0, 0, 1, ClosParam(25600, 0, 0))
    got = faithful.clos_param_get(0, 0, 1)
    assert (got.min_mhz, got.max_mhz) == (0, 100)


def test_inv3_hwp_gate() -> None:
    """§5.5.3: MSR 0x770 bit0 = 0 -> CP set, PP set and feature set fail."""
    sim = SimBackend(SimConfig(hwp=False, locked=False))
    for call in (
        lambda: sim.core_power_set(0, 0, True, True),
        lambda: sim.perf_set_feature(0, 0, 0b10),
        lambda: sim.perf_set_level(0, 0, 1),
    ):
        with pytest.raises(OSError) as exc:
            call()
        assert enotty(exc)
    sim.clos_param_set(0, 0, 0, ClosParam(800, 2300, 0))  # CLOS_PARAM is not gated
    assert sim.read_msr(0, 0x770) == 0


def test_inv4_get_phy_id() -> None:
    """§5.5.4: MSR 0x54 layout; never-online CPU -> 0; >= possible -> EINVAL."""
    sim = SimBackend(SimConfig(never_online=(200,)))
    assert [sim.phy_id(c) for c in (0, 128, 32, 33, 160)] == [0, 1, 0x800, 0x808, 0x801]
    assert sim.phy_id(200) == 0
    with pytest.raises(OSError) as exc:
        sim.phy_id(256)
    assert exc.value.errno == errno.EINVAL


def test_inv5_per_punit_independence() -> None:
    """§5.5.5: setting one punit never changes another."""
    sim = SimBackend()
    before = json.dumps({k: v for k, v in sim.state["punits"].items() if k != "0/1"})
    sim.core_power_set(0, 1, True, True)
    sim.clos_param_set(0, 1, 2, ClosParam(800, 2300, 5))
    sim.clos_assoc_set(0, 1, [(3, 2)])
    sim.perf_set_feature(0, 1, 0b10)
    after = json.dumps({k: v for k, v in sim.state["punits"].items() if k != "0/1"})
    assert before == after
    assert sim.core_power_get(0, 1).enable and not sim.core_power_get(0, 0).enable


def test_inv6_clos_storage_ratios() -> None:
    """§5.5.6: writes floor MHz/100, reads return ratio*100, prop_prio is 4 bits."""
    sim = SimBackend()
    sim.clos_param_set(1, 0, 2, ClosParam(2399, 4650, 15))
    assert sim.clos_param_get(1, 0, 2) == ClosParam(2300, 4600, 15)
    assert sim.state["punits"]["1/0"]["clos"][2] == [23, 46, 15]


def test_inv7_association_per_module_effect_only_with_cp(small_root: Path) -> None:
    """§5.5.7: per module (siblings share), R/W regardless of CP, effect only with CP on,
    persists across CP/TF toggles; CPReset = defaults + CLOS 0."""
    sim = SimBackend(SMALL_SIM)
    plat = SstPlatform(sim, discover_machine(small_root))
    sim.clos_param_set(0, 0, 3, ClosParam(800, 2300, 0))
    plat.associate(3, [0])  # cpu 0 -> module 0; sibling is cpu 8
    assert plat.get_association([0, 8]) == {0: 3, 8: 3}
    assert sim.expected_mhz(0) > 2300  # CP off: no effect
    sim.core_power_set(0, 0, True, False)
    assert sim.expected_mhz(0) == 2300
    sim.core_power_set(0, 0, False, False)
    sim.perf_set_feature(0, 0, 0b10)
    sim.core_power_set(0, 0, True, True)
    assert plat.get_association([8]) == {8: 3}
    plat.cp_reset(0)
    assert plat.get_association([0, 8]) == {0: 0, 8: 0}
    assert sim.clos_param_get(0, 0, 3) == ClosParam(0, 25500, 0)


def test_inv8_cp_status_delay() -> None:
    """§5.5.8: status reflects the write after a configurable delay; supported is read-only."""
    clock = Clock()
    sim = SimBackend(SimConfig(cp_status_delay_s=0.003), clock=clock)
    sim.core_power_set(0, 0, True, True)
    assert not sim.core_power_get(0, 0).enable
    clock.t += 0.004
    got = sim.core_power_get(0, 0)
    assert got.enable and got.ordered and got.supported


def test_inv9_pp_level_change() -> None:
    """§5.5.9: refused when locked / not allowed / same level (costs ~20 ms);
    success resets feature_state."""
    slept: list[float] = []
    locked = SimBackend(sleep=slept.append)
    with pytest.raises(OSError) as exc:
        locked.perf_set_level(0, 0, 1)
    assert enotty(exc) and slept == [0.02]
    sim = SimBackend(SimConfig(locked=False), sleep=slept.append)
    with pytest.raises(OSError):
        sim.perf_set_level(0, 0, 0)  # same level
    with pytest.raises(OSError):
        sim.perf_set_level(0, 0, 3)  # not allowed
    sim.perf_set_feature(0, 0, 0b10)
    sim.perf_set_level(0, 0, 1)
    pl = sim.perf_levels(0, 0)
    assert pl.current_level == 1 and pl.feature_state == 0


def test_inv10_feature_set_whole_byte_bf_unsupported() -> None:
    """§5.5.10: the byte is written whole; BF (unsupported on 6776P) never turns on."""
    sim = SimBackend()
    sim.perf_set_feature(0, 0, 0b11)
    assert sim.perf_levels(0, 0).feature_state == 0b10
    assert sim.state["punits"]["0/0"]["feature_error"] & 0b111 == 1
    sim.perf_set_feature(0, 0, 0b01)
    assert sim.perf_levels(0, 0).feature_state == 0


def test_inv11_tf_effective_only_with_cp_ordered_and_bucket() -> None:
    """§5.5.11: TF effective iff TF on, CP on, ordered; HP max by bucket, LP clipped."""
    sim = SimBackend()
    sim.perf_set_feature(0, 0, 0b10)  # lenient: accepted while CP is off
    assert not sim.tf_effective(0, 0)
    sim.core_power_set(0, 0, True, False)
    assert not sim.tf_effective(0, 0)  # proportional
    pct_on(sim, range(4))
    assert sim.tf_effective(0, 0)
    assert sim.expected_mhz(0) == 4600  # 4 HP modules -> bucket 0
    assert sim.expected_mhz(10) == 2300  # LP: CLOS 3 max and lp_clip
    pct_on(sim, range(12))  # 12 HP modules -> bucket 1 (16 @ 4200)
    assert sim.expected_mhz(0) == 4200
    strict = SimBackend(SimConfig(tf_strict=True))
    strict.perf_set_feature(0, 0, 0b10)
    assert strict.perf_levels(0, 0).feature_state == 0


def test_inv12_effective_frequency_bounds(small_root: Path) -> None:
    """§5.5.12: max_eff = min(scaling_max, CLOS max, TF/TRL limit); min_eff = min(max(
    scaling_min, CLOS min), max_eff)."""
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    sim = h.backend
    assert isinstance(sim, SimBackend)
    assert sim.expected_mhz(0) == 3900  # standard TRL with 2 active cores per punit
    h.writer.set_cpufreq(0, 1_000_000, 3_000_000, None, None)
    sim.sysfs_changed([0])
    assert sim.state["cpus"]["max_mhz"][0] == 3000
    assert sim.state["cpus"]["min_mhz"][0] == 1000
    sim.clos_param_set(0, 0, 0, ClosParam(2000, 2500, 0))
    sim.core_power_set(0, 0, True, False)
    sim.sync()  # the handler's end of a request
    sim.catch_up()  # once its reply is out: the oracle is recomputed once
    assert (sim.state["cpus"]["min_mhz"][0], sim.state["cpus"]["max_mhz"][0]) == (2000, 2500)


def test_inv13_counters() -> None:
    """§5.5.13: TSC at 2300 MHz always, MPERF at 2300 x busy, APERF at effective x busy."""
    clock = Clock()
    sim = SimBackend(clock=clock)
    pct_on(sim, range(4))
    sim.settle()
    a0 = [sim.read_msr(c, r) for c in (0, 10) for r in (MSR_APERF, MSR_MPERF, MSR_TSC)]
    clock.t += 0.5
    sim.settle()
    sim.state["cpus"]["load"][10] = 0.5
    clock.t += 0.5
    sim.settle()
    a1 = [sim.read_msr(c, r) for c in (0, 10) for r in (MSR_APERF, MSR_MPERF, MSR_TSC)]
    d = [b - a for a, b in zip(a0, a1, strict=True)]
    assert d[2] == d[5] == 2300 * 1_000_000
    assert d[1] == 2300 * 1_000_000 and d[0] == 4600 * 1_000_000
    assert 2300 * d[0] // d[1] == 4600 and 2300 * d[3] // d[4] == 2300
    assert d[4] < d[5]  # cpu 10 was half busy for half the time


def test_inv14_offline_cpu(tmp_path: Path) -> None:
    """§5.5.14: an offline CPU is not discovered, MSR open -> ENXIO, association by core works."""
    import dataclasses

    from nri_framework.simulate.sysfs import write_topology

    from .conftest import SMALL

    root = write_topology(tmp_path / "host", dataclasses.replace(SMALL, online="0-2,4-15"))
    sim = SimBackend(SMALL_SIM)
    plat = SstPlatform(sim, discover_machine(root))
    assert 3 not in plat.punit_of
    with pytest.raises(OSError) as exc:
        sim.read_msr(3, MSR_APERF)
    assert exc.value.errno == errno.ENXIO
    plat.associate(2, [11])  # cpu 11 is the sibling of offline cpu 3 (module 1 of 0/1)
    assert sim.clos_assoc_get(0, 1, 1) == 2


def test_inv15_cpufreq_qos_clamp(small_root: Path) -> None:
    """§5.5.15: the effective policy is clamped to cpuinfo; min > max makes min = max."""
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    sim = h.backend
    assert isinstance(sim, SimBackend)
    h.writer.set_cpufreq(1, 3_000_000, 2_000_000, None, None)
    sim.sysfs_changed([1])
    assert sim.state["cpus"]["min_mhz"][1] == sim.state["cpus"]["max_mhz"][1] == 2000


def test_inv16_msr_reads_only() -> None:
    """§5.5.16 (partial): the helper reads MSRs only; 0x54/0xCE/0x770 are modelled."""
    sim = SimBackend()
    assert sim.read_msr(33, 0x54) == 0x808
    assert (sim.read_msr(0, 0xCE) >> 8) & 0xFF == 23
    assert sim.read_msr(0, 0x770) == 1
    with pytest.raises(OSError) as exc:
        sim.read_msr(0, 0x1B0)
    assert exc.value.errno == errno.EIO


def test_state_file_persists_across_restart(tmp_path: Path) -> None:
    state = tmp_path / "sim.json"
    sim = SimBackend(state_file=state)
    sim.core_power_set(1, 1, True, True)
    sim.sync()
    doc = read_state(state)
    assert doc["punits"]["1/1"]["cp_enable"] is True
    assert doc["log"][-1]["op"] == "cp"
    again = SimBackend(state_file=state)
    assert again.core_power_get(1, 1).enable


def test_bios_pct_on_profile() -> None:
    sim = SimBackend(SimConfig(profile="bios-pct-on"))
    cp = sim.core_power_get(0, 0)
    assert cp.enable and cp.ordered
    assert sim.clos_assoc_get(0, 0, 0) == 0 and sim.clos_assoc_get(0, 0, 20) == 2
    assert sim.tf_effective(0, 0)


def test_every_change_is_in_the_state_file_before_the_reply(
    small_root: Path, tmp_path: Path
) -> None:
    """Hardware keeps each write at once, so a helper killed right after it
    answered comes back to what it answered (the model: its state file is
    written before the reply leaves, not later when idle)."""
    from nri_sst import messages as m

    state = tmp_path / "sim.json"
    h = RequestHandler(SimBackend(SMALL_SIM, state_file=state), small_root)
    h.peers.add(b"")
    h.dispatch(m.PrepareManagedMode())
    for clos in (2, 3, 1):  # back to back, as a plugin's flush sends them
        h.dispatch(m.AssociateCpus(clos=clos, cpus=[5]))
        # kill -9 now: a new helper reads the file
        again = RequestHandler(SimBackend(SMALL_SIM, state_file=state), small_root)
        again.peers.add(b"")
        assert again.dispatch(m.GetAssociation(cpus=[5])) == m.GetAssociationReply(clos={5: clos})


def test_an_unchanged_association_leaves_the_state_file_until_idle(
    small_root: Path, tmp_path: Path
) -> None:
    """An association to the CLOS a core is on already changes nothing the
    hardware holds: the reply leaves without the state file written (its
    log line and counters are saved when the helper is idle); a changed one
    is written before the reply."""
    from nri_sst import messages as m

    state = tmp_path / "sim.json"
    sim = SimBackend(SMALL_SIM, state_file=state)
    h = RequestHandler(sim, small_root)
    h.peers.add(b"")
    h.dispatch(m.PrepareManagedMode())
    h.dispatch(m.AssociateCpus(clos=2, cpus=[5]))
    assert SimBackend(SMALL_SIM, state_file=state).clos_assoc_get(1, 0, 1) == 2  # cpu 5, saved
    sim.idle()  # the counters and log lines of the change, when idle
    written = state.stat().st_mtime_ns, state.stat().st_ino
    assert not sim.has_deferred()
    h.dispatch(m.AssociateCpus(clos=2, cpus=[5]))
    assert (state.stat().st_mtime_ns, state.stat().st_ino) == written
    assert sim.has_deferred()
    sim.idle()
    assert read_state(state)["log"][-1]["op"] == "clos-assoc"
    assert not sim.has_deferred()
    h.dispatch(m.AssociateCpus(clos=1, cpus=[5]))
    again = RequestHandler(SimBackend(SMALL_SIM, state_file=state), small_root)  # kill -9 now
    again.peers.add(b"")
    assert again.dispatch(m.GetAssociation(cpus=[5])) == m.GetAssociationReply(clos={5: 1})


def _managed_with_clos3(root: Path) -> tuple[SimBackend, RequestHandler]:
    """A small sim in managed mode, CLOS 3 at 800-1600 MHz, CP enabled."""
    from nri_sst import messages as m

    sim = SimBackend(SMALL_SIM)
    h = RequestHandler(sim, root)
    h.peers.add(b"")
    h.dispatch(m.PrepareManagedMode())
    h.dispatch(m.ConfigureClos(clos=3, min_khz=800_000, max_khz=1_600_000))
    h.dispatch(m.EnableCP())
    return sim, h


def test_an_association_recomputes_what_a_whole_recompute_would(small_root: Path) -> None:
    """After an association the frequency oracle recomputes only the punits
    it changed: every CPU's figures are those of a whole recompute."""
    from nri_sst import messages as m

    sim, h = _managed_with_clos3(small_root)
    for clos, cpus in ((3, [0, 1, 2]), (0, [1]), (3, [9, 12])):
        h.dispatch(m.AssociateCpus(clos=clos, cpus=cpus))
        partial = [sim.expected_mhz(cpu) for cpu in range(SMALL_SIM.ncpus)]
        lows = list(sim.state["cpus"]["min_mhz"])
        sim._stale = True  # the whole oracle, for comparison
        assert [sim.expected_mhz(cpu) for cpu in range(SMALL_SIM.ncpus)] == partial
        assert sim.state["cpus"]["min_mhz"] == lows
    assert len(set(partial)) > 1  # the associations did change frequencies


def test_counters_count_each_cpu_at_its_frequency_until_an_association_changed_it() -> None:
    """An association changes the frequencies of the CPUs it moves (or, when
    the TF bucket changes, of every HP CPU of the punit): their counters
    count at the old frequency until the change, at the new one after it;
    the other CPUs' counters are not touched in between and count as before."""
    clock = Clock()
    sim = SimBackend(clock=clock)
    pct_on(sim, range(4))

    def aperf() -> list[int]:
        sim.settle()
        return [sim.read_msr(cpu, MSR_APERF) for cpu in (0, 5, 40)]

    a0 = aperf()
    clock.t += 1
    sim.clos_assoc_set(0, 0, [(5, 0)])  # 5 HP modules: bucket 0 still (4600)
    clock.t += 1
    a1 = aperf()
    assert [b - a for a, b in zip(a0, a1, strict=True)] == [
        4600 * 2_000_000,
        (2300 + 4600) * 1_000_000,
        2300 * 2_000_000,
    ]
    sim.clos_assoc_set(0, 0, [(m, 0) for m in range(6, 12)])  # 12: bucket 1 (4200)
    clock.t += 1
    a2 = aperf()
    assert [b - a for a, b in zip(a1, a2, strict=True)] == [4200 * 1_000_000] * 2 + [
        2300 * 1_000_000
    ]


def test_a_cpufreq_write_recomputes_only_the_cpus_whose_limits_changed(small_root: Path) -> None:
    """A cpufreq write computes the frequencies of the CPUs whose limits
    changed, their counters counting at the old frequency until the write;
    the other CPUs are not touched (nothing done for CPUs whose state does
    not change), and every figure is that of a whole recompute."""
    from nri_sst import messages as m

    clock = Clock()
    sim = SimBackend(SMALL_SIM, clock=clock)
    h = RequestHandler(sim, small_root)
    h.peers.add(b"")

    def aperf() -> list[int]:
        sim.settle()
        return [sim.read_msr(cpu, MSR_APERF) for cpu in (0, 5)]

    old = [sim.expected_mhz(cpu) for cpu in (0, 5)]
    a0 = aperf()
    clock.t += 1
    h.dispatch(m.SetCpufreq(cpus=[0], max_khz=3_000_000))
    assert sim._at is not None and sim._at[5] == clock.t - 1  # cpu 5's limits did not change
    clock.t += 1
    a1 = aperf()
    assert [b - a for a, b in zip(a0, a1, strict=True)] == [
        (old[0] + 3000) * 1_000_000,
        old[1] * 2_000_000,
    ]
    partial = [sim.expected_mhz(cpu) for cpu in range(SMALL_SIM.ncpus)]
    lows = list(sim.state["cpus"]["min_mhz"])
    sim._stale = True  # the whole oracle, for comparison
    assert [sim.expected_mhz(cpu) for cpu in range(SMALL_SIM.ncpus)] == partial
    assert sim.state["cpus"]["min_mhz"] == lows
    assert partial[0] == 3000 != old[0]


def test_idle_modules_raise_the_turbo_ratio_limit(tmp_path: Path) -> None:
    """Without SST-TF the turbo ratio limit follows the active modules of the
    punit (TRL buckets): every module busy, the lowest bucket's 3600 MHz; all
    but module 0 of punit 0/0 idle (load 0 in the state the model starts
    from), module 0 gets the one-core bucket's 3900 MHz, the other punits
    stay at 3600 (the all-busy count is only taken while every CPU is busy)."""
    state = tmp_path / "sim.json"
    busy = SimBackend(state_file=state)
    assert busy.expected_mhz(0) == 3600 and busy.expected_mhz(32) == 3600
    busy.save()
    doc = json.loads(state.read_text())
    cfg = busy.config
    for module in range(1, cfg.cores_per_punit):
        for thread in range(cfg.threads_per_core):
            doc["cpus"]["load"][thread * cfg.ncores + module] = 0.0
    state.write_text(json.dumps(doc))
    idle = SimBackend(state_file=state)
    assert idle.expected_mhz(0) == 3900 and idle.expected_mhz(cfg.ncores) == 3900
    assert idle.expected_mhz(cfg.cores_per_punit) == 3600  # punit 0/1: all busy


def test_an_association_reply_leaves_the_frequency_model_for_later(small_root: Path) -> None:
    """The handler's sync after an association write computes no frequency
    (no reply carries one): the model is computed when the helper catches up
    (or by the first read), to the same figures as computed at once."""
    from nri_sst import messages as m

    sim, h = _managed_with_clos3(small_root)
    sim.catch_up()
    computed = []
    recompute = sim._recompute

    def counting() -> None:
        computed.append(1)
        recompute()

    sim._recompute = counting  # type: ignore[method-assign]
    h.dispatch(m.AssociateCpus(clos=3, cpus=[0, 1, 2]))
    assert computed == [] and sim.has_deferred()
    sim.catch_up()
    assert computed == [1] and not sim.has_deferred()
    lazy = [sim.expected_mhz(cpu) for cpu in range(SMALL_SIM.ncpus)]
    sim._stale = True  # the whole oracle again, for comparison
    assert [sim.expected_mhz(cpu) for cpu in range(SMALL_SIM.ncpus)] == lazy


def test_the_hardware_part_is_the_state_encoded_after_an_irq_change(small_root: Path) -> None:
    """What the state file holds of the hardware is the state's encoding, the
    IRQ affinities kept encoded between changes and encoded again after one."""
    import msgspec
    from nri_sst.backends.sim import VOLATILE, _join

    sim = SimBackend(SMALL_SIM)
    h = RequestHandler(sim, small_root)

    def whole() -> bytes:
        return msgspec.json.encode({k: v for k, v in sim.state.items() if k not in VOLATILE})

    assert _join(sim._hardware_parts()) == whole()
    irq = next(i.number for i in h.interrupts.read() if i.writable)
    h.interrupts.set_affinity(irq, [1, 2])
    assert sim.state["irqs"][str(irq)] == [1, 2]
    assert _join(sim._hardware_parts()) == whole()


def _journaled(root: Path, tmp_path: Path) -> tuple[SimBackend, RequestHandler, Path]:
    """A small sim with a state file in managed mode, saved whole (as when idle)."""
    from nri_sst import messages as m

    state = tmp_path / "sim.json"
    sim = SimBackend(SMALL_SIM, state_file=state)
    h = RequestHandler(sim, root)
    h.peers.add(b"")
    h.dispatch(m.PrepareManagedMode())
    sim.idle()
    return sim, h, state


def _assoc_of_cpu5(state: Path) -> int:
    """CLOS of cpu 5 (punit 1/0, module 1) in what the state file and journal hold."""
    clos: int = read_state(state)["punits"]["1/0"]["assoc"][1]
    return clos


def test_a_change_is_appended_to_the_journal_and_the_file_saved_whole_when_idle(
    small_root: Path, tmp_path: Path
) -> None:
    """A change the hardware keeps costs the reply one appended line (the
    parts that changed), not the whole state rewritten; the idle helper
    saves the whole state and starts a new journal."""
    from nri_sst import messages as m

    sim, h, state = _journaled(small_root, tmp_path)
    written = state.stat().st_ino
    journal = Path(journal_path(state))
    header = journal.read_bytes()
    h.dispatch(m.AssociateCpus(clos=2, cpus=[5]))
    h.dispatch(m.AssociateCpus(clos=3, cpus=[5]))
    assert state.stat().st_ino == written
    lines = journal.read_bytes()[len(header) :].splitlines()
    assert [set(json.loads(line)) for line in lines] == [{"punits"}, {"punits"}]
    assert _assoc_of_cpu5(state) == 3
    sim.idle()
    assert state.stat().st_ino != written and journal.read_bytes().count(b"\n") == 1
    assert json.loads(state.read_bytes())["punits"]["1/0"]["assoc"][1] == 3


def test_a_journal_of_another_state_file_is_not_read(small_root: Path, tmp_path: Path) -> None:
    """The state file replaced (by hand, or saved anew by a helper killed
    before its new journal was made): the journal beside it follows another
    file and is not put over it."""
    from nri_sst import messages as m

    _, h, state = _journaled(small_root, tmp_path)
    before = state.read_bytes()
    h.dispatch(m.AssociateCpus(clos=2, cpus=[5]))
    assert _assoc_of_cpu5(state) == 2
    state.unlink()
    state.write_bytes(before)  # the same text, another file
    assert _assoc_of_cpu5(state) == 0
    assert SimBackend(SMALL_SIM, state_file=state).clos_assoc_get(1, 0, 1) == 0


def test_a_journal_line_cut_short_ends_the_journal(small_root: Path, tmp_path: Path) -> None:
    """A helper killed while appending: the changes before the cut line are
    read, the cut one is not, and a new helper starts from that."""
    from nri_sst import messages as m

    _, h, state = _journaled(small_root, tmp_path)
    h.dispatch(m.AssociateCpus(clos=2, cpus=[5]))
    h.dispatch(m.AssociateCpus(clos=3, cpus=[5]))
    journal = Path(journal_path(state))
    with journal.open("r+b") as f:
        f.truncate(journal.stat().st_size - 7)
    assert _assoc_of_cpu5(state) == 2
    again = SimBackend(SMALL_SIM, state_file=state)
    assert again.clos_assoc_get(1, 0, 1) == 2


def test_a_failed_journal_write_is_reported_and_the_next_change_saves_whole(
    small_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    from nri_sst import messages as m

    sim, h, state = _journaled(small_root, tmp_path)
    assert sim._journal is not None
    os.close(sim._journal)  # the next append fails (EBADF)
    ro = os.open(os.devnull, os.O_RDONLY)
    os.dup2(ro, sim._journal)
    os.close(ro)
    h.dispatch(m.AssociateCpus(clos=2, cpus=[5]))
    assert "backend sync failed" in caplog.text
    written = state.stat().st_ino
    h.dispatch(m.AssociateCpus(clos=3, cpus=[5]))
    assert state.stat().st_ino != written  # saved whole, a new journal after it
    assert json.loads(state.read_bytes())["punits"]["1/0"]["assoc"][1] == 3
    assert SimBackend(SMALL_SIM, state_file=state).clos_assoc_get(1, 0, 1) == 3


def test_a_journal_past_its_limit_is_saved_whole(
    small_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper never idle: the journal grows to at most its limit and a
    line; the change past it saves the whole state and starts a new journal."""
    from nri_sst import messages as m
    from nri_sst.backends import sim as sim_module

    monkeypatch.setattr(sim_module, "JOURNAL_LIMIT", 4096)
    _, h, state = _journaled(small_root, tmp_path)
    journal = Path(journal_path(state))
    sizes = []
    for n in range(40):
        h.dispatch(m.AssociateCpus(clos=n % 4, cpus=[5]))
        sizes.append(journal.stat().st_size)
        assert _assoc_of_cpu5(state) == n % 4
    line = sizes[1] - sizes[0]
    assert max(sizes) <= 4096 + line
    assert any(later < earlier for earlier, later in itertools.pairwise(sizes))

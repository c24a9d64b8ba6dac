"""Priority Core Turbo in the balloons policy (reference §13): the plan and its
programming on the Xeon 6776P model, CLOS association of HP/LP balloons, assoc-only
mode, the HP hints, exact validation errors, leaving managed mode.

Where the neighbouring test modules are: see :mod:`pct_helpers`.
"""

from __future__ import annotations

import functools
import logging
import operator
from pathlib import Path

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.extres import extended_resources
from nri_balloons.pcthints import PLACED_MAX
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_sst import messages as m
from nri_sst.backends.sim import SimConfig
from pct_helpers import (
    ASSOC_ONLY,
    SPEC,
    InProcessHelper,
    admit,
    disabled_cstates,
    make,
    pod,
    shared_root,  # noqa: F401 (the module's autouse host tree)
    start,
)


def test_spec_configuration_programs_managed_mode(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="cpuclass")
    policy, helper = make()
    lines = [r.getMessage() for r in caplog.records if r.name == "cpuclass"]
    assert "pct: mode=managed, 2 PCT cpuClass(es), 4 punit(s) across 2 package(s)" in lines
    assert "pct: programmed CLOS 0 min=2300000 max=4600000 kHz" in lines
    assert "pct: programmed CLOS 3 min=800000 max=2300000 kHz" in lines
    assert 'pct: cpuClass "hp-pct" classified HP (managed: pctPriority=high, CLOS 0)' in lines
    assert 'pct: cpuClass "lp-pct" classified LP (managed: pctPriority=low, CLOS 3)' in lines
    assert "pct: fallback CLOS for non-PCT CPUs set to 3 (LP)" in lines
    assert any(x.startswith("pct: PrepareManagedMode done") for x in lines)
    assert any(x.startswith("pct: EnableCP done") for x in lines)
    assert any(
        x.startswith("pct: SST discovered: pkg=0 punit=0 level=0 cpus=0-31,128-159") for x in lines
    )
    # the order of the SoC-wide programming (§13.2)
    kinds = [type(r).__name__ for r in helper.sent]
    assert (
        kinds.index("PrepareManagedMode") < kinds.index("ConfigureClos") < kinds.index("EnableCP")
    )
    # the model: CP on and ordered, TF on, on every punit; CLOS bounds programmed
    for pu in helper.punit_state():
        assert pu.cp.enabled and pu.cp.priority == "ordered", pu
        assert pu.tf.enabled, pu
        clos = {c.clos: c for c in pu.clos}
        assert (clos[0].min_khz, clos[0].max_khz) == (2_300_000, 4_600_000)
        assert (clos[3].min_khz, clos[3].max_khz) == (800_000, 2_300_000)
    # every CPU (idle, reserved) is on the LP fallback CLOS: no balloon holds HP CPUs yet
    assert set(helper.clos(policy.allowed).values()) == {3}


def punit_of(policy: BalloonsPolicy, cpus: int) -> set[tuple[int, int]]:
    pct = policy.cpu_classes.pct
    return {k for c in cpuset.ids(cpus) if (k := pct.punit_key(c)) is not None}


def test_spec_scenario_hp_spread_lp_and_clos(caplog: pytest.LogCaptureFixture) -> None:
    """Steps 5-6 of the spec: four HP pods of 2 CPUs, one LP pod of 8."""
    policy, helper = make()
    caplog.set_level(logging.DEBUG, logger="cpuclass")
    caplog.clear()  # what the admissions below log, not the start-up's (if it logged)
    hp = [admit(policy, f"pct-hp-{i}", 2, "hp-bln") for i in range(1, 5)]
    lp = admit(policy, "pct-lp", 8, "lp-bln")
    assert [c.bit_count() for c in hp] == [2, 2, 2, 2]
    assert lp.bit_count() == 8
    # four distinct punits (6.4), each HP balloon one physical core's two threads
    punits = [punit_of(policy, c) for c in hp]
    assert all(len(p) == 1 for p in punits)
    assert len(set.union(*punits)) == 4
    for c in hp:
        a, b = cpuset.ids(c)
        assert b == a + 128
    names = sorted(b.name for b in policy.balloons)
    assert names == [
        "default[0]",
        "hp-bln[0]",
        "hp-bln[1]",
        "hp-bln[2]",
        "hp-bln[3]",
        "lp-bln[0]",
        "reserved[0]",
    ]
    # 6.3: CLOS 0 on HP CPUs, CLOS 3 on LP and everything else
    all_hp = functools.reduce(operator.or_, hp)
    clos = helper.clos(policy.allowed)
    assert {c for c, k in clos.items() if k == 0} == set(cpuset.ids(all_hp))
    assert all(clos[c] == 3 for c in cpuset.ids(lp))
    # 6.1: one association line per HP pod (CLOS 0) and per LP pod (CLOS 3)
    lines = [r.getMessage() for r in caplog.records if "associated cpus" in r.getMessage()]
    assert sum(x.endswith("to CLOS 0") for x in lines) == 4, lines
    assert sum(x.endswith("to CLOS 3") for x in lines) == 1, lines
    assert f"pct: associated cpus {cpuset.format(lp)} to CLOS 3" in lines
    # C6/C6P disabled exactly on HP CPUs (the hp-pct class), enabled elsewhere
    for cpu in cpuset.ids(policy.allowed):
        want = {"C6", "C6P"} if all_hp >> cpu & 1 else set()
        assert disabled_cstates(cpu) == want, cpu
    # SST-TF effective: the model's HP bucket applies to every punit
    for pu in helper.punit_state():
        assert pu.tf.enabled and pu.cp.enabled and pu.cp.priority == "ordered"


def test_freed_hp_cpus_go_back_to_lp_clos_and_cstates(caplog: pytest.LogCaptureFixture) -> None:
    policy, helper = make()
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    assert set(helper.clos(hp).values()) == {0}
    caplog.set_level(logging.DEBUG, logger="cpuclass")
    policy.release("ctr-pct-hp-1")
    assert policy.cpu_classes.commit()
    assert set(helper.clos(policy.allowed).values()) == {3}
    assert f"pct: associated cpus {cpuset.format(hp)} to CLOS 3" in caplog.messages
    for cpu in cpuset.ids(hp):
        assert disabled_cstates(cpu) == set()


def test_hp_balloon_resize_associates_new_cpus() -> None:
    text = SPEC.read_text().replace("preferNewBalloons: true", "preferNewBalloons: false")
    policy, helper = make(text)
    first = admit(policy, "a", 2, "hp-bln")
    both = admit(policy, "b", 2, "hp-bln")
    assert first & both == first and both.bit_count() == 4
    assert set(helper.clos(both).values()) == {0}
    assert len(punit_of(policy, both)) == 1  # inflated within its punit


def test_extended_resource_capacity() -> None:
    text = SPEC.read_text().replace(
        "    pctMaxFreq: turbo\n", "    pctMaxFreq: turbo\n    publishExtendedResource: true\n"
    )
    policy, _ = make(text)
    res = extended_resources(policy)
    # 4 punits x 8 guaranteed HP CPUs (the smallest SST-TF bucket), as upstream's quickstart
    assert res == {"cpuclass.balloons.nri.io/*": None, "cpuclass.balloons.nri.io/hp-pct": 32}
    # the HP class's own balloons are not subtracted; CPUs held by other classes are
    admit(policy, "hp", 2, "hp-bln")
    assert extended_resources(policy)["cpuclass.balloons.nri.io/hp-pct"] == 32  # type: ignore[index]
    # no publishing class: only the ownership key, so every owned key is removed
    plain, _ = make()
    assert extended_resources(plain) == {"cpuclass.balloons.nri.io/*": None}


def test_assoc_only_mode_reads_and_associates(caplog: pytest.LogCaptureFixture) -> None:
    """Reference §19 manual example: the operator programmed SST (the sim's
    "BIOS PCT on" profile); the plugin only associates."""
    caplog.set_level(logging.DEBUG, logger="cpuclass")
    helper = InProcessHelper(SimConfig(profile="bios-pct-on"))
    policy, _ = make(ASSOC_ONLY, helper)
    kinds = {type(r).__name__ for r in helper.sent}
    assert not kinds & {"PrepareManagedMode", "ConfigureClos", "EnableCP"}
    assert (
        "pct: mode=assoc-only, 3 PCT cpuClass(es), 4 punit(s) across 2 package(s)"
        in caplog.messages
    )
    assert not any("PrepareManagedMode done" in x or "EnableCP done" in x for x in caplog.messages)
    hp = admit(policy, "a", 2, "hp")
    assert f"pct: associated cpus {cpuset.format(hp)} to CLOS 0" in caplog.messages
    assert set(helper.clos(hp).values()) == {0}
    lp = admit(policy, "b", 4, "lp")
    assert set(helper.clos(lp).values()) == {3}


def test_assoc_only_non_pct_cpus_left_alone() -> None:
    text = ASSOC_ONLY.replace("- {name: default, sstClosID: 3}\n", "")
    helper = InProcessHelper(SimConfig(profile="bios-pct-on"))
    before = None
    policy, _ = make(text, helper)
    before = helper.clos(policy.allowed)
    bln = policy.allocate(*pod("x", 2, "reserved"))  # a non-PCT class
    assert bln is not None
    assert policy.cpu_classes.commit()
    assert helper.clos(policy.allowed) == before
    assert not any(
        isinstance(r, m.AssociateCpus) and set(r.cpus) & set(cpuset.ids(bln.cpus)) and r.clos != 0
        for r in helper.sent
    )


def test_hp_hints_follow_room_then_free() -> None:
    """§13.6 tiers: with 2 HP CPUs of room per punit (a narrow SST-TF bucket),
    a second HP balloon avoids the punit the first one filled."""
    helper = InProcessHelper(SimConfig(tf_buckets=(2,), tf_mhz=(4600,)))
    policy, _ = make(helper=helper)
    pct = policy.cpu_classes.pct
    assert {pu.max_hp for pu in pct.punits} == {2}
    a = admit(policy, "a", 2, "hp-bln")
    hints = policy.cpu_classes.hints("hp-pct", 2, policy.free & ~policy.reserved, 0)
    assert hints.prefer and hints.prefer[0][0] == "sst-hp-reserve"
    first_choice = hints.prefer[0][1][0]
    assert not first_choice & a and punit_of(policy, first_choice) != punit_of(policy, a)
    # non-HP classes avoid punits holding HP CPUs
    lp_hints = policy.cpu_classes.hints("lp-pct", 8, policy.free, 0)
    assert lp_hints.avoid and lp_hints.avoid[0][0] == "sst-hp-in-use"
    lp = admit(policy, "lp", 8, "lp-bln")
    assert not punit_of(policy, lp) & punit_of(policy, a)


def test_invalid_pct_errors_are_exact() -> None:
    from nri_balloons.pct import PctError, plan_classes

    doc = load_policy(
        "reservedResources: {cpu: '1'}\n"
        "cpuClasses:\n- {name: a, pctPriority: high}\n- {name: b, sstClosID: 1}\n"
    )
    with pytest.raises(
        PctError,
        match=r"^pct: cannot mix managed \(pctPriority\) and assoc-only \(sstClosID\) modes$",
    ):
        plan_classes(doc.spec.cpu_classes, None)
    with pytest.raises(BalloonsError):
        bad = validate(doc, online_cpus=(1 << 256) - 1)
        assert bad.prepared is None
        raise BalloonsError("; ".join(bad.errors))


def test_placement_is_logged_with_the_punit(caplog: pytest.LogCaptureFixture) -> None:
    policy, _ = make()
    caplog.set_level(logging.INFO, logger="cpuclass")
    cpus = admit(policy, "pct-hp-1", 2, "hp-bln")
    ((pkg, unit),) = punit_of(policy, cpus)
    assert (
        f'pct: balloon hp-bln[0] (cpuClass "hp-pct", CLOS 0) on cpus {cpuset.format(cpus)}: '
        f"pkg={pkg} punit={unit}"
    ) in caplog.messages


def test_the_placement_line_is_logged_after_the_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The plugin logs a create's placement line with the decision's commit,
    once the answer is out (the stub's ``replying`` block left), not while
    the answer is built; a policy whose placements nobody commits logs them
    every PLACED_MAX."""
    from nri_framework.host import PolicyHost
    from nri_framework.model import RuntimeInfo

    plugin = start(InProcessHelper(), SPEC.read_text(), tmp_path)
    host = plugin.host
    assert isinstance(host, PolicyHost)
    try:
        host.configure("", RuntimeInfo(name="containerd", version="2.1.4"))
        host.synchronize([], [])
        caplog.set_level(logging.INFO, logger="cpuclass")

        def placed() -> list[str]:
            return [line for line in caplog.messages if line.startswith("pct: balloon hp-bln")]

        with host.replying():
            result = host.create_container(*pod("pct-hp-1", 2, "hp-bln"))
            assert placed() == []
        assert result.adjustment is not None and result.adjustment.resources.cpu is not None
        (line,) = placed()
        assert f"on cpus {result.adjustment.resources.cpu.cpus}: pkg=" in line
    finally:
        plugin.policy_shutdown()
    caplog.clear()
    policy, _ = make()
    pct = policy.cpu_classes.pct
    for i in range(PLACED_MAX - 1):
        pct.log_placement(f"hp-bln[{i}]", "hp-pct", 0b11 << 2 * i)
    assert placed() == [] and len(pct.placed) == PLACED_MAX - 1
    pct.log_placement("hp-bln[last]", "hp-pct", 0b11)
    assert len(placed()) == PLACED_MAX and pct.placed == []


def test_leaving_managed_mode_resets_sst(caplog: pytest.LogCaptureFixture) -> None:
    policy, helper = make()
    admit(policy, "pct-hp-1", 2, "hp-bln")
    assert all(pu.cp.enabled for pu in helper.punit_state())
    plain = SPEC.read_text()
    for field in ("    pctPriority: high\n", "    pctPriority: low\n"):
        plain = plain.replace(field, "")
    for field in ("    pctMinFreq: base\n", "    pctMaxFreq: turbo\n"):
        plain = plain.replace(field, "")
    plain = plain.replace("    pctMinFreq: min\n", "").replace("    pctMaxFreq: base\n", "")
    result = validate(load_policy(plain), online_cpus=policy.topology.online)
    assert result.prepared is not None, result.errors
    caplog.set_level(logging.INFO, logger="cpuclass")
    assert policy.reconfigure(result.prepared, []) in ("classes", "placement")
    assert policy.cpu_classes.commit()
    assert any(x.startswith("pct: managed mode left; SST reset") for x in caplog.messages)
    assert not any(pu.cp.enabled or pu.tf.enabled for pu in helper.punit_state())
    assert not policy.cpu_classes.pct.active


def test_hp_reserve_debug_lines_formatted_only_with_debug(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hpReserveCpus names each candidate punit and its free CPUs at debug
    level, best first; without debug the CPU sets are not formatted at all
    (a spy on pcthints' cpuset.format counts the calls)."""
    import nri_balloons.pcthints as pcthints

    policy, _ = make()
    free = policy.free & ~policy.reserved
    calls: list[int] = []
    real = cpuset.format

    def spy(cpus: int) -> str:
        calls.append(cpus)
        return real(cpus)

    monkeypatch.setattr(pcthints.cpuset, "format", spy)
    caplog.set_level(logging.INFO, logger="cpuclass")
    quiet = policy.cpu_classes.hints("hp-pct", 2, free, 0)
    assert calls == []
    caplog.set_level(logging.DEBUG, logger="cpuclass")
    loud = policy.cpu_classes.hints("hp-pct", 2, free, 0)
    assert loud == quiet
    (sets,) = [s for n, s in loud.prefer if n == "sst-hp-reserve"]
    lines = [t for t in caplog.messages if t.startswith("pct: hpReserveCpus tier=A")]
    assert len(lines) == len(sets) > 1
    assert [line.rsplit(" free=", 1)[1] for line in lines] == [real(s) for s in sets]

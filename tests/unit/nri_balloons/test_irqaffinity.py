"""IRQ affinity of the balloons policy (reference §11): the rules of
:func:`nri_balloons.irqaffinity.new_affinities`, the commits of
:class:`~nri_balloons.irqaffinity.IrqAffinity` and the plugin's IRQ list (asked
for only when a configuration uses ``irqClaim``/``irqMode``), against the SST
helper's own request handler and sim ``/proc/irq`` in-process
(:class:`pct_helpers.InProcessHelper`: only the socket is a stand-in)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from nri_balloons.config import BalloonType
from nri_balloons.irqaffinity import Irq, IrqAffinity, controllable, new_affinities
from nri_balloons.sstlink import Writer, exchange
from nri_framework import cpuset
from nri_framework.hookspecs import PolicyError
from nri_sst import messages as m
from nri_sst.backends.sim import SimConfig, SimIrq

from .pct_helpers import (  # noqa: F401
    InProcessHelper,
    PluginWithHelper,
    shared_root,
    start,
)

ALLOWED = cpuset.parse("2-15")
ALL = cpuset.parse("0-15")


def irq(number: int, description: str, affinity: str = "0-15", writable: bool = True) -> Irq:
    return Irq(number, description, cpuset.parse(affinity), writable)


TTYS0 = irq(4, "IR-IO-APIC 4-edge ttyS0")
RTC0 = irq(8, "IR-IO-APIC 8-edge rtc0")
ACPI = irq(9, "IR-IO-APIC 9-fasteoi acpi")
NIC = irq(40, "IR-PCI-MSIX-0000:17:00.0 4-edge eth0-TxRx-3")


def claimer(*patterns: str, mode: str = "") -> BalloonType:
    return BalloonType(name="claimer", irq_claim=list(patterns), irq_mode=mode)


def mode(name: str) -> BalloonType:
    return BalloonType(name=name, irq_mode=name)


# -- the rules of new_affinities --------------------------------------------------


def test_a_claim_gets_the_union_of_its_claiming_balloons() -> None:
    a, b = claimer("*ttyS0*"), claimer("*tty*")
    out = new_affinities([TTYS0], [(a, cpuset.parse("2-3")), (b, cpuset.parse("8-9"))], ALLOWED)
    assert out == {4: cpuset.parse("2-3,8-9")}


def test_a_numeric_claim_matches_the_irq_number_only() -> None:
    """``irqClaim: ["4"]`` is irq 4, not irq 40, nor a description with a 4 in it."""
    out = new_affinities([TTYS0, NIC], [(claimer("4"), cpuset.parse("2-3"))], ALLOWED)
    assert out == {4: cpuset.parse("2-3"), 40: ALLOWED}


def test_a_glob_claim_matches_the_whole_description() -> None:
    """Go's filepath.Match over the whole description: ``ttyS`` alone
    matches nothing (upstream test25's dedicated claimer)."""
    cpus = cpuset.parse("2-3")
    assert new_affinities([TTYS0], [(claimer("ttyS"), cpus)], ALLOWED) == {4: ALLOWED}
    assert new_affinities([TTYS0], [(claimer("*ttyS?"), cpus)], ALLOWED) == {4: cpus}
    assert new_affinities([TTYS0], [(claimer("IR-IO-APIC*"), cpus)], ALLOWED) == {4: cpus}


def test_a_sink_takes_every_unclaimed_irq() -> None:
    balloons = [(claimer("*rtc0*"), cpuset.parse("2-3")), (mode("sink"), cpuset.parse("4-5"))]
    out = new_affinities([TTYS0, RTC0, ACPI], balloons, ALLOWED)
    assert out == {4: cpuset.parse("4-5"), 8: cpuset.parse("2-3"), 9: cpuset.parse("4-5")}


def test_an_irq_outside_the_allowed_cpus_is_left_alone() -> None:
    """current ∩ allowed = ∅: out of the policy's scope, with or without
    isolate balloons; a claim or a sink still takes it."""
    outside = irq(9, "IR-IO-APIC 9-fasteoi acpi", affinity="0-1")
    assert new_affinities([outside], [], ALLOWED) == {}
    assert new_affinities([outside], [(mode("isolate"), cpuset.parse("2-3"))], ALLOWED) == {}
    sink = cpuset.parse("4-5")
    assert new_affinities([outside], [(mode("sink"), sink)], ALLOWED) == {9: sink}
    claimed = new_affinities([outside], [(claimer("9"), sink)], ALLOWED)
    assert claimed == {9: sink}


def test_isolate_takes_its_cpus_out_of_current_and_allowed() -> None:
    partly = irq(9, "IR-IO-APIC 9-fasteoi acpi", affinity="0-3")
    out = new_affinities([partly], [(mode("isolate"), cpuset.parse("2-5"))], ALLOWED)
    assert out == {9: cpuset.parse("0-1,6-15")}


def test_without_claim_sink_or_isolate_an_irq_gets_the_allowed_cpus() -> None:
    assert new_affinities([ACPI], [(BalloonType(name="plain"), 0b1100)], ALLOWED) == {9: ALLOWED}


def test_empty_balloons_are_ignored() -> None:
    """A claimer, a sink and an isolate balloon without CPUs count for nothing."""
    balloons = [(claimer("*ttyS0*"), 0), (mode("sink"), 0), (mode("isolate"), 0)]
    assert new_affinities([TTYS0], balloons, ALLOWED) == {4: ALLOWED}


def test_only_changed_affinities_are_returned() -> None:
    settled = irq(9, "IR-IO-APIC 9-fasteoi acpi", affinity="2-15")
    assert new_affinities([settled, TTYS0], [], ALLOWED) == {4: ALLOWED}


def test_controllable_interrupts_restrict_the_irqs() -> None:
    timer = irq(0, "IR-IO-APIC 2-edge timer", writable=False)
    irqs = [timer, TTYS0, RTC0]
    assert controllable(irqs, ["*rtc0*"]) == [RTC0]
    assert controllable(irqs, []) == [TTYS0, RTC0]
    assert controllable(irqs, ["*"]) == [TTYS0, RTC0]  # never a per-CPU one


# -- IrqAffinity against the helper's handler -------------------------------------

SIM_IRQS = (
    SimIrq(0, "IR-IO-APIC 2-edge timer", per_cpu=True),
    SimIrq(4, "IR-IO-APIC 4-edge ttyS0"),
    SimIrq(8, "IR-IO-APIC 8-edge rtc0"),
    SimIrq(9, "IR-IO-APIC 9-fasteoi acpi"),
)


def sim_helper() -> InProcessHelper:
    return InProcessHelper(SimConfig(interrupts=SIM_IRQS))


def affinities(helper: InProcessHelper) -> dict[int, int]:
    reply = helper.handler.dispatch(m.ListInterrupts(), b"inspector")
    assert isinstance(reply, m.ListInterruptsReply)
    return {i.number: cpuset.from_ids(i.affinity) for i in reply.interrupts}


def sent(helper: InProcessHelper, kind: type[m.Request]) -> list[m.Request]:
    return [r for r in helper.sent if isinstance(r, kind)]


def commit(irqs: IrqAffinity, writer: Writer) -> bool:
    return exchange(irqs.commit_steps(1.0), writer)


CLAIMER = claimer("*ttyS0*")


def decided(helper: InProcessHelper, balloons: list[tuple[BalloonType, int]]) -> IrqAffinity:
    irqs = IrqAffinity()
    assert exchange(irqs.list_steps(1.0), helper)
    irqs.decide([t for t, _ in balloons], balloons, ALLOWED, ["*"])
    return irqs


def test_a_commit_writes_the_changes_in_one_request_and_only_once() -> None:
    helper = sim_helper()
    all_online = affinities(helper)[0]
    balloons = [(CLAIMER, cpuset.parse("2-3")), (mode("plain"), cpuset.parse("4-5"))]
    irqs = decided(helper, balloons)
    assert commit(irqs, helper)
    now = affinities(helper)
    assert now == {0: all_online, 4: cpuset.parse("2-3"), 8: ALLOWED, 9: ALLOWED}
    (req,) = sent(helper, m.SetIrqAffinity)
    assert isinstance(req, m.SetIrqAffinity)
    assert sorted(i for g in req.groups for i in g.irqs) == [4, 8, 9]  # never the timer
    irqs.decide([CLAIMER], balloons, ALLOWED, ["*"])
    assert not irqs.unsettled()
    assert commit(irqs, helper)
    assert len(sent(helper, m.SetIrqAffinity)) == 1  # nothing changed: nothing sent


def test_an_unavailable_helper_keeps_the_changes_pending() -> None:
    helper = sim_helper()
    before = affinities(helper)
    irqs = decided(helper, [(CLAIMER, cpuset.parse("2-3"))])
    helper.down = True
    assert not commit(irqs, helper)
    assert irqs.unsettled() and irqs.pending[4] == cpuset.parse("2-3")
    assert affinities(helper) == before
    helper.down = False
    assert commit(irqs, helper)
    assert affinities(helper)[4] == cpuset.parse("2-3") and not irqs.unsettled()


def test_a_refusal_is_logged_and_the_list_asked_for_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    helper = sim_helper()
    irqs = decided(helper, [(CLAIMER, cpuset.parse("2-3"))])
    helper.refuse = {m.SetIrqAffinity}
    with caplog.at_level(logging.WARNING, logger="irq"):
        assert commit(irqs, helper)  # refused: not retried as if the helper were away
    assert "failed to set IRQ affinities: hardware-error" in caplog.text
    assert irqs.irqs is None
    helper.refuse = set()
    lists = len(sent(helper, m.ListInterrupts))
    irqs.decide([CLAIMER], [(CLAIMER, cpuset.parse("2-3"))], ALLOWED, ["*"])
    assert commit(irqs, helper)
    assert len(sent(helper, m.ListInterrupts)) == lists + 1
    assert affinities(helper)[4] == cpuset.parse("2-3")


def test_a_list_fetched_by_the_commit_is_marked_late() -> None:
    helper = sim_helper()
    irqs = IrqAffinity()
    balloons = [(CLAIMER, cpuset.parse("2-3"))]
    irqs.decide([CLAIMER], balloons, ALLOWED, ["*"])
    assert irqs.unsettled()  # not listed yet
    assert commit(irqs, helper)
    assert irqs.listed_late
    assert affinities(helper)[4] == cpuset.parse("2-3")


def test_nothing_is_asked_without_irq_options() -> None:
    helper = sim_helper()
    irqs = IrqAffinity()
    plain = BalloonType(name="plain")
    irqs.decide([plain], [(plain, cpuset.parse("2-3"))], ALLOWED, ["*"])
    assert commit(irqs, helper) and not irqs.unsettled()
    assert helper.sent == []


# -- the plugin: when the list is asked for ---------------------------------------

PLAIN = """
reservedResources: {cpu: "cpuset:0-1"}
balloonTypes:
- {name: plain, minBalloons: 1, minCPUs: 2, maxCPUs: 2}
"""
CLAIM = """
reservedResources: {cpu: "cpuset:0-1"}
balloonTypes:
- {name: claimer, minBalloons: 1, minCPUs: 2, maxCPUs: 2, irqClaim: ["*ttyS0*", "*rtc0*"]}
"""
DENIED = """
reservedResources: {cpu: "cpuset:0-1"}
controllableInterrupts: ["*rtc0*"]
balloonTypes:
- {name: claimer, minBalloons: 1, minCPUs: 2, maxCPUs: 2, irqClaim: ["*ttyS0*", "*rtc0*"]}
"""
DENIED_ERROR = (
    'invalid irqclaim ["*ttyS0*" "*rtc0*"]: denied interrupt: irq 4 '
    '(IR-IO-APIC 4-edge ttyS0) denied but matched by user pattern "*ttyS0*"'
)


def test_a_configuration_without_irq_options_asks_for_no_irq_list(tmp_path: Path) -> None:
    helper = sim_helper()
    plugin = start(helper, PLAIN, tmp_path)
    try:
        assert plugin.policy is not None and plugin.policy.config is not None
        assert helper.sent  # the helper was talked to (discovery)
        assert sent(helper, m.ListInterrupts) == []
        plugin.reconfigure(PLAIN.replace("maxCPUs: 2", "maxCPUs: 4"), "test")
        assert sent(helper, m.ListInterrupts) == []
        # a reload that starts using them asks for the list (and writes)
        plugin.reconfigure(CLAIM, "test")
        assert len(sent(helper, m.ListInterrupts)) == 1
        (claimer_balloon,) = [b for b in plugin.policy.balloons if b.bdef.name == "claimer"]
        assert affinities(helper)[4] == claimer_balloon.cpus
    finally:
        plugin.policy_shutdown()


def test_a_configuration_with_irq_options_is_checked_against_the_list_at_start(
    tmp_path: Path,
) -> None:
    helper = sim_helper()
    with pytest.raises(PolicyError) as err:
        start(helper, DENIED, tmp_path)
    assert DENIED_ERROR in str(err.value)
    assert len(sent(helper, m.ListInterrupts)) == 1
    assert sent(helper, m.SetIrqAffinity) == []


def test_a_reload_with_a_denied_claim_is_refused(tmp_path: Path) -> None:
    helper = sim_helper()
    plugin = start(helper, PLAIN, tmp_path)
    try:
        before = affinities(helper)
        with pytest.raises(PolicyError, match="denied interrupt"):
            plugin.reconfigure(DENIED, "test")
        assert affinities(helper) == before
        assert plugin.policy is not None and plugin.policy.config is not None
        assert "plain" in [t.name for t in plugin.policy.config.balloon_types]
    finally:
        plugin.policy_shutdown()


def test_a_list_fetched_late_logs_the_denied_claim_and_never_writes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The helper was away at start: the configuration could not be checked
    and runs; the first commit that reaches the helper lists the IRQs, logs
    the denied claim as an error and writes only the allowed one."""
    helper = sim_helper()
    before = affinities(helper)
    helper.down = True
    plugin = start(helper, DENIED, tmp_path)
    try:
        helper.down = False
        with caplog.at_level(logging.ERROR, logger="policy"):
            plugin.commit(plugin._reply_path())
        assert DENIED_ERROR in caplog.text
        now = affinities(helper)
        assert now[4] == before[4]  # ttyS0: denied, never written
        assert cpuset.size(now[8]) == 2  # rtc0: the claimer's CPUs
    finally:
        plugin.policy_shutdown()


UNMATCHED = """
reservedResources: {cpu: "cpuset:0-1"}
balloonTypes:
- name: claimer
  minBalloons: 1
  minCPUs: 2
  maxCPUs: 2
  irqClaim: ["*ttyS0*", "*nosuchdev*", "9999"]
"""


def test_a_claim_that_matches_no_interrupt_is_named_in_a_warning_and_the_rest_applied(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upstream silently claims nothing for such a pattern; ours says which
    pattern of which balloon type matched no IRQ, and the other claims apply."""
    helper = sim_helper()
    with caplog.at_level(logging.WARNING, logger="policy"):
        plugin = start(helper, UNMATCHED, tmp_path)
    try:
        for pattern in ('"*nosuchdev*"', '"9999"'):
            assert f"balloon type 'claimer': irqClaim {pattern} matches no interrupt" in caplog.text
        assert '"*ttyS0*" matches no' not in caplog.text
        plugin.commit(plugin._reply_path())
        assert cpuset.size(affinities(helper)[4]) == 2  # ttyS0: the claimer's CPUs
    finally:
        plugin.policy_shutdown()

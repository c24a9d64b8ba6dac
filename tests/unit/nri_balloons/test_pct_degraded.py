"""Priority Core Turbo when the SST helper is not there or not well: no helper, no
SST, a dead helper (PCT degrades, placement does not), a refused programming, and the
restarts of either side (issue #10: a new handshake, a timed-out association, a
restarted helper or plugin keeps what SST holds).

Where the neighbouring test modules are: see :mod:`pct_helpers`.
"""

from __future__ import annotations

import logging

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.extres import extended_resources
from nri_balloons.pct import Hints
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.sstlink import exchange
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.topology import Topology
from nri_sst import messages as m
from nri_sst.backends.sim import SimConfig
from pct_helpers import (
    SPEC,
    InProcessHelper,
    admit,
    disabled_cstates,
    host_root,
    make,
    pod,
    shared_root,  # noqa: F401 (the module's autouse host tree)
)


def test_dead_helper_degrades_pct_not_placement(caplog: pytest.LogCaptureFixture) -> None:
    helper = InProcessHelper()
    helper.down = True
    caplog.set_level(logging.DEBUG, logger="cpuclass")
    policy, _ = make_degraded(helper)
    assert any(
        "PCT" in r.getMessage() or "Priority Core Turbo" in r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR
    )
    bln = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert bln is not None and bln.cpus.bit_count() == 2  # still placed and pinned
    assert not policy.cpu_classes.commit()
    assert extended_resources(policy) is None  # no opinion while degraded
    # the helper returns: everything is programmed, HP CPUs on CLOS 0, the rest on 3
    helper.down = False
    assert policy.cpu_classes.commit()
    assert "pct: SST helper is back; SST state programmed and CPUs re-associated" in caplog.messages
    clos = helper.clos(policy.allowed)
    assert {c for c, k in clos.items() if k == 0} == set(cpuset.ids(bln.cpus))
    assert disabled_cstates(cpuset.ids(bln.cpus)[0]) == {"C6", "C6P"}


def make_degraded(helper: InProcessHelper):  # type: ignore[no-untyped-def]
    topo = Topology.from_sysfs(str(host_root()))
    policy = BalloonsPolicy(topo, str(host_root()), writer=helper)
    result = validate(load_policy(SPEC.read_text()), online_cpus=topo.online)
    assert result.prepared is not None
    policy.set_config(result.prepared)
    assert not policy.cpu_classes.commit()
    return policy, helper


def test_restarted_helper_is_programmed_again(caplog: pytest.LogCaptureFixture) -> None:
    policy, helper = make()
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    helper.restart()  # a new helper: SST as the BIOS left it (CP off, all CLOS 0)
    assert not helper.punit_state()[0].cp.enabled
    caplog.set_level(logging.INFO, logger="cpuclass")
    # the LP pod's CPUs are on CLOS 3 as far as the plugin knows: its decision
    # sends nothing; the plugin's probe notices the new helper
    assert exchange(policy.cpu_classes.pct.probe_steps(), helper)
    lp = admit(policy, "pct-lp", 8, "lp-bln")
    assert "pct: SST helper reconnected; programming SST state again" in caplog.messages
    assert all(pu.cp.enabled and pu.tf.enabled for pu in helper.punit_state())
    clos = helper.clos(policy.allowed)
    assert {c for c, k in clos.items() if k == 0} == set(cpuset.ids(hp))
    assert all(clos[c] == 3 for c in cpuset.ids(lp))


def test_no_helper_means_no_pct(caplog: pytest.LogCaptureFixture) -> None:
    topo = Topology.from_sysfs(str(host_root()))
    policy = BalloonsPolicy(topo, str(host_root()))
    result = validate(load_policy(SPEC.read_text()), online_cpus=topo.online)
    assert result.prepared is not None
    policy.set_config(result.prepared)
    assert "pct: no SST helper (--sst-helper); ignoring PCT fields in cpuClasses" in caplog.messages
    assert policy.cpu_classes.commit()
    assert isinstance(policy.cpu_classes.hints("hp-pct", 2, policy.free, 0), Hints)


def test_sst_not_supported(caplog: pytest.LogCaptureFixture) -> None:
    from nri_sst.backends.none import NoneBackend

    helper = InProcessHelper(backend=NoneBackend())
    policy, _ = make(helper=helper)
    assert (
        "pct: SST not supported on this host; ignoring PCT fields in cpuClasses" in caplog.messages
    )
    assert any("Speed Select Technology (SST) support not detected" in x for x in caplog.messages)
    assert not policy.cpu_classes.pct.active
    assert admit(policy, "a", 2, "hp-bln").bit_count() == 2


def test_refused_programming_turns_pct_off_not_the_policy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spec step 11: `pct: failed to prepare managed mode` in the log; pods
    are still placed."""
    helper = InProcessHelper(SimConfig(hwp=False))  # HWP off: CP/PP/feature sets fail
    policy, _ = make(helper=helper)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(e.startswith("pct: failed to prepare managed mode: ") for e in errors), errors
    assert not policy.cpu_classes.pct.active
    assert admit(policy, "pct-hp-1", 2, "hp-bln").bit_count() == 2


# --------------------------------------------------------------------------- issue #10


def prepares(helper: InProcessHelper) -> list[m.PrepareManagedMode]:
    return [r for r in helper.sent if isinstance(r, m.PrepareManagedMode)]


def test_rehandshake_with_the_same_helper_keeps_sst(caplog: pytest.LogCaptureFixture) -> None:
    """Defect 4: a new handshake with the same helper process (our peer
    evicted after other clients said hello; our socket recreated after a
    timeout) is not a restart: no PrepareManagedMode, no CPU through CLOS 0."""
    policy, helper = make()
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    assert len(prepares(helper)) == 1
    helper.watch = hp
    caplog.set_level(logging.INFO, logger="cpuclass")
    helper.evict()
    admit(policy, "pct-hp-2", 2, "hp-bln")
    helper.stopped = True  # a timeout: the client makes a new socket
    assert not admit_deferred(policy, "pct-hp-3", 2, "hp-bln")
    helper.stopped = False
    assert policy.cpu_classes.commit()
    assert helper.session.handshakes == 3 and helper.peers == 2
    assert len(prepares(helper)) == 1
    assert "pct: SST helper reconnected; programming SST state again" not in caplog.messages
    assert helper.seen and all(set(c.values()) == {0} for c in helper.seen)


def admit_deferred(policy: BalloonsPolicy, name: str, cpus: int, balloon: str) -> bool:
    """Create a container and commit; the commit's result."""
    assert policy.allocate(*pod(name, cpus, balloon)) is not None
    return policy.cpu_classes.commit()


def test_timed_out_association_is_sent_again() -> None:
    """Defect 4: after an AssociateCpus without an answer its outcome is
    unknown: the same helper gets those CPUs again when it answers."""
    policy, helper = make()
    helper.stopped = True
    bln = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert bln is not None
    assert not policy.cpu_classes.commit()
    assert set(helper.clos(bln.cpus).values()) == {3}  # it never arrived
    helper.stopped = False
    assert policy.cpu_classes.commit()
    assert set(helper.clos(bln.cpus).values()) == {0}
    assert len(prepares(helper)) == 1  # the same helper: nothing programmed again


def test_restarted_helper_keeps_what_sst_holds_for_the_same_plan(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defect 4: a helper restarted with the hardware still programmed (kill
    -9 keeps SST; the sim keeps it in its state file) is programmed again
    with keep_programmed: CLOS bounds and EnableCP again, every CPU
    re-associated, and no other CPU passes through CLOS 0 (what a CPReset
    would do)."""
    policy, helper = make()
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    helper.restart(keep_hardware=True)
    helper.sent.clear()
    helper.watch = policy.allowed & ~hp
    caplog.set_level(logging.INFO, logger="cpuclass")
    assert exchange(policy.cpu_classes.pct.probe_steps(), helper)  # the plugin's probe
    lp = admit(policy, "pct-lp", 8, "lp-bln")
    assert "pct: SST helper reconnected; programming SST state again" in caplog.messages
    assert prepares(helper) == [m.PrepareManagedMode(keep_programmed=True)]
    kinds = [type(r).__name__ for r in helper.sent]
    assert "EnableCP" in kinds
    bounds = {r.clos: (r.min_khz, r.max_khz) for r in helper.sent if isinstance(r, m.ConfigureClos)}
    # the plan's CLOS, and the others as a CPReset leaves them (no limit)
    assert bounds == {
        0: (2_300_000, 4_600_000),
        1: (0, m.CLOS_NO_LIMIT_KHZ),
        2: (0, m.CLOS_NO_LIMIT_KHZ),
        3: (800_000, 2_300_000),
    }
    assert helper.seen and all(set(seen.values()) == {3} for seen in helper.seen)
    clos = helper.clos(policy.allowed)
    assert {c for c, k in clos.items() if k == 0} == set(cpuset.ids(hp))
    assert all(clos[c] == 3 for c in cpuset.ids(lp))
    writes = [w for r in helper.sent for w in (r.items if isinstance(r, m.Apply) else [r])]
    reassociated = set().union(*(r.cpus for r in writes if isinstance(r, m.AssociateCpus)))
    assert reassociated == set(cpuset.ids(policy.allowed))


def test_restarted_plugin_keeps_what_sst_holds() -> None:
    """Defect 4: a new plugin process on a helper whose SST is programmed
    (the plugin was killed) programs its plan without a CPReset, and
    associates no CPU before the runtime's Synchronize names the running
    containers: no CPU of a running HP balloon passes through another CLOS."""
    policy, helper = make()
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    admit(policy, "pct-lp", 8, "lp-bln")
    before = helper.clos(policy.allowed)
    helper.sent.clear()
    helper.watch = hp
    # the plugin's start: configured before the runtime's Synchronize
    topo = Topology.from_sysfs(str(helper.root))
    fresh = BalloonsPolicy(topo, str(helper.root), writer=helper)
    fresh.cpu_classes.pct.hold = True
    result = validate(load_policy(SPEC.read_text()), online_cpus=topo.online)
    assert result.prepared is not None
    fresh.set_config(result.prepared)
    assert fresh.cpu_classes.commit()
    assert not [r for r in helper.sent if isinstance(r, m.AssociateCpus)]
    assert not fresh.cpu_classes.unsettled()  # nothing for a background commit
    # the Synchronize: the running containers restored, then their CPUs associated
    fresh.cpu_classes.pct.hold = False
    fresh.set_config(result.prepared)
    assert fresh.restore(policy.export(), set(policy.owner)) == set(policy.owner)
    assert fresh.cpu_classes.commit()
    assert prepares(helper) == [m.PrepareManagedMode(keep_programmed=True)]
    assert helper.seen and all(set(seen.values()) == {0} for seen in helper.seen)
    assert helper.clos(policy.allowed) == before


def test_a_flush_that_sends_nothing_does_not_say_a_dead_helper_is_back() -> None:
    """The probe found the helper dead; decisions on cores already on their
    CLOS send nothing. The next flush must ask the helper before PCT counts as
    back: ``pct_degraded`` stays on while it is dead, goes off once it answers."""
    policy, helper = make()
    admit(policy, "pct-lp", 8, "lp-bln")
    pct = policy.cpu_classes.pct
    helper.down = True
    assert exchange(pct.probe_steps(), helper)  # the probe notices: degraded
    assert pct.degraded
    assert policy.allocate(*pod("pct-lp-2", 8, "lp-bln")) is not None
    assert not policy.cpu_classes.commit()  # the commit of that decision
    assert pct.degraded  # still dead: not "back"
    helper.down = False
    assert policy.cpu_classes.commit()
    assert not pct.degraded

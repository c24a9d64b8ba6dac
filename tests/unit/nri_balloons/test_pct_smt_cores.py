"""Priority Core Turbo on an SMT node: SST associates whole cores, so CLOS is per
core (issue #10), on the ``pct16`` fixture (2 packages x 4 cores, sibling = cpu + 8).

Where the neighbouring test modules are: see :mod:`pct_helpers`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from nri_balloons.observe import inspect
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.sstlink import exchange
from nri_framework import cpuset
from nri_framework.simulate.sysfs import write_topology
from nri_sst import messages as m
from nri_sst.backends.sim import SimConfig
from pct_helpers import (
    InProcessHelper,
    admit,
    make,
    pod,
    shared_root,  # noqa: F401 (the module's autouse host tree)
)

DATA = Path(__file__).resolve().parents[2] / "data" / "balloons"


# -- CLOS is per core (issue #10) --------------------------------------------------------
#
# SST associates whole cores: a thread cannot be on another CLOS than its sibling.
# These tests run 1-CPU pods on the ``pct16`` fixture (2 packages x 4 cores, SMT
# sibling = cpu + 8) with the sim shaped to it, as test19's node.

SIM16 = SimConfig(
    packages=2,
    punits_per_package=1,
    cores_per_punit=4,
    base_mhz=2900,
    p0_mhz=3800,
    cpuinfo_max_khz=3_800_000,
    tf_buckets=(4,),
    tf_mhz=(3800,),
    lp_clip_mhz=2900,
)

CORES = (DATA / "pct16-cores" / "balloons-config.yaml").read_text()

CLASS_CLOS = {"pct-hp": 0, "pct-lp": 3}
"""The CLOS each class asks for; CPUs of other classes and idle ones follow the
LP fallback (CLOS 3)."""


@pytest.fixture(scope="module")
def root16(module_tmp: Path) -> Path:
    return write_topology(module_tmp / "root", "pct16")


def make16(root: Path, text: str = CORES, config: SimConfig = SIM16):  # type: ignore[no-untyped-def]
    return make(text, InProcessHelper(config, root))


def core_classes(policy: BalloonsPolicy) -> dict[int, set[str]]:
    """Core mask -> the classes of the balloons on its threads ("" = no balloon)."""
    owner: dict[int, str] = {}
    for top in policy.balloons:
        for bln in top.walk():
            for cpu in cpuset.ids(bln.cpus):
                owner[cpu] = policy.balloon_class(bln.bdef)
    return {
        mask: {owner.get(c, "") for c in cpuset.ids(mask)}
        for mask in policy.topology.core_masks.values()
    }


def assert_views_agree(policy: BalloonsPolicy, helper: InProcessHelper) -> list[set[str]]:
    """For every CPU the CLOS the helper reports, the plugin's (``clos_of`` and
    ``/debug/state``) and the rule applied to the classes on its core agree: a
    core with an HP thread is on CLOS 0 (HP wins), any other on CLOS 3. Returns
    the class sets of the cores whose balloons ask for two CLOS."""
    pct = policy.cpu_classes.pct
    actual = helper.clos(policy.topology.online)
    state = inspect(policy)
    assert state is not None
    shown = {row["cpu"]: row.get("clos") for row in state["cpus"]}
    mixed = []
    for mask, classes in core_classes(policy).items():
        want = 0 if "pct-hp" in classes else 3
        for cpu in cpuset.ids(mask):
            assert actual[cpu] == want, (cpu, classes, actual)
            assert pct.clos_of(cpu) == want, (cpu, classes)
            assert shown[cpu] == want, (cpu, classes)
        asked = {CLASS_CLOS.get(c, 3) for c in classes if c}
        if len(asked) > 1:
            mixed.append(classes)
    return mixed


def test_one_cpu_hp_and_lp_pods_keep_cores_whole(root16: Path) -> None:
    """Churn of 1-CPU HP and LP pods: no core ever carries an HP and an LP
    balloon while whole cores are free, and every view of every CPU's CLOS
    agrees after every decision."""
    policy, helper = make16(root16)
    assert_views_agree(policy, helper)
    for i in range(6):
        admit(policy, f"hp{i}", 1, "hp-bln")
        assert assert_views_agree(policy, helper) == []
        admit(policy, f"lp{i}", 1, "lp-bln")
        assert assert_views_agree(policy, helper) == []
    for i in (1, 4):
        policy.release(f"ctr-hp{i}")
        assert policy.cpu_classes.commit()
        assert assert_views_agree(policy, helper) == []
        policy.release(f"ctr-lp{5 - i}")
        assert policy.cpu_classes.commit()
        assert assert_views_agree(policy, helper) == []
    for i in range(6, 8):
        admit(policy, f"lp{i}", 1, "lp-bln")
        assert assert_views_agree(policy, helper) == []
        admit(policy, f"hp{i}", 1, "hp-bln")
        assert assert_views_agree(policy, helper) == []


def shared_core_pods(policy: BalloonsPolicy) -> dict[str, int]:
    """Container id -> its CPU, for the containers on the one core that holds
    both an HP and an LP balloon."""
    (core,) = [
        mask for mask, classes in core_classes(policy).items() if {"pct-hp", "pct-lp"} <= classes
    ]
    return {cid: bln.cpus for cid, bln in policy.owner.items() if bln.cpus & core}


def fill(policy: BalloonsPolicy, hp: int, lp: int) -> None:
    for i in range(max(hp, lp)):
        if i < hp:
            admit(policy, f"hp{i}", 1, "hp-bln")
        if i < lp:
            admit(policy, f"lp{i}", 1, "lp-bln")


def test_a_core_shared_by_hp_and_lp_is_on_the_hp_clos_and_logged(
    root16: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """9 HP + 6 LP 1-CPU pods on 15 free CPUs: one core must hold both. It is
    on CLOS 0 (HP wins), every view says so, and a warning names both."""
    policy, helper = make16(root16)
    caplog.set_level(logging.INFO, logger="cpuclass")
    fill(policy, 9, 6)
    assert policy.free & ~policy.reserved == 0
    assert assert_views_agree(policy, helper) == [{"pct-hp", "pct-lp"}]
    pods = shared_core_pods(policy)
    hp_cpu = next(c for cid, c in pods.items() if cid.startswith("ctr-hp"))
    lp_cpu = next(c for cid, c in pods.items() if cid.startswith("ctr-lp"))
    line = (
        f'pct: cpus {cpuset.format(hp_cpu)} (cpuClass "pct-hp", CLOS 0) and '
        f'{cpuset.format(lp_cpu)} (cpuClass "pct-lp", CLOS 3) share a core; SST associates '
        "whole cores: the core is on CLOS 0 (the higher-priority CLOS wins)"
    )
    assert any(r.getMessage() == line and r.levelno == logging.WARNING for r in caplog.records)
    # the LP pod leaves: its idle CPU does not take the HP pod's core to CLOS 3
    (lp_id,) = [cid for cid in pods if cid.startswith("ctr-lp")]
    policy.release(lp_id)
    assert policy.cpu_classes.commit()
    assert assert_views_agree(policy, helper) == []
    assert set(helper.clos(hp_cpu).values()) == {0}
    # an LP pod on it again, then the HP pod leaves: the core goes to CLOS 3
    assert admit(policy, "lp-again", 1, "lp-bln") == lp_cpu
    assert assert_views_agree(policy, helper) == [{"pct-hp", "pct-lp"}]
    (hp_id,) = [cid for cid in pods if cid.startswith("ctr-hp")]
    policy.release(hp_id)
    assert policy.cpu_classes.commit()
    assert assert_views_agree(policy, helper) == []
    assert set(helper.clos(hp_cpu | lp_cpu).values()) == {3}


def test_an_idle_sibling_follows_the_hp_core_at_info_level(
    root16: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy, helper = make16(root16)
    caplog.set_level(logging.INFO, logger="cpuclass")
    hp = admit(policy, "hp", 1, "hp-bln")
    sibling = policy.topology.siblings(hp) & ~hp
    assert set(helper.clos(hp | sibling).values()) == {0}
    assert policy.cpu_classes.pct.clos_of(cpuset.ids(sibling)[0]) == 0
    (record,) = [r for r in caplog.records if "share a core" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert f'{cpuset.format(sibling)} (cpuClass "", CLOS 3)' in record.getMessage()


def restarted(policy: BalloonsPolicy, helper: InProcessHelper) -> BalloonsPolicy:
    """A new plugin process: a new policy on the same helper, restoring the
    balloons the old one exported (as the state dir does)."""
    saved = policy.export()
    fresh, _ = make(CORES, helper)
    assert fresh.restore(saved, set(policy.owner)) == set(policy.owner)
    assert fresh.cpu_classes.commit()
    return fresh


def test_views_agree_after_plugin_and_helper_restarts(root16: Path) -> None:
    policy, helper = make16(root16)
    fill(policy, 9, 6)
    policy.release("ctr-hp3")
    policy.release("ctr-lp1")
    assert policy.cpu_classes.commit()
    before = helper.clos(policy.topology.online)
    mixed = assert_views_agree(policy, helper)
    # the plugin restarts: it programs SST again (every core to CLOS 0) and
    # re-associates every core from the restored balloons
    policy = restarted(policy, helper)
    assert assert_views_agree(policy, helper) == mixed
    assert helper.clos(policy.topology.online) == before
    # the helper restarts with SST as the BIOS left it: once the plugin has
    # noticed (its probe), and until it has programmed SST again, it does not
    # claim to know any CLOS
    helper.restart()
    pct = policy.cpu_classes.pct
    assert exchange(pct.probe_steps(), pct.writer)
    state = inspect(policy)
    assert state is not None and not any("clos" in row for row in state["cpus"])
    assert policy.cpu_classes.commit()
    assert assert_views_agree(policy, helper) == mixed
    assert helper.clos(policy.topology.online) == before


def test_a_refused_association_leaves_the_clos_unknown(
    root16: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The helper refuses an AssociateCpus (it may have moved some cores):
    the plugin shows no CLOS for those cores rather than a stale one."""
    policy, helper = make16(root16)
    hp = admit(policy, "hp", 1, "hp-bln")
    helper.refuse = {m.AssociateCpus}
    other = admit(policy, "hp2", 1, "hp-bln")  # cores that move to CLOS 0 (an LP pod's would not)
    assert any(x.startswith("cpuclass: pct failed to apply class on CPUs") for x in caplog.messages)
    pct = policy.cpu_classes.pct
    unknown = policy.topology.siblings(other)
    assert all(pct.clos_of(c) is None for c in cpuset.ids(unknown))
    state = inspect(policy)
    assert state is not None
    assert all("clos" not in r for r in state["cpus"] if unknown >> r["cpu"] & 1)
    assert all(pct.clos_of(c) == 0 for c in cpuset.ids(policy.topology.siblings(hp)))
    helper.refuse = set()
    policy.release("ctr-hp2")
    assert policy.cpu_classes.commit()
    assert assert_views_agree(policy, helper) == []


def test_hostile_association_replies_are_not_believed(root16: Path) -> None:
    """A reply naming CPUs outside the requested cores (or outside the node)
    records nothing for them; a reply for another CLOS counts as refused."""
    policy, helper = make16(root16)
    pct = policy.cpu_classes.pct
    helper.tamper = lambda req, reply: (
        m.AssociateCpusReply(clos=req.clos, cpus=[*req.cpus, 3, 11, -1, 10**12])
        if isinstance(req, m.AssociateCpus)
        else reply
    )
    hp = admit(policy, "hp", 1, "hp-bln")
    assert 3 not in cpuset.ids(policy.topology.siblings(hp))
    assert pct.clos_of(3) == pct.clos_of(11) == 3  # not moved to CLOS 0
    assert set(pct.known) <= set(policy.topology.cpus)
    helper.tamper = lambda req, reply: (
        m.AssociateCpusReply(clos=1, cpus=req.cpus) if isinstance(req, m.AssociateCpus) else reply
    )
    policy.release("ctr-hp")
    assert policy.cpu_classes.commit()
    assert all(pct.clos_of(c) is None for c in cpuset.ids(policy.topology.siblings(hp)))


def test_dead_helper_shows_no_clos_until_every_core_is_associated_again(root16: Path) -> None:
    policy, helper = make16(root16)
    admit(policy, "hp", 1, "hp-bln")
    helper.down = True
    bln = policy.allocate(*pod("hp2", 1, "hp-bln"))  # an association to send
    assert bln is not None and not policy.cpu_classes.commit()
    state = inspect(policy)
    assert state is not None and not any("clos" in row for row in state["cpus"])
    helper.down = False
    assert policy.cpu_classes.commit()
    assert assert_views_agree(policy, helper) == []


ASSOC16 = """
reservedResources: {cpu: "cpuset:0"}
balloonTypes:
- {name: hp-bln, cpuClass: clos0, preferNewBalloons: true}
- {name: lp-bln, cpuClass: clos3, preferNewBalloons: true}
cpuClasses:
- {name: clos0, sstClosID: 0}
- {name: clos3, sstClosID: 3}
"""


def assoc_only16(root: Path) -> tuple[BalloonsPolicy, InProcessHelper]:
    """Assoc-only on pct16, SST as an operator left it: cores 0-1 of each
    punit on CLOS 0, cores 2-3 on CLOS 2 (the sim's ``bios-pct-on``)."""
    config = SimConfig(**{**SIM16.__dict__, "profile": "bios-pct-on", "tf_buckets": (2,)})
    return make16(root, ASSOC16, config)  # type: ignore[no-any-return]


def test_assoc_only_core_follows_its_remaining_pct_thread(root16: Path) -> None:
    """A core with a CLOS 0 and a CLOS 3 thread is on CLOS 0; when the CLOS 0
    thread leaves PCT (non-PCT CPUs ask for no CLOS), the core goes to the
    remaining thread's CLOS 3."""
    policy, helper = assoc_only16(root16)
    pct = policy.cpu_classes.pct
    pct.use(1 << 4, "clos0")
    pct.use(1 << 12, "clos3")
    assert exchange(pct.flush_steps(), pct.writer)
    assert helper.clos(1 << 4 | 1 << 12) == {4: 0, 12: 0}
    pct.use(1 << 4, "")
    assert exchange(pct.flush_steps(), pct.writer)
    assert helper.clos(1 << 4 | 1 << 12) == {4: 3, 12: 3}
    assert pct.clos_of(4) == pct.clos_of(12) == 3


def test_assoc_only_hints_keep_pct_threads_off_cores_of_other_clos(root16: Path) -> None:
    """A non-PCT CPU in use on CLOS 2 (as the operator left it): a CLOS 0
    class avoids its sibling, which would move it; the sibling of reserved
    CPU 0, on CLOS 0 already, is fine."""
    policy, helper = assoc_only16(root16)
    pct = policy.cpu_classes.pct
    assert helper.clos(1 << 2 | 1 << 10) == {2: 2, 10: 2}
    free = policy.topology.online & ~(1 << 0 | 1 << 2)
    hints = pct.hints("clos0", 1, free, 0)
    assert hints.prefer[0] == ("sst-whole-core", [free & ~(1 << 10)])


def test_hp_room_counts_cores(root16: Path) -> None:
    """SST-TF counts HP cores: an HP balloon on both threads of one core
    takes one core of a punit's two, leaving room for one more."""
    config = SimConfig(**{**SIM16.__dict__, "tf_buckets": (2,)})
    policy, _ = make16(root16, CORES, config)
    hp = admit(policy, "hp", 2, "hp-bln")
    assert hp == policy.topology.siblings(hp)  # one whole core
    hints = policy.cpu_classes.hints("pct-hp", 1, policy.free & ~policy.reserved, 0)
    sets = dict(hints.prefer)["sst-hp-reserve"]
    assert len(sets) == 2  # both punits have room
    topo = policy.topology
    assert not sets[0] & topo.package_masks[topo.cpus[cpuset.ids(hp)[0]].package]


def test_clos_hints_on_shared_cores(root16: Path) -> None:
    """``sst-clos-0`` does not offer the free sibling an HP balloon holds on
    CLOS 0 (another balloon's core; test19 T1.3 spreads HP balloons by room)
    but does to that balloon when it grows; ``sst-hp-core`` offers it after
    the punit choice; LP balloons pair on LP cores (``sst-clos-3``)."""
    policy, _ = make16(root16)
    topo = policy.topology
    hp = admit(policy, "hp", 1, "hp-bln")
    free = policy.free & ~policy.reserved
    lp = admit(policy, "lp", 1, "lp-bln")
    if not topo.siblings(lp) & free & ~lp:  # it paired with the reserved CPU
        lp = admit(policy, "lp2", 1, "lp-bln")
    hp_sib, lp_sib = topo.siblings(hp) & ~hp, topo.siblings(lp) & ~lp
    free = policy.free & ~policy.reserved
    assert lp_sib & free
    names = lambda h: [n for n, _ in h.prefer]  # noqa: E731
    hints = policy.cpu_classes.hints("pct-hp", 1, free, 0)
    assert names(hints) == ["sst-whole-core", "sst-hp-reserve", "sst-hp-core"]
    assert dict(hints.prefer)["sst-hp-core"] == [hp_sib]
    assert not dict(hints.prefer)["sst-whole-core"][0] & lp_sib
    grow = policy.cpu_classes.hints("pct-hp", 1, free, hp)
    assert dict(grow.prefer)["sst-clos-0"] == [hp_sib]
    lp_hints = policy.cpu_classes.hints("pct-lp", 1, free, 0)
    assert lp_sib & dict(lp_hints.prefer)["sst-clos-3"][0]
    assert not hp_sib & dict(lp_hints.prefer)["sst-clos-3"][0]

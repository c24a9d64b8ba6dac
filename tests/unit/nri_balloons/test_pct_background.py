"""Priority Core Turbo's waits for the SST helper: the reply path's budget, the
plugin's background commit (hooks run meanwhile, a new configuration stops it, a
settled background publishes again), and the wait given to each blocking call.

Where the neighbouring test modules are: see :mod:`pct_helpers`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.extres import extended_resources
from nri_balloons.pct import DISCOVER_TIMEOUT
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.sstlink import Budget, Wait
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.topology import Topology
from nri_sst import messages as m
from nri_sst.backends.sim import SimConfig

if TYPE_CHECKING:
    from nri_balloons.plugin import Balloons

from pct_helpers import (
    ASSOC_ONLY,
    SPEC,
    InProcessHelper,
    admit,
    disabled_cstates,
    host_root,
    make,
    pod,
    shared_root,  # noqa: F401 (the module's autouse host tree)
    start,
)


def test_reply_path_waits_at_most_its_budget() -> None:
    """Defect 8: on the reply path every wait for the helper together ends at
    the 100 ms budget (injected clock: a helper that takes 60 ms per answer),
    however many requests the decision needs; the rest is applied later."""
    policy, helper = make()
    helper.batches = False  # an older helper: each write its own request
    helper.latency = 0.06
    handler = policy.cpu_classes
    start = helper.clock.now
    wait = Wait(budget=Budget(0.1, helper.clock))
    bln = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert bln is not None
    assert not handler.commit(wait)  # AssociateCpus and SetCstates: 120 ms
    assert helper.clock.now - start <= 0.1 + 1e-9  # not 120 ms
    assert handler.unsettled()
    helper.latency = 0.0
    assert handler.commit()  # what the background does: everything left
    assert set(helper.clos(bln.cpus).values()) == {0}
    assert disabled_cstates(cpuset.ids(bln.cpus)[0]) == {"C6", "C6P"}
    assert not handler.unsettled()


def test_one_request_per_decision_fits_where_two_did_not() -> None:
    """The decision of the test above in one round trip (an ``Apply``: the
    association and the C-states together): 60 ms, within the budget."""
    policy, helper = make()
    helper.latency = 0.06
    start = helper.clock.now
    helper.sent.clear()
    bln = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert bln is not None
    assert policy.cpu_classes.commit(Wait(budget=Budget(0.1, helper.clock)))
    assert helper.clock.now - start == pytest.approx(0.06)
    assert [type(r) for r in helper.sent] == [m.Apply]
    assert set(helper.clos(bln.cpus).values()) == {0}
    assert disabled_cstates(cpuset.ids(bln.cpus)[0]) == {"C6", "C6P"}
    assert not policy.cpu_classes.unsettled()


def test_decisions_between_two_background_requests_are_kept() -> None:
    """The plugin's background awaits each request; hooks run meanwhile and
    only record decisions. Those recorded while a request of a commit is
    answered (its one ``Apply``: the association and the C-states) are not
    lost when it ends: the next commit applies them."""
    policy, helper = make()
    handler = policy.cpu_classes
    first = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert first is not None
    later = []
    steps = handler.commit_steps(1.0)
    ask = next(steps)
    try:
        while True:
            if isinstance(ask.request, m.AssociateCpus | m.SetCstates | m.Apply):
                # the background awaits the helper's answer; a hook meanwhile
                bln = policy.allocate(*pod(f"pct-hp-{len(later) + 2}", 2, "hp-bln"))
                assert bln is not None
                later.append(bln.cpus)
            ask = steps.send(helper.request(ask.request, ask.timeout))
    except StopIteration as done:
        assert done.value is True
    assert len(later) == 1
    assert handler.unsettled()  # the hooks' decisions wait for the next commit
    assert handler.commit()
    assert not handler.unsettled()
    for cpus in (first.cpus, *later):
        assert set(helper.clos(cpus).values()) == {0}
        assert all(disabled_cstates(c) == {"C6", "C6P"} for c in cpuset.ids(cpus))


async def background_at_the_gate(plugin: Balloons, helper: InProcessHelper) -> None:
    """The spec applied while the helper is down: the plugin's background
    takes over; the helper is back, but holds the background's retry (after
    0.5 s) at its gate, until the test sets it."""
    helper.down = True
    plugin.apply(plugin.prepare(SPEC.read_text(), "spec"))
    assert plugin.background is not None  # the reply path left it to the background
    helper.down = False
    helper.gate = asyncio.Event()
    for _ in range(150):
        if plugin._steps is not None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the background's retry did not reach the helper")


async def test_a_new_configuration_stops_the_background() -> None:
    """The plugin's background commit waits for the helper; a new
    configuration arrives meanwhile: the background is stopped first, so
    what it would still do for the old configuration (managed mode here)
    never overwrites the new one (assoc-only). The plugin's writer is the
    in-process helper (the plugin is started without --sst-helper, then
    given it)."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    helper = InProcessHelper(SimConfig(profile="bios-pct-on"))
    plugin = Balloons()
    PolicyHost("balloons", plugin, host_root=str(host_root()))
    assert plugin.policy is not None
    handler = plugin.policy.cpu_classes
    handler.writer = handler.pct.writer = helper
    try:
        await background_at_the_gate(plugin, helper)
        plugin.reconfigure(ASSOC_ONLY, "test")
        helper.gate.set()
        for _ in range(100):
            if plugin.background is None:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        assert handler.pct.mode == "assoc-only"
        assert not any(isinstance(r, m.PrepareManagedMode) for r in helper.sent)
        assert not handler.unsettled()
    finally:
        plugin.policy_shutdown()


async def test_a_settled_background_has_the_agent_publish_again() -> None:
    """Extended resources are "no opinion" while PCT waits for the helper: once
    the background has programmed SST, the host's listeners (the agent's NRT
    and extended-resource publishers) are told, or the node keeps what it had
    during the outage."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    helper = InProcessHelper()
    plugin = Balloons()
    host = PolicyHost("balloons", plugin, host_root=str(host_root()))
    assert plugin.policy is not None
    handler = plugin.policy.cpu_classes
    handler.writer = handler.pct.writer = helper
    plugin.policy.cpu_classes.pct.hold = False
    calls: list[object] = []
    try:
        helper.down = True
        plugin.apply(plugin.prepare(SPEC.read_text(), "spec"))
        assert plugin.background is not None
        assert extended_resources(plugin.policy) is None  # waiting for the helper
        host.add_listener(lambda: calls.append(extended_resources(plugin.policy)))
        helper.down = False
        for _ in range(150):  # its retry comes after 0.5 s
            if plugin.background is None:
                break
            await asyncio.sleep(0.02)
        assert plugin.background is None and not handler.unsettled()
        assert calls and calls[-1] is not None  # an opinion now: PCT is active
    finally:
        plugin.policy_shutdown()


async def test_a_hook_does_not_commit_while_the_background_runs() -> None:
    """The background awaits the helper (its request held at the in-process
    helper's gate); a CreateContainer meanwhile answers with its pinning and
    only records its CPU class decisions: the hook sends the helper nothing
    (two writers would interleave their requests), and the background applies
    the decision once the helper answers."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    helper = InProcessHelper()
    plugin = Balloons()
    PolicyHost("balloons", plugin, host_root=str(host_root()))
    assert plugin.policy is not None
    handler = plugin.policy.cpu_classes
    handler.writer = handler.pct.writer = helper
    handler.pct.hold = False
    try:
        await background_at_the_gate(plugin, helper)
        sent = len(helper.sent)
        result = plugin.nri_create_container(*pod("pct-hp-1", 2, "hp-bln"))
        assert result is not None and result.adjustment is not None
        assert result.adjustment.resources is not None
        assert result.adjustment.resources.cpu is not None
        cpus = cpuset.parse(result.adjustment.resources.cpu.cpus)
        assert cpuset.ids(cpus) and len(helper.sent) == sent  # recorded only
        assert handler.unsettled()
        helper.gate.set()
        for _ in range(150):
            if plugin.background is None:
                break
            await asyncio.sleep(0.02)
        assert plugin.background is None and not handler.unsettled()
        assert set(helper.clos(cpus).values()) == {0}
        assert all(disabled_cstates(c) == {"C6", "C6P"} for c in cpuset.ids(cpus))
    finally:
        plugin.policy_shutdown()


# --- the wait of a blocking call is its argument -------------------------------------------


class TimedHelper(InProcessHelper):
    """The in-process helper, recording the timeout each request was given."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[tuple[type[m.Request], float | None]] = []

    def request(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        self.timeouts.append((type(req), timeout))
        return super().request(req, timeout)


def prepared_spec(topo: Topology):  # type: ignore[no-untyped-def]
    result = validate(load_policy(SPEC.read_text()), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    return result.prepared


def test_the_wait_given_to_a_call_is_the_one_its_requests_get() -> None:
    """``Wait`` is an argument of each blocking call (configure's SST
    programming, a commit), never state left on the handler: the requests of
    a call get its per-request timeout (SoC-wide ones at least
    DISCOVER_TIMEOUT), a later call without one the writer's default, and a
    call's budget caps each of its requests at what is left of it."""
    helper = TimedHelper()
    helper.batches = False  # an older helper: each write its own request, each capped
    topo = Topology.from_sysfs(str(helper.root))
    policy = BalloonsPolicy(topo, str(helper.root), writer=helper)
    policy.set_config(prepared_spec(topo), Wait(timeout=0.25))
    given = dict(helper.timeouts)
    assert given[m.Discover] == given[m.PrepareManagedMode] == DISCOVER_TIMEOUT
    assert given[m.ConfigureClos] == given[m.EnableCP] == 0.25
    helper.timeouts.clear()
    assert policy.cpu_classes.commit()  # no wait given: the writer's default
    assert helper.timeouts and {t for _, t in helper.timeouts} == {None}

    helper.timeouts.clear()
    helper.latency = 0.03
    policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    policy.allocate(*pod("pct-lp-1", 2, "lp-bln"))
    assert policy.cpu_classes.commit(Wait(timeout=0.5, budget=Budget(0.1, helper.clock)))
    timeouts = [t for _, t in helper.timeouts]
    assert len(timeouts) >= 2  # the HP association and its C-states
    left = 0.1
    for t in timeouts:  # each capped at what the call's budget has left
        assert t == pytest.approx(min(0.5, left))
        left -= 0.03


def test_two_flushes_keep_their_own_timeouts() -> None:
    """Sans-IO, no helper loop: the steps of one flush keep the timeout they
    were given while another flush runs and ends between two of their
    requests (a timeout set on the allocator for the time of a flush and
    restored after would change the first flush's later requests)."""
    policy, helper = make()
    pct = policy.cpu_classes.pct
    policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    policy.allocate(*pod("pct-lp-1", 2, "lp-bln"))
    first = pct.flush_steps(0.5)
    ask = next(first)  # its one request
    assert isinstance(ask.request, m.AssociateCpus) and ask.timeout == 0.5
    policy.allocate(*pod("pct-hp-2", 2, "hp-bln"))
    second = pct.flush_steps(None)  # another flush, start to end, meanwhile
    other = next(second)
    assert other.timeout is None
    with pytest.raises(StopIteration) as ended:
        second.send(helper.request(other.request, other.timeout))
    assert ended.value.value is True
    assert ask.timeout == 0.5
    with pytest.raises(StopIteration) as done:
        first.send(helper.request(ask.request, ask.timeout))
    assert done.value.value is True


def irq_spec() -> str:
    """The spec, its HP balloons claiming ttyS0 and rtc0 (so a decision needs
    an association, C-states and IRQ affinities)."""
    text = SPEC.read_text()
    return text.replace(
        "    preferNewBalloons: true\n",
        '    preferNewBalloons: true\n    irqClaim: ["*ttyS0*", "*rtc0*"]\n',
        1,
    )


@pytest.mark.parametrize("batches", [True, False], ids=["apply", "older helper"])
def test_a_pct_create_is_one_helper_round_trip(batches: bool) -> None:
    """Through the plugin's hooks: each HP pod's CreateContainer and its
    StopContainer ask the helper once (an ``Apply`` with the association to
    CLOS 0, the C-states and the IRQ affinities); an older helper (no
    ``apply`` capability) gets the same writes one by one, with the same
    result."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    helper = InProcessHelper()
    helper.batches = batches
    plugin = Balloons()
    PolicyHost("balloons", plugin, host_root=str(host_root()))
    assert plugin.policy is not None
    handler = plugin.policy.cpu_classes
    handler.writer = handler.pct.writer = helper
    try:
        plugin.apply(plugin.prepare(irq_spec(), "spec"))
        handler.pct.hold = False  # as after the runtime's Synchronize
        assert handler.commit()
        for i in range(3):
            p, c = pod(f"pct-hp-{i}", 2, "hp-bln")
            helper.sent.clear()
            plugin.nri_create_container(p, c)
            writes = [type(w) for r in helper.sent for w in getattr(r, "items", [r])]
            assert sorted(t.__name__ for t in writes) == [
                "AssociateCpus",
                "SetCstates",
                "SetIrqAffinity",
            ]
            assert [type(r) for r in helper.sent] == ([m.Apply] if batches else writes)
            bln = next(b for b in plugin.policy.balloons if c.id in b.members)
            assert set(helper.clos(bln.cpus).values()) == {0}
            assert all(disabled_cstates(x) == {"C6", "C6P"} for x in cpuset.ids(bln.cpus))
            assert not handler.unsettled() and not plugin.irq.unsettled()
        helper.sent.clear()
        plugin.nri_stop_container(p, c)
        assert len(helper.sent) == (1 if batches else 3)
    finally:
        plugin.policy_shutdown()


def test_a_create_whose_reply_fails_still_ends_its_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision's request goes to the helper before the reply is built
    and its answer is taken after (Balloons.begin_commit): when building the
    reply raises, the commit is still ended before the hook gives up (the
    association sent and learned, nothing left pending for the background)."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    helper = InProcessHelper()
    plugin = Balloons()
    PolicyHost("balloons", plugin, host_root=str(host_root()))
    assert plugin.policy is not None
    handler = plugin.policy.cpu_classes
    handler.writer = handler.pct.writer = helper
    try:
        plugin.apply(plugin.prepare(SPEC.read_text(), "spec"))
        handler.pct.hold = False  # as after the runtime's Synchronize
        assert handler.commit()

        def broken(*args: object) -> None:
            raise RuntimeError("the reply could not be built")

        monkeypatch.setattr(plugin, "_create_result", broken)
        p, c = pod("pct-hp-broken", 2, "hp-bln")
        helper.sent.clear()
        with pytest.raises(RuntimeError, match="could not be built"):
            plugin.nri_create_container(p, c)
        assert [type(r) for r in helper.sent] == [m.Apply]
        bln = next(b for b in plugin.policy.balloons if c.id in b.members)
        assert {handler.pct.clos_of(x) for x in cpuset.ids(bln.cpus)} == {0}
        assert not handler.unsettled() and plugin.background is None
    finally:
        plugin.policy_shutdown()


def test_nothing_is_sent_for_cores_already_on_their_clos() -> None:
    """An LP pod on idle CPUs: they are on CLOS 3 already (the helper said
    so) and its class writes nothing else, so its decision asks the helper
    nothing, nor does its release; an HP pod's moves cores to CLOS 0."""
    policy, helper = make()
    helper.sent.clear()
    lp = admit(policy, "pct-lp", 4, "lp-bln")
    assert helper.sent == []
    assert set(helper.clos(lp).values()) == {3}
    policy.release("ctr-pct-lp")
    assert policy.cpu_classes.commit()
    assert helper.sent == []
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    writes = [w for r in helper.sent for w in getattr(r, "items", [r])]
    assert [w for w in writes if isinstance(w, m.AssociateCpus)] == [
        m.AssociateCpus(clos=0, cpus=cpuset.ids(hp))
    ]


def test_a_write_refused_in_an_apply_loses_none_of_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The helper refuses an ``Apply`` whole when one write is invalid: the
    plugin then sends its writes one by one, so the association still goes
    through and only the refused write is logged."""
    policy, helper = make()
    helper.refuse = {m.SetCstates}
    helper.sent.clear()
    hp = admit(policy, "pct-hp-1", 2, "hp-bln")
    assert [type(r) for r in helper.sent] == [m.Apply, m.AssociateCpus, m.SetCstates]
    assert set(helper.clos(hp).values()) == {0}
    assert policy.cpu_classes.pct.clos_of(cpuset.ids(hp)[0]) == 0
    assert any(x.startswith("cpuclass: C-states of CPUs") for x in caplog.messages)


def test_a_short_apply_reply_is_not_believed() -> None:
    """A helper answering an ``Apply`` with fewer replies than items: none of
    its writes counts as done (the CLOS of those cores is not claimed)."""
    policy, helper = make()
    helper.tamper = lambda req, reply: (
        m.ApplyReply(replies=[]) if isinstance(req, m.Apply) else reply
    )
    bln = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert bln is not None
    policy.cpu_classes.commit()
    pct = policy.cpu_classes.pct
    assert all(pct.clos_of(c) is None for c in cpuset.ids(bln.cpus))
    written = policy.cpu_classes.written[cpuset.ids(bln.cpus)[0]]
    assert written.cstates != ("C6", "C6P")  # its C-states are not taken as written


def test_a_create_and_a_stop_commit_after_their_answer_and_the_start_waits(
    tmp_path: Path,
) -> None:
    """With a helper, a create's CPU class decisions go to the helper once its
    answer is out (the stub's ``replying`` block, left after it wrote the
    answer): inside it the answer carries the pinning and the helper was
    sent nothing; leaving it sends the one Apply, which programs the HP
    CLOS. A stop likewise. So that the container's process starts on
    programmed CPUs, the helper makes the plugin subscribe to
    StartContainer (answered after that commit: test_stub); without a
    helper there is nothing to wait for and no subscription."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost
    from nri_framework.model import Event, RuntimeInfo

    runtime = RuntimeInfo(name="containerd", version="2.1.4")
    helper = InProcessHelper()
    plugin = start(helper, SPEC.read_text(), tmp_path)
    host = plugin.host
    assert isinstance(host, PolicyHost)
    try:
        assert host.configure("", runtime) & Event.START_CONTAINER.bit
        host.synchronize([], [])
        helper.sent.clear()
        p, c = pod("pct-hp-1", 2, "hp-bln")
        with host.replying():
            result = host.create_container(p, c)
            assert result.adjustment is not None and result.adjustment.resources.cpu
            cpus = cpuset.parse(result.adjustment.resources.cpu.cpus)
            assert helper.sent == []  # the answer does not wait for the helper
        assert [type(r) for r in helper.sent] == [m.Apply]
        assert set(helper.clos(cpus).values()) == {0}
        helper.sent.clear()
        with host.replying():
            host.stop_container(p, c)
            assert helper.sent == []
        assert [type(r) for r in helper.sent] == [m.Apply]
        assert set(helper.clos(cpus).values()) != {0}  # back to the idle class
    finally:
        plugin.policy_shutdown()
    options = {"config_file": str(tmp_path / "balloons.yaml")}  # what start() wrote
    bare = PolicyHost("balloons", Balloons(), host_root=str(host_root()), options=options)
    assert not bare.configure("", runtime) & Event.START_CONTAINER.bit

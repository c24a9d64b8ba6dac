"""Priority Core Turbo in the balloons policy (reference §13), against the SST
helper's own request handler and sim backend (the Xeon 6776P model) called
in-process: real validation and SST state, without the socket (the
integration tier runs the helper as a process:
tests/integration/nri_balloons/test_pct_helper.py).

``InProcessHelper`` is a stand-in for the ZeroMQ socket only: requests go
through the client's sans-IO session to :class:`nri_sst.handler.RequestHandler`
unchanged."""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
from pathlib import Path

import pytest
from nri_balloons.config import load_policy
from nri_balloons.pct import Hints
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.sstlink import Budget, WriteRefused, WriterUnavailable
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.topology import Topology
from nri_sst import PROTOCOL_VERSION
from nri_sst import messages as m
from nri_sst.backends.base import Backend
from nri_sst.backends.sim import SimBackend, SimConfig
from nri_sst.client import HelperRequestError, HelperUnavailable, Send, Session
from nri_sst.handler import RequestHandler

SPEC = Path(__file__).parents[3] / "examples" / "pct-managed" / "balloons-pct-managed.yaml"


_ROOT: list[Path] = []


def host_root() -> Path:
    """The 6776P sysfs tree of this module (the helper writes C-states into it;
    every test starts with a configuration that writes every CPU's C-states)."""
    return _ROOT[-1]


@pytest.fixture(autouse=True, scope="module")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    _ROOT.append(write_topology(tmp_path_factory.mktemp("pct") / "root", "xeon-6776p"))


class Clock:
    """An injected monotonic clock: the session's deadlines and the reply
    budget read it; the stand-in transport advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class InProcessHelper:
    """The helper's request handler in this process, reached through the
    client's own sans-IO session (:class:`nri_sst.client.Session`: the real
    handshake, reply matching, deadlines and helper instance); only the
    socket is a stand-in (see the module doc). Helper states a socket would
    show: ``down`` (killed: nothing connected), ``stopped`` (SIGSTOPped:
    every request costs its whole timeout on the clock), ``latency`` (seconds
    each answer takes on the clock)."""

    endpoint = "inproc://sst-helper"

    def __init__(self, config: SimConfig | None = None, backend: Backend | None = None) -> None:
        self.config = config
        self.clock = Clock()
        self.session = Session(self.endpoint, "test", clock=self.clock)
        self.down = False
        self.stopped = False
        self.latency = 0.0
        self.gate: asyncio.Event | None = None
        """when set, an awaited request is answered only once the event is"""
        self.sent: list[m.Request] = []
        self.watch = 0
        """CPUs whose CLOS is recorded in ``seen`` after every request"""
        self.seen: list[dict[int, int]] = []
        self.peers = 0
        self.peer = b""
        self._backend = backend
        self.restart(keep_hardware=False)

    def restart(self, keep_hardware: bool = False) -> None:
        """A new helper process (a new ``instance``; our peer unknown to it).
        ``keep_hardware``: SST as the old one left it (a kill -9 leaves the
        hardware programmed; the sim keeps it in its state file); otherwise
        as the BIOS left it."""
        state = _ROOT[-1].parent / f"sim-{id(self)}.json"
        if keep_hardware:
            self.backend.idle()  # what the helper's loop does when idle: the state file
        else:
            state.unlink(missing_ok=True)
        self.backend = self._backend or SimBackend(self.config, state_file=state)
        self.handler = RequestHandler(self.backend, host_root())
        self.handler.dispatch(m.Hello(protocol=PROTOCOL_VERSION), b"inspector")

    def evict(self) -> None:
        """What the helper does when its peer table is full: forget every peer."""
        self.handler.peers.clear()
        self.handler.dispatch(m.Hello(protocol=PROTOCOL_VERSION), b"inspector")

    @property
    def instance(self) -> str:
        return self.session.instance

    def request(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        if self.session.needs_socket:  # a new socket: a new peer for the helper
            self.session.connecting()
            self.peers += 1
            self.peer = b"plugin-%d" % self.peers
        call = self.session.begin(req, timeout)
        frames = call.frames
        while True:
            if self.down:
                raise WriterUnavailable(str(call.not_connected()))
            if self.stopped or self.latency >= call.remaining():
                self.clock.now = max(self.clock.now, call.deadline)
                raise WriterUnavailable(str(call.timed_out()))
            self.clock.now += self.latency
            sent = m.decode_request(frames[2])
            if not isinstance(sent, m.Hello):
                self.sent.append(sent)
            reply = self.handler.handle(frames[2], self.peer)
            if self.watch:
                self.seen.append(self.clos(self.watch))
            try:
                out = call.receive([b"", frames[1], reply])
            except HelperRequestError as exc:
                raise WriteRefused(str(exc)) from None
            except HelperUnavailable as exc:
                raise WriterUnavailable(str(exc)) from None
            if isinstance(out, Send):
                frames = out.frames
                continue
            assert out is not None
            return out

    async def request_async(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        if self.gate is not None:
            await self.gate.wait()
        return self.request(req, timeout)

    def close(self) -> None:
        self.session.lost()

    def clos(self, cpus: int) -> dict[int, int]:
        reply = self.handler.dispatch(m.GetAssociation(cpus=cpuset.ids(cpus)), b"inspector")
        assert isinstance(reply, m.GetAssociationReply)
        return reply.clos

    def punit_state(self) -> list[m.PunitInfo]:
        reply = self.handler.dispatch(m.Discover(), b"inspector")
        assert isinstance(reply, m.DiscoverReply)
        return [pu for pkg in reply.packages for pu in pkg.punits]


def make(text: str | None = None, helper: InProcessHelper | None = None):  # type: ignore[no-untyped-def]
    helper = helper or InProcessHelper()
    topo = Topology.from_sysfs(str(host_root()))
    policy = BalloonsPolicy(topo, str(host_root()), writer=helper)
    doc = load_policy(text if text is not None else SPEC.read_text())
    result = validate(doc, online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    policy.set_config(result.prepared)
    assert policy.cpu_classes.commit()
    return policy, helper


def pod(name: str, cpus: int, balloon: str) -> tuple[Pod, Container]:
    p = Pod(
        id=f"pod-{name}",
        name=name,
        namespace="default",
        uid=f"uid-{name}",
        annotations={"balloon.balloons.resource-policy.nri.io": balloon},
    )
    cpu = CpuResources(shares=1024 * cpus, quota=100_000 * cpus, period=100_000)
    return p, Container(
        id=f"ctr-{name}", pod_sandbox_id=p.id, name="bench", resources=Resources(cpu=cpu)
    )


def admit(policy: BalloonsPolicy, name: str, cpus: int, balloon: str) -> int:
    """Create a container (one decision, one commit, as the plugin does); its CPUs."""
    bln = policy.allocate(*pod(name, cpus, balloon))
    assert bln is not None
    assert policy.cpu_classes.commit()
    return bln.cpus


def disabled_cstates(cpu: int) -> set[str]:
    base = host_root() / f"sys/devices/system/cpu/cpu{cpu}/cpuidle"
    out = set()
    for state in base.glob("state*"):
        if (state / "disable").read_text().strip() == "1":
            out.add((state / "name").read_text().strip())
    return out


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
    res = policy.extended_resources()
    # 4 punits x 8 guaranteed HP CPUs (the smallest SST-TF bucket), as upstream's quickstart
    assert res == {"cpuclass.balloons.nri.io/*": None, "cpuclass.balloons.nri.io/hp-pct": 32}
    # the HP class's own balloons are not subtracted; CPUs held by other classes are
    admit(policy, "hp", 2, "hp-bln")
    assert policy.extended_resources()["cpuclass.balloons.nri.io/hp-pct"] == 32  # type: ignore[index]
    # no publishing class: only the ownership key, so every owned key is removed
    plain, _ = make()
    assert plain.extended_resources() == {"cpuclass.balloons.nri.io/*": None}


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
    assert policy.extended_resources() is None  # no opinion while degraded
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
    lp = admit(policy, "pct-lp", 8, "lp-bln")
    assert "pct: SST helper reconnected; programming SST state again" in caplog.messages
    assert all(pu.cp.enabled and pu.tf.enabled for pu in helper.punit_state())
    clos = helper.clos(policy.allowed)
    assert {c for c, k in clos.items() if k == 0} == set(cpuset.ids(hp))
    assert all(clos[c] == 3 for c in cpuset.ids(lp))


ASSOC_ONLY = """
reservedResources: {cpu: "cpuset:0,1,128,129"}
pinCPU: true
balloonTypes:
- name: hp
  cpuClass: hp-clos0
  maxCPUs: 8
  preferNewBalloons: true
- name: lp
  cpuClass: lp-clos3
cpuClasses:
- {name: default, sstClosID: 3}
- {name: hp-clos0, sstClosID: 0}
- {name: lp-clos3, sstClosID: 3}
"""


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
    lp = admit(policy, "pct-lp", 8, "lp-bln")
    assert "pct: SST helper reconnected; programming SST state again" in caplog.messages
    assert prepares(helper) == [m.PrepareManagedMode(keep_programmed=True)]
    kinds = [type(r).__name__ for r in helper.sent]
    assert kinds.count("ConfigureClos") == 2 and "EnableCP" in kinds
    assert helper.seen and all(set(seen.values()) == {3} for seen in helper.seen)
    clos = helper.clos(policy.allowed)
    assert {c for c, k in clos.items() if k == 0} == set(cpuset.ids(hp))
    assert all(clos[c] == 3 for c in cpuset.ids(lp))
    reassociated = set().union(*(r.cpus for r in helper.sent if isinstance(r, m.AssociateCpus)))
    assert reassociated == set(cpuset.ids(policy.allowed))


def test_reply_path_waits_at_most_its_budget() -> None:
    """Defect 8: on the reply path every wait for the helper together ends at
    the 100 ms budget (injected clock: a helper that takes 60 ms per answer),
    however many requests the decision needs; the rest is applied later."""
    policy, helper = make()
    helper.latency = 0.06
    handler = policy.cpu_classes
    start = helper.clock.now
    with handler.exchanges(budget=Budget(0.1, helper.clock)):
        bln = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
        assert bln is not None
        assert not handler.commit()  # AssociateCpus and SetCstates: 120 ms
    assert helper.clock.now - start <= 0.1 + 1e-9  # not 120 ms
    assert handler.unsettled()
    helper.latency = 0.0
    assert handler.commit()  # what the background does: everything left
    assert set(helper.clos(bln.cpus).values()) == {0}
    assert disabled_cstates(cpuset.ids(bln.cpus)[0]) == {"C6", "C6P"}
    assert not handler.unsettled()


def test_decisions_between_two_background_requests_are_kept() -> None:
    """The plugin's background awaits each request; hooks run meanwhile and
    only record decisions. Those recorded between two requests of a commit
    (its association, its C-states) are not lost when it ends: the next
    commit applies them."""
    policy, helper = make()
    handler = policy.cpu_classes
    first = policy.allocate(*pod("pct-hp-1", 2, "hp-bln"))
    assert first is not None
    later = []
    steps = handler.commit_steps(1.0)
    ask = next(steps)
    try:
        while True:
            if isinstance(ask.request, m.AssociateCpus | m.SetCstates):
                # the background awaits the helper's answer; a hook meanwhile
                bln = policy.allocate(*pod(f"pct-hp-{len(later) + 2}", 2, "hp-bln"))
                assert bln is not None
                later.append(bln.cpus)
            ask = steps.send(helper.request(ask.request, ask.timeout))
    except StopIteration as done:
        assert done.value is True
    assert len(later) == 2
    assert handler.unsettled()  # the hooks' decisions wait for the next commit
    assert handler.commit()
    assert not handler.unsettled()
    for cpus in (first.cpus, *later):
        assert set(helper.clos(cpus).values()) == {0}
        assert all(disabled_cstates(c) == {"C6", "C6P"} for c in cpuset.ids(cpus))


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
        helper.down = True
        plugin.apply(plugin.prepare(SPEC.read_text(), "spec"))
        assert plugin.background is not None  # the reply path left it to the background
        helper.down = False
        helper.gate = asyncio.Event()
        for _ in range(100):  # its retry (after 0.5 s) waits for the helper
            if plugin._steps is not None:
                break
            await asyncio.sleep(0.02)
        assert plugin._steps is not None
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

"""Priority Core Turbo in the balloons policy (reference §13), against the SST
helper's own request handler and sim backend (the Xeon 6776P model) called
in-process: real validation and SST state, without the socket (the
integration tier runs the helper as a process:
tests/integration/nri_balloons/test_pct_helper.py).

``InProcessHelper`` is a stand-in for the ZeroMQ socket only: requests go
through the client's sans-IO session to :class:`nri_sst.handler.RequestHandler`
unchanged, except where a test injects a fault (``down``, ``stopped``,
``refuse``) or a hostile reply (``tamper``)."""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.extres import extended_resources
from nri_balloons.observe import inspect
from nri_balloons.pct import DISCOVER_TIMEOUT, Hints
from nri_balloons.policy import BalloonsError, BalloonsPolicy
from nri_balloons.sstlink import Budget, Wait, WriteRefused, WriterUnavailable, exchange
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

if TYPE_CHECKING:
    from nri_balloons.plugin import Balloons

SPEC = Path(__file__).parents[3] / "examples" / "pct-managed" / "balloons-pct-managed.yaml"

DATA = Path(__file__).resolve().parents[2] / "data" / "balloons"


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

    def __init__(
        self,
        config: SimConfig | None = None,
        root: Path | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.config = config
        self.root = root or host_root()
        self.clock = Clock()
        self.session = Session(self.endpoint, "test", clock=self.clock)
        self.down = False
        self.stopped = False
        self.latency = 0.0
        self.gate: asyncio.Event | None = None
        """when set, an awaited request is answered only once the event is"""
        self.refuse: set[type[m.Request]] = set()
        """request types answered with an error (a test's fault injection)"""
        self.tamper: Callable[[m.Request, m.Reply], m.Reply] | None = None
        """rewrites replies (a test's hostile helper)"""
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
        self.handler = RequestHandler(self.backend, self.root)
        self.handler.dispatch(m.Hello(protocol=PROTOCOL_VERSION), b"inspector")

    def evict(self) -> None:
        """Our session ends on the helper (its connection dropped, or evicted
        from the peer table): the next request is asked for Hello again."""
        self.handler.forget(self.peer)

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
                if type(sent) in self.refuse:
                    raise WriteRefused(f"hardware-error: {type(sent).__name__} refused by the test")
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
            return self.tamper(req, out) if self.tamper else out

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
    topo = Topology.from_sysfs(str(helper.root))
    policy = BalloonsPolicy(topo, str(helper.root), writer=helper)
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
    res = extended_resources(policy)
    # 4 punits x 8 guaranteed HP CPUs (the smallest SST-TF bucket), as upstream's quickstart
    assert res == {"cpuclass.balloons.nri.io/*": None, "cpuclass.balloons.nri.io/hp-pct": 32}
    # the HP class's own balloons are not subtracted; CPUs held by other classes are
    admit(policy, "hp", 2, "hp-bln")
    assert extended_resources(policy)["cpuclass.balloons.nri.io/hp-pct"] == 32  # type: ignore[index]
    # no publishing class: only the ownership key, so every owned key is removed
    plain, _ = make()
    assert extended_resources(plain) == {"cpuclass.balloons.nri.io/*": None}


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
    reassociated = set().union(*(r.cpus for r in helper.sent if isinstance(r, m.AssociateCpus)))
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


def test_reply_path_waits_at_most_its_budget() -> None:
    """Defect 8: on the reply path every wait for the helper together ends at
    the 100 ms budget (injected clock: a helper that takes 60 ms per answer),
    however many requests the decision needs; the rest is applied later."""
    policy, helper = make()
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
def root16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_topology(tmp_path_factory.mktemp("pct16") / "root", "pct16")


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
    lp = admit(policy, "lp", 1, "lp-bln")
    assert any(x.startswith("cpuclass: pct failed to apply class on CPUs") for x in caplog.messages)
    pct = policy.cpu_classes.pct
    unknown = policy.topology.siblings(lp)
    assert all(pct.clos_of(c) is None for c in cpuset.ids(unknown))
    state = inspect(policy)
    assert state is not None
    assert all("clos" not in r for r in state["cpus"] if unknown >> r["cpu"] & 1)
    assert all(pct.clos_of(c) == 0 for c in cpuset.ids(policy.topology.siblings(hp)))
    helper.refuse = set()
    policy.release("ctr-lp")
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
    bln = policy.allocate(*pod("lp", 1, "lp-bln"))
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
    assert len(timeouts) >= 3
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
    ask = next(first)
    assert isinstance(ask.request, m.AssociateCpus) and ask.timeout == 0.5
    reply = helper.request(ask.request, ask.timeout)
    policy.allocate(*pod("pct-hp-2", 2, "hp-bln"))
    assert exchange(pct.flush_steps(None), helper) is True  # another flush, start to end
    ask = first.send(reply)
    assert isinstance(ask.request, m.AssociateCpus) and ask.timeout == 0.5
    with pytest.raises(StopIteration) as done:
        first.send(helper.request(ask.request, ask.timeout))
    assert done.value.value is True

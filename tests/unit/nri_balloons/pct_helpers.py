"""What the Priority Core Turbo unit tests (reference §13) share: the SST
helper's own request handler and sim backend (the Xeon 6776P model) called
in-process: real validation and SST state, without the socket (the
integration tier runs the helper as a process:
tests/integration/nri_balloons/test_pct_helper.py).

``InProcessHelper`` is a stand-in for the ZeroMQ socket only: requests go
through the client's sans-IO session to :class:`nri_sst.handler.RequestHandler`
unchanged, except where a test injects a fault (``down``, ``stopped``,
``refuse``) or a hostile reply (``tamper``).

Every test module imports :func:`shared_root` (its autouse host tree, one per
module) with the builders it uses.

The PCT unit tests: :mod:`test_pct` (the plan, its programming, association and
hints), :mod:`test_pct_degraded` (a helper absent, dead, refusing or restarted),
:mod:`test_pct_background` (the waits: the reply path's budget, the background
commit, each call's own timeout), :mod:`test_pct_smt_cores` (CLOS per core on an SMT
node); the in-process helper and the shared builders are in :mod:`pct_helpers`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from nri_balloons.configyaml import load_policy
from nri_balloons.plugin import Balloons
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.sstlink import Writer, WriteRefused, WriterUnavailable
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.host import PolicyHost
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
def shared_root(module_tmp: Path) -> None:
    _ROOT.append(write_topology(module_tmp / "root", "xeon-6776p"))


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
        self.batches = True
        """False: an older helper, without the ``apply`` capability (each
        write is a request of its own)"""
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
                refused = [r for r in getattr(sent, "items", [sent]) if type(r) in self.refuse]
                if refused:  # an Apply with one: refused whole (each is then sent alone)
                    raise WriteRefused(
                        f"hardware-error: {type(refused[0]).__name__} refused by the test"
                    )
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

    def supports(self, capability: str) -> bool:
        if capability == "apply" and not self.batches:
            return False
        hello = self.session.hello
        return hello is not None and capability in hello.capabilities

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


class PluginWithHelper(Balloons):
    """The balloons plugin with ``--sst-helper`` reaching the in-process helper."""

    def __init__(self, helper: InProcessHelper) -> None:
        super().__init__()
        self.helper = helper

    def helper_writer(self, endpoint: str) -> Writer:
        return self.helper


def start(helper: InProcessHelper, config: str, tmp_path: Path) -> PluginWithHelper:
    path = tmp_path / "balloons.yaml"
    path.write_text(config)
    plugin = PluginWithHelper(helper)
    options = {"sst_helper": helper.endpoint, "config_file": str(path)}
    PolicyHost("balloons", plugin, host_root=str(host_root()), options=options)
    return plugin

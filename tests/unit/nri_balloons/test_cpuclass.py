"""The cpuClass handler: class resolution, turboPriority arbitration, batched
and minimal commits (upstream ``handler_commit_test.go`` cases, reference §12),
and the balloons policy driving it."""

from __future__ import annotations

import functools
import logging
import tempfile
from pathlib import Path

import pytest
from nri_balloons.config import CPUClass
from nri_balloons.configyaml import load_policy
from nri_balloons.cpuclass import (
    ClassDef,
    CpuClassError,
    CpuClassHandler,
    TurboInfo,
    WriteRefused,
    WriteRequest,
    WriterUnavailable,
    resolve,
)
from nri_balloons.frequency import Frequency
from nri_balloons.policy import BalloonsPolicy
from nri_balloons.validation import validate
from nri_framework import cpuset
from nri_framework.model import Container, CpuResources, Pod, Resources
from nri_framework.simulate.sysfs import write_topology
from nri_framework.topology import Topology
from nri_sst import messages as m

MIN, BASE, TURBO = 800_000, 2_900_000, 3_800_000  # n4c16's cpufreq


_TREES = tempfile.TemporaryDirectory(prefix="cpuclass-")
"""Every cached topology's sysfs tree; removed when the test process exits."""


@functools.cache
def topology(name: str = "n4c16") -> Topology:
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=_TREES.name))
    write_topology(root, name)
    return Topology.from_sysfs(str(root))


class Recorder:
    """A writer that records every request; ``down`` makes it unavailable,
    ``refuse`` makes it refuse requests of that type."""

    endpoint = (
        ""  # no helper: PCT stays off (tests/unit/nri_balloons/test_pct_degraded.py covers it)
    )
    instance = ""

    def __init__(self) -> None:
        self.requests: list[WriteRequest] = []
        self.down = False
        self.refuse: type | None = None

    def request(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        assert isinstance(request, m.SetCpufreq | m.SetCstates | m.SetUncore), request
        if self.down:
            raise WriterUnavailable("helper at ipc:///x did not answer within 100 ms")
        if self.refuse is not None and isinstance(request, self.refuse):
            raise WriteRefused("invalid-argument: no")
        self.requests.append(request)
        if isinstance(request, m.SetCpufreq):
            return m.SetCpufreqReply(cpus=request.cpus)
        if isinstance(request, m.SetCstates):
            return m.SetCstatesReply(cpus=request.cpus, disabled=request.disabled)
        return m.SetUncoreReply(package=request.package, die=request.die)

    async def request_async(self, request: m.Request, timeout: float | None = None) -> m.Reply:
        return self.request(request, timeout)

    def supports(self, capability: str) -> bool:
        return False  # as an older helper: each write its own request

    def close(self) -> None:
        pass

    def take(self) -> list[WriteRequest]:
        out, self.requests = self.requests, []
        return out

    def freq(self) -> dict[int, tuple[int | None, int | None]]:
        """cpu -> (min, max) of the SetCpufreq requests taken so far."""
        out: dict[int, tuple[int | None, int | None]] = {}
        for r in self.requests:
            if isinstance(r, m.SetCpufreq):
                for c in r.cpus:
                    lo, hi = out.get(c, (None, None))
                    out[c] = (r.min_khz or lo, r.max_khz or hi)
        return out


def mask(*cpus: int) -> int:
    return cpuset.from_ids(cpus)


def cls(name: str, **kw: object) -> CPUClass:
    for k in ("min_freq", "max_freq", "uncore_min_freq", "uncore_max_freq"):
        v = kw.get(k)
        if isinstance(v, str):
            kw[k] = Frequency.parse(v)
        elif isinstance(v, int):
            kw[k] = Frequency(v)
    return CPUClass(name=name, **kw)  # type: ignore[arg-type]


def handler(*classes: CPUClass, domain: str = "package") -> tuple[CpuClassHandler, Recorder]:
    rec = Recorder()
    h = CpuClassHandler(topology(), rec)
    h.configure(list(classes), domain)
    return h, rec


TURBO_CLASSES = (
    cls("turbo-high", min_freq="turbo", max_freq="turbo", turbo_priority=10),
    cls("turbo-low", min_freq="turbo", max_freq="turbo", turbo_priority=1),
    cls("default-turbo", min_freq="min", max_freq="turbo"),
    cls("default-noturbo", min_freq="min", max_freq="base"),
)


# --------------------------------------------------------------------------- resolution


def test_resolve_symbolic_and_numeric() -> None:
    info = TurboInfo(MIN, BASE, TURBO)
    c = cls("c", min_freq="min", max_freq="turbo", uncore_max_freq="2GHz")
    assert resolve(c, info) == ClassDef(min_freq=MIN, max_freq=TURBO, uncore_max_freq=2_000_000)
    assert resolve(c, info, BASE).max_freq == BASE  # turbo lost to a higher priority
    b = cls("b", min_freq="base", max_freq=3_000_000)
    assert resolve(b, info) == ClassDef(min_freq=BASE, max_freq=3_000_000)
    # without platform info symbolic values are not written
    assert resolve(c, None) == ClassDef(uncore_max_freq=2_000_000)


def test_configure_logs_resolved_classes(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cpuclass")
    handler(cls("fast", min_freq="turbo", max_freq="turbo", disabled_cstates=["C4", "C8"]))
    assert (
        'cpuClass "fast" configured: minFreq=turbo(3800000) maxFreq=turbo(3800000) '
        "disabledCstates=[C4 C8]" in caplog.messages
    )


def test_bad_turbo_domain() -> None:
    h = CpuClassHandler(topology(), Recorder())
    with pytest.raises(CpuClassError, match='unsupported turboDomain "die"'):
        h.configure([], "die")


def test_uncore_without_driver_is_an_error() -> None:
    h = CpuClassHandler(topology(), Recorder())  # n4c16 has no intel_uncore_frequency
    with pytest.raises(CpuClassError) as err:
        h.configure([cls("u", uncore_max_freq="2GHz")])
    assert str(err.value) == (
        'uncore limits set in cpu class "u@d0" but uncore driver not available; '
        "load the intel_uncore_frequency driver"
    )


# --------------------------------------------------------------------------- turbo


def turbo_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [msg for msg in caplog.messages if f'class "{name}" ' in msg and "turbo:" in msg]


def test_turbo_priority_winner_loser_and_regain(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cpuclass")
    h, rec = handler(*TURBO_CLASSES)
    h.use(mask(2, 3, 4, 5, 6, 7), "default-noturbo")
    h.use(mask(1), "default-turbo")
    h.commit()
    assert rec.freq()[1] == (MIN, TURBO)  # no turbo class active: default-turbo has turbo
    assert rec.freq()[2] == (MIN, BASE)
    rec.take()

    h.use(mask(2), "turbo-low")
    h.commit()
    assert turbo_lines(caplog, "turbo-low")[-1] == (
        'turbo: domain=0 class "turbo-low" (prio=1, winner=true): minFreq=3800000 maxFreq=3800000'
    )
    assert "winner=false" in turbo_lines(caplog, "default-turbo")[-1]
    assert turbo_lines(caplog, "default-turbo")[-1].endswith("maxFreq=2900000")
    assert rec.freq() == {2: (TURBO, TURBO), 1: (None, BASE)}  # only what changed
    rec.take()

    h.use(mask(3), "turbo-high")
    h.commit()
    assert 'class "turbo-high" (prio=10, winner=true)' in turbo_lines(caplog, "turbo-high")[-1]
    assert turbo_lines(caplog, "turbo-low")[-1].endswith("minFreq=2900000 maxFreq=2900000")
    assert rec.freq() == {3: (TURBO, TURBO), 2: (BASE, BASE)}  # cpu 1 already at base
    rec.take()

    h.use(mask(3), "default-noturbo")  # the turbo-high balloon is gone
    h.commit()
    assert "winner=true" in turbo_lines(caplog, "turbo-low")[-1]
    assert rec.freq() == {3: (MIN, BASE), 2: (TURBO, TURBO)}
    rec.take()

    h.use(mask(2), "default-noturbo")  # no turbo class left: default-turbo regains turbo
    h.commit()
    assert rec.freq() == {2: (MIN, BASE), 1: (None, TURBO)}


def test_turbo_domains_package_and_system() -> None:
    # cpu 1 on package 0 and cpu 9 on package 1
    assert topology().cpus[1].package != topology().cpus[9].package
    for domain, expect in (("package", TURBO), ("system", BASE)):
        h, rec = handler(*TURBO_CLASSES, domain=domain)
        h.use(mask(1), "default-turbo")
        h.use(mask(9), "turbo-high")
        h.commit()
        assert rec.freq()[1] == (MIN, expect), domain
        assert rec.freq()[9] == (TURBO, TURBO)


def test_same_winner_recomputes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cpuclass")
    h, rec = handler(*TURBO_CLASSES)
    h.use(mask(2), "turbo-low")
    h.commit()
    n = len(caplog.messages)
    rec.take()
    h.use(mask(2), "turbo-low")  # a 2nd container in the same balloon
    assert h.commit()
    assert len(caplog.messages) == n
    assert rec.take() == []


# --------------------------------------------------------------------------- commits


def test_commit_idempotent_and_grouped() -> None:
    h, rec = handler(cls("hp", min_freq=800_000, max_freq=4_600_000, freq_governor="performance"))
    h.use(mask(0, 1, 2, 3), "hp")
    h.commit()
    assert rec.take() == [
        m.SetCpufreq(cpus=[0, 1, 2, 3], min_khz=800_000, max_khz=4_600_000, governor="performance")
    ]
    h.commit()
    assert rec.take() == []


def test_reconfigured_class_writes_only_what_changed() -> None:
    h, rec = handler(cls("c", min_freq="min", max_freq="base"))
    h.use(mask(2, 3), "c")
    h.commit()
    rec.take()
    h.configure([cls("c", min_freq="min", max_freq="turbo")])
    h.use(mask(2, 3), "c")
    h.commit()
    assert rec.take() == [m.SetCpufreq(cpus=[2, 3], max_khz=TURBO)]
    h.configure([cls("c", min_freq="min", max_freq="turbo")])
    h.use(mask(2, 3), "c")
    h.commit()
    assert rec.take() == []


def test_empty_class_writes_nothing() -> None:
    h, rec = handler(cls("hp", min_freq=800_000, max_freq=4_000_000, disabled_cstates=["C8"]))
    h.use(mask(0), "hp")
    h.commit()
    rec.take()
    h.use(mask(0), "")
    h.commit()
    assert rec.take() == []


def test_unknown_class_logged_and_not_written(caplog: pytest.LogCaptureFixture) -> None:
    h, rec = handler(cls("hp", max_freq=4_000_000))
    h.use(mask(0), "nope")
    h.commit()
    assert 'unknown CPU class "nope"' in caplog.messages
    assert rec.take() == []


def test_epp_and_governor_written() -> None:
    h, rec = handler(cls("e", freq_governor="powersave", energy_performance_preference=128))
    h.use(mask(4, 5), "e")
    h.commit()
    assert rec.take() == [m.SetCpufreq(cpus=[4, 5], governor="powersave", epp="128")]


def test_cstates_disable_then_reenable() -> None:
    h, rec = handler(
        cls("idle", min_freq="min", max_freq="base"),
        cls("lowlat", disabled_cstates=["C8", "C4"]),
    )
    h.use(mask(*range(2, 8)), "idle")
    h.use(mask(4, 5), "lowlat")
    h.commit()
    reqs = rec.take()
    assert m.SetCstates(cpus=[2, 3, 6, 7], disabled=[]) in reqs
    assert m.SetCstates(cpus=[4, 5], disabled=["C4", "C8"]) in reqs
    assert m.SetCpufreq(cpus=[2, 3, 6, 7], min_khz=MIN, max_khz=BASE) in reqs
    h.use(mask(4, 5), "idle")
    h.commit()
    assert rec.take() == [
        m.SetCpufreq(cpus=[4, 5], min_khz=MIN, max_khz=BASE),
        m.SetCstates(cpus=[4, 5], disabled=[]),
    ]


def test_cstates_not_sent_again_for_cpus_whose_cstates_do_not_change() -> None:
    # the rule: nothing sent for CPUs whose state does not change; a
    # CPU moving to another class with the same C-states gets its cpufreq only
    h, rec = handler(
        cls("a", min_freq="min", disabled_cstates=["C8", "C4"]),
        cls("b", max_freq="base", disabled_cstates=["C4", "C8"]),
    )
    h.use(mask(4, 5), "a")
    h.commit()
    assert m.SetCstates(cpus=[4, 5], disabled=["C4", "C8"]) in rec.take()
    h.use(mask(4, 5), "b")
    h.commit()
    assert rec.take() == [m.SetCpufreq(cpus=[4, 5], max_khz=BASE)]
    h.use(mask(4, 5), "b")  # the same class again: nothing at all
    h.commit()
    assert rec.take() == []
    h.use(mask(4, 5, 6), "a")  # only the CPU whose C-states change gets a write
    h.commit()
    reqs = rec.take()
    assert [r for r in reqs if isinstance(r, m.SetCstates)] == [
        m.SetCstates(cpus=[6], disabled=["C4", "C8"])
    ]


def test_reconfigured_class_writes_its_new_cstates() -> None:
    # the C-states a class disables on a CPU are remembered per class until the
    # classes change: the same class name with other C-states plans them anew
    h, rec = handler(cls("lowlat", disabled_cstates=["C8"]))
    h.use(mask(4, 5), "lowlat")
    h.commit()
    assert rec.take() == [m.SetCstates(cpus=[4, 5], disabled=["C8"])]
    h.configure([cls("lowlat", disabled_cstates=["C4", "C8"])])
    h.use(mask(4, 5), "lowlat")
    h.commit()
    assert rec.take() == [m.SetCstates(cpus=[4, 5], disabled=["C4", "C8"])]


def test_debug_lines_of_the_plan_with_debug_on(caplog: pytest.LogCaptureFixture) -> None:
    # the plan skips what only its debug lines need while debug is off: with
    # debug on, the C-state and uncore lines are still there (upstream's)
    caplog.set_level(logging.DEBUG, "cpuclass")
    h, rec = handler(cls("lowlat", disabled_cstates=["C8", "C4"]))
    h.use(mask(4, 5), "lowlat")
    h.commit()
    assert rec.take() == [m.SetCstates(cpus=[4, 5], disabled=["C4", "C8"])]
    assert 'cstates: class "lowlat@d0" on cpus 4-5: disable=[C4 C8]' in caplog.messages
    assert "uncore: pkg/die 0/0: no limits in effect" in caplog.messages


def test_cstates_untouched_when_no_class_disables_any() -> None:
    h, rec = handler(cls("idle", min_freq="min"))
    h.use(mask(2, 3), "idle")
    h.commit()
    assert all(not isinstance(r, m.SetCstates) for r in rec.take())


def uncore_handler(*classes: CPUClass) -> tuple[CpuClassHandler, Recorder]:
    rec = Recorder()
    h = CpuClassHandler(topology(), rec)
    h.uncore_available = True
    h.configure(list(classes))
    return h, rec


def test_uncore_skip_both_zero() -> None:
    h, rec = uncore_handler(cls("idle", min_freq=800_000))
    h.use(mask(0, 1), "idle")
    h.commit()
    assert [r for r in rec.take() if isinstance(r, m.SetUncore)] == []


def test_uncore_max_wins_across_classes_and_recomputes() -> None:
    h, rec = uncore_handler(
        cls("lo", uncore_min_freq=800_000, uncore_max_freq=1_500_000),
        cls("hi", uncore_min_freq=1_200_000, uncore_max_freq=2_400_000),
    )
    die = topology().cpus[0].die_key
    assert topology().cpus[1].die_key == die
    h.use(mask(0), "lo")
    h.use(mask(1), "hi")
    h.commit()
    assert rec.take() == [
        m.SetUncore(package=die[0], die=die[1], min_khz=1_200_000, max_khz=2_400_000)
    ]
    h.use(mask(1), "lo")
    h.commit()
    assert rec.take() == [
        m.SetUncore(package=die[0], die=die[1], min_khz=800_000, max_khz=1_500_000)
    ]
    h.commit()
    assert rec.take() == []


# --------------------------------------------------------------------------- helper away


def test_unavailable_helper_degrades_and_reapplies(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "cpuclass")
    h, rec = handler(cls("a", min_freq="min", max_freq="base"), cls("b", max_freq="turbo"))
    h.use(mask(2, 3, 4), "a")
    h.commit()
    rec.take()
    rec.down = True
    h.use(mask(3), "b")
    assert not h.commit()
    assert h.degraded
    h.use(mask(2), "b")
    assert not h.commit()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "cpuclass: SST helper unavailable: helper at ipc:///x did not answer within 100 ms"
    ]
    rec.down = False
    assert h.commit()
    assert not h.degraded
    # everything is re-applied (cpu 4 did not change), not only what changed
    assert rec.take() == [
        m.SetCpufreq(cpus=[2, 3], max_khz=TURBO),
        m.SetCpufreq(cpus=[4], min_khz=MIN, max_khz=BASE),
    ]
    assert "cpuclass: SST helper is back; CPU class settings re-applied" in caplog.messages
    h.commit()
    assert rec.take() == []


def test_refused_request_is_logged_and_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    h, rec = handler(cls("a", min_freq="min", disabled_cstates=["C8"]))
    rec.refuse = m.SetCstates
    h.use(mask(2), "a")
    assert h.commit()
    assert rec.take() == [m.SetCpufreq(cpus=[2], min_khz=MIN)]
    assert any("refused: invalid-argument" in msg for msg in caplog.messages)


# --------------------------------------------------------------------------- the policy

POLICY = """
reservedResources: {cpu: "cpuset:0-1"}
idleCPUClass: %(idle)s
balloonTypes:
- name: lowlat
  cpuClass: lowlat
  matchExpressions: [{key: name, operator: Equals, values: [lowlat]}]
  maxCPUs: 4
- name: plain
  matchExpressions: [{key: name, operator: Equals, values: [plain]}]
cpuClasses:
- name: lowlat
  minFreq: 2GHz
  maxFreq: turbo
  disabledCstates: [C4, C8]
- name: default
  minFreq: min
  maxFreq: base
"""


def make_policy(idle: str = '""') -> tuple[BalloonsPolicy, Recorder]:
    topo = topology()
    result = validate(load_policy(POLICY % {"idle": idle}), online_cpus=topo.online)
    assert result.prepared is not None, result.errors
    rec = Recorder()
    policy = BalloonsPolicy(topo, writer=rec)
    policy.set_config(result.prepared)
    return policy, rec


def ctr(i: int, name: str, cpus: int) -> tuple[Pod, Container]:
    pod = Pod(id=f"p{i}", name=f"p{i}", uid=f"u{i}", namespace="default")
    return pod, Container(
        id=f"c{i}",
        pod_sandbox_id=pod.id,
        name=name,
        resources=Resources(cpu=CpuResources(shares=1024 * cpus)),
    )


def state(policy: BalloonsPolicy, cpu: int) -> tuple[str, int, int, tuple[str, ...] | None]:
    w = policy.cpu_classes.written[cpu]
    return (
        policy.cpu_classes.cpu_class[cpu],
        w.min_freq or 0,
        w.max_freq or 0,
        w.cstates,
    )


def test_policy_default_class_on_idle_and_reserved_then_balloon_class() -> None:
    policy, rec = make_policy()
    policy.cpu_classes.commit()
    for cpu in range(16):  # no idleCPUClass: "default" on idle and reserved CPUs
        assert state(policy, cpu) == (f"default@d{topology().cpus[cpu].package}", MIN, BASE, ())
    rec.take()
    policy.allocate(*ctr(1, "lowlat", 2))
    policy.cpu_classes.commit()
    bln = policy.owner["c1"]
    assert bln.cpus.bit_count() == 2
    reqs = rec.take()
    assert [r.cpus for r in reqs] == [cpuset.ids(bln.cpus)] * 2  # one cpufreq, one cstates
    for cpu in cpuset.ids(bln.cpus):
        assert state(policy, cpu)[1:] == (2_000_000, TURBO, ("C4", "C8"))
    policy.release("c1")
    policy.cpu_classes.commit()
    for cpu in cpuset.ids(bln.cpus):
        assert state(policy, cpu)[1:] == (MIN, BASE, ())
    # a plain balloon has no cpuClass: the "default" class, nothing to write
    rec.take()
    policy.allocate(*ctr(2, "plain", 1))
    policy.cpu_classes.commit()
    assert rec.take() == []


def test_policy_class_only_reconfigure_rewrites_default_cpus() -> None:
    policy, rec = make_policy()
    policy.cpu_classes.commit()
    rec.take()
    text = (POLICY % {"idle": '""'}).replace("maxFreq: base", "maxFreq: turbo")
    result = validate(load_policy(text), online_cpus=topology().online)
    assert result.prepared is not None
    assert policy.reconfigure(result.prepared, []) == "classes"
    policy.cpu_classes.commit()
    assert rec.take() == [m.SetCpufreq(cpus=list(range(16)), max_khz=TURBO)]


def test_plugin_without_helper_warns_and_honours_log_debug(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from nri_balloons.cpuclass import NullWriter
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    root = write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(POLICY % {"idle": '""'} + "log: {debug: [cpuclass]}\n")
    plugin = Balloons()
    try:
        PolicyHost("balloons", plugin, options={"config_file": str(cfg)}, host_root=str(root))
        assert plugin.policy is not None
        assert isinstance(plugin.policy.cpu_classes.writer, NullWriter)
        assert any("there is no SST helper (--sst-helper)" in msg for msg in caplog.messages)
        assert logging.getLogger("cpuclass").level == logging.DEBUG
        plugin.reconfigure(POLICY % {"idle": '""'}, "test")
        assert logging.getLogger("cpuclass").level == logging.NOTSET
    finally:
        logging.getLogger("cpuclass").setLevel(logging.NOTSET)


@pytest.mark.parametrize("debug", [False, True])
def test_without_a_helper_a_decision_plans_no_writes_unless_they_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, debug: bool
) -> None:
    """No helper: nothing is written, so a decision plans no class writes (its
    cost on every create); with cpuclass debug logging it plans them to log
    what it would write, as before."""
    from nri_balloons.plugin import Balloons
    from nri_framework.host import PolicyHost

    root = write_topology(tmp_path / "host", "n4c16")
    cfg = tmp_path / "balloons.yaml"
    cfg.write_text(POLICY % {"idle": '""'} + ("log: {debug: [cpuclass]}\n" if debug else ""))
    plugin = Balloons()
    try:
        host = PolicyHost(
            "balloons", plugin, options={"config_file": str(cfg)}, host_root=str(root)
        )
        assert plugin.policy is not None
        classes = plugin.policy.cpu_classes
        host.synchronize([], [])
        classes.dirty = 0
        caplog.clear()
        cpu = CpuResources(shares=2048, quota=200_000, period=100_000)
        pod = Pod(id="p", name="lowlat", namespace="ns", uid="u")
        ctr = Container(id="c", pod_sandbox_id="p", name="lowlat", resources=Resources(cpu=cpu))
        result = host.create_container(pod, ctr)
        assert result.adjustment is not None
        pinned = cpuset.parse(result.adjustment.resources.cpu.cpus)  # type: ignore[union-attr]
        not_writing = [
            r for r in caplog.messages if r.startswith("cpuclass: no SST helper, not writing")
        ]
        if debug:
            assert classes.dirty == 0  # planned (and logged)
            assert any("SetCpufreq" in r for r in not_writing), caplog.messages
        else:
            assert classes.dirty & pinned == pinned  # left for when it is logged
            assert not_writing == []
    finally:
        logging.getLogger("cpuclass").setLevel(logging.NOTSET)


class _PerCpuUse(CpuClassHandler):
    """The oracle: ``use`` as it was, splitting by domain and comparing classes
    CPU by CPU."""

    def use(self, cpus: int, name: str) -> None:
        cpus &= self.allowed
        if not cpus:
            return
        if name and name not in self.classes:
            logging.getLogger("nri_balloons.cpuclass").error("unknown CPU class %r", name)
        self.pct.use(cpus, name)
        for per_class in self.active.values():
            for c in list(per_class):
                per_class[c] &= ~cpus
                if not per_class[c]:
                    del per_class[c]
        by_domain: dict[int, int] = {}
        for cpu in cpuset.ids(cpus):
            d = self.domain_of.get(cpu, 0)
            by_domain[d] = by_domain.get(d, 0) | 1 << cpu
        if name:
            for d, mask in by_domain.items():
                per_class = self.active.setdefault(d, {})
                per_class[name] = per_class.get(name, 0) | mask
        for d in sorted(by_domain):
            self._recalculate_turbo(d)
        for d, mask in by_domain.items():
            syn = self._synthetic(name, d)
            for cpu in cpuset.ids(mask):
                if self.cpu_class.get(cpu) != syn:
                    self.cpu_class[cpu] = syn
                    self.dirty |= 1 << cpu


def _state(h: CpuClassHandler) -> tuple[object, ...]:
    return (list(h.cpu_class.items()), h.dirty, h.active, h.winner, h.defs)


@pytest.mark.parametrize("domain", ["package", "system"])
@pytest.mark.parametrize("seed", range(4))
def test_use_visits_changed_cpus_only_with_the_per_cpu_result(domain: str, seed: int) -> None:
    import random

    rnd = random.Random(seed)
    topo = topology()
    online = cpuset.ids(topo.online)
    allowed = topo.online if seed % 2 else cpuset.from_ids(online[1:-2])
    names = ["", *(c.name for c in TURBO_CLASSES)]
    ours = CpuClassHandler(topo, Recorder())
    oracle = _PerCpuUse(topo, Recorder())
    for h in (ours, oracle):
        h.configure(list(TURBO_CLASSES), domain, allowed, idle_class="default-noturbo")
    grown = 0
    for _ in range(300):
        op = rnd.random()
        if op < 0.4:  # a balloon grows by one CPU: its class on its whole set again
            grown |= 1 << rnd.choice(online)
            name = rnd.choice(names)
            for h in (ours, oracle):
                h.forget(grown)
                h.use(grown, name)
        elif op < 0.8:
            mask = cpuset.from_ids(rnd.sample(online, rnd.randint(1, len(online))))
            name = rnd.choice(names)
            for h in (ours, oracle):
                h.use(mask, name)
        elif op < 0.95:
            mask = cpuset.from_ids(rnd.sample(online, rnd.randint(1, 4)))
            for h in (ours, oracle):
                h.forget(mask)
        else:
            grown = 0
            for h in (ours, oracle):
                h.reset()
        assert _state(ours) == _state(oracle)
        if rnd.random() < 0.1:
            ours.dirty = oracle.dirty = 0  # as a commit does

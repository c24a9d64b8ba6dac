"""Every request field validated against the discovered machine (sst.md §1.7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_sst import messages as m
from nri_sst.backends.none import NoneBackend
from nri_sst.backends.sim import SimBackend
from nri_sst.handler import RequestHandler

from .conftest import SMALL_SIM


@pytest.fixture
def handler(small_root: Path) -> RequestHandler:
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    h.peers.add(b"")
    return h


@pytest.fixture(scope="module")
def ro_handler(module_tmp: Path) -> RequestHandler:
    """Shared by the rejection cases: a rejected request writes nothing."""
    from nri_framework.simulate.sysfs import write_topology

    from .conftest import SMALL

    h = RequestHandler(SimBackend(SMALL_SIM), write_topology(module_tmp / "v", SMALL))
    h.peers.add(b"")
    return h


def error(h: RequestHandler, req: m.Request) -> m.ErrorReply:
    reply = m.decode_reply(h.handle(m.encode(req)))
    assert isinstance(reply, m.ErrorReply), reply
    return reply


BAD = [
    # (request, code, fragment of the message)
    (m.AssociateCpus(clos=4, cpus=[0]), "invalid-argument", "invalid CLOS id 4"),
    (m.AssociateCpus(clos=-1, cpus=[0]), "invalid-argument", "invalid CLOS id -1"),
    (m.AssociateCpus(clos=0, cpus=[16]), "invalid-argument", "not online"),
    (m.AssociateCpus(clos=0, cpus=[-1]), "invalid-argument", "not online"),
    (m.AssociateCpus(clos=0, cpus=[]), "invalid-argument", "empty CPU list"),
    (m.GetAssociation(cpus=[99]), "invalid-argument", "not online"),
    (m.GetClosConfig(clos=9), "invalid-argument", "invalid CLOS id 9"),
    (m.ConfigureClos(clos=5, min_khz=0, max_khz=0), "invalid-argument", "CLOS id 5"),
    (m.ConfigureClos(clos=0, min_khz=700_000, max_khz=0), "invalid-argument", "min_khz"),
    (m.ConfigureClos(clos=0, min_khz=0, max_khz=4_700_000), "invalid-argument", "max_khz"),
    (m.ConfigureClos(clos=0, min_khz=0, max_khz=25_600_000), "invalid-argument", "max_khz"),
    (m.ConfigureClos(clos=0, min_khz=2_350_000, max_khz=4_600_000), "invalid-argument", "100 MHz"),
    (
        m.ConfigureClos(clos=0, min_khz=2_300_000, max_khz=0),
        "invalid-argument",
        "min freq 2300 MHz must be smaller than max freq 0 MHz",
    ),
    (
        m.ConfigureClos(clos=0, min_khz=0, max_khz=0, proportional_priority=16),
        "invalid-argument",
        "proportional_priority",
    ),
    (m.SetCstates(cpus=[0], disabled=["C7"]), "invalid-argument", "unknown C-states ['C7']"),
    (
        m.SetCstates(cpus=[0], disabled=["../../../../etc/passwd"]),
        "invalid-argument",
        "unknown C-states",
    ),
    (m.SetCstates(cpus=[40], disabled=[]), "invalid-argument", "not online"),
    (m.SetCpufreq(cpus=[0], min_khz=100), "invalid-argument", "min_khz: 100 kHz outside"),
    (m.SetCpufreq(cpus=[0], max_khz=9_000_000), "invalid-argument", "max_khz"),
    (
        m.SetCpufreq(cpus=[0], min_khz=3_000_000, max_khz=2_000_000),
        "invalid-argument",
        "greater than",
    ),
    (m.SetCpufreq(cpus=[0], governor="schedutil"), "invalid-argument", "scaling_available"),
    (m.SetCpufreq(cpus=[0], governor="../x"), "invalid-argument", "governor"),
    (m.SetCpufreq(cpus=[0], epp="turbo"), "invalid-argument", "epp"),
    (m.SetCpufreq(cpus=[0], epp="256"), "invalid-argument", "epp"),
    (
        m.SetCpufreq(cpus=[0], governor="performance", epp="power"),
        "invalid-argument",
        "performance governor",
    ),
    (m.SetUncore(package=0, die=0, min_khz=100), "invalid-argument", "min_khz"),
    (m.SetUncore(package=0, die=0, max_khz=9_000_000), "invalid-argument", "max_khz"),
    (
        m.SetUncore(package=0, die=0, min_khz=2_000_000, max_khz=1_000_000),
        "invalid-argument",
        "greater than",
    ),
    (m.SetUncore(package=7, die=0), "invalid-argument", "package_07_die_00"),
    (m.ReadFrequency(cpus=[1000]), "invalid-argument", "not online"),
    (m.Hello(protocol=99), "protocol-mismatch", "protocol 99"),
]


@pytest.mark.parametrize(("req", "code", "text"), BAD, ids=lambda x: repr(x)[:60])
def test_field_rejected(ro_handler: RequestHandler, req: m.Request, code: str, text: str) -> None:
    handler = ro_handler
    before = (
        handler.host_root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq"
    ).read_text()
    err = error(handler, req)
    assert err.code == code
    assert text in err.message
    after = (handler.host_root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq").read_text()
    assert before == after


def test_no_write_before_validation_of_all_cpus(handler: RequestHandler) -> None:
    err = error(handler, m.AssociateCpus(clos=3, cpus=[0, 1, 99]))
    assert err.code == "invalid-argument"
    reply = handler.dispatch(m.GetAssociation(cpus=[0, 1]))
    assert reply == m.GetAssociationReply(clos={0: 0, 1: 0})


def test_valid_writes_reach_sysfs(handler: RequestHandler) -> None:
    cpu = handler.host_root / "sys/devices/system/cpu"
    handler.dispatch(m.SetCstates(cpus=[1, 9], disabled=["C6", "C6P"]))
    names = [(cpu / f"cpu9/cpuidle/state{i}/name").read_text().strip() for i in range(5)]
    disabled = [(cpu / f"cpu9/cpuidle/state{i}/disable").read_text().strip() for i in range(5)]
    assert dict(zip(names, disabled, strict=True)) == {
        "POLL": "0",
        "C1": "0",
        "C1E": "0",
        "C6": "1",
        "C6P": "1",
    }
    handler.dispatch(
        m.SetCpufreq(
            cpus=[2],
            min_khz=2_300_000,
            max_khz=4_600_000,
            governor="performance",
            epp="performance",
        )
    )
    f = cpu / "cpu2/cpufreq"
    assert (f / "scaling_min_freq").read_text().strip() == "2300000"
    assert (f / "scaling_governor").read_text().strip() == "performance"
    assert (f / "energy_performance_preference").read_text().strip() == "performance"
    handler.dispatch(m.SetUncore(package=1, die=0, min_khz=1_000_000, max_khz=2_000_000))
    u = cpu / "intel_uncore_frequency/package_01_die_00"
    assert (u / "min_freq_khz").read_text().strip() == "1000000"
    assert (u / "max_freq_khz").read_text().strip() == "2000000"


def test_none_backend_says_not_supported(small_root: Path) -> None:
    h = RequestHandler(NoneBackend(), small_root)
    h.peers.add(b"")
    for req in (
        m.PrepareManagedMode(),
        m.AssociateCpus(clos=0, cpus=[0]),
        m.TFStatus(),
        m.Teardown(),
        m.ReadFrequency(cpus=[0]),
    ):
        err = error(h, req)
        assert err.code == "not-supported"
        assert "SST not supported" in err.message
    d = h.dispatch(m.Discover())
    assert isinstance(d, m.DiscoverReply) and not d.supported and d.online_cpus == list(range(16))
    assert isinstance(h.dispatch(m.SetCstates(cpus=[0], disabled=["C6"])), m.SetCstatesReply)


def test_handshake_required(small_root: Path) -> None:
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    assert error(h, m.Discover()).code == "handshake-required"
    hello = m.decode_reply(h.handle(m.encode(m.Hello(protocol=1)), b"peer"))
    assert isinstance(hello, m.HelloReply) and hello.sst_supported
    assert isinstance(m.decode_reply(h.handle(m.encode(m.TFStatus()), b"peer")), m.TFStatusReply)


FILES = ("scaling_min_freq", "scaling_max_freq", "energy_performance_preference")


def _cpufreq(handler: RequestHandler, cpu: int, name: str) -> str:
    return (handler.host_root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/{name}").read_text()


@pytest.mark.parametrize(
    ("first", "then", "text"),
    [
        (
            m.SetCpufreq(cpus=[0, 1], max_khz=2_000_000),
            m.SetCpufreq(cpus=[1, 2], min_khz=3_000_000),
            "min_khz 3000000 is greater than max_khz 2000000 (scaling_max_freq of cpu 1)",
        ),
        (
            m.SetCpufreq(cpus=[1], min_khz=3_000_000),
            m.SetCpufreq(cpus=[1], max_khz=2_000_000),
            "max_khz 2000000 is smaller than min_khz 3000000 (scaling_min_freq of cpu 1)",
        ),
        (
            m.SetCpufreq(cpus=[1], governor="performance"),
            m.SetCpufreq(cpus=[0, 1], epp="power"),
            "refused under the performance governor of cpu 1",
        ),
    ],
    ids=["min-above-earlier-max", "max-below-earlier-min", "epp-under-earlier-governor"],
)
def test_cpufreq_checked_against_the_state_it_leaves(
    handler: RequestHandler, first: m.SetCpufreq, then: m.SetCpufreq, text: str
) -> None:
    assert isinstance(handler.dispatch(first), m.SetCpufreqReply)
    before = {(c, f): _cpufreq(handler, c, f) for c in (0, 1, 2) for f in FILES}
    err = error(handler, then)
    assert err.code == "invalid-argument" and text in err.message, err.message
    assert before == {(c, f): _cpufreq(handler, c, f) for c in (0, 1, 2) for f in FILES}


def test_cpufreq_changes_whose_resulting_state_is_valid_are_accepted(
    handler: RequestHandler,
) -> None:
    handler.dispatch(m.SetCpufreq(cpus=[1], governor="performance", max_khz=2_000_000))
    handler.dispatch(m.SetCpufreq(cpus=[1], min_khz=2_000_000))  # = the max now
    handler.dispatch(m.SetCpufreq(cpus=[1], governor="powersave", epp="power"))
    handler.dispatch(m.SetCpufreq(cpus=[1], min_khz=3_000_000, max_khz=4_000_000))
    assert _cpufreq(handler, 1, "scaling_min_freq").strip() == "3000000"
    assert _cpufreq(handler, 1, "energy_performance_preference").strip() == "power"


def test_uncore_checked_against_the_state_it_leaves(handler: RequestHandler) -> None:
    handler.dispatch(m.SetUncore(package=0, die=0, max_khz=1_500_000))
    err = error(handler, m.SetUncore(package=0, die=0, min_khz=1_800_000))
    assert err.code == "invalid-argument"
    assert "min_khz 1800000 is greater than max_khz 1500000 (max_freq_khz now)" in err.message
    handler.dispatch(m.SetUncore(package=0, die=0, min_khz=1_200_000))
    err = error(handler, m.SetUncore(package=0, die=0, max_khz=1_000_000))
    assert "max_khz 1000000 is smaller than min_khz 1200000" in err.message

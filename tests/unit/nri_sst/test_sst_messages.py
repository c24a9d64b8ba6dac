"""The closed message set: round trips and rejections (size checked before decoding)."""

from __future__ import annotations

import msgspec
import pytest
from nri_sst import messages as m

REQUESTS: list[m.Request] = [
    m.Hello(protocol=1, capabilities=["x"], client="t"),
    m.Discover(),
    m.PrepareManagedMode(),
    m.ConfigureClos(clos=3, min_khz=800_000, max_khz=2_300_000, proportional_priority=2),
    m.EnableCP(),
    m.AssociateCpus(clos=0, cpus=[32, 160]),
    m.GetAssociation(cpus=[0, 1]),
    m.GetClosConfig(clos=1),
    m.TFStatus(),
    m.Teardown(),
    m.SetCstates(cpus=[1], disabled=["C6", "C6P"]),
    m.SetCpufreq(cpus=[1], min_khz=800_000, max_khz=None, governor="performance", epp=None),
    m.SetUncore(package=0, die=0, min_khz=800_000, max_khz=2_000_000),
    m.ReadFrequency(cpus=[0]),
    m.ReadFrequency(cpus=[0, 1], clos=True),
    m.ListInterrupts(),
    m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[4, 8], cpus=[0, 1])]),
    m.ReadResctrl(),
    m.SetResctrl(groups=[m.ResctrlGroup(name="gold", schemata={"L3": {0: 0xFF}})], force=True),
    m.Apply(
        items=[
            m.AssociateCpus(clos=0, cpus=[2, 3]),
            m.SetCpufreq(cpus=[2], max_khz=3_000_000),
            m.SetCstates(cpus=[2, 3], disabled=["C6"]),
            m.SetUncore(package=0, die=0, min_khz=800_000),
            m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[24], cpus=[2])]),
        ]
    ),
]

CLOS = m.ClosConfig(clos=0, min_khz=0, max_khz=25_500_000, proportional_priority=0)
REPLIES: list[m.Reply] = [
    m.HelloReply(protocol=1, backend="sim", sst_supported=True, capabilities=["sst-cp"]),
    m.DiscoverReply(
        supported=True,
        backend="sim",
        api_version=3,
        online_cpus=[0, 1],
        packages=[
            m.PackageInfo(
                package=0,
                cpus=[0, 1],
                punits=[
                    m.PunitInfo(
                        package=0,
                        punit=0,
                        cpus=[0, 1],
                        pp=m.PPInfo(True, 0, [0, 1], True, 1),
                        cp=m.CPInfo(True, False, "proportional"),
                        tf=m.TFInfo(True, False, [m.TFBucket(8, [4600])], [2300]),
                        bf=m.BFInfo(False, False),
                        base_mhz=2300,
                        max_hp_cpus=32,
                        guaranteed_hp_cpus=8,
                        clos=[CLOS],
                    )
                ],
            )
        ],
        cpufreq=m.CpufreqInfo(800_000, 2_300_000, 4_600_000, ["performance"], ["power"]),
        cstates=["POLL", "C1"],
        uncore=[m.UncoreDomain(0, 0, 800_000, 2_200_000)],
    ),
    m.PrepareManagedModeReply(punits=4),
    m.ConfigureClosReply(config=CLOS),
    m.EnableCPReply(punits=4),
    m.AssociateCpusReply(clos=0, cpus=[1]),
    m.GetAssociationReply(clos={1: 0, 129: 3}),
    m.GetClosConfigReply(config=CLOS),
    m.TFStatusReply(punits=[m.PunitTF(0, 0, True, True)]),
    m.TeardownReply(punits=4),
    m.SetCstatesReply(cpus=[1], disabled=["C6"]),
    m.SetCpufreqReply(cpus=[1]),
    m.SetUncoreReply(package=0, die=0),
    m.ReadFrequencyReply(tsc_mhz=2300, samples=[m.FrequencySample(0, 1, 2, 3)]),
    m.ReadFrequencyReply(
        tsc_mhz=2300,
        samples=[m.FrequencySample(0, 1, 2, 3)],
        backend="sim",
        punits=[m.PunitClos(package=0, punit=1, cp_enabled=True, clos=[CLOS])],
    ),
    m.ListInterruptsReply(
        interrupts=[m.Interrupt(4, "IR-IO-APIC 4-edge ttyS0", [0, 1], True)],
        default_affinity=[0, 1],
    ),
    m.SetIrqAffinityReply(affinities={4: [1]}),
    m.ReadResctrlReply(
        mounted=True,
        resources=[m.ResctrlResource(name="L3", cache_ids=[0], num_closids=16, cbm_mask=0xFF)],
        groups=[m.ResctrlGroup(name="", schemata={"L3": {0: 0xFF}})],
        managed=[],
    ),
    m.SetResctrlReply(groups=["gold"], removed=[]),
    m.ApplyReply(
        replies=[
            m.AssociateCpusReply(clos=0, cpus=[2, 3]),
            m.ErrorReply(code="hardware-error", message="EBUSY"),
        ]
    ),
    m.ErrorReply(code="invalid-argument", message="no"),
]


def test_closed_set_is_complete() -> None:
    assert {type(r) for r in REQUESTS} == set(m.REPLY_FOR)
    assert {type(r) for r in REPLIES} == set(m.REPLY_FOR.values()) | {m.ErrorReply}


@pytest.mark.parametrize("req", REQUESTS, ids=lambda r: type(r).__name__)
def test_request_round_trip(req: m.Request) -> None:
    assert m.decode_request(m.encode(req)) == req


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: type(r).__name__)
def test_reply_round_trip(reply: m.Reply) -> None:
    assert m.decode_reply(m.encode(reply)) == reply


def test_a_reply_is_not_a_request() -> None:
    with pytest.raises(m.HelperError) as exc:
        m.decode_request(m.encode(m.TeardownReply(punits=1)))
    assert exc.value.code == "unknown-message"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (msgspec.msgpack.encode({"type": "format-disk"}), "unknown-message"),
        (msgspec.msgpack.encode({"type": "discover", "extra": 1}), "malformed"),
        (msgspec.msgpack.encode({"type": "associate-cpus", "clos": "0", "cpus": []}), "malformed"),
        (msgspec.msgpack.encode({"type": "associate-cpus", "clos": 0}), "malformed"),
        (msgspec.msgpack.encode([1, 2, 3]), "malformed"),
        (msgspec.msgpack.encode({"clos": 1}), "malformed"),
        (b"\xc1", "malformed"),
        (b"", "malformed"),
    ],
)
def test_rejections_are_typed(data: bytes, code: str) -> None:
    with pytest.raises(m.HelperError) as exc:
        m.decode_request(data)
    assert exc.value.code == code
    assert isinstance(exc.value.reply(), m.ErrorReply)


def test_size_checked_before_decoding() -> None:
    # A valid request padded past the limit: rejected as too large, never decoded.
    big = m.encode(m.AssociateCpus(clos=0, cpus=list(range(30_000))))
    assert len(big) > m.MAX_MESSAGE_SIZE
    with pytest.raises(m.HelperError) as exc:
        m.decode_request(big)
    assert exc.value.code == "too-large"
    ok = m.encode(m.AssociateCpus(clos=0, cpus=list(range(8192))))
    assert len(ok) <= m.MAX_MESSAGE_SIZE
    assert isinstance(m.decode_request(ok), m.AssociateCpus)


def test_deep_nesting_is_malformed_not_internal() -> None:
    data = b"\x81\xa1x" * 20_000 + b"\xc0"  # {"x": {"x": ... }} 20000 deep
    assert len(data) <= m.MAX_MESSAGE_SIZE
    with pytest.raises(m.HelperError) as exc:
        m.decode_request(data)
    assert exc.value.code == "malformed"

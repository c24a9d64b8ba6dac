"""The request handler: the managed-mode sequence and fuzzing (never an exception)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend
from nri_sst.handler import MAX_PEERS, RequestHandler

from .conftest import SMALL_SIM
from .test_sst_messages import REQUESTS


@pytest.fixture(scope="module")
def handler(module_tmp: Path) -> RequestHandler:
    from nri_framework.simulate.sysfs import write_topology

    from .conftest import SMALL

    return fresh_handler(write_topology(module_tmp / "host", SMALL))


def fresh_handler(root: Path) -> RequestHandler:
    """A helper over ``root`` (the small machine) with the peer ``fuzz`` said Hello."""
    h = RequestHandler(SimBackend(SMALL_SIM), root)
    h.handle(m.encode(m.Hello(protocol=1)), b"fuzz")
    return h


def test_discover_xeon(xeon_root: Path) -> None:
    h = RequestHandler(SimBackend(), xeon_root)
    h.dispatch(m.Hello(protocol=1))
    d = h.discover()
    rows = [(pu.package, pu.punit, pu.cpus) for pkg in d.packages for pu in pkg.punits]

    def span(a: int, b: int) -> list[int]:
        return list(range(a, a + 32)) + list(range(b, b + 32))

    assert rows == [
        (0, 0, span(0, 128)),
        (0, 1, span(32, 160)),
        (1, 0, span(64, 192)),
        (1, 1, span(96, 224)),
    ]
    pu = d.packages[0].punits[0]
    assert (pu.max_hp_cpus, pu.guaranteed_hp_cpus, pu.base_mhz) == (32, 8, 2300)
    assert pu.tf.buckets[0] == m.TFBucket(hp_cores=8, max_mhz=[4600])
    assert not pu.bf.supported and pu.cp.supported
    assert d.cstates == ["POLL", "C1", "C1E", "C6", "C6P"]
    assert d.cpufreq is not None and d.cpufreq.max_khz == 4_600_000


def test_read_frequency_with_clos_bounds_in_the_same_reply(xeon_root: Path) -> None:
    h = RequestHandler(SimBackend(), xeon_root)
    h.dispatch(m.Hello(protocol=1))
    plain = h.dispatch(m.ReadFrequency(cpus=[0, 200]))
    assert isinstance(plain, m.ReadFrequencyReply) and plain.punits == []
    assert plain.backend == "sim" and [s.cpu for s in plain.samples] == [0, 200]
    h.dispatch(m.ConfigureClos(clos=3, min_khz=800_000, max_khz=2_300_000, proportional_priority=0))
    reply = h.dispatch(m.ReadFrequency(cpus=[0], clos=True))
    assert isinstance(reply, m.ReadFrequencyReply)
    assert [(pu.package, pu.punit) for pu in reply.punits] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for pu in reply.punits:
        assert [c.clos for c in pu.clos] == [0, 1, 2, 3]
        assert (pu.clos[3].min_khz, pu.clos[3].max_khz) == (800_000, 2_300_000)


def test_managed_sequence_and_teardown(small_root: Path) -> None:
    sim = SimBackend(SMALL_SIM)
    h = RequestHandler(sim, small_root)
    h.peers.add(b"")
    h.dispatch(m.PrepareManagedMode())
    assert h.managed
    h.dispatch(m.ConfigureClos(clos=0, min_khz=2_300_000, max_khz=4_600_000))
    r = h.dispatch(m.ConfigureClos(clos=3, min_khz=800_000, max_khz=2_300_000))
    assert r == m.ConfigureClosReply(config=m.ClosConfig(3, 800_000, 2_300_000, 0))
    h.dispatch(m.EnableCP())
    h.dispatch(m.AssociateCpus(clos=3, cpus=list(range(16))))
    h.dispatch(m.AssociateCpus(clos=0, cpus=[2, 10]))
    assert h.dispatch(m.GetAssociation(cpus=[2, 3, 10])) == m.GetAssociationReply(
        clos={2: 0, 3: 3, 10: 0}
    )
    assert sim.expected_mhz(2) == 4600 and sim.expected_mhz(3) == 2300
    tf = h.dispatch(m.TFStatus())
    assert isinstance(tf, m.TFStatusReply) and all(p.enabled for p in tf.punits)
    h.dispatch(m.Teardown())
    assert not h.managed
    for pu in sim.state["punits"].values():
        assert not pu["cp_enable"] and pu["feature_state"] == 0
        assert pu["assoc"][:2] == [0, 0]
    ops = [e["op"] for e in sim.state["log"] if e.get("pkg") == 0 and e.get("punit") == 0]
    tail = ops[-(4 + 1 + 1 + 1) :]
    assert tail == ["clos-param"] * 4 + ["clos-assoc", "feature", "cp"]


def test_association_is_per_core_and_reported_so(small_root: Path) -> None:
    """SST associates cores: asking for one thread moves its sibling too, and
    the reply names both (SMT sibling = cpu + 8 on the small machine)."""
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    h.peers.add(b"")
    h.dispatch(m.PrepareManagedMode())
    r = h.dispatch(m.AssociateCpus(clos=2, cpus=[3]))
    assert r == m.AssociateCpusReply(clos=2, cpus=[3, 11])
    assert h.dispatch(m.GetAssociation(cpus=[3, 11])) == m.GetAssociationReply(clos={3: 2, 11: 2})


def test_keep_programmed_leaves_managed_state_alone(small_root: Path) -> None:
    """A re-programming client (helper restarted, same plan) asks to keep the
    state: no CPReset when SST is already managed, a full prepare otherwise."""
    sim = SimBackend(SMALL_SIM)
    h = RequestHandler(sim, small_root)
    h.peers.add(b"")
    first = h.dispatch(m.PrepareManagedMode(keep_programmed=True))
    assert first == m.PrepareManagedModeReply(punits=4, reset=True)  # not managed yet
    h.dispatch(m.ConfigureClos(clos=1, min_khz=2_300_000, max_khz=4_600_000))
    h.dispatch(m.EnableCP())
    h.dispatch(m.AssociateCpus(clos=1, cpus=[2]))
    again = RequestHandler(sim, small_root)  # a restarted helper over the same hardware
    again.peers.add(b"")
    assert again.instance != h.instance
    kept = again.dispatch(m.PrepareManagedMode(keep_programmed=True))
    assert kept == m.PrepareManagedModeReply(punits=4, reset=False) and again.managed
    assert again.dispatch(m.GetAssociation(cpus=[2])) == m.GetAssociationReply(clos={2: 1})
    cfg = again.dispatch(m.GetClosConfig(clos=1))
    assert isinstance(cfg, m.GetClosConfigReply) and cfg.config.max_khz == 4_600_000
    reset = again.dispatch(m.PrepareManagedMode())
    assert reset == m.PrepareManagedModeReply(punits=4, reset=True)
    assert again.dispatch(m.GetAssociation(cpus=[2])) == m.GetAssociationReply(clos={2: 0})


def test_hello_reply_names_the_helper_instance(small_root: Path) -> None:
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    a = h.dispatch(m.Hello(protocol=1), b"a")
    b = h.dispatch(m.Hello(protocol=1), b"b")
    assert isinstance(a, m.HelloReply) and isinstance(b, m.HelloReply)
    assert a.instance == b.instance and len(a.instance) == 16


REFUSED = {
    # REQUESTS is written for the 256-CPU 6776P; the handler here runs the 16-CPU one
    m.AssociateCpus: m.ErrorReply(
        code="invalid-argument", message="cpus: CPUs 32,160 are not online (online: 0-15)"
    ),
}


def test_every_request_gets_its_typed_reply(small_root: Path) -> None:
    """REQUESTS in their order (prepare, program, associate, ..., teardown) on
    a fresh helper: each valid one gets exactly its reply type, the one
    invalid for this machine exactly its refusal."""
    h = fresh_handler(small_root)
    for req in [*REQUESTS, m.AssociateCpus(clos=0, cpus=[3, 11])]:
        reply = m.decode_reply(h.handle(m.encode(req), b"fuzz"))
        if isinstance(req, m.AssociateCpus) and req.cpus == [32, 160]:
            assert reply == REFUSED[m.AssociateCpus]
        else:
            assert type(reply) is m.REPLY_FOR[type(req)], (req, reply)
    assert reply == m.AssociateCpusReply(clos=0, cpus=[3, 11])


VALIDATION = {"invalid-argument", "not-supported", "protocol-mismatch"}
"""What a request that decodes may still be refused with: a field the machine
refuses, SST (or a knob) absent, a Hello of another protocol."""


def check_reply(data: bytes, reply: m.Reply) -> None:
    """``reply`` is the one ``data`` must get, told from the input: bytes that
    do not decode get exactly the decoder's refusal; a request that decodes
    gets its own reply type or a validation refusal, never anything else."""
    try:
        req = m.decode_request(data)
    except m.HelperError as exc:
        assert reply == exc.reply()
        return
    if isinstance(reply, m.ErrorReply):
        assert reply.code in VALIDATION, (req, reply)
    else:
        assert type(reply) is m.REPLY_FOR[type(req)], (req, reply)


def _mutate(data: bytes, flips: list[tuple[int, int]]) -> bytes:
    buf = bytearray(data)
    for pos, val in flips:
        if buf:
            buf[pos % len(buf)] = val
    return bytes(buf)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=256))
def test_fuzz_random_bytes(handler: RequestHandler, data: bytes) -> None:
    check_reply(data, m.decode_reply(handler.handle(data, b"fuzz")))


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(REQUESTS),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
)
def test_fuzz_mutated_requests(
    handler: RequestHandler, req: m.Request, flips: list[tuple[int, int]]
) -> None:
    data = _mutate(m.encode(req), flips)
    check_reply(data, m.decode_reply(handler.handle(data, b"fuzz")))


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.sampled_from(sorted(t.__struct_config__.tag for t in m.REPLY_FOR)),  # type: ignore[type-var]
    st.dictionaries(
        st.sampled_from(
            [
                "clos",
                "cpus",
                "min_khz",
                "max_khz",
                "disabled",
                "governor",
                "epp",
                "package",
                "die",
                "protocol",
                "proportional_priority",
                "x",
            ]
        ),
        _values | st.lists(st.integers(-5, 300), max_size=20),
        max_size=5,
    ),
)
def test_fuzz_structured_messages(
    handler: RequestHandler, tag: str, fields: dict[str, object]
) -> None:
    data = msgspec.msgpack.encode({"type": tag, **fields})
    check_reply(data, m.decode_reply(handler.handle(data, b"fuzz")))


def test_other_clients_never_end_an_active_session(small_root: Path) -> None:
    """1100 other peers say Hello (MAX_PEERS is 1024): the plugin, which keeps
    asking meanwhile, keeps its session; only the least recently active of
    the others lose theirs."""
    h = RequestHandler(SimBackend(SMALL_SIM), small_root)
    h.dispatch(m.Hello(protocol=1), b"plugin")
    for i in range(1100):
        h.dispatch(m.Hello(protocol=1), f"info-{i}".encode())
        if i % 500 == 0:
            h.dispatch(m.TFStatus(), b"plugin")
    assert len(h.peers) == MAX_PEERS
    assert isinstance(h.dispatch(m.TFStatus(), b"plugin"), m.TFStatusReply)
    assert b"info-1099" in h.peers and b"info-0" not in h.peers
    h.forget(b"plugin")  # its connection closed
    err = m.decode_reply(h.handle(m.encode(m.TFStatus()), b"plugin"))
    assert isinstance(err, m.ErrorReply) and err.code == "handshake-required"


def test_an_item_the_hardware_refuses_is_its_own_error_and_the_rest_is_written(
    small_root: Path,
) -> None:
    """An ``Apply`` validated whole: one write the kernel then refuses (a
    stand-in for the sim's ``/proc/irq``, ours: it refuses irq 8 as a kernel
    may with EIO) is that item's ErrorReply; the items after it are written."""
    from nri_sst.interrupts import IrqWriteError

    h = fresh_handler(small_root)
    real = h.interrupts.set_affinity

    def set_affinity(irq: int, cpus: list[int]) -> list[int]:
        if irq == 8:
            raise IrqWriteError("irq 8: Input/output error")
        return real(irq, cpus)

    h.interrupts.set_affinity = set_affinity  # type: ignore[method-assign]
    reply = m.decode_reply(
        h.handle(
            m.encode(
                m.Apply(
                    items=[
                        m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[8], cpus=[2])]),
                        m.AssociateCpus(clos=3, cpus=[2]),
                        m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[4], cpus=[2])]),
                    ]
                )
            ),
            b"fuzz",
        )
    )
    assert isinstance(reply, m.ApplyReply), reply
    refused, associated, written = reply.replies
    assert isinstance(refused, m.ErrorReply) and refused.code == "hardware-error"
    assert isinstance(associated, m.AssociateCpusReply) and 2 in associated.cpus
    assert written == m.SetIrqAffinityReply(affinities={4: [2]})
    got = h.dispatch(m.GetAssociation(cpus=[2]), b"fuzz")
    assert got == m.GetAssociationReply(clos={2: 3})


def test_an_apply_is_validated_whole_before_anything_is_written(small_root: Path) -> None:
    h = fresh_handler(small_root)
    before = h.dispatch(m.GetAssociation(cpus=[2]), b"fuzz")
    reply = m.decode_reply(
        h.handle(
            m.encode(
                m.Apply(
                    items=[
                        m.AssociateCpus(clos=3, cpus=[2]),
                        m.SetCstates(cpus=[2], disabled=["C6"]),
                        m.SetUncore(package=0, die=0, min_khz=10**9),
                    ]
                )
            ),
            b"fuzz",
        )
    )
    assert isinstance(reply, m.ErrorReply) and reply.code == "invalid-argument", reply
    assert reply.message.startswith("apply: item 2 (SetUncore): ")
    assert h.dispatch(m.GetAssociation(cpus=[2]), b"fuzz") == before
    states = list((small_root / "sys/devices/system/cpu/cpu2/cpuidle").glob("state*"))
    assert states and all((s / "disable").read_text().strip() == "0" for s in states)

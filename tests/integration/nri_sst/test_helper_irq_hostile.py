"""Hostile ``SetIrqAffinity`` requests against the real ``nri-sst-helper
serve`` process (sim backend: a server's ``/proc/irq``) over its real ipc
socket: wrong types, unknown fields, huge lists, IRQs that are negative,
absent or per-CPU, CPUs that are not online. Each gets its typed error,
nothing is written (read back with ``ListInterrupts``) and the helper keeps
answering."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from helper_process import Helper
from nri_sst import messages as m

TIMER, TTYS0, RTC0, NVME_Q1 = 0, 4, 8, 41  # the sim's server IRQs (timer, nvme0q1: per-CPU)
NOT_ONLINE = 9999


class Peer:
    """A raw DEALER that has said Hello: sends any bytes as a request."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self.zmq = zmq
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.n = 0
        assert isinstance(self.send(m.encode(m.Hello(protocol=1))), m.HelloReply)

    def send(self, payload: bytes) -> m.Reply:
        self.n += 1
        rid = b"%d" % self.n
        self.sock.send_multipart([b"", rid, payload])
        assert self.sock.poll(5000), "the helper did not answer"
        frames = self.sock.recv_multipart()
        assert frames[1] == rid
        return m.decode_reply(frames[2])

    def affinities(self) -> dict[int, list[int]]:
        reply = self.send(m.encode(m.ListInterrupts()))
        assert isinstance(reply, m.ListInterruptsReply)
        return {i.number: i.affinity for i in reply.interrupts}


@pytest.fixture
def peer(helper: Helper) -> Iterator[Peer]:
    p = Peer(helper.endpoint)
    yield p
    p.sock.close(0)


def raw(**fields: Any) -> bytes:
    return msgspec.msgpack.encode({"type": "set-irq-affinity", **fields})


def group(irqs: Any, cpus: Any, **extra: Any) -> dict[str, Any]:
    return {"irqs": irqs, "cpus": cpus, **extra}


CASES: dict[str, tuple[bytes, m.ErrorCode, str]] = {
    "groups not a list": (raw(groups="all"), "malformed", "Expected `array`"),
    "no groups": (raw(), "malformed", "missing required field `groups`"),
    "irq as text": (raw(groups=[group(["4"], [2])]), "malformed", "Expected `int`"),
    "irq as bool": (raw(groups=[group([True], [2])]), "malformed", "Expected `int`"),
    "irq as float": (raw(groups=[group([4.0], [2])]), "malformed", "Expected `int`"),
    "cpus as a mask": (raw(groups=[group([4], "0x3")]), "malformed", "Expected `array`"),
    "unknown group field": (
        raw(groups=[group([4], [2], mask="ff")]),
        "malformed",
        "unknown field `mask`",
    ),
    "unknown field": (raw(groups=[], path="/proc/irq/4"), "malformed", "unknown field `path`"),
    "too many irqs": (
        raw(groups=[group(list(range(m.MAX_IRQ_BATCH + 1)), [2])]),
        "invalid-argument",
        "exceed the limit of 1024",
    ),
    "a group per irq": (
        raw(groups=[group([i], [2]) for i in range(m.MAX_IRQ_BATCH + 1)]),
        "invalid-argument",
        "exceed the limit of 1024",
    ),
    "huge cpu list": (
        raw(groups=[group([TTYS0], [-1] * 30_000)]),
        "invalid-argument",
        "cpus: CPUs [-1] are not online",
    ),
    "huge list of distinct cpus": (
        raw(groups=[group([TTYS0], list(range(-1, -10_000, -1)))]),
        "invalid-argument",
        "cpus: CPUs [-9999, -9998, ",
    ),
    "over the size limit": (
        raw(groups=[group([TTYS0], [2] * (m.MAX_MESSAGE_SIZE + 1))]),
        "too-large",
        "exceeds the limit",
    ),
    "negative irq": (raw(groups=[group([-1], [2])]), "invalid-argument", "no irq -1"),
    "irq beyond int64": (
        raw(groups=[group([2**64 - 1], [2])]),
        "invalid-argument",
        f"no irq {2**64 - 1}",
    ),
    "absent irq": (raw(groups=[group([5], [2])]), "invalid-argument", "no irq 5"),
    "per-CPU timer": (raw(groups=[group([TIMER], [2])]), "invalid-argument", "not controllable"),
    "per-CPU queue": (
        raw(groups=[group([NVME_Q1], [2])]),
        "invalid-argument",
        "not controllable",
    ),
    "offline cpu": (
        raw(groups=[group([TTYS0], [2, NOT_ONLINE])]),
        "invalid-argument",
        f"CPUs {NOT_ONLINE} are not online",
    ),
    "negative cpu": (raw(groups=[group([TTYS0], [-3])]), "invalid-argument", "not online"),
    "empty cpus": (raw(groups=[group([TTYS0], [])]), "invalid-argument", "empty CPU list"),
    "irq twice": (
        raw(groups=[group([TTYS0], [2]), group([TTYS0], [3])]),
        "invalid-argument",
        "named more than once",
    ),
    "valid group, then a bad one": (
        raw(groups=[group([RTC0], [2, 3]), group([TIMER], [2])]),
        "invalid-argument",
        "not controllable",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_irq_affinity_gets_a_typed_error_and_writes_nothing(
    helper: Helper, peer: Peer, name: str
) -> None:
    payload, code, text = CASES[name]
    before = peer.affinities()
    reply = peer.send(payload)
    assert isinstance(reply, m.ErrorReply), reply
    assert reply.code == code and text in reply.message, reply
    assert len(reply.message) <= m.MAX_ERROR_MESSAGE  # a huge request, a bounded answer
    assert peer.affinities() == before  # nothing written
    ok = peer.send(m.encode(m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[TTYS0], cpus=[2, 3])])))
    assert isinstance(ok, m.SetIrqAffinityReply) and ok.affinities == {TTYS0: [2, 3]}
    assert helper.proc.poll() is None

"""Hostile ``Apply`` requests (a decision's writes in one request) against the
real ``nri-sst-helper serve`` process (sim backend) over its real ipc socket:
wrong types, unknown or nested messages, too many items, too many IRQs, a
huge payload, and valid items beside an invalid one. Each gets its typed
error naming the item, nothing is written (the associations and IRQ
affinities read back), and the helper keeps answering; a valid ``Apply``
then gets a reply per item."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from helper_process import Helper
from nri_sst import messages as m
from test_helper_irq_hostile import NOT_ONLINE, RTC0, TIMER, TTYS0, Peer

WATCHED = [2, 3, 130, 131]
"""The CPUs whose CLOS the cases would change."""


@pytest.fixture
def peer(helper: Helper) -> Iterator[Peer]:
    p = Peer(helper.endpoint)
    assert isinstance(p.send(m.encode(m.PrepareManagedMode())), m.PrepareManagedModeReply)
    yield p
    p.sock.close(0)


def raw(items: Any, **fields: Any) -> bytes:
    return msgspec.msgpack.encode({"type": "apply", "items": items, **fields})


def assoc(clos: Any = 3, cpus: Any = (2, 3), **extra: Any) -> dict[str, Any]:
    return {
        "type": "associate-cpus",
        "clos": clos,
        "cpus": cpus if isinstance(cpus, str) else list(cpus),
        **extra,
    }


def irq(irqs: Any, cpus: Any) -> dict[str, Any]:
    return {"type": "set-irq-affinity", "groups": [{"irqs": irqs, "cpus": cpus}]}


CASES: dict[str, tuple[bytes, m.ErrorCode, str]] = {
    "items not a list": (raw("all"), "malformed", "Expected `array`"),
    "no items": (msgspec.msgpack.encode({"type": "apply"}), "malformed", "missing required"),
    "unknown field": (raw([assoc()], atomic=True), "malformed", "unknown field `atomic`"),
    "unknown item field": (raw([assoc(path="/dev/cpu")]), "malformed", "unknown field `path`"),
    "a read as an item": (raw([{"type": "discover"}]), "malformed", "Invalid value 'discover'"),
    "a teardown as an item": (raw([assoc(), {"type": "teardown"}]), "malformed", "'teardown'"),
    "a hello as an item": (raw([{"type": "hello", "protocol": 1}]), "malformed", "'hello'"),
    "an apply in an apply": (raw([{"type": "apply", "items": []}]), "malformed", "'apply'"),
    "an item without a type": (raw([{"clos": 3, "cpus": [2]}]), "malformed", "missing"),
    "too many items": (
        raw([assoc()] * (m.MAX_APPLY_ITEMS + 1)),
        "invalid-argument",
        f"{m.MAX_APPLY_ITEMS + 1} items exceed the limit of {m.MAX_APPLY_ITEMS}",
    ),
    "too many irqs in all": (
        raw([irq(list(range(600)), [2]), irq(list(range(600, 1200)), [3])]),
        "invalid-argument",
        f"1200 IRQs exceed the limit of {m.MAX_IRQ_BATCH}",
    ),
    "over the size limit": (
        raw([assoc(cpus=[2] * (m.MAX_MESSAGE_SIZE + 1))]),
        "too-large",
        "exceeds the limit",
    ),
    "a valid association, then a bad irq": (
        raw([assoc(), irq([TIMER], [2])]),
        "invalid-argument",
        "apply: item 1 (SetIrqAffinity): irqs: irq 0",
    ),
    "a valid irq, then a bad clos": (
        raw([irq([TTYS0], [2, 3]), assoc(clos=7)]),
        "invalid-argument",
        "apply: item 1 (AssociateCpus)",
    ),
    "valid items, then an offline cpu": (
        raw([assoc(), irq([RTC0], [2]), assoc(clos=0, cpus=[130, NOT_ONLINE])]),
        "invalid-argument",
        f"apply: item 2 (AssociateCpus): cpus: CPUs {NOT_ONLINE} are not online",
    ),
    "a huge cpu list in an item": (
        raw([assoc(), assoc(cpus=list(range(-1, -8000, -1)))]),
        "invalid-argument",
        "apply: item 1 (AssociateCpus): cpus: CPUs [-7999",
    ),
    "cpus as text": (raw([assoc(cpus="2-3")]), "malformed", "Expected `array`"),
}


def clos_of(peer: Peer) -> dict[int, int]:
    reply = peer.send(m.encode(m.GetAssociation(cpus=WATCHED)))
    assert isinstance(reply, m.GetAssociationReply), reply
    return reply.clos


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_apply_gets_a_typed_error_and_writes_nothing(
    helper: Helper, peer: Peer, name: str
) -> None:
    payload, code, text = CASES[name]
    before = clos_of(peer), peer.affinities()
    reply = peer.send(payload)
    assert isinstance(reply, m.ErrorReply), reply
    assert reply.code == code and text in reply.message, reply
    assert len(reply.message) <= m.MAX_ERROR_MESSAGE  # a huge request, a bounded answer
    assert (clos_of(peer), peer.affinities()) == before  # nothing written
    ok = peer.send(
        m.encode(
            m.Apply(
                items=[
                    m.AssociateCpus(clos=3, cpus=[2]),
                    m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[TTYS0], cpus=[2, 3])]),
                ]
            )
        )
    )
    assert isinstance(ok, m.ApplyReply), ok
    first, second = ok.replies
    assert isinstance(first, m.AssociateCpusReply) and first.clos == 3 and 2 in first.cpus
    assert isinstance(second, m.SetIrqAffinityReply) and second.affinities == {TTYS0: [2, 3]}
    assert clos_of(peer)[2] == 3
    assert helper.proc.poll() is None


def test_every_item_gets_its_own_reply_in_order(helper: Helper) -> None:
    """Every item of a valid ``Apply`` is written and answered, in order (an
    item the hardware refuses when written is its own ErrorReply and the
    next ones are written all the same: the sim refuses nothing it
    validated, so tests/unit/nri_sst/test_sst_handler.py checks that)."""
    p = Peer(helper.endpoint)
    try:
        reply = p.send(
            m.encode(
                m.Apply(
                    items=[
                        m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[RTC0], cpus=[4])]),
                        m.AssociateCpus(clos=0, cpus=[4]),
                        m.SetIrqAffinity(groups=[m.IrqGroup(irqs=[TTYS0], cpus=[5])]),
                    ]
                )
            )
        )
        assert isinstance(reply, m.ApplyReply), reply
        kinds = [type(r) for r in reply.replies]
        assert kinds == [m.SetIrqAffinityReply, m.AssociateCpusReply, m.SetIrqAffinityReply]
        assert p.affinities()[RTC0] == [4] and p.affinities()[TTYS0] == [5]
    finally:
        p.sock.close(0)

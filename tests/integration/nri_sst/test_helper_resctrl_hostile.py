"""Hostile ``SetResctrl`` requests against the real ``nri-sst-helper serve``
process (sim backend: a resctrl tree) over its real ipc socket: wrong types,
unknown fields, path-like names, bitmasks the kernel refuses. Each gets its
typed error, nothing is written (read back with ``ReadResctrl``) and the
helper keeps answering; a valid configuration is then applied."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from helper_process import Helper
from nri_sst import messages as m
from test_helper_irq_hostile import Peer


@pytest.fixture
def peer(helper: Helper) -> Iterator[Peer]:
    p = Peer(helper.endpoint)
    yield p
    p.sock.close(0)


def groups(peer: Peer) -> dict[str, dict[str, dict[int, int]]]:
    reply = peer.send(m.encode(m.ReadResctrl()))
    assert isinstance(reply, m.ReadResctrlReply) and reply.mounted
    return {g.name: g.schemata for g in reply.groups}


def raw(**fields: Any) -> bytes:
    return msgspec.msgpack.encode({"type": "set-resctrl", **fields})


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (raw(groups="gold"), "malformed"),
        (raw(groups=[{"name": "gold", "schemata": {}, "path": "/etc"}]), "malformed"),
        (raw(groups=[{"name": 7, "schemata": {}}]), "malformed"),
        (raw(groups=[{"name": "../../etc", "schemata": {}}]), "invalid-argument"),
        (raw(groups=[{"name": "gold", "schemata": {"L3": {"0": 255}}}]), "malformed"),
        (raw(groups=[{"name": "gold", "schemata": {"L3": {0: 0x505}}}]), "invalid-argument"),
        (raw(groups=[{"name": "gold", "schemata": {"L3": {0: 2**64 - 1}}}]), "invalid-argument"),
        (raw(groups=[{"name": f"g{i}", "schemata": {}} for i in range(300)]), "invalid-argument"),
    ],
)
def test_hostile_set_resctrl_is_refused_and_the_helper_lives(
    peer: Peer, payload: bytes, code: str
) -> None:
    before = groups(peer)
    reply = peer.send(payload)
    assert isinstance(reply, m.ErrorReply) and reply.code == code, reply
    assert groups(peer) == before
    ok = m.SetResctrl(groups=[m.ResctrlGroup(name="gold", schemata={"L3": {0: 0xFF}})])
    assert isinstance(peer.send(m.encode(ok)), m.SetResctrlReply)
    assert groups(peer)["gold"]["L3"][0] == 0xFF

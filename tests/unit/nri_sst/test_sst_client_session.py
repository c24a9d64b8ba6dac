"""The client's sans-IO core (:class:`nri_sst.client.Session`) without sockets:
frames in, decisions out, deadlines from an injected clock. The helper side
is the real request handler (:class:`nri_sst.handler.RequestHandler` on the
sim backend) fed the bytes the core produced; the shells are tested against
the helper process in tests/integration/nri_sst/test_sst_client.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from nri_sst import PROTOCOL_VERSION
from nri_sst import messages as m
from nri_sst.backends.sim import SimBackend, SimConfig
from nri_sst.client import (
    CONNECT_GRACE,
    MAX_REPLY_SIZE,
    Call,
    HelperRequestError,
    HelperUnavailable,
    Send,
    Session,
)
from nri_sst.handler import RequestHandler

from .conftest import SMALL_SIM


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def session(clock: Clock) -> Session:
    s = Session("ipc:///run/test.sock", "test", timeout=0.1, clock=clock)
    s.connecting()
    return s


def helper(root: Path, config: SimConfig = SMALL_SIM) -> RequestHandler:
    return RequestHandler(SimBackend(config), root)


def answer(h: RequestHandler, call: Call, peer: bytes = b"p1") -> m.Reply | Send | None:
    """The handler's answer to what the call sends now, back into the call."""
    _, rid, payload = call.frames
    return call.receive([b"", rid, h.handle(payload, peer)])


def run(h: RequestHandler, call: Call, peer: bytes = b"p1") -> m.Reply:
    out = answer(h, call, peer)
    while isinstance(out, Send):
        out = answer(h, call, peer)
    assert out is not None
    return out


def sent(call: Call) -> m.Request:
    return m.decode_request(call.frames[2])


def test_hello_first_then_the_request_with_fresh_ids(session: Session, small_root: Path) -> None:
    h = helper(small_root)
    call = session.begin(m.TFStatus())
    assert call.frames[0] == b"" and len(call.frames[1]) == 8
    assert sent(call) == m.Hello(protocol=PROTOCOL_VERSION, capabilities=[], client="test")
    hello_rid = call.frames[1]
    out = answer(h, call)
    assert isinstance(out, Send) and out.frames is call.frames
    assert sent(call) == m.TFStatus() and call.frames[1] != hello_rid
    assert isinstance(answer(h, call), m.TFStatusReply)
    assert session.hello is not None and session.instance == h.instance
    # the next call on this connection sends no Hello
    again = session.begin(m.TFStatus())
    assert sent(again) == m.TFStatus()
    assert again.frames[1] not in (hello_rid, call.frames[1])


def test_late_reply_is_not_this_calls(session: Session, small_root: Path) -> None:
    h = helper(small_root)
    run(h, session.begin(m.TFStatus()))
    first = session.begin(m.TFStatus())
    late = [b"", first.frames[1], h.handle(first.frames[2], b"p1")]
    second = session.begin(m.GetClosConfig(clos=1))
    assert second.receive(late) is None  # dropped: another request's answer
    assert second.receive([b"", second.frames[1]]) is None  # not the frame shape
    reply = answer(h, second)
    assert isinstance(reply, m.GetClosConfigReply) and reply.config.clos == 1


def test_handshake_required_redone_once(session: Session, small_root: Path) -> None:
    h = helper(small_root)
    run(h, session.begin(m.TFStatus()))
    h.forget(b"p1")  # our session ended on the helper (connection dropped, evicted)
    call = session.begin(m.TFStatus())
    assert sent(call) == m.TFStatus()
    out = answer(h, call)
    assert isinstance(out, Send) and isinstance(sent(call), m.Hello)
    assert isinstance(answer(h, call), Send) and sent(call) == m.TFStatus()
    h.forget(b"p1")  # asked twice within one call: a refusal, not a loop
    with pytest.raises(HelperRequestError, match="handshake-required"):
        answer(h, call)


def test_generation_changes_with_the_helper_instance_only(
    session: Session, small_root: Path
) -> None:
    """Defect 4 of issue #10: a re-handshake with the same helper process
    (our peer evicted, our socket recreated after a timeout) is not a new
    helper; only a new ``instance`` (a restarted helper) is."""
    h = helper(small_root)
    run(h, session.begin(m.TFStatus()))
    assert session.generation == 1
    first = session.instance
    h.forget(b"p1")
    run(h, session.begin(m.TFStatus()))
    session.begin(m.TFStatus()).timed_out()  # the shell makes a new socket
    session.connecting()
    run(h, session.begin(m.TFStatus()), peer=b"p2")
    assert session.handshakes == 3
    assert (session.generation, session.instance) == (1, first)
    restarted = helper(small_root)
    run(restarted, session.begin(m.TFStatus()))  # handshake-required, then Hello
    assert session.generation == 2 and session.instance == restarted.instance != first


def test_helper_without_instance_counts_every_handshake(session: Session) -> None:
    for n in (1, 2):
        call = session.begin(m.Hello(protocol=PROTOCOL_VERSION))
        reply = m.HelloReply(protocol=1, backend="old", sst_supported=True, capabilities=[])
        assert call.receive([b"", call.frames[1], m.encode(reply)]) == reply
        assert session.generation == n


def test_one_deadline_for_the_whole_call(session: Session, clock: Clock, small_root: Path) -> None:
    h = helper(small_root)
    call = session.begin(m.TFStatus(), timeout=0.5)
    assert call.remaining() == pytest.approx(0.5)
    clock.now += 0.3
    assert isinstance(answer(h, call), Send)  # the Hello answered after 300 ms
    assert call.remaining() == pytest.approx(0.2)  # the request gets what is left
    clock.now += 0.2
    assert call.remaining() <= 0
    exc = call.timed_out()
    assert "did not answer TFStatus within 500 ms" in str(exc)
    # the outcome is unknown: a new socket and handshake, the helper still known
    assert session.needs_socket and session.hello is None
    assert session.instance == h.instance


def test_connect_grace_only_for_a_new_socket(session: Session, clock: Clock) -> None:
    """A send may wait for a new socket to connect, briefly and within the
    deadline; on an established socket a helper that is not connected fails
    the send at once (defect 8: it no longer spins until the deadline)."""
    call = session.begin(m.Discover(), timeout=2.0)
    assert call.send_wait() == pytest.approx(CONNECT_GRACE)
    short = session.begin(m.Discover(), timeout=0.005)
    assert short.send_wait() == pytest.approx(0.005)
    clock.now += CONNECT_GRACE
    assert call.send_wait() == 0
    exc = call.not_connected()
    assert "not connected (Discover)" in str(exc)
    assert not session.needs_socket  # nothing was queued: the socket stays


def test_garbage_wrong_type_and_oversized_replies(session: Session, small_root: Path) -> None:
    h = helper(small_root)
    run(h, session.begin(m.TFStatus()))
    for payload, text in [
        (b"\xc1garbage", "undecodable reply"),
        (m.encode(m.TeardownReply(punits=1)), "helper answered TeardownReply to TFStatus"),
        (b"\x00" * (MAX_REPLY_SIZE + 1), "exceeds the limit"),
    ]:
        call = session.begin(m.TFStatus())
        with pytest.raises(HelperUnavailable, match=text):
            call.receive([b"", call.frames[1], payload])
        assert session.needs_socket and session.hello is None
        session.connecting()
        run(h, session.begin(m.TFStatus()), peer=b"p%d" % len(text))


def test_typed_refusal(session: Session, small_root: Path) -> None:
    h = helper(small_root)
    with pytest.raises(HelperRequestError) as err:
        run(h, session.begin(m.AssociateCpus(clos=9, cpus=[0])))
    assert err.value.code == "invalid-argument"
    assert not session.needs_socket  # the connection is fine

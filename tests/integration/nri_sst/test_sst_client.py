"""The client's two shells (blocking and asyncio) over real sockets: against
the helper process (``nri-sst-helper serve --backend sim``, started, SIGSTOPped,
killed and restarted for real), and against scripted ROUTER peers where the
helper cannot misbehave on purpose (late replies, a forgotten handshake, a
huge reply): those peers are ours, small, and stand in for a hostile helper."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import zmq
from nri_framework.simulate.sysfs import write_topology
from nri_sst import messages as m
from nri_sst.client import MAX_REPLY_SIZE, HelperClient, HelperUnavailable, SyncHelperClient

sys.path.insert(0, str(Path(__file__).parents[1] / "nri_balloons"))
from sst_node import Helper  # the helper process of the balloons tests

R = TypeVar("R")
Client = SyncHelperClient | HelperClient


class SlowFirstPeer(threading.Thread):
    """Answers Hello at once, the first TFStatus after 300 ms, later ones at once;
    forgets the handshake once (asks for it again)."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.stop = False
        self.hellos = 0
        self.late_sent = threading.Event()
        """set once the late reply to the first TFStatus is sent"""

    def run(self) -> None:
        tf = 0
        forgot = False
        while not self.stop:
            if not self.sock.poll(20):
                continue
            peer, empty, rid, payload = self.sock.recv_multipart()
            req = m.decode_request(payload)
            reply: m.Reply
            if isinstance(req, m.Hello):
                self.hellos += 1
                reply = m.HelloReply(
                    protocol=1, backend="fake", sst_supported=True, capabilities=[]
                )
            elif isinstance(req, m.GetClosConfig) and not forgot:
                forgot = True
                reply = m.ErrorReply(code="handshake-required", message="send Hello first")
            elif isinstance(req, m.GetClosConfig):
                reply = m.GetClosConfigReply(config=m.ClosConfig(req.clos, 0, 25_500_000, 0))
            else:
                tf += 1
                if tf == 1:
                    time.sleep(0.3)  # the stimulus: a reply later than the client waits
                reply = m.TFStatusReply(punits=[m.PunitTF(0, tf, True, True)])
            self.sock.send_multipart([peer, empty, rid, m.encode(reply)])
            if tf == 1:
                self.late_sent.set()
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[SlowFirstPeer]:
    p = SlowFirstPeer(f"ipc://{tmp_path}/fake.sock")
    p.start()
    yield p
    p.stop = True
    p.join(5)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_late_reply_dropped_and_handshake_redone(
    kind: str, peer: SlowFirstPeer, tmp_path: Path
) -> None:
    """Against libzmq's ROUTER (the blocking shell's own ZMTP end meets it too)."""
    c = client(kind, f"ipc://{tmp_path}/fake.sock", timeout=0.1)
    try:
        with pytest.raises(HelperUnavailable):
            await call(c, m.TFStatus(), m.TFStatusReply)
        # the late reply to the first TFStatus arrives meanwhile
        assert await asyncio.to_thread(peer.late_sent.wait, 5)
        got = await call(c, m.TFStatus(), m.TFStatusReply, timeout=1.0)
        assert got.punits[0].punit == 2  # its own reply, not the late one
        cfg = await call(c, m.GetClosConfig(clos=2), m.GetClosConfigReply, timeout=1.0)
        assert cfg.config.clos == 2
    finally:
        c.close()
    assert peer.hellos == 3  # first connect, after the reset, after handshake-required


def test_sync_client_no_helper_raises_within_timeout(tmp_path: Path) -> None:
    """No helper listening: the send fails (the fail-fast branch, bounded by the
    connect grace: see test_sst_client_session), it never waits for a reply."""
    endpoint = f"ipc://{tmp_path}/nobody.sock"
    with SyncHelperClient(endpoint, timeout=0.1) as c, pytest.raises(HelperUnavailable) as exc:
        c.request(m.Discover())
    assert str(exc.value) == f"helper at {endpoint} not connected (Discover)"


# --------------------------------------------------------------------------- the helper process


@pytest.fixture(scope="module")
def host_root(module_tmp: Path) -> Path:
    return write_topology(module_tmp / "host", "xeon-6776p")


@pytest.fixture
def helper(host_root: Path, tmp_path: Path) -> Iterator[Helper]:
    h = Helper(tmp_path, host_root)
    h.start()
    yield h
    if h.proc is not None and h.proc.poll() is None:
        h.proc.send_signal(signal.SIGCONT)
    h.stop()


def client(kind: str, endpoint: str, timeout: float = 0.1) -> Client:
    if kind == "sync":
        return SyncHelperClient(endpoint, timeout=timeout, client="test")
    return HelperClient(endpoint, timeout=timeout, client="test")


async def call(c: Client, req: m.Request, want: type[R], timeout: float | None = None) -> R:
    if isinstance(c, HelperClient):
        return await c.call(req, want, timeout)
    return c.call(req, want, timeout)


async def call_until(c: Client, req: m.Request, want: type[R], within: float = 10.0) -> R:
    """``req`` until the helper answers (ZeroMQ reconnects on its own)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call(c, req, want, timeout=1.0)
        except HelperUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_rehandshake_is_the_same_helper_restart_is_not(kind: str, helper: Helper) -> None:
    """Defect 4 of issue #10: a timeout makes a new socket and a new
    handshake, with the same helper process: the generation stays; a
    restarted helper (kill -9, started again) is a new generation."""
    assert helper.proc is not None
    c = client(kind, helper.endpoint)
    try:
        await call(c, m.TFStatus(), m.TFStatusReply, timeout=2.0)
        first = (c.generation, c.instance)
        assert first[0] == 1 and first[1]
        helper.proc.send_signal(signal.SIGSTOP)
        with pytest.raises(HelperUnavailable, match="did not answer TFStatus within 100 ms"):
            await call(c, m.TFStatus(), m.TFStatusReply)
        helper.proc.send_signal(signal.SIGCONT)
        await call(c, m.TFStatus(), m.TFStatusReply, timeout=2.0)
        assert c.session.handshakes == 2  # a new socket said hello again
        assert (c.generation, c.instance) == first
        helper.kill()
        helper.start()
        await call_until(c, m.TFStatus(), m.TFStatusReply)
        assert c.generation == 2 and c.instance != first[1]
    finally:
        c.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.parametrize("state", ["absent", "stopped"])
async def test_no_connected_helper_fails_fast(
    kind: str, state: str, helper: Helper, tmp_path: Path
) -> None:
    """Defect 8 of issue #10: a send to a helper that is not connected (none
    listening, or a SIGSTOPped one a new socket cannot finish connecting to)
    fails after the short connect grace, not at the end of a 2 s timeout."""
    assert helper.proc is not None
    endpoint = helper.endpoint
    if state == "absent":
        endpoint = f"ipc://{tmp_path}/nobody.sock"
    else:
        helper.proc.send_signal(signal.SIGSTOP)
    c = client(kind, endpoint)
    try:
        for _ in range(3):
            # the send's branch (bounded by the connect grace, see
            # test_sst_client_session), not the 2 s reply timeout's
            with pytest.raises(HelperUnavailable) as exc:
                await call(c, m.Discover(), m.DiscoverReply, timeout=2.0)
            assert str(exc.value) == f"helper at {endpoint} not connected (Discover)"
    finally:
        c.close()


class HugeReplyPeer(threading.Thread):
    """Answers Hello with a reply larger than the client takes."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.stop = False

    def run(self) -> None:
        caps = ["x" * 1024] * (MAX_REPLY_SIZE // 1024 + 16)
        reply = m.encode(
            m.HelloReply(protocol=1, backend="huge", sst_supported=True, capabilities=caps)
        )
        while not self.stop:
            if self.sock.poll(20):
                peer, empty, rid, _ = self.sock.recv_multipart()
                self.sock.send_multipart([peer, empty, rid, reply])
        self.sock.close(0)
        self.ctx.term()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_huge_reply_is_dropped_by_the_socket(kind: str, tmp_path: Path) -> None:
    """The reply size is bounded where the bytes arrive, not only after a
    whole oversized message was received: the asyncio shell's ZeroMQ drops
    the connection (the call times out), the blocking shell's ZMTP end
    closes it at the frame header past the bound (the call fails at once;
    tests/integration/nri_sst/test_sst_client_wire.py has the byte-exact bound)."""
    endpoint = f"ipc://{tmp_path}/huge.sock"
    peer = HugeReplyPeer(endpoint)
    peer.start()
    c = client(kind, endpoint)
    why = "did not answer Hello" if kind == "async" else "broke the protocol: message over"
    try:
        with pytest.raises(HelperUnavailable, match=why):
            await call(c, m.Hello(protocol=1), m.HelloReply, timeout=0.5)
    finally:
        c.close()
        peer.stop = True
        peer.join(5)


class StepClock:
    """The monotonic clock, which the test moves ahead by ``skip`` (the
    client's deadlines read it)."""

    def __init__(self) -> None:
        self.skip = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skip


def test_started_call_ends_at_its_deadline_from_the_start(helper: Helper) -> None:
    """SyncHelperClient.start sends and returns; finish waits for the reply
    until the deadline counted from start, not from finish: the caller's
    work in between is spent of the call's timeout (the reply path's budget
    holds whatever the hook does between the two). A SIGSTOPped helper: the
    request was sent, finish ends at once once the clock is past the
    deadline, and the helper answers the next call after SIGCONT."""
    assert helper.proc is not None
    clock = StepClock()
    c = SyncHelperClient(helper.endpoint, timeout=0.1, client="test", clock=clock)
    try:
        assert isinstance(c.finish(c.start(m.TFStatus(), timeout=2.0)), m.TFStatusReply)
        helper.proc.send_signal(signal.SIGSTOP)
        call = c.start(m.TFStatus(), timeout=12.0)  # sent: the connection is up
        clock.skip += 12.0  # the caller's work took the whole timeout
        t0 = time.monotonic()
        with pytest.raises(HelperUnavailable, match="did not answer TFStatus within 12000 ms"):
            c.finish(call)
        assert time.monotonic() - t0 < 10.0  # liveness: it did not wait the timeout again
        helper.proc.send_signal(signal.SIGCONT)
        reply = c.finish(c.start(m.TFStatus(), timeout=5.0))
        assert isinstance(reply, m.TFStatusReply)  # the late reply was not taken for it
    finally:
        c.close()

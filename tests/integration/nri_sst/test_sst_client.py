"""The client against a scripted ROUTER peer: late replies are dropped, handshake redone."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from nri_sst import messages as m
from nri_sst.client import HelperClient, HelperUnavailable, SyncHelperClient


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
                    time.sleep(0.3)
                reply = m.TFStatusReply(punits=[m.PunitTF(0, tf, True, True)])
            self.sock.send_multipart([peer, empty, rid, m.encode(reply)])
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[SlowFirstPeer]:
    p = SlowFirstPeer(f"ipc://{tmp_path}/fake.sock")
    p.start()
    yield p
    p.stop = True
    p.join(5)


async def test_late_reply_dropped_and_handshake_redone(peer: SlowFirstPeer, tmp_path: Path) -> None:
    async with HelperClient(f"ipc://{tmp_path}/fake.sock", timeout=0.1) as c:
        with pytest.raises(HelperUnavailable):
            await c.request(m.TFStatus())
        time.sleep(0.35)  # the late reply to the first TFStatus arrives meanwhile
        got = await c.call(m.TFStatus(), m.TFStatusReply, timeout=1.0)
        assert got.punits[0].punit == 2  # its own reply, not the late one
        cfg = await c.call(m.GetClosConfig(clos=2), m.GetClosConfigReply, timeout=1.0)
        assert cfg.config.clos == 2
    assert peer.hellos == 3  # first connect, after the reset, after handshake-required


def test_sync_client_no_helper_raises_within_timeout(tmp_path: Path) -> None:
    with SyncHelperClient(f"ipc://{tmp_path}/nobody.sock", timeout=0.1) as c:
        t0 = time.monotonic()
        with pytest.raises(HelperUnavailable):
            c.request(m.Discover())
        assert time.monotonic() - t0 < 0.15

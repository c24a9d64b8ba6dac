"""The server loop in this process, turn by turn (:meth:`Server.run_once`), over
its real socket: the order it serves peers in, counted in turns, not time."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from nri_sst import messages as m
from nri_sst import zmtp
from nri_sst.backends.sim import SimBackend
from nri_sst.handler import RequestHandler
from nri_sst.server import Server

from .conftest import SMALL_SIM
from .test_zmtp import CLIENT_GREETING, CLIENT_READY


def request(req: m.Request) -> bytes:
    return zmtp.encode_frames([b"", b"rid-0001", m.encode(req)])


class Client:
    """A DEALER on a plain socket that sends everything at once and counts replies."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.sock.sendall(CLIENT_GREETING + CLIENT_READY + data)
        self.sock.setblocking(False)
        self.data = b""

    def replies(self) -> int:
        try:
            while chunk := self.sock.recv(65536):
                self.data += chunk
        except BlockingIOError:
            pass
        buf, n = self.data[64:], 0  # after the greeting
        while len(buf) >= 2:
            flags = buf[0]
            head, size = (9, int.from_bytes(buf[1:9], "big")) if flags & 2 else (2, buf[1])
            if len(buf) < head + size:
                break
            n += not flags & (zmtp.MORE | zmtp.COMMAND)
            buf = buf[head + size :]
        return n


def test_a_flooding_peer_delays_a_client_by_about_one_request(
    small_root: Path, tmp_path: Path
) -> None:
    """Six peers with 40 requests queued each: a client that connects then has
    its handshake, Hello and request handled in about as many turns (one
    event per turn, of the peer that asked least lately), not behind a turn
    of each of the others per event (some 20 turns)."""
    server = Server(f"ipc://{tmp_path}/h.sock", RequestHandler(SimBackend(SMALL_SIM), small_root))
    try:
        flood = request(m.Hello(protocol=1)) + request(m.TFStatus()) * 40
        flooders = [Client(server.listener.path, flood) for _ in range(6)]
        for _ in range(30):
            server.run_once()
        assert all(0 < f.replies() < 41 for f in flooders)
        client = Client(server.listener.path, request(m.Hello(protocol=1)) + request(m.TFStatus()))
        turns = 0
        while client.replies() < 2:
            server.run_once()
            turns += 1
            assert turns <= 6
        assert sum(f.replies() for f in flooders) < 6 * 41
    finally:
        server.shutdown()


class Recording(SimBackend):
    """The sim, saying which deferred work the loop ran, in order."""

    def __init__(self) -> None:
        super().__init__(SMALL_SIM)
        self.calls: list[str] = []

    def catch_up(self) -> None:
        self.calls.append("catch_up")
        super().catch_up()

    def idle(self) -> None:
        self.calls.append("idle")
        super().idle()


def test_the_backend_catches_up_once_a_reply_is_out_and_nothing_waits(
    small_root: Path, tmp_path: Path
) -> None:
    """The sim's frequency model is not computed before an association's
    reply (its sync leaves it): the loop has the backend catch up in the turn
    after the reply left, when no request waits, not while one does, and
    leaves its idle work (the state file) for a turn that found nothing."""
    backend = Recording()
    server = Server(f"ipc://{tmp_path}/h.sock", RequestHandler(backend, small_root))
    try:
        two = request(m.Hello(protocol=1)) + request(m.PrepareManagedMode())
        client = Client(server.listener.path, two + request(m.AssociateCpus(clos=2, cpus=[5])))
        turns = 0
        while client.replies() < 3:
            server.run_once()
            turns += 1
            assert turns <= 8
        assert backend.calls == []  # each turn served a request: nothing deferred ran
        assert backend.has_deferred()  # the model of the association (no state file here)
        server.run_once()  # nothing waits: the turn after the last reply
        assert backend.calls == ["catch_up"]
        assert not backend.has_deferred()  # the model is current
    finally:
        server.shutdown()


def test_a_request_answered_in_the_turn_it_came_leaves_the_peers_interest_alone(
    small_root: Path, tmp_path: Path
) -> None:
    """One peer asking, one request at a time (the plugin's way): each is read
    and answered in one turn, and the peer waits to read again as before, so
    the turn changes no epoll interest (two epoll_ctl calls a request were
    there for nothing); a peer whose next request waits behind its reply
    still stops being read until it is served (the backpressure)."""
    server = Server(f"ipc://{tmp_path}/h.sock", RequestHandler(SimBackend(SMALL_SIM), small_root))
    modified: list[str] = []

    def counted(name: str) -> Callable[..., object]:
        call = getattr(server.selector, name)

        def counting(*args: object) -> object:
            modified.append(name)
            return call(*args)

        return counting

    for name in ("register", "modify", "unregister"):
        setattr(server.selector, name, counted(name))
    try:
        client = Client(server.listener.path, request(m.Hello(protocol=1)))
        while client.replies() < 1:
            server.run_once()
        modified.clear()
        for n in range(2, 6):
            client.sock.sendall(request(m.TFStatus()))
            while client.replies() < n:
                server.run_once()
        assert modified == []
        client.sock.sendall(request(m.TFStatus()) * 3)  # three at once: one a turn
        while client.replies() < 8:
            server.run_once()
        assert modified  # the peer's reads stopped while a request of it waited
    finally:
        server.shutdown()

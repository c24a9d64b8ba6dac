"""The blocking client's own ZMTP end (:class:`nri_sst.client.SyncHelperClient`)
on the wire: against helpers of ours written with plain sockets that break the
protocol on purpose (a wrong greeting, a reply past the bound, endless frames,
an endless stream of replies that are not ours, silence, a close mid-reply),
against one that comes and goes (file descriptors do not leak across
reconnects), and against the real helper process.

Deadlines read an injected clock: :class:`Frozen` never passes one (only the
protection under test can end the call), :class:`Ticks` passes one after a
fixed number of reads whatever the machine's speed. Each call runs in a thread
joined with a generous bound (:func:`ends`): a protection removed shows as a
call that does not end, not as a slow one."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from helper_process import Helper, start_helper, stop_helper
from nri_sst import PROTOCOL_VERSION, zmtp
from nri_sst import messages as m
from nri_sst.client import MAX_REPLY_SIZE, HelperUnavailable, SyncHelperClient

T = TypeVar("T")
LIVENESS = 60.0
"""Seconds a call that should end at once may take on a loaded machine before
the test calls it hung (it never decides a figure)."""


class Frozen:
    """A clock that never moves: no deadline passes."""

    def __call__(self) -> float:
        return 1000.0


class Ticks:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float = 0.001) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def ends(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread; its result or its exception, failing the test if
    it has not ended within :data:`LIVENESS`."""
    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            err.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(LIVENESS)
    assert not t.is_alive(), "the call did not end"
    if err:
        raise err[0]
    return out[0]


# --------------------------------------------------------------------------- a helper of ours

Script = Callable[["Server", socket.socket], None]


class Server(threading.Thread):
    """Listens on a socket file; each accepted connection goes to ``script``
    (one at a time), which says what the helper sends."""

    def __init__(self, path: Path, script: Script) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.script = script
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.listener.settimeout(0.02)
        self.stopping = threading.Event()
        self.accepted = 0
        self.eofs = 0
        """Connections that the client closed (read to their end)."""
        self.flag = threading.Event()
        """Set by a script when it has done what the test waits for."""
        self.done = threading.Semaphore(0)
        """Released when a connection is closed (its script ended)."""

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            with conn:
                conn.settimeout(LIVENESS)
                with contextlib.suppress(OSError, EOFError):  # the client went away
                    self.script(self, conn)
            self.done.release()

    def hold(self, conn: socket.socket) -> None:
        """Read and ignore everything until the client closes."""
        while conn.recv(65536):
            pass
        self.eofs += 1

    def close(self) -> None:
        self.stopping.set()
        self.join(LIVENESS)
        self.listener.close()
        self.path.unlink(missing_ok=True)


def handshake(conn: socket.socket) -> zmtp.Connection:
    """The helper's side of the NULL handshake (its own ROUTER end)."""
    wire = zmtp.Connection(max_size=1 << 20, max_frames=3, discard_limit=1 << 21, discard_frames=8)
    assert isinstance(next_event(conn, wire), zmtp.Handshake)
    return wire


def next_event(conn: socket.socket, wire: zmtp.Connection) -> zmtp.Event:
    while True:
        event = wire.next_event()
        if out := wire.output():
            conn.sendall(out)
        if event is not None:
            return event
        data = conn.recv(65536)
        if not data:
            raise EOFError
        wire.receive(data)


def request(conn: socket.socket, wire: zmtp.Connection) -> tuple[bytes, m.Request]:
    event = next_event(conn, wire)
    assert isinstance(event, zmtp.Message), event
    _, rid, payload = event.frames
    return rid, m.decode_request(payload)


def hello_reply(instance: str = "ours") -> bytes:
    return m.encode(
        m.HelloReply(
            protocol=PROTOCOL_VERSION,
            backend="hostile",
            sst_supported=True,
            capabilities=[],
            instance=instance,
        )
    )


def answer(conn: socket.socket, wire: zmtp.Connection, n: int = 1 << 30) -> None:
    """Answer Hello and TFStatus properly (``n`` requests, then hold)."""
    for _ in range(n):
        rid, req = request(conn, wire)
        reply = hello_reply() if isinstance(req, m.Hello) else m.encode(m.TFStatusReply(punits=[]))
        conn.sendall(zmtp.encode_frames([b"", rid, reply]))


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Script], tuple[Server, str]]]:
    servers: list[Server] = []

    def start(script: Script) -> tuple[Server, str]:
        s = Server(tmp_path / f"h{len(servers)}.sock", script)
        s.start()
        servers.append(s)
        return s, f"ipc://{s.path}"

    yield start
    for s in servers:
        s.close()


# --------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:5555",
        "ipc://@abstract",
        "ipc://",
        "/run/helper.sock",
        "ipc:///" + "x" * 107,
    ],
)
def test_only_ipc_endpoints_with_a_socket_path(endpoint: str) -> None:
    with pytest.raises(ValueError, match="SyncHelperClient"):
        SyncHelperClient(endpoint)


# --------------------------------------------------------------------------- a hostile helper


@pytest.mark.parametrize(
    ("sent", "reason"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n" * 3, "not a ZMTP 3 peer"),
        (zmtp.GREETING + zmtp.ready(b"DEALER"), "socket type 'DEALER'"),
        (zmtp.GREETING + zmtp.encode_frames([b"x"]), "message before the READY"),
    ],
    ids=["not-zmtp", "not-a-router", "message-first"],
)
def test_a_wrong_handshake_fails_the_call_at_once(
    serve: Callable[[Script], tuple[Server, str]], sent: bytes, reason: str
) -> None:
    """Frozen clock: neither the grace nor the deadline ends it, the check does."""

    def script(s: Server, conn: socket.socket) -> None:
        conn.sendall(sent)
        s.hold(conn)

    _, endpoint = serve(script)
    with SyncHelperClient(endpoint, timeout=1.0, clock=Frozen()) as c:
        with pytest.raises(HelperUnavailable, match=f"broke the protocol: {reason}"):
            ends(lambda: c.request(m.TFStatus()))
        assert c.sock is None  # dropped: the next call connects again


def test_a_reply_past_the_bound_by_one_byte_fails_at_its_header(
    serve: Callable[[Script], tuple[Server, str]],
) -> None:
    """The header of a reply of MAX_REPLY_SIZE + 1 bytes and a little of it,
    the rest never sent: the client gives up at the header (it neither waits
    for nor keeps the reply); a reply of exactly MAX_REPLY_SIZE is taken."""
    pad = MAX_REPLY_SIZE - len(m.encode(m.HelloReply(1, "", True, ["x" * 70000], "ours")))
    exact = m.encode(m.HelloReply(1, "", True, ["x" * (70000 + pad)], "ours"))
    assert len(exact) == MAX_REPLY_SIZE

    def script(s: Server, conn: socket.socket) -> None:
        wire = handshake(conn)
        rid, _ = request(conn, wire)
        if s.accepted == 1:
            size = (MAX_REPLY_SIZE + 1).to_bytes(8, "big")  # a long last frame
            conn.sendall(b"\x01\x00\x01\x08" + rid + b"\x02" + size + bytes(4096))
        else:
            conn.sendall(zmtp.encode_frames([b"", rid, exact]))
        s.hold(conn)

    _, endpoint = serve(script)
    with SyncHelperClient(endpoint, timeout=1.0, clock=Frozen()) as c:
        with pytest.raises(HelperUnavailable, match="broke the protocol: message over"):
            ends(lambda: c.request(m.Hello(protocol=PROTOCOL_VERSION)))
        reply = ends(lambda: c.call(m.Hello(protocol=PROTOCOL_VERSION), m.HelloReply))
        assert len(reply.capabilities[0]) == 70000 + pad


def flood(first: Callable[[bytes], bytes], chunk: bytes) -> Script:
    """A helper that answers the handshake, takes one request, sends
    ``first(its id)`` and then ``chunk`` for ever."""

    def script(s: Server, conn: socket.socket) -> None:
        wire = handshake(conn)
        rid, _ = request(conn, wire)
        conn.sendall(first(rid))
        while True:
            conn.sendall(chunk)

    return script


def test_endless_frames_fail_the_call_at_the_fourth(
    serve: Callable[[Script], tuple[Server, str]],
) -> None:
    # the delimiter, the id, and MORE frames
    _, endpoint = serve(flood(lambda rid: b"\x01\x00\x01\x08" + rid, b"\x01\x01x" * 1000))
    c = SyncHelperClient(endpoint, timeout=1.0, clock=Frozen())
    with c, pytest.raises(HelperUnavailable, match="broke the protocol: message over 4 frames"):
        ends(lambda: c.request(m.Hello(protocol=PROTOCOL_VERSION)))


def test_endless_replies_that_are_not_ours_end_at_the_deadline(
    serve: Callable[[Script], tuple[Server, str]],
) -> None:
    """A helper that never stops sending (well-formed replies to ids we never
    sent): the call ends at its deadline, data or not."""

    other = zmtp.encode_frames([b"", b"not-ours", hello_reply()])
    _, endpoint = serve(flood(lambda _rid: b"", other * 100))
    c = SyncHelperClient(endpoint, timeout=0.2, clock=Ticks())
    with c, pytest.raises(HelperUnavailable, match="did not answer Hello within 200 ms"):
        ends(lambda: c.request(m.Hello(protocol=PROTOCOL_VERSION)))


def test_endless_replies_while_idle_end_the_next_call_at_its_deadline(
    serve: Callable[[Script], tuple[Server, str]],
) -> None:
    """The flood starts after an answered call, while the client is idle: the
    next call's look at what came meanwhile ends at its deadline too. (The
    bound on that look, the deadline checked between reads, is not what this
    catches: a flood from a thread of this process does not outpace the
    reader, whose look ends whenever the socket is empty for a moment.)"""

    def script(s: Server, conn: socket.socket) -> None:
        wire = handshake(conn)
        answer(conn, wire, n=2)
        other = zmtp.encode_frames([b"", b"not-ours", hello_reply()])
        conn.sendall(other * 100)
        s.flag.set()
        while True:
            conn.sendall(other * 100)

    server, endpoint = serve(script)
    c = SyncHelperClient(endpoint, timeout=0.2, clock=Ticks())
    with c:
        assert isinstance(ends(lambda: c.request(m.TFStatus())), m.TFStatusReply)
        assert server.flag.wait(LIVENESS)
        with pytest.raises(HelperUnavailable, match="did not answer TFStatus within 200 ms"):
            ends(lambda: c.request(m.TFStatus()))


def test_a_helper_that_never_answers(serve: Callable[[Script], tuple[Server, str]]) -> None:
    """Accepted, no greeting: the call fails at the end of the connect grace,
    and the next one at once (the socket stays; one connection, no storm).
    Accepted and handshaken, the request never answered: the call ends at its
    deadline, the socket is dropped (the helper sees it closed) and the next
    call is a new connection with its own Hello."""

    def silent(s: Server, conn: socket.socket) -> None:
        s.hold(conn)

    server, endpoint = serve(silent)
    with SyncHelperClient(endpoint, timeout=10.0) as c:
        for _ in range(2):
            with pytest.raises(HelperUnavailable, match="not connected"):
                ends(lambda: c.request(m.TFStatus()))
        assert server.accepted == 1

    def mute_first(s: Server, conn: socket.socket) -> None:
        wire = handshake(conn)
        if s.accepted == 1:
            request(conn, wire)  # the Hello, never answered
            s.hold(conn)
        else:
            answer(conn, wire)

    server, endpoint = serve(mute_first)
    with SyncHelperClient(endpoint, timeout=0.1) as c:
        with pytest.raises(HelperUnavailable, match="did not answer TFStatus within 100 ms"):
            ends(lambda: c.request(m.TFStatus()))
        assert isinstance(ends(lambda: c.request(m.TFStatus())), m.TFStatusReply)
        assert server.accepted == 2 and server.eofs == 1
        assert c.session.handshakes == 1 and c.generation == 1


def test_a_helper_that_closes_mid_reply(serve: Callable[[Script], tuple[Server, str]]) -> None:
    """Half a reply, then the connection closed: the call fails at once (a
    frozen clock: not at a deadline); the next call connects again."""

    def script(s: Server, conn: socket.socket) -> None:
        wire = handshake(conn)
        if s.accepted == 1:
            rid, _ = request(conn, wire)
            whole = zmtp.encode_frames([b"", rid, hello_reply()])
            conn.sendall(whole[: len(whole) // 2])
            return  # closed
        answer(conn, wire)

    server, endpoint = serve(script)
    with SyncHelperClient(endpoint, timeout=1.0, clock=Frozen()) as c:
        with pytest.raises(HelperUnavailable, match="closed the connection"):
            ends(lambda: c.request(m.TFStatus()))
        assert isinstance(ends(lambda: c.request(m.TFStatus())), m.TFStatusReply)
        assert server.accepted == 2


def test_a_helper_gone_while_idle_is_reconnected_in_the_next_call(
    serve: Callable[[Script], tuple[Server, str]],
) -> None:
    """The helper closes our connection between calls (it restarted, say): the
    next call notices before it sends, connects again and says Hello first."""

    def script(s: Server, conn: socket.socket) -> None:
        answer(conn, handshake(conn), n=2)  # Hello, TFStatus, then closed

    server, endpoint = serve(script)
    with SyncHelperClient(endpoint, timeout=1.0, clock=Frozen()) as c:
        for i in range(3):
            assert isinstance(ends(lambda: c.request(m.TFStatus())), m.TFStatusReply)
            assert c.session.handshakes == i + 1
            assert server.done.acquire(timeout=LIVENESS)  # closed by the helper
        assert server.accepted == 3


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_no_descriptor_leaks_across_reconnects(
    serve: Callable[[Script], tuple[Server, str]], tmp_path: Path
) -> None:
    """A helper that comes and goes: each call a new connection (it closes
    ours after one request), every tenth call nobody listening. The process
    holds as many descriptors after 300 calls as before, and no socket was
    left for the garbage collector to close."""

    def script(s: Server, conn: socket.socket) -> None:
        answer(conn, handshake(conn), n=2)

    server, endpoint = serve(script)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        c = SyncHelperClient(endpoint, timeout=5.0)
        before = fds()
        refused = 0
        for i in range(300):
            if i % 10 == 9:
                os.rename(server.path, tmp_path / "away.sock")  # nobody at the path
            try:
                c.request(m.TFStatus())
                assert server.done.acquire(timeout=LIVENESS)  # closed by the helper
            except HelperUnavailable:
                refused += 1
            if i % 10 == 9:
                os.rename(tmp_path / "away.sock", server.path)
            assert fds() <= before + 1  # the client's socket
        c.close()
        gc.collect()
        assert fds() == before
    assert refused == 30
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught


# --------------------------------------------------------------------------- the real helper


def test_the_real_helper_restarted_again_and_again(host_root: Path, tmp_path: Path) -> None:
    """The helper process killed and started five times: each time the call
    fails at once while it is away, the first call after it is back meets a
    new generation, and no descriptor is left behind."""
    helper: Helper = start_helper(host_root, tmp_path)
    c = SyncHelperClient(helper.endpoint, timeout=2.0, client="test")
    try:
        assert isinstance(c.request(m.TFStatus()), m.TFStatusReply)
        before = fds()
        for i in range(5):
            helper.proc.send_signal(signal.SIGKILL)
            helper.proc.wait(10)
            with pytest.raises(HelperUnavailable, match="not connected"):
                c.request(m.TFStatus())
            helper.sock.unlink(missing_ok=True)
            helper = start_helper(host_root, tmp_path, sock=helper.sock)
            for _ in range(50):  # requests back to back on the new connection
                assert isinstance(c.request(m.TFStatus()), m.TFStatusReply)
            assert c.generation == i + 2
            assert fds() <= before
    finally:
        c.close()
        stop_helper(helper)

"""The helper's client: one sans-IO core (:class:`Session`) and two thin
shells around it, :class:`SyncHelperClient` (blocking) and
:class:`HelperClient` (asyncio).

The core decides everything that is not I/O (the model is h11): request ids
(8 bytes, from a random start), the handshake (``Hello`` before anything
else on a connection, once more when the helper answers
``handshake-required``), which reply belongs to which request (late answers
to timed-out requests are dropped), the deadline of a call (one for the
whole call, Hello included, from an injectable clock), the connect grace of
a new socket, and what a failure means:

* a timeout, garbage or a reply of the wrong type raises
  :class:`HelperUnavailable` and asks the shell for a new socket (no stale
  request is delivered to a restarted helper), with the handshake redone;
* a send to a helper that is not connected fails at once (after the short
  :data:`CONNECT_GRACE` of a new socket), it never waits for the helper;
* a typed refusal raises :class:`HelperRequestError`.

``HelloReply.instance`` is random per helper process: :attr:`Session.generation`
changes only when it does (a restarted helper, whose SST state may be gone),
not on a re-handshake with the same helper (our peer evicted after other
clients said hello, our own socket recreated after a timeout).

Typical use::

    async with HelperClient("ipc:///run/nri-sst/helper.sock") as sst:
        info = await sst.request(Discover())          # -> DiscoverReply
        await sst.request(AssociateCpus(clos=0, cpus=[32, 160]))
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import select
import socket
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec

if TYPE_CHECKING:
    import zmq
    import zmq.asyncio

from nri_sst import PROTOCOL_VERSION, zmtp
from nri_sst import messages as m

DEFAULT_TIMEOUT = 0.1
"""Seconds per call unless the caller says otherwise (the plugin's reply budget)."""
CONNECT_GRACE = 0.05
"""Seconds a new socket may take to connect before a send fails: an ipc
connection to a running helper takes well under a millisecond, but the
helper answers the ZMTP greeting from its own loop, which a loaded 2-core
node may not schedule at once; half the reply budget."""
MAX_REPLY_SIZE = 4 * 1024 * 1024
"""Largest reply accepted (the blocking client's ZMTP end closes a connection
at the frame header past it, the asyncio client's ZeroMQ drops it; checked
again before decoding)."""

R = TypeVar("R")
Clock = Callable[[], float]


class HelperUnavailable(Exception):
    """The helper did not answer in time, is not running, or answered garbage."""


class HelperRequestError(Exception):
    """The helper refused a request with a typed :class:`~nri_sst.messages.ErrorReply`."""

    def __init__(self, error: m.ErrorReply) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code
        self.message = error.message


class Send(msgspec.Struct, frozen=True):
    """The next frames of a call to send (the request after its Hello)."""

    frames: list[bytes]


class Session:
    """The client's state towards one helper endpoint, without I/O.

    A shell calls :meth:`connecting` whenever it (re)creates its socket,
    :meth:`begin` for each request, and drives the returned :class:`Call`.
    """

    def __init__(
        self,
        endpoint: str,
        client: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        clock: Clock = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.client = client
        self.timeout = timeout
        self.clock = clock
        self._ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 16)
        self.hello: m.HelloReply | None = None
        """The handshake of the current connection (None: Hello first)."""
        self.instance = ""
        """The helper process that answered the last handshake ("" before one)."""
        self.generation = 0
        """How many helper processes this session has met: changes only when
        ``instance`` does (a restarted helper), never on a re-handshake."""
        self.handshakes = 0
        self.needs_socket = True
        """The shell must (re)create its socket before the next send."""
        self._grace_until = 0.0

    # -- shell events ------------------------------------------------------------

    def connecting(self) -> None:
        """The shell created a new socket: a new peer for the helper."""
        self.needs_socket = False
        self.hello = None
        self._grace_until = self.clock() + CONNECT_GRACE

    def lost(self) -> None:
        """The connection can no longer be trusted (a timeout, garbage): a new
        socket and a new handshake before the next request."""
        self.needs_socket = True
        self.hello = None

    def begin(self, req: m.Request, timeout: float | None = None) -> Call:
        """Start a call; its deadline is ``timeout`` (or the session's) from now."""
        t = self.timeout if timeout is None else timeout
        return Call(self, req, self.clock() + t, t)

    # -- core decisions ----------------------------------------------------------

    def _frames(self, req: m.Request) -> tuple[bytes, list[bytes]]:
        rid = (next(self._ids) & (2**64 - 1)).to_bytes(8, "little")
        return rid, [b"", rid, m.encode(req)]

    def _hello_request(self) -> m.Hello:
        return m.Hello(protocol=PROTOCOL_VERSION, capabilities=[], client=self.client)

    def _handshake(self, reply: m.HelloReply) -> None:
        self.hello = reply
        self.handshakes += 1
        # a helper that does not say which process it is: every handshake may
        # be a restarted one
        instance = reply.instance or f"unnamed-{self.handshakes}"
        if instance != self.instance:
            self.instance = instance
            self.generation += 1

    def grace_left(self) -> float:
        """Seconds a send may still wait for a new socket to connect."""
        return max(self._grace_until - self.clock(), 0.0)


class Call:
    """One request as the session runs it: Hello first when this connection
    has not said it, then the request; once more Hello and the request when
    the helper asks for the handshake (it evicted our peer, or restarted)."""

    def __init__(self, session: Session, req: m.Request, deadline: float, timeout: float) -> None:
        self.session = session
        self.request = req
        self.deadline = deadline
        self.timeout = timeout
        self._rehello_done = False
        self._in_hello = session.hello is None and not isinstance(req, m.Hello)
        self.rid, self.frames = session._frames(session._hello_request() if self._in_hello else req)
        """The frames to send now; :meth:`receive` may return the next ones."""

    def remaining(self) -> float:
        """Seconds left until the deadline (at most 0 when it has passed)."""
        return self.deadline - self.session.clock()

    def send_wait(self) -> float:
        """How long a send may wait for the connection: the connect grace of a
        new socket, never beyond the deadline; 0 for an established one."""
        return max(min(self.session.grace_left(), self.remaining()), 0.0)

    def not_connected(self) -> HelperUnavailable:
        """The send found no connected helper: nothing was queued (ZeroMQ
        keeps reconnecting the asyncio shell's socket; the blocking shell
        connects again in its next call, or finishes the handshake of a
        socket that was accepted but not answered yet)."""
        return HelperUnavailable(
            f"helper at {self.session.endpoint} not connected ({type(self.request).__name__})"
        )

    def connected(self) -> None:
        """The shell made a new connection before this call sent anything (it
        found the old one gone): Hello first on it."""
        if (
            not self._in_hello
            and self.session.hello is None
            and not isinstance(self.request, m.Hello)
        ):
            self._in_hello = True
            self.rid, self.frames = self.session._frames(self.session._hello_request())

    def timed_out(self) -> HelperUnavailable:
        """The deadline passed without the reply: the outcome is unknown."""
        self.session.lost()
        return HelperUnavailable(
            f"helper at {self.session.endpoint} did not answer {type(self.request).__name__} "
            f"within {self.timeout * 1000:.0f} ms"
        )

    def _broken(self, why: str) -> HelperUnavailable:
        self.session.lost()
        return HelperUnavailable(why)

    def receive(self, frames: list[bytes]) -> m.Reply | Send | None:
        """A message from the socket: None when it is not this call's (a late
        reply, dropped), :class:`Send` with the next frames, or the typed
        reply that ends the call. Raises :class:`HelperRequestError` for a
        refusal and :class:`HelperUnavailable` for garbage."""
        if len(frames) != 3 or frames[0] != b"" or frames[1] != self.rid:
            return None
        if len(frames[2]) > MAX_REPLY_SIZE:
            raise self._broken(f"reply of {len(frames[2])} bytes from helper exceeds the limit")
        try:
            reply = m.decode_reply(frames[2])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise self._broken(f"undecodable reply from helper: {exc}") from None
        s = self.session
        if self._in_hello:
            hello = cast(m.HelloReply, self._expect(s._hello_request(), reply))
            s._handshake(hello)
            self._in_hello = False
            self.rid, self.frames = s._frames(self.request)
            return Send(self.frames)
        if (
            isinstance(reply, m.ErrorReply)
            and reply.code == "handshake-required"
            and not self._rehello_done
            and not isinstance(self.request, m.Hello)
        ):
            self._rehello_done = True
            self._in_hello = True
            s.hello = None
            self.rid, self.frames = s._frames(s._hello_request())
            return Send(self.frames)
        result = self._expect(self.request, reply)
        if isinstance(result, m.HelloReply):
            s._handshake(result)
        return result

    def _expect(self, req: m.Request, reply: m.Reply) -> m.Reply:
        if isinstance(reply, m.ErrorReply):
            raise HelperRequestError(reply)
        want = m.REPLY_FOR[type(req)]
        if not isinstance(reply, want):
            raise self._broken(f"helper answered {type(reply).__name__} to {type(req).__name__}")
        return reply


def _configure(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for a helper that is not there
    sock.setsockopt(zmq.RECONNECT_IVL, 20)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_SIZE)


def _import_zmq() -> None:
    """pyzmq (~10 ms of imports) when the first asyncio client is built, not
    when the plugin imports this module: the blocking client (the plugin's
    reply path) speaks ZMTP itself and never needs it."""
    global zmq
    import zmq
    import zmq.asyncio  # zmq.asyncio.Context in HelperClient


class _Shell:
    """What both shells share: the session and the typed ``call``."""

    def __init__(
        self, endpoint: str, timeout: float, client: str, clock: Clock = time.monotonic
    ) -> None:
        self.session = Session(endpoint, client, timeout, clock)

    @property
    def endpoint(self) -> str:
        return self.session.endpoint

    @property
    def timeout(self) -> float:
        return self.session.timeout

    @property
    def hello(self) -> m.HelloReply | None:
        """The reply of the current connection's handshake."""
        return self.session.hello

    @property
    def instance(self) -> str:
        """The helper process of the last handshake ("" before one)."""
        return self.session.instance

    @property
    def generation(self) -> int:
        """Changes only when the helper process does (see :class:`Session`)."""
        return self.session.generation

    @staticmethod
    def _narrow(reply: m.Reply, want: type[R]) -> R:
        if not isinstance(reply, want):
            raise HelperUnavailable(f"unexpected reply {type(reply).__name__}")
        return reply


def ipc_path(endpoint: str) -> str:
    """The socket file of an ``ipc://`` endpoint, the only kind the blocking
    client speaks (as the helper serves only those); anything else is refused."""
    path = endpoint.removeprefix("ipc://")
    if path == endpoint or not path or path.startswith("@"):
        raise ValueError(
            f"SyncHelperClient: {endpoint!r} is not an ipc:// endpoint with a socket path "
            "(the helper serves only those)"
        )
    if len(os.fsencode(path)) > 107:
        raise ValueError(f"SyncHelperClient: the socket path of {endpoint!r} is over 107 bytes")
    return path


def _writable(sock: socket.socket, wait: float) -> bool:
    """Whether ``sock`` has room to send within ``wait`` seconds (a helper
    that does not read: rare, so its own poll object)."""
    p = select.poll()
    p.register(sock.fileno(), select.POLLOUT)
    return bool(p.poll(max(math.ceil(wait * 1000), 0)))


READ_SIZE = 65536
"""Bytes read at a time: the connection holds at most one partial reply and one read."""
REPLY_FRAMES_SIZE = MAX_REPLY_SIZE + 8
"""The reply bound on the wire: the empty delimiter, the 8-byte id and the reply."""


class SyncHelperClient(_Shell):
    """The blocking shell (CLI, benchmarks, the plugin's reply path: every
    wait ends at the call's deadline).

    It speaks ZMTP 3.1 itself (:mod:`nri_sst.zmtp`, the DEALER end) over a
    plain non-blocking AF_UNIX stream socket, all in the calling thread: a
    request is one ``send`` of its frames, its reply is read with ``poll`` and
    ``recv`` until the call's deadline. No libzmq I/O thread to wake on
    either side of a round trip (that was most of its cost on the reply path).
    The socket is connected in the call that needs it: a helper that is not
    listening fails the call at once, the next call tries again; one that
    accepted but has not finished the handshake within the connect grace
    fails it too (the socket stays for the next call, nothing of the request
    was sent)."""

    def __init__(
        self,
        endpoint: str,
        timeout: float = DEFAULT_TIMEOUT,
        client: str = "nri-sst-helper",
        clock: Clock = time.monotonic,
    ) -> None:
        self._path = ipc_path(endpoint)
        super().__init__(endpoint, timeout, client, clock)
        self.sock: socket.socket | None = None
        self.wire: zmtp.Connection | None = None
        self._poll = select.poll()

    # -- the socket ----------------------------------------------------------------

    def _connect(self, call: Call) -> tuple[socket.socket, zmtp.Connection]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.connect(self._path)
        except OSError as exc:
            sock.close()
            # ENOENT, ECONNREFUSED: nobody listens; EAGAIN: its backlog is full
            raise call.not_connected() from exc
        wire = zmtp.dealer_end(REPLY_FRAMES_SIZE)
        self.sock, self.wire = sock, wire
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self.session.connecting()
        return sock, wire

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.wire = None
        self._poll = select.poll()

    def close(self) -> None:
        self._close_socket()
        self.session.lost()

    def __enter__(self) -> SyncHelperClient:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _lost(self, call: Call, why: str) -> HelperUnavailable:
        return call._broken(f"helper at {self.endpoint} {why} ({type(call.request).__name__})")

    def _read(self, call: Call, sock: socket.socket, wire: zmtp.Connection, wait: float) -> bool:
        """Feed ``wire`` one read, waiting at most ``wait`` seconds for it;
        False when nothing came. Raises for a connection that ended."""
        if not self._poll.poll(max(math.ceil(wait * 1000), 0)):
            return False
        try:
            data = sock.recv(READ_SIZE)
        except BlockingIOError:
            return False
        except OSError as exc:
            raise self._lost(call, f"connection failed: {exc.strerror}") from None
        if not data:
            raise self._lost(call, "closed the connection")
        wire.receive(data)
        return True

    def _event(self, call: Call, wire: zmtp.Connection) -> zmtp.Event | None:
        event = wire.next_event()
        if isinstance(event, zmtp.Closed | zmtp.Discarded):  # Discarded: over the bound too
            reason = event.reason if isinstance(event, zmtp.Closed) else "message over the bound"
            raise self._lost(call, f"broke the protocol: {reason}")
        return event

    def _write(self, call: Call, sock: socket.socket, data: bytes) -> None:
        """All of ``data``, waiting for room at most until the call's deadline."""
        view = memoryview(data)
        while view:
            try:
                view = view[sock.send(view, socket.MSG_NOSIGNAL) :]
                continue
            except BlockingIOError:
                pass
            except OSError as exc:  # EPIPE, ECONNRESET: the helper went away
                raise self._lost(call, f"connection failed: {exc.strerror}") from None
            left = call.remaining()
            if left <= 0 or not _writable(sock, left):
                raise call.timed_out()

    def _ready(self, call: Call) -> tuple[socket.socket, zmtp.Connection]:
        """The connection to send on: what came meanwhile is read (late
        replies dropped, a helper that went away noticed: a new socket now),
        a new one connected, its handshake awaited within the connect grace."""
        sock, wire = self.sock, self.wire
        if sock is not None and wire is not None and not self.session.needs_socket:
            try:
                while self._read(call, sock, wire, 0):
                    while self._event(call, wire) is not None:
                        pass  # late replies to calls that ended: dropped
                    if call.remaining() <= 0:
                        break  # a helper that never stops sending: finish times out
            except HelperUnavailable:
                sock = wire = None
        if sock is None or wire is None or self.session.needs_socket:
            self._close_socket()
            sock, wire = self._connect(call)
            call.connected()
            # our greeting: 64 bytes into a new socket's empty buffer
            self._write(call, sock, wire.output())
        while not wire.open:
            event = self._event(call, wire)
            if event is None and not self._read(call, sock, wire, call.send_wait()):
                raise call.not_connected()  # the socket stays, its handshake goes on
        return sock, wire

    def _send(
        self, call: Call, sock: socket.socket, wire: zmtp.Connection, frames: list[bytes]
    ) -> None:
        self._write(call, sock, wire.output() + zmtp.encode_frames(frames))

    # -- calls ---------------------------------------------------------------------

    def request(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        """Send ``req``, return its typed reply (see ``messages.REPLY_FOR``)."""
        return self.finish(self.start(req, timeout))

    def start(self, req: m.Request, timeout: float | None = None) -> Call:
        """Send ``req`` (its Hello first on a new connection) without waiting
        for the reply: :meth:`finish` waits for it, until the call's deadline
        (``timeout`` from now), so that the caller can work meanwhile. One
        call at a time: a call started before the last one was finished is
        left (its late reply is dropped)."""
        call = self.session.begin(req, timeout)
        try:
            sock, wire = self._ready(call)
            self._send(call, sock, wire, call.frames)
        except HelperUnavailable:
            if self.session.needs_socket:
                self._close_socket()
            raise
        return call

    def finish(self, call: Call) -> m.Reply:
        """The typed reply of ``call`` (:meth:`start`), waited for at most
        until its deadline."""
        sock, wire = self.sock, self.wire
        if sock is None or wire is None or self.session.needs_socket:
            raise call.timed_out()  # its socket is gone (closed meanwhile)
        try:
            while True:
                event = self._event(call, wire)
                if event is None:
                    left = call.remaining()
                    if left <= 0:
                        raise call.timed_out()
                    self._read(call, sock, wire, left)
                    continue
                if not isinstance(event, zmtp.Message):
                    continue
                out = call.receive(event.frames)
                if isinstance(out, Send):
                    self._send(call, sock, wire, out.frames)
                elif out is not None:
                    return out
        except HelperUnavailable:
            if self.session.needs_socket:
                self._close_socket()
            raise

    def call(self, req: m.Request, want: type[R], timeout: float | None = None) -> R:
        """``request`` checked against the expected reply type (for typed callers)."""
        return self._narrow(self.request(req, timeout), want)


class HelperClient(_Shell):
    """The asyncio shell; one request in flight at a time (serialised). A
    cancelled request leaves the socket as it is (its late reply is dropped)."""

    def __init__(
        self,
        endpoint: str,
        timeout: float = DEFAULT_TIMEOUT,
        client: str = "nri-resource-policy",
        clock: Clock = time.monotonic,
    ) -> None:
        _import_zmq()
        super().__init__(endpoint, timeout, client, clock)
        self.ctx = zmq.asyncio.Context.instance()
        self.sock: zmq.asyncio.Socket | None = None
        self._lock = asyncio.Lock()

    def _socket(self) -> zmq.asyncio.Socket:
        if self.sock is None or self.session.needs_socket:
            self._close_socket()
            self.sock = self.ctx.socket(zmq.DEALER)
            _configure(self.sock)
            self.sock.connect(self.endpoint)
            self.session.connecting()
        return self.sock

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None

    def close(self) -> None:
        self._close_socket()
        self.session.lost()

    async def __aenter__(self) -> HelperClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def _send(self, sock: zmq.asyncio.Socket, call: Call, frames: list[bytes]) -> None:
        try:
            await sock.send_multipart(frames, zmq.NOBLOCK)
            return
        except zmq.Again:
            wait = call.send_wait()
            ms = int(wait * 1000) + 1
            # pyzmq's stub of the asyncio poll lacks its ``flags`` argument
            if not wait or not await sock.poll(ms, zmq.POLLOUT):  # type: ignore[call-arg]
                raise call.not_connected() from None
        try:
            await sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            raise call.not_connected() from None

    async def request(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        """Send ``req``, return its typed reply (see ``messages.REPLY_FOR``)."""
        async with self._lock:
            call = self.session.begin(req, timeout)
            sock = self._socket()
            frames = call.frames
            try:
                while True:
                    await self._send(sock, call, frames)
                    while True:
                        left = call.remaining()
                        if left <= 0 or not await sock.poll(int(left * 1000) + 1):
                            raise call.timed_out()
                        out = call.receive(await sock.recv_multipart())
                        if isinstance(out, Send):
                            frames = out.frames
                            break
                        if out is not None:
                            return out
            except HelperUnavailable:
                if self.session.needs_socket:
                    self._close_socket()
                raise

    async def call(self, req: m.Request, want: type[R], timeout: float | None = None) -> R:
        """``request`` narrowed to the expected reply type ``want``."""
        return self._narrow(await self.request(req, timeout), want)

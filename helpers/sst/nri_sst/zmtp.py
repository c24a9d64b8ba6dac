"""ZMTP 3.1 (rfc.zeromq.org 37), one end of one stream connection, sans-IO: the
helper's ROUTER end of an accepted connection, or the client's DEALER end.

The helper speaks the ZeroMQ wire protocol itself instead of through libzmq,
because libzmq cannot bound what a hostile peer costs: it assembles a whole
multipart message in memory before the application sees its first frame
(``ZMQ_MAXMSGSIZE`` bounds one frame, nothing bounds the frame count: one
message of 2000 frames of 60 KB put 120 MB in a ROUTER that had read nothing),
and it aborts the process when ``accept`` fails with ``EMFILE``. Here every
byte is accounted for:

* a message is kept while it has at most ``max_frames`` frames and
  ``max_size`` bytes; past that the rest of it is read and thrown away as it
  arrives (:class:`Discarded` reports it, so the peer gets an error reply),
  and past ``discard_limit`` bytes or ``discard_frames`` frames the
  connection is given up (:class:`Closed`);
* commands are at most :data:`MAX_COMMAND` bytes;
* input is only what the caller fed: the caller feeds more only when
  :meth:`Connection.next_event` has nothing complete, so the buffer holds at
  most one partial message and one read.

Only what a DEALER and a ROUTER need of each other: the NULL mechanism, READY
with ``Socket-Type``, message frames, PING/PONG. Peers of another socket type
(``peer_types``), mechanism or an older ZMTP get an ERROR command (where ZMTP
has one) and :class:`Closed`. The client's end passes its reply bound as both
``max_size`` and ``discard_limit``: a message over it closes the connection at
the frame header that passes it, nothing of it is read or kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

MORE = 0x01
LONG = 0x02
COMMAND = 0x04

GREETING_SIZE = 64
GREETING = (
    b"\xff"
    + bytes(8)
    + b"\x7f"  # signature
    + bytes((3, 1))  # version 3.1
    + b"NULL".ljust(20, b"\x00")  # mechanism
    + b"\x00"  # as-server (unused by NULL)
    + bytes(31)  # filler
)
MAX_COMMAND = 1024
"""Largest command frame accepted (READY with a 255-byte identity fits)."""
PEER_TYPES = frozenset({b"DEALER"})
"""Socket types that may connect to the helper (its ROUTER end): its clients are DEALERs."""
ROUTER_PEERS = frozenset({b"ROUTER"})
"""Socket types a client's DEALER end accepts: the helper is a ROUTER."""


class Handshake(msgspec.Struct, frozen=True):
    """The peer's READY arrived: the connection carries messages from now on."""

    socket_type: str


class Message(msgspec.Struct, frozen=True):
    """A whole message within the limits."""

    frames: list[bytes]


class Discarded(msgspec.Struct, frozen=True):
    """A whole message over ``max_frames`` or ``max_size``, thrown away as it came."""

    head: list[bytes]
    """Its first frames, those that were kept before a limit was passed."""
    size: int
    """Bytes of all its frames."""
    frames: int


class Closed(msgspec.Struct, frozen=True):
    """The peer broke the protocol or a limit: drop the connection."""

    reason: str


Event = Handshake | Message | Discarded | Closed


def encode_frames(frames: Sequence[bytes], flags: int = 0) -> bytes:
    """The wire form of a message (``flags=COMMAND`` for one command frame)."""
    out = bytearray()
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        f = flags | (MORE if i < last else 0)
        n = len(frame)
        if n <= 255:
            out += bytes((f, n))
        else:
            out += bytes((f | LONG,)) + n.to_bytes(8, "big")
        out += frame
    return bytes(out)


def command(name: bytes, data: bytes = b"") -> bytes:
    return encode_frames([bytes((len(name),)) + name + data], COMMAND)


def ready(socket_type: bytes) -> bytes:
    """The READY command of the NULL mechanism with one property, ``Socket-Type``."""
    prop = b"Socket-Type"
    return command(
        b"READY", bytes((len(prop),)) + prop + len(socket_type).to_bytes(4, "big") + socket_type
    )


def error(reason: str) -> bytes:
    text = reason.encode()[:255]
    return command(b"ERROR", bytes((len(text),)) + text)


def _properties(data: bytes) -> dict[bytes, bytes] | None:
    """ZMTP metadata (name-length, name, 4-byte value-length, value)*; None if malformed."""
    props: dict[bytes, bytes] = {}
    i = 0
    while i < len(data):
        n = data[i]
        name = data[i + 1 : i + 1 + n]
        j = i + 1 + n
        if n == 0 or len(name) < n or j + 4 > len(data):
            return None
        size = int.from_bytes(data[j : j + 4], "big")
        value = data[j + 4 : j + 4 + size]
        if len(value) < size:
            return None
        props[name.lower()] = value
        i = j + 4 + size
    return props


class Connection:
    """One connection, accepted or made: bytes in (:meth:`receive`), events
    out (:meth:`next_event`), bytes to send (:meth:`output`). ``socket_type``
    is ours (said in our READY), ``peer_types`` those we take (theirs).

    :data:`GREETING` is queued for sending at once (a libzmq peer sends the
    rest of its greeting only after it has seen ours); our READY once the
    peer's greeting is in."""

    def __init__(
        self,
        max_size: int,
        max_frames: int,
        discard_limit: int,
        discard_frames: int,
        socket_type: bytes = b"ROUTER",
        peer_types: frozenset[bytes] = PEER_TYPES,
    ) -> None:
        self.max_size = max_size
        self.max_frames = max_frames
        self.discard_limit = discard_limit
        self.discard_frames = discard_frames
        self.socket_type = socket_type
        self.peer_types = peer_types
        self._in = bytearray()
        self._out = bytearray(GREETING)
        self._state = "greeting"  # -> "ready" (READY awaited) -> "open" -> "closed"
        self._frames: list[bytes] = []
        self._count = 0
        self._size = 0
        self._discarding = False
        self._skip = 0
        """Bytes of a discarded frame still to throw away."""
        self._last = False
        """The discarded frame being skipped is the message's last."""

    @property
    def open(self) -> bool:
        return self._state == "open"

    @property
    def buffered(self) -> int:
        """Input bytes held (at most one partial message and one read)."""
        return len(self._in)

    def receive(self, data: bytes) -> None:
        self._in += data

    def output(self) -> bytes:
        """Bytes queued for the peer (greeting, READY, PONG, ERROR); emptied."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def next_event(self) -> Event | None:
        """The next complete event in the input fed so far, or None (feed more)."""
        buf = self._in
        while self._state != "closed":
            if self._state == "greeting":
                if len(buf) < GREETING_SIZE:
                    return None
                greeting = bytes(buf[:GREETING_SIZE])
                del buf[:GREETING_SIZE]
                if greeting[0] != 0xFF or not greeting[9] & 0x01 or greeting[10] < 3:
                    return self._close("not a ZMTP 3 peer")
                if greeting[12:32] != GREETING[12:32]:
                    self._out += error("only the NULL mechanism is supported")
                    return self._close("mechanism is not NULL")
                self._out += ready(self.socket_type)
                self._state = "ready"
                continue
            if self._skip:
                n = min(self._skip, len(buf))
                del buf[:n]
                self._skip -= n
                if self._skip:
                    return None
                if self._last:
                    return self._end_discarded()
                continue
            if len(buf) < 2:
                return None
            flags = buf[0]
            if flags & ~(MORE | LONG | COMMAND):
                return self._close(f"reserved frame flags 0x{flags:02x}")
            if flags & LONG:
                if len(buf) < 9:
                    return None
                head, size = 9, int.from_bytes(buf[1:9], "big")
            else:
                head, size = 2, buf[1]
            if flags & COMMAND:
                if flags & MORE or self._count:
                    return self._close("command inside a message")
                if size > MAX_COMMAND:
                    return self._close(f"command of {size} bytes")
                if len(buf) < head + size:
                    return None
                body = bytes(buf[head : head + size])
                del buf[: head + size]
                event = self._command(body)
                if event is not None:
                    return event
                continue
            if self._state != "open":
                return self._close("message before the READY command")
            count, total = self._count + 1, self._size + size
            if not self._discarding and (count > self.max_frames or total > self.max_size):
                self._discarding = True
            if self._discarding:
                if total > self.discard_limit or count > self.discard_frames:
                    return self._close(f"message over {count} frames or {total} bytes")
                del buf[:head]
                self._count, self._size = count, total
                self._skip, self._last = size, not flags & MORE
                if not size and self._last:
                    return self._end_discarded()
                continue
            if len(buf) < head + size:
                return None
            self._frames.append(bytes(buf[head : head + size]))
            del buf[: head + size]
            self._count, self._size = count, total
            if not flags & MORE:
                frames = self._frames
                self._reset()
                return Message(frames)
        return None

    def _reset(self) -> None:
        self._frames = []
        self._count = self._size = 0
        self._discarding = False

    def _end_discarded(self) -> Discarded:
        event = Discarded(head=self._frames, size=self._size, frames=self._count)
        self._reset()
        return event

    def _close(self, reason: str) -> Closed:
        self._state = "closed"
        self._in.clear()
        self._frames = []
        return Closed(reason)

    def _command(self, body: bytes) -> Event | None:
        n = body[0] if body else 0
        name, data = body[1 : 1 + n], body[1 + n :]
        if len(name) < n or not n:
            return self._close("malformed command")
        if self._state == "ready":
            if name == b"ERROR":
                return self._close(f"peer error: {data[1:].decode(errors='replace')}")
            if name != b"READY":
                return self._close(f"{name.decode(errors='replace')} before READY")
            props = _properties(data)
            if props is None:
                return self._close("malformed READY metadata")
            peer = props.get(b"socket-type", b"")
            if peer not in self.peer_types:
                self._out += error("invalid socket type")
                return self._close(f"socket type {peer.decode(errors='replace')!r}")
            self._state = "open"
            return Handshake(peer.decode())
        if name == b"PING" and len(data) >= 2:
            self._out += command(b"PONG", data[2:18])
        elif name == b"ERROR":
            return self._close(f"peer error: {data[1:].decode(errors='replace')}")
        elif name == b"READY":
            return self._close("second READY")
        return None  # PONG and unknown commands are ignored (ZMTP 3.1)


def dealer_end(reply_bound: int) -> Connection:
    """A client's end (DEALER, taking a ROUTER): a request's reply is three
    frames (delimiter, id, reply) of at most ``reply_bound`` bytes; a message
    over that closes the connection at the header that passes it (the bound is
    both the kept and the discarded limit)."""
    return Connection(
        max_size=reply_bound,
        max_frames=3,
        discard_limit=reply_bound,
        discard_frames=3,
        socket_type=b"DEALER",
        peer_types=ROUTER_PEERS,
    )

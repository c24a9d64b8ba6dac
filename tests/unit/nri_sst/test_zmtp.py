"""The helper's ZMTP 3.1 ROUTER end, sans-IO: golden bytes, the NULL handshake
with what libzmq 4.3 sends, and the bounds on what a peer can make it hold."""

from __future__ import annotations

import pytest
from nri_sst import zmtp

# What a libzmq 4.3 DEALER sends: signature (padding = routing-id size + 1), 3.1, NULL.
CLIENT_GREETING = bytes.fromhex("ff00000000000000017f0301") + b"NULL" + bytes(16 + 1 + 31)
CLIENT_READY = b"\x04\x29\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER\x08Identity\x00\x00\x00\x00"


def connection(**limits: int) -> zmtp.Connection:
    args = {"max_size": 100, "max_frames": 3, "discard_limit": 10_000, "discard_frames": 8}
    return zmtp.Connection(**(args | limits))


def open_connection(**limits: int) -> zmtp.Connection:
    c = connection(**limits)
    c.output()
    c.receive(CLIENT_GREETING + CLIENT_READY)
    assert c.next_event() == zmtp.Handshake("DEALER")
    c.output()
    return c


def test_golden_bytes() -> None:
    greeting = bytes.fromhex("ff00000000000000007f0301") + b"NULL" + bytes(48)
    assert greeting == zmtp.GREETING and len(greeting) == 64
    assert zmtp.ready(b"ROUTER") == b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER"
    assert zmtp.encode_frames([b"", b"id", b"x" * 256]) == (
        b"\x01\x00" + b"\x01\x02id" + b"\x02" + (256).to_bytes(8, "big") + b"x" * 256
    )


def test_null_handshake_then_messages() -> None:
    c = connection()
    assert c.output() == zmtp.GREETING  # at once: libzmq waits for it
    c.receive(CLIENT_GREETING[:30])
    assert c.next_event() is None and c.output() == b""
    c.receive(CLIENT_GREETING[30:] + CLIENT_READY[:5])
    assert c.next_event() is None
    assert c.output() == zmtp.ready(b"ROUTER")
    c.receive(CLIENT_READY[5:] + b"\x01\x00\x01\x0812345678\x00\x03abc\x00\x01z")
    assert c.next_event() == zmtp.Handshake("DEALER")
    assert c.next_event() == zmtp.Message([b"", b"12345678", b"abc"])
    assert c.next_event() == zmtp.Message([b"z"])
    assert c.next_event() is None and c.open


def test_ping_gets_pong_with_its_context() -> None:
    c = open_connection()
    c.receive(b"\x04\x0b\x04PING\x00\x0actx1")
    assert c.next_event() is None
    assert c.output() == b"\x04\x09\x04PONGctx1"


def test_an_over_long_message_is_thrown_away_as_it_arrives() -> None:
    """A 5000-byte payload (limit 100) fed in 100-byte reads: the connection
    never holds more than one read, and reports the message once it ended."""
    c = open_connection()
    data = b"\x01\x00\x01\x08rid-0001\x02" + (5000).to_bytes(8, "big") + bytes(5000) + b"\x00\x00"
    events = []
    for i in range(0, len(data), 100):
        c.receive(data[i : i + 100])
        while (e := c.next_event()) is not None:
            events.append(e)
        assert c.buffered <= 100
    assert events == [
        zmtp.Discarded(head=[b"", b"rid-0001"], size=5008, frames=3),
        zmtp.Message([b""]),
    ]


def test_too_many_frames_are_thrown_away() -> None:
    c = open_connection()
    c.receive(b"\x01\x00\x01\x08rid-0001" + b"\x01\x01x" * 3 + b"\x00\x01y")
    assert c.next_event() == zmtp.Discarded(head=[b"", b"rid-0001", b"x"], size=12, frames=6)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x00" + b"\x02" + (20_000).to_bytes(8, "big"), "message over"),
        (b"\x01\x00" * 9, "message over 9 frames"),
        (b"\x40\x00", "reserved frame flags 0x40"),
        (b"\x01\x00" + CLIENT_READY, "command inside a message"),
        (b"\x06" + (2000).to_bytes(8, "big"), "command of 2000 bytes"),
        (CLIENT_READY, "second READY"),
        (b"\x04\x07\x05ERROR\x00", "peer error"),
    ],
    ids=[
        "discard-limit",
        "discard-frames",
        "flags",
        "command-in-message",
        "big-command",
        "ready-twice",
        "error",
    ],
)
def test_protocol_breaches_close_the_connection(data: bytes, reason: str) -> None:
    c = open_connection()
    c.receive(data)
    event = c.next_event()
    assert isinstance(event, zmtp.Closed) and reason in event.reason, event
    assert c.buffered == 0
    c.receive(b"\x00\x01x")
    assert c.next_event() is None  # closed: nothing more comes out


@pytest.mark.parametrize(
    ("data", "reason", "error"),
    [
        (b"GET / HTTP/1.1\r\n" * 4, "not a ZMTP 3 peer", False),
        (CLIENT_GREETING[:10] + b"\x02\x00" + CLIENT_GREETING[12:], "not a ZMTP 3 peer", False),
        (CLIENT_GREETING[:12] + b"CURVE".ljust(20, b"\0") + bytes(32), "not NULL", True),
        (CLIENT_GREETING + CLIENT_READY.replace(b"\x06DEALER", b"\x06ROUTER"), "socket type", True),
        (CLIENT_GREETING + b"\x00\x01x", "message before the READY", False),
        (CLIENT_GREETING + b"\x04\x05\x04PING", "PING before READY", False),
    ],
    ids=["http", "zmtp-2", "curve", "router-peer", "message-first", "ping-first"],
)
def test_bad_handshakes_close_the_connection(data: bytes, reason: str, error: bool) -> None:
    c = connection()
    c.output()
    c.receive(data)
    event = c.next_event()
    assert isinstance(event, zmtp.Closed) and reason in event.reason, event
    assert (b"\x05ERROR" in c.output()) == error


# What a libzmq 4.3 ROUTER sends to a DEALER that connected (signature, 3.1, NULL, READY).
ROUTER_GREETING = bytes.fromhex("ff00000000000000017f0301") + b"NULL" + bytes(16 + 1 + 31)
ROUTER_READY = b"\x04\x1c\x05READY\x0bSocket-Type\x00\x00\x00\x06ROUTER"


def dealer(limit: int = 100) -> zmtp.Connection:
    """The client's end (:func:`zmtp.dealer_end`) with a small reply bound."""
    return zmtp.dealer_end(limit)


def test_the_dealer_end_takes_a_router_and_says_dealer() -> None:
    c = dealer()
    assert c.output() == zmtp.GREETING
    c.receive(ROUTER_GREETING + ROUTER_READY + b"\x01\x00\x01\x08rid-0001\x00\x02ok")
    assert c.next_event() == zmtp.Handshake("ROUTER")
    assert c.output() == zmtp.ready(b"DEALER")
    assert c.next_event() == zmtp.Message([b"", b"rid-0001", b"ok"])


def test_the_dealer_end_refuses_a_dealer_peer() -> None:
    """The helper is a ROUTER: another DEALER (or anything else) is not it."""
    c = dealer()
    c.output()
    c.receive(ROUTER_GREETING + ROUTER_READY.replace(b"\x06ROUTER", b"\x06DEALER"))
    event = c.next_event()
    assert isinstance(event, zmtp.Closed) and "socket type 'DEALER'" in event.reason, event
    assert b"\x05ERROR" in c.output()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x00\x01\x08rid-0001\x02" + (93).to_bytes(8, "big"), "101 bytes"),
        (b"\x01\x00\x01\x08rid-0001\x01\x00\x00\x00", "4 frames"),
    ],
    ids=["size", "frames"],
)
def test_the_dealer_end_closes_at_the_header_past_its_bound(data: bytes, reason: str) -> None:
    """Over the bound by one byte or one frame: closed at once, at the header
    that passes it, the payload not awaited, nothing of it kept."""
    c = dealer(limit=100)
    c.output()
    c.receive(ROUTER_GREETING + ROUTER_READY)
    assert c.next_event() == zmtp.Handshake("ROUTER")
    c.receive(data)
    event = c.next_event()
    assert isinstance(event, zmtp.Closed) and reason in event.reason, event
    assert c.buffered == 0

"""Hostile peers of the SST helper, and the well-behaved client measured among them.

The hostile peers speak ZMTP 3.1 by hand on plain unix sockets (bytes written
here from the spec, rfc.zeromq.org 37, independently of :mod:`nri_sst.zmtp`),
so they can send what no libzmq peer would: garbage, frames of any size
generated as they are sent, endless multipart messages, requests whose replies
they never read. ``python hostile.py SOCKET KIND... --seconds S`` runs a
flood in its own process (one thread per kind), so that the measured client
in the test process shares no interpreter lock with the attackers; the bench
(``tests/bench/bench_sst.py``) runs the same flood.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from nri_sst import messages as m
from nri_sst.client import HelperUnavailable, SyncHelperClient

MORE, LONG, COMMAND = 0x01, 0x02, 0x04
GREETING = (
    bytes([0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 1])  # signature (as libzmq pads it), 3.1
    + b"NULL"
    + bytes(16)
    + b"\x00"  # as-server
    + bytes(31)
)


def frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) <= 255:
        return bytes([flags, len(body)]) + body
    return bytes([flags | LONG]) + len(body).to_bytes(8, "big") + body


def header(size: int, flags: int = 0) -> bytes:
    return bytes([flags | LONG]) + size.to_bytes(8, "big")


def ready(socket_type: bytes) -> bytes:
    props = b"\x0bSocket-Type" + len(socket_type).to_bytes(4, "big") + socket_type
    props += b"\x08Identity" + (0).to_bytes(4, "big")
    return frame(b"\x05READY" + props, COMMAND)


def request(payload: bytes, rid: bytes = b"hostile!") -> bytes:
    return frame(b"", MORE) + frame(rid, MORE) + frame(payload)


HELLO = request(m.encode(m.Hello(protocol=1)))
DISCOVER = request(m.encode(m.Discover()))
CONNECTIONS: Counter[str] = Counter()
"""Connections made, by the name of the thread that made them (in a flood:
the attack's kind)."""
CONNECTED = "flood: every attacker connected; connections "
ENDED = "flood: ended; connections "


class RawPeer:
    """One connection to the helper; ``handshake`` does greeting and READY."""

    def __init__(
        self,
        path: Path,
        handshake: bool = True,
        socket_type: bytes = b"DEALER",
        timeout: float = 2.0,
    ):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        CONNECTIONS[threading.current_thread().name] += 1
        if handshake:
            self.sock.sendall(GREETING + ready(socket_type))
            self.read_exactly(64)  # the helper's greeting
            self.read_frame()  # its READY

    def read_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the helper")
            data += chunk
        return data

    def read_frame(self) -> tuple[int, bytes]:
        flags = self.read_exactly(1)[0]
        n = self.read_exactly(8 if flags & LONG else 1)
        return flags, self.read_exactly(int.from_bytes(n, "big"))

    def read_message(self) -> list[bytes]:
        frames = []
        while True:
            flags, body = self.read_frame()
            frames.append(body)
            if not flags & MORE:
                return frames

    def closed_by_helper(self, timeout: float = 2.0) -> bool:
        """Reads (and drops) until the helper closes the connection."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


# --------------------------------------------------------------------------- attacks
# Each runs until ``stop`` is set; every connection error just starts over.

Attack = Callable[[Path, threading.Event], None]


def _again(path: Path, stop: threading.Event, one: Callable[[Path], None]) -> None:
    while not stop.is_set():
        try:
            one(path)
        except OSError:
            time.sleep(0.001)


def garbage(path: Path, stop: threading.Event) -> None:
    """Connect, send random bytes (no greeting), hang up."""
    rnd = random.Random(1)

    def one(p: Path) -> None:
        peer = RawPeer(p, handshake=False)
        try:
            peer.sock.sendall(rnd.randbytes(rnd.randrange(1, 4096)))
        finally:
            peer.close()

    _again(path, stop, one)


def oversized(path: Path, stop: threading.Event) -> None:
    """Requests with one 1 MiB payload frame."""
    big = bytes(1 << 20)

    def one(p: Path) -> None:
        peer = RawPeer(p)
        try:
            while not stop.is_set():
                peer.sock.sendall(frame(b"", MORE) + frame(b"12345678", MORE) + header(len(big)))
                peer.sock.sendall(big)
        finally:
            peer.close()

    _again(path, stop, one)


def multi_frame(path: Path, stop: threading.Event, frames: int = 256, size: int = 1 << 20) -> None:
    """One message of ``frames`` frames of ``size`` bytes, generated as it is sent."""
    chunk = bytes(size)

    def one(p: Path) -> None:
        peer = RawPeer(p)
        try:
            peer.sock.sendall(frame(b"", MORE) + frame(b"12345678", MORE))
            for i in range(frames):
                if stop.is_set():
                    return
                peer.sock.sendall(header(size, MORE if i < frames - 1 else 0))
                peer.sock.sendall(chunk)
        finally:
            peer.close()

    _again(path, stop, one)


def small_frames(path: Path, stop: threading.Event) -> None:
    """One message of 2000 frames of 60 KB (each under any per-frame limit)."""
    multi_frame(path, stop, frames=2000, size=60_000)


def non_reader(path: Path, stop: threading.Event) -> None:
    """Hello, then Discover after Discover, never reading a reply."""

    def one(p: Path) -> None:
        peer = RawPeer(p)
        try:
            peer.sock.sendall(HELLO)
            while not stop.is_set():
                peer.sock.sendall(DISCOVER * 16)
        finally:
            peer.close()

    _again(path, stop, one)


def discover_flood(path: Path, stop: threading.Event) -> None:
    """A client that does nothing wrong but ask, as fast as it can (the largest reply)."""

    def one(p: Path) -> None:
        peer = RawPeer(p)
        try:
            peer.sock.sendall(HELLO)
            peer.read_message()
            while not stop.is_set():
                peer.sock.sendall(DISCOVER)
                peer.read_message()
        finally:
            peer.close()

    _again(path, stop, one)


def churn(path: Path, stop: threading.Event) -> None:
    """Connections opened and dropped, half of them mid-greeting."""
    n = 0

    def one(p: Path) -> None:
        nonlocal n
        n += 1
        peer = RawPeer(p, handshake=False)
        if n % 2:
            peer.sock.sendall(GREETING[:20])
        peer.close()

    _again(path, stop, one)


ATTACKS: dict[str, Attack] = {
    "garbage": garbage,
    "oversized": oversized,
    "multi-frame": multi_frame,
    "small-frames": small_frames,
    "non-reader": non_reader,
    "discover-flood": discover_flood,
    "churn": churn,
}
FLOOD = ["garbage", "oversized", "multi-frame", "small-frames", "non-reader", "churn"]
"""The bounded flood of the latency test and the bench: several hostile clients."""


def run(path: Path, kinds: list[str], seconds: float) -> None:
    """The flood; says on stdout when every attack has connected, and at the
    end, with the connections of each (:data:`CONNECTED`, :data:`ENDED`)."""
    stop = threading.Event()
    threads = [
        threading.Thread(target=ATTACKS[k], args=(path, stop), name=k, daemon=True) for k in kinds
    ]
    for t in threads:
        t.start()
    end = time.monotonic() + seconds
    said = False
    while time.monotonic() < end:
        if not said and all(CONNECTIONS[k] for k in kinds):
            print(CONNECTED + json.dumps(dict(CONNECTIONS)), flush=True)
            said = True
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join(5)
    print(ENDED + json.dumps(dict(CONNECTIONS)), flush=True)


@contextmanager
def flood(path: Path, kinds: list[str], seconds: float) -> Iterator[subprocess.Popen[str]]:
    """The attack ``kinds`` from another process for at most ``seconds``."""
    proc = subprocess.Popen(
        [sys.executable, __file__, str(path), *kinds, "--seconds", str(seconds)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def connections(proc: subprocess.Popen[str], said: str, timeout: float = 20.0) -> dict[str, int]:
    """Wait (at most ``timeout``) for the flood ``proc`` to say ``said``
    (:data:`CONNECTED`, :data:`ENDED`); the connections of each attack then."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
            raise TimeoutError(f"the flood did not say {said!r} within {timeout} s")
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the flood exited ({proc.wait(10)}) before saying {said!r}")
        if line.startswith(said):
            counts: dict[str, int] = json.loads(line[len(said) :])
            return counts


# --------------------------------------------------------------------------- the measured client


def latencies(
    endpoint: str, until: Callable[[], bool], interval: float = 0.005, timeout: float = 0.1
) -> list[float]:
    """Seconds of each GetClosConfig round trip of a well-behaved client
    (``timeout``: the plugin's 100 ms budget) until ``until()``; a miss raises
    ``HelperUnavailable``."""
    out: list[float] = []
    with SyncHelperClient(endpoint, timeout=timeout) as c:
        connected = time.monotonic() + 2.0
        while True:  # the client fails fast while its socket is not connected
            try:
                c.call(m.Hello(protocol=1), m.HelloReply, timeout=2.0)
                break
            except HelperUnavailable:
                if time.monotonic() >= connected:
                    raise
                time.sleep(0.01)
        while not until():
            t0 = time.perf_counter()
            c.call(m.GetClosConfig(clos=0), m.GetClosConfigReply)
            out.append(time.perf_counter() - t0)
            time.sleep(interval)
    return out


__all__ = ["ATTACKS", "CONNECTED", "ENDED", "FLOOD", "RawPeer", "connections", "flood", "latencies"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("socket", type=Path)
    ap.add_argument("kinds", nargs="+", choices=sorted(ATTACKS))
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    run(args.socket, args.kinds, args.seconds)

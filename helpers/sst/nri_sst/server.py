"""``nri-sst-helper serve``: the helper's socket file, its peers and its event loop.

The helper is a ZeroMQ ROUTER on the wire (the plugin's pyzmq DEALER connects
to it), spoken by :mod:`nri_sst.zmtp` over non-blocking unix sockets in one
``selectors`` loop, so that everything a peer can cost is bounded here (see
:mod:`nri_sst.zmtp` for why not libzmq). Requests are ``[b"", request_id,
payload]``, replies ``[b"", request_id, reply]``; anything else gets an
``ErrorReply`` and the helper lives on.

Bounds, whatever the peers do:

* **connections**: at most :data:`MAX_CONNECTIONS`, and never more than the
  ``nofile`` limit leaves after :data:`FD_RESERVE` (the soft limit is raised
  to the hard one at start). At the cap a new connection replaces the oldest
  one that has not said Hello; when every one has, accepting waits (the
  kernel's backlog holds the rest). A failing ``accept`` (``EMFILE`` after the
  limit was lowered from outside) pauses accepting for
  :data:`ACCEPT_BACKOFF`, never ends the helper.
* **memory**: per connection one request (:data:`~nri_sst.messages.MAX_MESSAGE_SIZE`)
  and one read in, :data:`MAX_PENDING_OUTPUT` out: the requests of a peer
  that does not read its replies are not read.
* **time**: one request per turn of the loop, of the peer that asked least
  lately, so flooding peers delay a client by about one request however many
  they are; no call waits on a peer.

The socket file lives in a directory shared with the unprivileged plugin, so
its path is never trusted: an existing path is replaced only when it is a
socket nobody answers on (a helper that died); a symlink, a directory, a
file or a live socket make the helper refuse to start. The socket gets its
mode from the umask around ``bind`` (no chmod, which would follow a symlink
swapped in); after bind, ``lstat`` must show a socket of ours with that mode,
and at exit the path is removed only while it is still that socket (same
device and inode).

SIGTERM/SIGINT stop the loop; in managed mode (after PrepareManagedMode,
before Teardown) the helper first resets SST: CPReset, then TF disable, then
CP disable on every package.
"""

from __future__ import annotations

import itertools
import logging
import os
import resource
import selectors
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from nri_sst import messages as m
from nri_sst import zmtp
from nri_sst.backends.base import Backend
from nri_sst.handler import RequestHandler
from nri_sst.hostfs import MAX_KEPT_FILES
from nri_sst.retry import Backoff, Obstacle, Reporter

log = logging.getLogger("nri_sst")

MAX_CONNECTIONS = 32
"""Peers connected at once (the plugin needs one; ``info`` one more)."""
FD_RESERVE = 16 + MAX_KEPT_FILES
"""File descriptors kept free of connections for the backend and sysfs writes
(the writer's kept C-state files among them)."""
BACKLOG = 32
ACCEPT_BURST = 16
ACCEPT_BACKOFF = 0.1
"""Seconds without accepting after ``accept`` failed (EMFILE, ENFILE, ENOMEM)."""
RECV_CHUNK = 16 * 1024
MAX_PENDING_OUTPUT = 128 * 1024
"""Unsent reply bytes of one peer above which its requests are not read."""
FRAME_OVERHEAD = 64
"""Room for the empty delimiter and the request id beside the payload."""
DISCARD_LIMIT = 1024 * 1024
"""Bytes of one refused message read and thrown away before its peer is dropped."""
DISCARD_FRAMES = 64
LOAD_DECAY = 0.99
"""How a peer's load fades per turn (of anybody's): ~100 turns to forget."""
WIRE_ERROR = "expected frames [b'', request_id, payload]"


class ServeError(Exception):
    """The helper cannot serve on this endpoint (the message says why)."""


def ipc_path(endpoint: str) -> Path:
    """The socket file of an ``ipc://`` endpoint; anything else is refused.

    Only a socket file restricts who connects (its mode and its directory):
    ``tcp://`` and the abstract namespace (``ipc://@name``) let anyone in."""
    if not endpoint.startswith("ipc://"):
        raise ServeError(
            f"--socket {endpoint!r}: only ipc:// endpoints are served "
            "(a socket file that only the pod's containers reach; tcp:// has no authentication)"
        )
    path = endpoint.removeprefix("ipc://")
    if path.startswith("@"):
        raise ServeError(f"--socket {endpoint!r}: abstract ipc sockets have no access control")
    if not path.startswith("/"):
        raise ServeError(f"--socket {endpoint!r}: the socket path must be absolute")
    if len(os.fsencode(path)) > 107:
        raise ServeError(f"--socket {endpoint!r}: the socket path is longer than 107 bytes")
    return Path(path)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a socket"


def _answered(path: Path) -> bool:
    """Somebody accepts connections on the socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except TimeoutError:
        return True  # a full backlog: alive
    except OSError as exc:
        raise ServeError(f"{path}: cannot tell whether a helper serves there: {exc}") from None
    finally:
        probe.close()
    return True


class SocketFile:
    """The bound, listening socket and the file it made (device and inode)."""

    def __init__(self, path: Path, mode: int = 0o600) -> None:
        self.path = path
        self._clear_stale()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o777 & ~mode)
        try:
            sock.bind(str(path))
        except OSError as exc:
            sock.close()
            raise ServeError(f"cannot bind {path}: {exc.strerror}") from None
        finally:
            os.umask(old)
        try:  # what the path names now, never following a symlink
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            sock.close()
            raise ServeError(f"{path} vanished right after bind: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if (
            not stat.S_ISSOCK(st.st_mode)
            or stat.S_IMODE(st.st_mode) != mode
            or st.st_uid != os.geteuid()
        ):
            sock.close()  # not ours any more: leave the path alone
            raise ServeError(
                f"{path} is not the socket just bound ({_kind(st.st_mode)}, mode "
                f"{stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): refusing to serve"
            )
        self.identity = (st.st_dev, st.st_ino)
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self.sock = sock

    def _clear_stale(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ServeError(
                f"{self.path} exists and is {_kind(st.st_mode)}: refusing to replace it"
            )
        if _answered(self.path):
            raise ServeError(f"{self.path}: another helper is serving on this socket")
        self.path.unlink(missing_ok=True)
        log.info("nri-sst-helper: removed the stale socket %s", self.path)

    def close(self) -> None:
        """Close the socket; remove the file only while it is still the one we made."""
        self.sock.close()
        try:
            st = os.lstat(self.path)
        except OSError:
            return
        if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self.identity:
            self.path.unlink(missing_ok=True)


def raise_nofile_limit() -> int:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit; returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("nri-sst-helper: cannot raise the nofile limit to %d: %s", hard, exc)
    return soft


def open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:
        return FD_RESERVE


class Peer:
    """One connected client."""

    __slots__ = ("ident", "load", "mask", "out", "pending", "served", "sock", "wire")

    def __init__(self, ident: bytes, sock: socket.socket) -> None:
        self.ident = ident
        self.sock = sock
        self.wire = zmtp.Connection(
            max_size=m.MAX_MESSAGE_SIZE + FRAME_OVERHEAD,
            max_frames=3,
            discard_limit=DISCARD_LIMIT,
            discard_frames=DISCARD_FRAMES,
        )
        self.out = bytearray()
        self.pending: zmtp.Event | None = None
        """The next complete event, read but not handled yet."""
        self.served = 0
        """When its last event was handled (the server's turn count)."""
        self.load = 0.0
        """Events handled lately: +1 each, decaying by :data:`LOAD_DECAY` a turn."""
        self.mask = 0


class Server:
    def __init__(self, endpoint: str, handler: RequestHandler, socket_mode: int = 0o600) -> None:
        self.endpoint = endpoint
        self.handler = handler
        path = ipc_path(endpoint)
        limit = raise_nofile_limit()
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.listener = SocketFile(path, socket_mode)
        self.selector.register(self.listener.sock, selectors.EVENT_READ)
        self.max_connections = min(MAX_CONNECTIONS, limit - open_fds() - FD_RESERVE)
        if self.max_connections < 2:
            self.listener.close()
            raise ServeError(f"the nofile limit {limit} leaves no file descriptors for peers")
        self.peers: dict[int, Peer] = {}
        """By file descriptor, oldest connection first."""
        self._ids = itertools.count(1)
        self._turns = 0
        self._accepting = True
        self._resume_at: float | None = None
        """When accepting resumes after a failed accept (None: when a peer leaves)."""
        self._full_logged = False
        self._deferred_failed: set[str] = set()
        """the deferred work whose last run failed (logged once)"""
        self._busy = False
        self._wakeup_set = False
        self.stopping = False

    # ------------------------------------------------------------------ loop

    def stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.stopping = True

    def serve_forever(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        self._wakeup_set = True
        log.info(
            "nri-sst-helper: serving on %s (backend %s)", self.endpoint, self.handler.backend.name
        )
        while not self.stopping:
            self.run_once()
        return self.shutdown()

    def run_once(self) -> None:
        """One turn: wait for I/O (not at all while a request is pending), read,
        accept, then handle one event (see :meth:`_serve_one`)."""
        backend = self.handler.backend
        timeout = 0.0 if self._busy else 0.01 if backend.has_deferred() else 1.0
        if self._resume_at is not None:
            timeout = max(0.0, min(timeout, self._resume_at - time.monotonic()))
        ready = self.selector.select(timeout)
        touched: list[Peer] = []
        for key, mask in ready:
            if key.fileobj is self.listener.sock:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._drain_wakeups()
            elif (peer := self.peers.get(key.fd)) is not None and self._io(peer, mask):
                touched.append(peer)
        busy = self._busy
        served = self._serve_one()
        self._busy = served is not None
        if served is not None:
            touched.append(served)
        # what each peer touched this turn waits for next, once: a request read
        # and answered in the same turn leaves its peer's interest as it was
        # (no epoll_ctl to stop reading and another to read again)
        for peer in touched:
            if self.peers.get(peer.sock.fileno()) is peer:  # not closed meanwhile
                self._interest(peer)
        if self._resume_at is not None and time.monotonic() >= self._resume_at:
            self._resume_accepting()
        if not ready and not self._busy:
            if busy:  # the last reply is out and nothing waits: the backend catches up
                self._deferred(backend.catch_up)
            elif backend.has_deferred():
                self._deferred(backend.idle)

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _deferred(self, work: Callable[[], None]) -> None:
        """The backend's deferred work (:meth:`~nri_sst.backends.base.Backend.catch_up`
        or ``idle``); a failure is logged once until it succeeds again."""
        name = work.__name__
        try:
            work()
        except OSError as exc:
            if name not in self._deferred_failed:
                log.error("nri-sst-helper: backend deferred work failed: %s", exc)
            self._deferred_failed.add(name)
        else:
            self._deferred_failed.discard(name)

    # ------------------------------------------------------------------ connections

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            victim = None
            if len(self.peers) >= self.max_connections:
                victim = self._oldest_without_session()
                if victim is None:
                    self._pause_accepting(None)
                    return
            try:
                sock, _ = self.listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning(
                    "nri-sst-helper: accept failed (%s); not accepting for %d ms",
                    exc.strerror or exc,
                    ACCEPT_BACKOFF * 1000,
                )
                self._pause_accepting(time.monotonic() + ACCEPT_BACKOFF)
                return
            if victim is not None:
                self._close(victim, "replaced by a new connection (connection limit)")
            sock.setblocking(False)
            peer = Peer(b"\x00" + next(self._ids).to_bytes(4, "big"), sock)
            self.peers[sock.fileno()] = peer
            log.debug("nri-sst-helper: peer %s connected", peer.ident.hex())
            if self._flush(peer):
                self._interest(peer)

    def _oldest_without_session(self) -> Peer | None:
        """The peer to close for a new one at the cap: the oldest that has not said Hello."""
        for peer in self.peers.values():
            if peer.ident not in self.handler.peers:
                return peer
        if not self._full_logged:
            log.warning(
                "nri-sst-helper: %d peers connected, all in session: new connections wait",
                len(self.peers),
            )
            self._full_logged = True
        return None

    def _pause_accepting(self, until: float | None) -> None:
        if self._accepting:
            self.selector.unregister(self.listener.sock)
            self._accepting = False
        self._resume_at = until

    def _resume_accepting(self) -> None:
        self._resume_at = None
        if not self._accepting:
            self.selector.register(self.listener.sock, selectors.EVENT_READ)
            self._accepting = True

    def _close(self, peer: Peer, reason: str) -> None:
        log.debug("nri-sst-helper: peer %s closed: %s", peer.ident.hex(), reason)
        fd = peer.sock.fileno()
        if peer.mask:
            self.selector.unregister(peer.sock)
            peer.mask = 0
        self.peers.pop(fd, None)
        peer.sock.close()
        self.handler.forget(peer.ident)
        if len(self.peers) < self.max_connections:
            self._full_logged = False
            if not self._accepting and self._resume_at is None:
                self._resume_accepting()

    def _interest(self, peer: Peer) -> None:
        want = 0
        if peer.pending is None and len(peer.out) < MAX_PENDING_OUTPUT:
            want |= selectors.EVENT_READ
        if peer.out:
            want |= selectors.EVENT_WRITE
        if want == peer.mask:
            return
        if not peer.mask:
            self.selector.register(peer.sock, want)
        elif not want:
            self.selector.unregister(peer.sock)
        else:
            self.selector.modify(peer.sock, want)
        peer.mask = want

    # ------------------------------------------------------------------ I/O

    def _io(self, peer: Peer, mask: int) -> bool:
        """Send what waits, read what came; False when the peer was closed
        (the caller sets what it waits for next: :meth:`_interest`)."""
        if mask & selectors.EVENT_WRITE and not self._flush(peer):
            return False
        if mask & selectors.EVENT_READ and peer.pending is None:
            try:
                data = peer.sock.recv(RECV_CHUNK)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                self._close(peer, f"receive failed: {exc}")
                return False
            if not data:
                self._close(peer, "closed by the peer")
                return False
            peer.wire.receive(data)
            peer.pending = peer.wire.next_event()
            return self._flush(peer)
        return True

    def _flush(self, peer: Peer) -> bool:
        """Send what can be sent now; False when the peer was closed."""
        peer.out += peer.wire.output()
        if peer.out:
            try:
                sent = peer.sock.send(peer.out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._close(peer, f"send failed: {exc}")
                return False
            del peer.out[:sent]
        return True

    def _serve_one(self) -> Peer | None:
        """Handle one event: of the peer that asked least lately (lowest
        :attr:`Peer.load`) among those that have one and room for its reply.
        A client that asks now and then thus goes before peers that keep the
        helper busy, however many they are. Returns the peer served (None:
        nothing to handle); the caller sets what it waits for next."""
        turn = self._turns
        waiting = [
            p
            for p in self.peers.values()
            if p.pending is not None and len(p.out) < MAX_PENDING_OUTPUT
        ]
        if not waiting:
            return None
        peer = (
            waiting[0]
            if len(waiting) == 1
            else min(waiting, key=lambda p: p.load * LOAD_DECAY ** (turn - p.served))
        )
        event = peer.pending
        assert event is not None  # waiting holds only peers with one
        peer.pending = None
        self._turns += 1
        peer.load = peer.load * LOAD_DECAY ** (self._turns - peer.served) + 1
        peer.served = self._turns
        if isinstance(event, zmtp.Closed):
            self._flush(peer)  # an ERROR command, where there is one
            self._close(peer, event.reason)
            return peer
        reply = self._answer(peer, event)
        if reply is not None:
            peer.out += zmtp.encode_frames(reply)
        peer.pending = peer.wire.next_event()
        self._flush(peer)
        return peer

    def _answer(self, peer: Peer, event: zmtp.Event) -> list[bytes] | None:
        if isinstance(event, zmtp.Message):
            frames = event.frames
            if len(frames) == 3 and frames[0] == b"":
                return [b"", frames[1], self.handler.handle(frames[2], peer.ident)]
            error = m.ErrorReply(code="malformed", message=WIRE_ERROR)
            return [b"", frames[1] if len(frames) > 1 else b"", m.encode(error)]
        if isinstance(event, zmtp.Discarded):
            head = event.head
            rid = head[1] if len(head) > 1 and head[0] == b"" else b""
            if event.frames > 3:
                error = m.ErrorReply(
                    code="malformed", message=f"{WIRE_ERROR}, got {event.frames} frames"
                )
            else:
                error = m.too_large(event.size).reply()
            return [b"", rid, m.encode(error)]
        return None  # Handshake: the peer may send requests now

    # ------------------------------------------------------------------ stop

    def shutdown(self) -> int:
        if self._wakeup_set:
            signal.set_wakeup_fd(-1)
        for peer in list(self.peers.values()):
            self._close(peer, "helper stopping")
        self.listener.close()
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()
        code = 0
        backend = self.handler.backend
        managed = self.handler.managed
        if managed:
            log.info("nri-sst-helper: stopping in managed mode; resetting SST")
            try:
                self.handler.teardown()
            except m.HelperError as exc:
                log.error("nri-sst-helper: teardown failed: %s", exc.message)
                code = 1
        try:
            if managed:
                backend.sync()
            backend.idle()
        except OSError as exc:
            log.error("nri-sst-helper: backend deferred work failed: %s", exc)
            code = 1
        return code


SYSFS_FIX = (
    "mount the node's /sys there: chart hostPath volume hostsysfs (the node's /sys at "
    "/host/sys, --host-root /host)"
)
SOCKET_DIR_FIX = (
    "share the socket's directory with the plugin: chart emptyDir volume sst-ipc, mounted at "
    "/run/nri-sst in both the sst-helper and the plugin container"
)


def pod_obstacle(path: Path, host_root: Path) -> Obstacle | None:
    """What the pod lacks for serving on ``path``: the socket's directory, or
    the host's sysfs under ``host_root`` (both mounts of the chart's pod)."""
    if not path.parent.is_dir():
        return Obstacle(str(path.parent), "does not exist (the socket's directory)", SOCKET_DIR_FIX)
    cpu = Path(host_root) / "sys/devices/system/cpu"
    if not cpu.is_dir():
        return Obstacle(str(cpu), "does not exist (sysfs not mounted)", SYSFS_FIX)
    return None


def wait_for_pod(path: Path, host_root: Path, backoff: Backoff) -> bool:
    """Until :func:`pod_obstacle` finds nothing (``True``), retrying with
    ``backoff`` and logging the obstacle rarely (:mod:`nri_sst.retry`): a pod
    lacking a mount is no reason to exit into a crash loop. ``False`` when
    SIGTERM/SIGINT came first."""
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    reporter = Reporter(log)
    attempt = 0
    try:
        while (obstacle := pod_obstacle(path, host_root)) is not None:
            attempt += 1
            reporter.failed(f"nri-sst-helper: cannot serve: {obstacle}")
            delay = backoff.next()
            log.debug("nri-sst-helper: attempt %d failed, retrying in %.2fs", attempt, delay)
            if stopped.wait(delay):
                return False
        if attempt:
            reporter.cleared(f"nri-sst-helper: {path.parent} and {host_root} are there now")
        return True
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def serve(endpoint: str, backend: Backend, host_root: Path) -> int:
    """Serve until SIGTERM; 1 when the socket cannot be served (logged why):
    what is unsafe at the socket path (a symlink, a file, a live helper) is
    refused at once (a pod lacking a mount is waited out before, by
    :func:`wait_for_pod`)."""
    handler = RequestHandler(backend, host_root)
    backend.sync()
    try:
        server = Server(endpoint, handler)
    except ServeError as exc:
        log.error("nri-sst-helper: %s", exc)
        return 1
    return server.serve_forever()

"""``nri-sst-helper serve``: the ZeroMQ ROUTER loop around :class:`RequestHandler`.

Frames: ``[peer, b"", request_id, payload]`` in, ``[peer, b"", request_id, reply]``
out. Anything else (wrong frame count, oversized payload, garbage) gets an
``ErrorReply`` when there is a peer to answer, and the server lives on.

The ipc socket file is made 0600 right after bind (with a 0177 umask around the
bind, so it is never more open). SIGTERM/SIGINT stop the loop; in managed mode
(after PrepareManagedMode, before Teardown) the helper first resets SST:
CPReset, then TF disable, then CP disable on every package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path
from types import FrameType

import zmq

from nri_sst import messages as m
from nri_sst.backends.base import Backend
from nri_sst.handler import RequestHandler

log = logging.getLogger("nri_sst")

RCV_LIMIT = 1024 * 1024
"""ZeroMQ drops peers sending frames above this; 64 KiB..1 MiB get an ErrorReply."""


def ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint.removeprefix("ipc://")) if endpoint.startswith("ipc://") else None


class Server:
    def __init__(self, endpoint: str, handler: RequestHandler, socket_mode: int = 0o600) -> None:
        self.endpoint = endpoint
        self.handler = handler
        self.socket_mode = socket_mode
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, RCV_LIMIT)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.stopping = False
        path = ipc_path(endpoint)
        if path is not None and path.exists():
            path.unlink()  # a stale socket of a previous helper
        old = os.umask(0o177)
        try:
            self.sock.bind(endpoint)
        finally:
            os.umask(old)
        if path is not None:
            os.chmod(path, socket_mode)

    def stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.stopping = True

    def serve_forever(self) -> int:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        log.info(
            "nri-sst-helper: serving on %s (backend %s)", self.endpoint, self.handler.backend.name
        )
        backend = self.handler.backend
        while not self.stopping:
            try:
                ready = self.sock.poll(10 if backend.has_deferred() else 100, zmq.POLLIN)
            except zmq.ZMQError:
                continue  # EINTR from a signal
            if ready:
                self.serve_one()
            elif backend.has_deferred():
                backend.idle()
        return self.shutdown()

    def serve_one(self) -> None:
        try:
            frames = self.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.ZMQError:
            return
        if not frames:
            return
        peer = frames[0]
        if len(frames) == 4 and frames[1] == b"":
            rid, payload = frames[2], frames[3]
            reply = self.handler.handle(payload, peer)
        else:
            rid = frames[2] if len(frames) > 2 else b""
            reply = m.encode(
                m.ErrorReply(
                    code="malformed",
                    message="expected frames [b'', request_id, payload]",
                )
            )
        try:
            self.sock.send_multipart([peer, b"", rid, reply], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.warning("nri-sst-helper: reply dropped: %s", exc)

    def shutdown(self) -> int:
        code = 0
        if self.handler.managed:
            log.info("nri-sst-helper: stopping in managed mode; resetting SST")
            try:
                self.handler.teardown()
            except m.HelperError as exc:
                log.error("nri-sst-helper: teardown failed: %s", exc.message)
                code = 1
            finally:
                self.handler.backend.sync()
        self.handler.backend.idle()
        self.sock.close(0)
        path = ipc_path(self.endpoint)
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
        return code


def serve(endpoint: str, backend: Backend, host_root: Path) -> int:
    handler = RequestHandler(backend, host_root)
    backend.sync()
    return Server(endpoint, handler).serve_forever()

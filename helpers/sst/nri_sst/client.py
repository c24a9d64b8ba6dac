"""Clients of the helper: :class:`HelperClient` (asyncio) and :class:`SyncHelperClient`.

Both are ZeroMQ DEALERs with a per-request timeout (default 100 ms). Each
request carries an 8-byte id; replies with another id (late answers to timed
out requests) are dropped. A timeout, a helper that is not there, or a helper
speaking garbage raises :class:`HelperUnavailable`; a typed refusal raises
:class:`HelperRequestError` with the helper's code and message. ZeroMQ
reconnects by itself; after a timeout the socket is recreated so no stale
request is delivered to a restarted helper, and the Hello handshake is redone
transparently when the helper asks for it.

Typical use::

    async with HelperClient("ipc:///run/nri-sst/helper.sock") as sst:
        info = await sst.request(Discover())          # -> DiscoverReply
        await sst.request(AssociateCpus(clos=0, cpus=[32, 160]))
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from types import TracebackType
from typing import Any, TypeVar, cast

import msgspec
import zmq
import zmq.asyncio

from nri_sst import PROTOCOL_VERSION
from nri_sst import messages as m

DEFAULT_TIMEOUT = 0.1
R = TypeVar("R")


class HelperUnavailable(Exception):
    """The helper did not answer in time, is not running, or answered garbage."""


class HelperRequestError(Exception):
    """The helper refused a request with a typed :class:`~nri_sst.messages.ErrorReply`."""

    def __init__(self, error: m.ErrorReply) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.code = error.code
        self.message = error.message


def _configure(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 20)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)


def _expect(req: m.Request, reply: m.Reply) -> m.Reply:
    if isinstance(reply, m.ErrorReply):
        raise HelperRequestError(reply)
    want = m.REPLY_FOR[type(req)]
    if not isinstance(reply, want):
        raise HelperUnavailable(f"helper answered {type(reply).__name__} to {type(req).__name__}")
    return reply


class _Base:
    def __init__(self, endpoint: str, timeout: float, client: str) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.client = client
        self._ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 16)
        self._hello_reply: m.HelloReply | None = None
        self.handshakes = 0
        """How many Hello handshakes succeeded: a change tells a caller that the
        connection was re-established (a timeout, or a restarted helper that
        asked for the handshake again), so helper-side state may be gone."""

    @property
    def hello(self) -> m.HelloReply | None:
        """The reply of the current connection's handshake."""
        return self._hello_reply

    @hello.setter
    def hello(self, reply: m.HelloReply | None) -> None:
        if reply is not None:
            self.handshakes += 1
        self._hello_reply = reply

    def _frames(self, req: m.Request) -> tuple[bytes, list[bytes]]:
        rid = (next(self._ids) & (2**64 - 1)).to_bytes(8, "little")
        return rid, [b"", rid, m.encode(req)]

    @staticmethod
    def _parse(rid: bytes, frames: list[bytes]) -> m.Reply | None:
        if len(frames) != 3 or frames[0] != b"" or frames[1] != rid:
            return None  # a late reply to an earlier request
        try:
            return m.decode_reply(frames[2])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise HelperUnavailable(f"undecodable reply from helper: {exc}") from None

    def _hello(self) -> m.Hello:
        return m.Hello(protocol=PROTOCOL_VERSION, capabilities=[], client=self.client)


class HelperClient(_Base):
    """asyncio DEALER client; one request in flight at a time (serialised)."""

    def __init__(
        self, endpoint: str, timeout: float = DEFAULT_TIMEOUT, client: str = "nri-resource-policy"
    ) -> None:
        super().__init__(endpoint, timeout, client)
        self.ctx = zmq.asyncio.Context.instance()
        self.sock: zmq.asyncio.Socket | None = None
        self._lock = asyncio.Lock()

    def _socket(self) -> zmq.asyncio.Socket:
        if self.sock is None:
            self.sock = self.ctx.socket(zmq.DEALER)
            _configure(self.sock)
            self.sock.connect(self.endpoint)
        return self.sock

    def _reset(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
        self.hello = None

    def close(self) -> None:
        self._reset()

    async def __aenter__(self) -> HelperClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def _roundtrip(self, req: m.Request, timeout: float) -> m.Reply:
        sock = self._socket()
        rid, frames = self._frames(req)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    await sock.send_multipart(frames, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    if time.monotonic() >= deadline:
                        raise HelperUnavailable(
                            f"helper at {self.endpoint} not connected ({type(req).__name__})"
                        ) from None
                    await asyncio.sleep(0.002)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not await sock.poll(int(left * 1000) + 1):
                    raise HelperUnavailable(
                        f"helper at {self.endpoint} did not answer {type(req).__name__} "
                        f"within {timeout * 1000:.0f} ms"
                    )
                reply = self._parse(rid, await sock.recv_multipart())
                if reply is not None:
                    return reply
        except HelperUnavailable:
            self._reset()
            raise

    async def request(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        """Send ``req``, return its typed reply (see ``messages.REPLY_FOR``)."""
        t = self.timeout if timeout is None else timeout
        async with self._lock:
            if self.hello is None and not isinstance(req, m.Hello):
                self.hello = cast(
                    m.HelloReply, _expect(self._hello(), await self._roundtrip(self._hello(), t))
                )
            reply = await self._roundtrip(req, t)
            if isinstance(reply, m.ErrorReply) and reply.code == "handshake-required":
                self.hello = cast(
                    m.HelloReply, _expect(self._hello(), await self._roundtrip(self._hello(), t))
                )
                reply = await self._roundtrip(req, t)
            result = _expect(req, reply)
            if isinstance(result, m.HelloReply):
                self.hello = result
            return result

    async def call(self, req: m.Request, want: type[R], timeout: float | None = None) -> R:
        """``request`` narrowed to the expected reply type ``want``."""
        reply = await self.request(req, timeout)
        if not isinstance(reply, want):
            raise HelperUnavailable(f"unexpected reply {type(reply).__name__}")
        return reply


class SyncHelperClient(_Base):
    """Blocking twin of :class:`HelperClient` (CLI, benchmarks, threads)."""

    def __init__(
        self, endpoint: str, timeout: float = DEFAULT_TIMEOUT, client: str = "nri-sst-helper"
    ) -> None:
        super().__init__(endpoint, timeout, client)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock: zmq.Socket[bytes] | None = None
        self._rcvtimeo = -1

    def _socket(self) -> zmq.Socket[bytes]:
        if self.sock is None:
            self.sock = self.ctx.socket(zmq.DEALER)
            _configure(self.sock)
            self.sock.connect(self.endpoint)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None
        self._rcvtimeo = -1
        self.hello = None

    def __enter__(self) -> SyncHelperClient:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _roundtrip(self, req: m.Request, timeout: float) -> m.Reply:
        sock = self._socket()
        rid, frames = self._frames(req)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    sock.send_multipart(frames, zmq.NOBLOCK)
                    break
                except zmq.Again:
                    if time.monotonic() >= deadline:
                        raise HelperUnavailable(
                            f"helper at {self.endpoint} not connected ({type(req).__name__})"
                        ) from None
                    time.sleep(0.002)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise zmq.Again()
                ms = int(left * 1000) + 1
                if ms != self._rcvtimeo:  # a blocking receive with a timeout:
                    sock.setsockopt(zmq.RCVTIMEO, ms)  # one call, no separate poll
                    self._rcvtimeo = ms
                reply = self._parse(rid, sock.recv_multipart())
                if reply is not None:
                    return reply
        except zmq.Again:
            self.close()
            raise HelperUnavailable(
                f"helper at {self.endpoint} did not answer {type(req).__name__} "
                f"within {timeout * 1000:.0f} ms"
            ) from None
        except HelperUnavailable:
            self.close()
            raise

    def request(self, req: m.Request, timeout: float | None = None) -> m.Reply:
        t = self.timeout if timeout is None else timeout
        if self.hello is None and not isinstance(req, m.Hello):
            self.hello = cast(
                m.HelloReply, _expect(self._hello(), self._roundtrip(self._hello(), t))
            )
        reply = self._roundtrip(req, t)
        if isinstance(reply, m.ErrorReply) and reply.code == "handshake-required":
            self.hello = cast(
                m.HelloReply, _expect(self._hello(), self._roundtrip(self._hello(), t))
            )
            reply = self._roundtrip(req, t)
        result = _expect(req, reply)
        if isinstance(result, m.HelloReply):
            self.hello = result
        return result

    def call(self, req: m.Request, want: type[R], timeout: float | None = None) -> R:
        """``request`` checked against the expected reply type (for typed callers)."""
        reply = self.request(req, timeout)
        if not isinstance(reply, want):
            raise HelperUnavailable(f"unexpected reply {type(reply).__name__}")
        return reply

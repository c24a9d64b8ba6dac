"""One plugin connection, seen from the runtime: register, calls with deadlines.

The runtime side of the trunk (:class:`~nri_framework.nri.connection.NriConnection`
with :attr:`Role.RUNTIME`) over an asyncio stream: it serves
``nri.pkg.api.v1alpha1.Runtime`` on conn 2 (RegisterPlugin, UpdateContainers)
and calls ``nri.pkg.api.v1alpha1.Plugin`` on conn 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from nri_framework.model import Event
from nri_framework.nri.connection import ConnectionClosed, NriConnection, NriEvent, Role
from nri_framework.nri.ttrpc import (
    MAX_MESSAGE,
    Code,
    ProtocolNotice,
    RequestReceived,
    ResponseReceived,
)
from nri_framework.pb import nri_pb2 as pb
from nri_framework.stub import PLUGIN_INDEX_RE, PLUGIN_NAME_RE

log = logging.getLogger("nri_framework.simulate")

M = TypeVar("M", bound=Message)
UpdateHandler = Callable[
    ["PluginPeer", list[pb.ContainerUpdate]], Awaitable[list[pb.ContainerUpdate]]
]


class PluginError(Exception):
    """A call to a plugin failed."""


class FatalPluginError(PluginError):
    """Upstream's ``isFatalError``: the plugin is closed and the event goes on without it."""


class PluginStatusError(PluginError):
    """The plugin answered with an error status: the runtime operation fails."""

    def __init__(self, code: int, message: str) -> None:
        name = Code(code).name if code in Code._value2member_map_ else str(code)
        go_name = "".join(p.capitalize() for p in name.split("_"))
        super().__init__(f"rpc error: code = {go_name} desc = {message}")
        self.code = code
        self.message = message


class OversizedRequest(PluginStatusError):
    """The request is larger than the ttrpc limit; nothing was sent."""

    def __init__(self, length: int, maximum: int) -> None:
        super().__init__(
            Code.RESOURCE_EXHAUSTED,
            f"message length {length} exceed maximum message size of {maximum}",
        )
        self.length = length
        self.maximum = maximum


class RegistrationError(Exception):
    """RegisterPlugin carried an invalid name or index."""


def _go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def check_name(name: str) -> None:
    """Upstream's ``api.CheckPluginName``."""
    if not name:
        raise RegistrationError("invalid plugin name: name is empty")
    if not PLUGIN_NAME_RE.match(name):
        bad = next(ch for ch in name if not PLUGIN_NAME_RE.match(ch))
        raise RegistrationError(
            f"invalid plugin name {_go_quote(name)}: contains invalid character '{bad}'"
        )


def check_index(idx: str) -> None:
    """Upstream's ``api.CheckPluginIndex``."""
    if len(idx) != 2:
        raise RegistrationError(f"invalid plugin index {_go_quote(idx)}, must be 2 digits")
    if not PLUGIN_INDEX_RE.match(idx):
        raise RegistrationError(f"invalid plugin index {_go_quote(idx)} (not [0-9][0-9])")


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return 0
    with contextlib.suppress(OSError):
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])
    return 0


class PluginPeer:
    """The runtime's end of one plugin trunk."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_updates: UpdateHandler,
        max_message_size: int = MAX_MESSAGE,
        nri_reported: bool = False,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = NriConnection(Role.RUNTIME)
        self.on_updates = on_updates
        self.max_message_size = max_message_size
        self.nri_reported = nri_reported
        self.pid = _peer_pid(writer)
        self.name = ""
        self.index = ""
        self.nri_version = ""
        self.events = 0
        self.closed = False
        #: v0.12: the plugin answered UNIMPLEMENTED once; events go over StateChange
        self.legacy_events = False
        self.registered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # a refusal may come after the runtime stopped waiting: never "unretrieved"
        self.registered.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._calls: dict[int, asyncio.Future[tuple[int, str, bytes]]] = {}
        #: seconds each answered call took, by method (request sent -> answer read)
        self.call_times: defaultdict[str, list[float]] = defaultdict(list)
        self._tasks: set[asyncio.Task[None]] = set()
        self._reading: asyncio.Task[None] | None = None

    @property
    def full_name(self) -> str:
        return f"{self.index}-{self.name}"

    @property
    def qualified_name(self) -> str:
        return f"external:{self.index or '??'}-{self.name or 'plugin'}[{self.pid}]"

    def subscribed(self, event: Event) -> bool:
        return bool(self.events & event.bit)

    # -- plumbing --------------------------------------------------------------

    def start(self) -> None:
        self._reading = asyncio.create_task(self._read_loop())

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.closed and not self.writer.is_closing():
            self.writer.write(data)

    def close(self) -> None:
        """Close the trunk; pending calls fail with ``ttrpc: closed``."""
        if self.closed:
            return
        self.closed = True
        log.info("connection to plugin %s closed", _go_quote(self.full_name))
        self.writer.close()
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(FatalPluginError("ttrpc: closed"))
        if not self.registered.done():
            self.registered.set_exception(FatalPluginError("connection closed"))
        if self._reading is not None and self._reading is not asyncio.current_task():
            self._reading.cancel()

    async def wait_closed(self) -> None:
        """Wait until the socket is really closed (after :meth:`close`)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        try:
            while not self.closed:
                data = await self.reader.read(65536)
                if not data:
                    break
                self._handle(self.conn.receive_data(data))
                self.flush()
        except (ConnectionError, OSError) as exc:
            log.debug("plugin %s: read failed: %s", self.full_name, exc)
        self.close()

    def _handle(self, events: Sequence[NriEvent]) -> None:
        for ev in events:
            if isinstance(ev, RequestReceived):
                self._dispatch(ev)
            elif isinstance(ev, ResponseReceived):
                fut = self._calls.get(ev.stream_id)
                if fut is not None and not fut.done():
                    fut.set_result((ev.code, ev.message, ev.payload))
            elif isinstance(ev, ProtocolNotice):
                log.warning("plugin %s: %s", self.full_name, ev.reason)
            elif isinstance(ev, ConnectionClosed):
                log.error("plugin %s: %s", self.full_name, ev.reason)
                self.close()

    # -- calls to the plugin -----------------------------------------------------

    async def call(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        deadline: float,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> M:
        """Call ``method``; the answer must arrive before ``deadline`` (loop time)."""
        if self.closed:
            raise FatalPluginError("ttrpc: closed")
        payload = request.SerializeToString()
        if len(payload) > self.max_message_size:
            raise OversizedRequest(len(payload), self.max_message_size)
        loop = asyncio.get_running_loop()
        timeout = max(0.0, deadline - loop.time())
        sid = self.conn.send_request(method, payload, int(timeout * 1e9), metadata)
        fut: asyncio.Future[tuple[int, str, bytes]] = loop.create_future()
        self._calls[sid] = fut
        started = time.perf_counter()
        self.flush()
        try:
            code, message, data = await asyncio.wait_for(fut, timeout)
            self.call_times[method].append(time.perf_counter() - started)
        except TimeoutError:
            self.conn.forget(sid)
            raise FatalPluginError("context deadline exceeded") from None
        finally:
            self._calls.pop(sid, None)
        if code:
            raise PluginStatusError(code, message)
        return response_type.FromString(data)

    # -- the Runtime service -----------------------------------------------------

    def _dispatch(self, ev: RequestReceived) -> None:
        if ev.service != self.conn.served_service:
            self.conn.send_response(
                ev.stream_id, code=Code.UNIMPLEMENTED, message=f"service {ev.service}"
            )
        elif ev.method == "RegisterPlugin":
            self._register(ev)
        elif ev.method == "UpdateContainers":
            task = asyncio.create_task(self._update_containers(ev))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.conn.send_response(
                ev.stream_id, code=Code.UNIMPLEMENTED, message=f"method {ev.method}"
            )

    def _register(self, ev: RequestReceived) -> None:
        try:
            req = pb.RegisterPluginRequest.FromString(ev.payload)
            self._check_registration(req)
        except (DecodeError, RegistrationError) as exc:
            self.conn.send_response(ev.stream_id, code=Code.UNKNOWN, message=str(exc))
            return
        self.name, self.index, self.nri_version = req.plugin_name, req.plugin_idx, req.NRI_version
        suffix = f" (with NRI version {self.nri_version or 'unknown'})" if self.nri_reported else ""
        log.info(
            "plugin %s registered as %s%s",
            _go_quote(self.qualified_name),
            _go_quote(self.full_name),
            suffix,
        )
        self.conn.send_response(ev.stream_id)
        if not self.registered.done():
            self.registered.set_result(None)

    def _check_registration(self, req: pb.RegisterPluginRequest) -> None:
        try:
            check_name(req.plugin_name)
        except RegistrationError as exc:
            self._fail_registration(f"plugin registered with an invalid name: {exc}")
            raise RegistrationError(f"invalid plugin name: {exc}") from None
        try:
            check_index(req.plugin_idx)
        except RegistrationError as exc:
            self._fail_registration(
                f"plugin {_go_quote(req.plugin_name)} registered with an invalid index: {exc}"
            )
            raise RegistrationError(f"invalid plugin index: {exc}") from None

    def _fail_registration(self, reason: str) -> None:
        if not self.registered.done():
            self.registered.set_exception(RegistrationError(reason))

    async def _update_containers(self, ev: RequestReceived) -> None:
        try:
            req = pb.UpdateContainersRequest.FromString(ev.payload)
        except DecodeError as exc:
            self.conn.send_response(ev.stream_id, code=Code.INVALID_ARGUMENT, message=str(exc))
            self.flush()
            return
        log.info("plugin %s requested container updates", _go_quote(self.full_name))
        failed = await self.on_updates(self, list(req.update))
        resp = pb.UpdateContainersResponse(failed=failed)
        self.conn.send_response(ev.stream_id, resp.SerializeToString())
        self.flush()

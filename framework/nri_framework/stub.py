"""The NRI plugin stub over asyncio: connect, register, serve, reconnect.

Converts NRI requests to the domain model, calls the host, and answers.
External mode connects to the runtime's socket; pre-launched mode uses the
socket the runtime passed as fd 3 (``NRI_PLUGIN_SOCKET``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, SupportsIndex

import msgspec
from google.protobuf.message import DecodeError, Message
from nri_sst.retry import Backoff, Obstacle, Reporter

from nri_framework import convert, logsetup
from nri_framework.hookspecs import PolicyError
from nri_framework.host import PolicyHost
from nri_framework.instrumentation import RequestLatency
from nri_framework.model import Event, Update
from nri_framework.nri.connection import (
    ConnectionClosed,
    NriConnection,
    Role,
)
from nri_framework.nri.lifecycle import Lifecycle, LifecycleError, LifecycleEvent
from nri_framework.nri.ttrpc import (
    Code,
    ProtocolNotice,
    RequestReceived,
    ResponseReceived,
    TtrpcError,
)
from nri_framework.nri.versions import runtime_nri_version, synchronizes_prelaunched
from nri_framework.pb import nri_pb2 as pb
from nri_framework.startup import Pause, nri_socket_obstacle, pause_heap, settle_heap

log = logging.getLogger("nri_framework.stub")

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
PLUGIN_NAME_RE = re.compile(r"^[a-zA-Z0-9_.+-]+$")
PLUGIN_INDEX_RE = re.compile(r"^[0-9]{2}$")


class Disconnected(Exception):
    """The trunk to the runtime is gone."""


class StubOptions(msgspec.Struct):
    name: str = "resource-policy"
    index: str = "90"
    socket_path: str = DEFAULT_SOCKET
    #: pre-launched: the inherited socket fd (3); None for external mode
    fd: int | None = None
    #: external mode: reconnect after losing the runtime (else exit non-zero)
    reconnect: bool = True
    register_timeout: float = 5.0
    call_timeout: float = 2.0
    backoff_initial: float = 0.5
    backoff_max: float = 10.0

    @classmethod
    def from_environment(cls, env: dict[str, str] | None = None, **kw: object) -> StubOptions:
        """Pre-launched mode when the runtime set ``NRI_PLUGIN_SOCKET``."""
        env = dict(os.environ if env is None else env)
        opts = cls(**kw)  # type: ignore[arg-type]
        if env.get("NRI_PLUGIN_SOCKET"):
            opts.fd = int(env["NRI_PLUGIN_SOCKET"])
            opts.name = env.get("NRI_PLUGIN_NAME", opts.name)
            opts.index = env.get("NRI_PLUGIN_IDX", opts.index)
            opts.reconnect = False
        return opts

    def validate(self) -> None:
        if not PLUGIN_NAME_RE.match(self.name):
            raise ValueError(f"invalid plugin name {self.name!r}: must match [a-zA-Z0-9_.+-]+")
        if not PLUGIN_INDEX_RE.match(self.index):
            raise ValueError(f"invalid plugin index {self.index!r}: must be two digits")


Handler = Callable[[bytes], bytes]


def wire(msg: Message) -> bytes:
    """Serialize a protobuf message (typed for mypy)."""
    data: bytes = msg.SerializeToString()
    return data


#: Bytes a :class:`TrunkReader` keeps without a sink before it stops reading.
KEPT_MAX = 1 << 16


class TrunkReader(asyncio.StreamReader):
    """The trunk's :class:`asyncio.StreamReader`, which hands what arrives to a
    sink (:meth:`Session.receive`) in the transport's read callback: a request
    is answered in the callback that read it, without waking a task for each
    read or a second turn of the loop (~15 us of every request). What arrives
    while there is no sink is kept for the next one; :meth:`ended` is the
    reason the trunk ended (EOF or the transport's error)."""

    def __init__(self) -> None:
        super().__init__()
        self._sink: Callable[[bytes], None] | None = None
        self._kept = bytearray()
        self._end: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reading: asyncio.BaseTransport | None = None
        self._paused = False

    def set_transport(self, transport: asyncio.BaseTransport) -> None:
        super().set_transport(transport)
        self._reading = transport

    def hand_to(self, sink: Callable[[bytes], None] | None) -> None:
        """Hand what arrives to ``sink`` (first what was kept); ``None``: keep it."""
        self._sink = sink
        if sink is None:
            return
        if self._kept:
            data = bytes(self._kept)
            self._kept.clear()
            sink(data)
        if self._paused and isinstance(self._reading, asyncio.ReadTransport):
            self._paused = False
            self._reading.resume_reading()

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        chunk = bytes(data)  # the transport's bytes themselves (no copy)
        if self._sink is not None:
            self._sink(chunk)
        elif not self._end.done():  # after the end: nobody will read it
            self._kept += chunk
            if len(self._kept) > KEPT_MAX and isinstance(self._reading, asyncio.ReadTransport):
                self._paused = True  # a sink comes soon; until then the peer waits
                self._reading.pause_reading()

    def feed_eof(self) -> None:
        super().feed_eof()
        self.finish("runtime closed the connection")

    def set_exception(self, exc: Exception) -> None:
        super().set_exception(exc)
        self.finish(f"connection lost: {exc}")

    def finish(self, reason: str) -> None:
        """End the trunk for ``reason`` (the first one given stays)."""
        if not self._end.done():
            self._end.set_result(reason)

    def ended_already(self) -> bool:
        return self._end.done()

    async def ended(self) -> str:
        return await asyncio.shield(self._end)


async def open_trunk(
    path: str | None = None, *, sock: socket.socket | None = None
) -> tuple[TrunkReader, asyncio.StreamWriter]:
    """:func:`asyncio.open_unix_connection` with a :class:`TrunkReader`."""
    loop = asyncio.get_running_loop()
    reader = TrunkReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.create_unix_connection(lambda: protocol, path, sock=sock)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class Session:
    """One connected trunk: the read loop, dispatch of requests, our own calls."""

    def __init__(
        self,
        host: PolicyHost,
        opts: StubOptions,
        reader: TrunkReader,
        writer: asyncio.StreamWriter,
        latency: RequestLatency | None = None,
    ) -> None:
        self.host = host
        self.opts = opts
        #: how long each served request took (``/metrics``); the stub's, across sessions
        self.latency = latency if latency is not None else RequestLatency()
        self.reader = reader
        self.writer = writer
        self.conn = NriConnection(Role.PLUGIN)
        self.calls: dict[int, asyncio.Future[tuple[int, str, bytes]]] = {}
        self.sync_pods: list[pb.PodSandbox] = []
        self.sync_containers: list[pb.Container] = []
        self.sync_messages = 0
        self.nri_version: tuple[int, ...] = ()
        self.lifecycle = Lifecycle()
        # waiters on the lifecycle's state, set by advance()
        self.configured = asyncio.Event()
        self.synchronized = asyncio.Event()
        self.registered = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed_reason = ""
        self.handlers: dict[str, Handler] = {}
        #: the pods of this runtime's requests, converted once while resent unchanged
        self.pods = convert.ResentPods()
        self._install_handlers()

    # -- plumbing ------------------------------------------------------------

    def advance(self, event: LifecycleEvent, what: str = "") -> None:
        """Move the lifecycle (raises :class:`LifecycleError`) and wake its waiters."""
        before = self.lifecycle.state
        if self.lifecycle.apply(event, what) is before:
            return  # the waiters it reaches are set already
        for waiter, reached in (
            (self.registered, self.lifecycle.registered),
            (self.configured, self.lifecycle.configured),
            (self.synchronized, self.lifecycle.synchronized),
        ):
            if reached:
                waiter.set()

    def advance_own(self, event: LifecycleEvent) -> None:
        """:meth:`advance` for our own calls: a refusal is a :class:`Disconnected`."""
        try:
            self.advance(event)
        except LifecycleError as exc:
            raise Disconnected(str(exc)) from None

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            logsetup.write_held()  # the lines of a decision before its reply
            self.writer.write(data)

    async def call(
        self,
        method: str,
        request: Message,
        response_type: type[Message],
        timeout: float | None = None,
    ) -> Message:
        """Call ``method`` on the runtime's service and wait for the answer."""
        if self.writer.is_closing():
            raise Disconnected("connection closed")
        timeout = self.opts.call_timeout if timeout is None else timeout
        sid = self.conn.send_request(method, request.SerializeToString(), int(timeout * 1e9))
        fut: asyncio.Future[tuple[int, str, bytes]] = asyncio.get_running_loop().create_future()
        self.calls[sid] = fut
        self.flush()
        try:
            code, message, payload = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.conn.forget(sid)
            raise TtrpcError(Code.DEADLINE_EXCEEDED, f"{method}: no answer in {timeout}s") from None
        finally:
            self.calls.pop(sid, None)
        if code:
            raise TtrpcError(code, message)
        resp = response_type()
        resp.ParseFromString(payload)
        return resp

    async def read_loop(self) -> None:
        """Serve the trunk until it ends: what arrives is handled by :meth:`receive`
        in the transport's read callback (:class:`TrunkReader`)."""
        reader = self.reader
        try:
            reader.hand_to(self.receive)
            if reader.at_eof():  # the end came before us
                reader.finish("runtime closed the connection")
            elif (exc := reader.exception()) is not None:
                reader.finish(f"connection lost: {exc}")
            reason = await reader.ended()
            self.closed_reason = self.closed_reason or reason
        finally:
            reader.hand_to(None)
            self.advance(LifecycleEvent.CONNECTION_LOST)
            for fut in self.calls.values():
                if not fut.done():
                    fut.set_exception(Disconnected(self.closed_reason or "connection closed"))

    def receive(self, data: bytes) -> None:
        """Bytes from the trunk: answer the requests, resolve our calls, send."""
        if self.reader.ended_already():
            return
        for ev in self.conn.receive_data(data):
            if isinstance(ev, RequestReceived):
                self.dispatch(ev)
            elif isinstance(ev, ResponseReceived):
                fut = self.calls.get(ev.stream_id)
                if fut is not None and not fut.done():
                    fut.set_result((ev.code, ev.message, ev.payload))
            elif isinstance(ev, ProtocolNotice):
                log.warning("NRI protocol: %s", ev.reason)
            elif isinstance(ev, ConnectionClosed):
                log.error("closing NRI connection: %s", ev.reason)
                self.closed_reason = ev.reason
                self.reader.finish(ev.reason)
                return
        self.flush()

    def dispatch(self, ev: RequestReceived) -> None:
        """Answer one request. Handlers are synchronous: decisions never interleave."""
        if ev.service != self.conn.served_service:
            self.conn.send_response(
                ev.stream_id, code=Code.UNIMPLEMENTED, message=f"service {ev.service}"
            )
            return
        entry = self.handlers.get(ev.method)
        if entry is None:
            self.conn.send_response(
                ev.stream_id, code=Code.UNIMPLEMENTED, message=f"method {ev.method}"
            )
            return
        latency = self.latency  # its timing() inlined: this is every request's path
        with self.host.replying() as later:
            started = latency.clock()
            try:
                self._answer(ev, entry)
            finally:  # a method of ours: a bounded label set
                latency.observe(ev.method, latency.clock() - started)
            if later:  # the answer leaves before what was left for after it
                self.flush()

    def _answer(self, ev: RequestReceived, handler: Handler) -> None:
        try:
            payload = handler(ev.payload)
        except TtrpcError as exc:
            self.conn.send_response(ev.stream_id, code=exc.code, message=exc.message)
        except LifecycleError as exc:
            log.warning("NRI protocol: %s", exc)
            self.conn.send_response(ev.stream_id, code=Code.FAILED_PRECONDITION, message=str(exc))
        except DecodeError as exc:
            log.warning("%s: undecodable request: %s", ev.method, exc)
            self.conn.send_response(
                ev.stream_id, code=Code.INVALID_ARGUMENT, message=f"{ev.method}: {exc}"
            )
        except PolicyError as exc:
            log.error("%s: %s", ev.method, exc)
            self.conn.send_response(ev.stream_id, code=Code.UNKNOWN, message=str(exc))
        except Exception as exc:
            log.exception("%s failed", ev.method)
            self.conn.send_response(ev.stream_id, code=Code.UNKNOWN, message=f"{ev.method}: {exc}")
        else:
            self.conn.send_response(ev.stream_id, payload)

    # -- Plugin service ------------------------------------------------------

    def _install_handlers(self) -> None:
        h = self.handlers
        h["Configure"] = self.on_configure
        h["Synchronize"] = self.on_synchronize
        h["Shutdown"] = self.on_shutdown
        h["CreateContainer"] = self.on_create_container
        h["UpdateContainer"] = self.on_update_container
        h["StopContainer"] = self.on_stop_container
        h["StateChange"] = self.on_state_change
        h["UpdatePodSandbox"] = self.on_update_pod_sandbox
        # v0.12 dedicated event RPCs: served only when some hook wants the
        # event; otherwise UNIMPLEMENTED makes the runtime fall back to StateChange.
        for method, event, req_type in (
            ("RunPodSandbox", Event.RUN_POD_SANDBOX, pb.RunPodSandboxRequest),
            ("StopPodSandbox", Event.STOP_POD_SANDBOX, pb.StopPodSandboxRequest),
            ("RemovePodSandbox", Event.REMOVE_POD_SANDBOX, pb.RemovePodSandboxRequest),
            ("PostUpdatePodSandbox", Event.POST_UPDATE_POD_SANDBOX, pb.PostUpdatePodSandboxRequest),
            ("PostCreateContainer", Event.POST_CREATE_CONTAINER, pb.PostCreateContainerRequest),
            ("StartContainer", Event.START_CONTAINER, pb.StartContainerRequest),
            ("PostStartContainer", Event.POST_START_CONTAINER, pb.PostStartContainerRequest),
            ("PostUpdateContainer", Event.POST_UPDATE_CONTAINER, pb.PostUpdateContainerRequest),
            ("RemoveContainer", Event.REMOVE_CONTAINER, pb.RemoveContainerRequest),
        ):
            hook = getattr(self.host.hook, f"nri_{event.name.lower()}", None)
            if hook is not None and hook.get_hookimpls():
                h[method] = self._dedicated(method, event, req_type)

    def _dedicated(self, method: str, event: Event, req_type: type[Message]) -> Handler:
        has_container = "container" in req_type.DESCRIPTOR.fields_by_name

        def handle(payload: bytes) -> bytes:
            req: Any = req_type.FromString(payload)
            pod = self.pods.convert(req.pod)
            container = None
            if has_container and req.HasField("container"):
                container = convert.container_from_pb(req.container)
            _check_container(event, container is not None)
            self.advance(_event_kind(container is not None), method)
            self.host.notify(event, pod, container)
            if event is Event.REMOVE_POD_SANDBOX:
                self.pods.forget(pod.id)
            return b""

        return handle

    def on_configure(self, payload: bytes) -> bytes:
        req = pb.ConfigureRequest.FromString(payload)
        self.advance(LifecycleEvent.CONFIGURE)
        runtime = convert.runtime_from_pb(req)
        self.nri_version = runtime_nri_version(runtime.name, runtime.version, runtime.nri_version)
        events = self.host.configure(req.config, runtime)
        if runtime.sent_timeouts:
            # a reconnect waits for RegisterPlugin as long as this runtime admits plugins
            self.opts.register_timeout = runtime.registration_timeout
        log.info(
            "configured by runtime %s %s (NRI %s), subscribed events 0x%x",
            runtime.name,
            runtime.version,
            ".".join(map(str, self.nri_version)) or "unknown",
            events,
        )
        if self.opts.fd is not None and not synchronizes_prelaunched(self.nri_version):
            self.advance(LifecycleEvent.NO_SYNCHRONIZE)
            updates = self.host.restore_without_sync()
            if updates:
                self.background(self.push_restored(updates))
        return wire(pb.ConfigureResponse(events=events))

    def on_synchronize(self, payload: bytes) -> bytes:
        req = pb.SynchronizeRequest.FromString(payload)
        self.advance(LifecycleEvent.SYNCHRONIZE_MORE if req.more else LifecycleEvent.SYNCHRONIZE)
        self.sync_pods.extend(req.pods)
        self.sync_containers.extend(req.containers)
        self.sync_messages += 1
        if req.more:
            # NRI 0.7+: a split Synchronize; every part but the last is answered
            # with more=true and no updates, else the runtime closes us
            return wire(pb.SynchronizeResponse(more=True))
        pause_heap()  # what is converted and decided now lives on (settled below)
        try:
            pods, containers = convert.synchronize_from_pb(self.sync_pods, self.sync_containers)
            self.sync_pods, self.sync_containers = [], []
            messages, self.sync_messages = self.sync_messages, 0
            updates = self.host.synchronize(pods, containers)
        except BaseException:
            settle_heap()
            raise
        log.info(
            "synchronized %d pod(s), %d container(s), %d update(s)%s",
            len(pods),
            len(containers),
            len(updates),
            f", in {messages} messages" if messages > 1 else "",
        )
        resp = pb.SynchronizeResponse()
        for u in updates:
            convert.update_to_pb(u, resp.update.add())
        settle_heap()  # the containers just converted live on: no full collection walks them
        return wire(resp)

    def on_shutdown(self, payload: bytes) -> bytes:
        self.advance(LifecycleEvent.SHUTDOWN)
        log.info("runtime asked us to shut down")
        self.host.shutdown()
        return b""

    def on_create_container(self, payload: bytes) -> bytes:
        req = pb.CreateContainerRequest.FromString(payload)
        self.advance(LifecycleEvent.CONTAINER_EVENT, "CreateContainer")
        result = self.host.create_container(
            self.pods.convert(req.pod), convert.container_from_pb(req.container)
        )
        return wire(convert.create_result_to_pb(result))

    def on_update_container(self, payload: bytes) -> bytes:
        req = pb.UpdateContainerRequest.FromString(payload)
        self.advance(LifecycleEvent.CONTAINER_EVENT, "UpdateContainer")
        updates = self.host.update_container(
            self.pods.convert(req.pod),
            convert.container_from_pb(req.container),
            convert.recent_resources(req.linux_resources),
        )
        resp = pb.UpdateContainerResponse()
        for u in updates:
            convert.update_to_pb(u, resp.update.add())
        return wire(resp)

    def on_stop_container(self, payload: bytes) -> bytes:
        req = pb.StopContainerRequest.FromString(payload)
        self.advance(LifecycleEvent.CONTAINER_EVENT, "StopContainer")
        updates = self.host.stop_container(
            self.pods.convert(req.pod), convert.container_from_pb(req.container)
        )
        resp = pb.StopContainerResponse()
        for u in updates:
            convert.update_to_pb(u, resp.update.add())
        return wire(resp)

    def on_update_pod_sandbox(self, payload: bytes) -> bytes:
        req = pb.UpdatePodSandboxRequest.FromString(payload)
        self.advance(LifecycleEvent.POD_EVENT, "UpdatePodSandbox")
        self.host.update_pod_sandbox(
            self.pods.convert(req.pod), convert.recent_resources(req.linux_resources)
        )
        return b""

    def on_state_change(self, payload: bytes) -> bytes:
        req = pb.StateChangeEvent.FromString(payload)
        has_container = req.HasField("container")
        event = _EVENTS.get(req.event)
        if event is None:
            self.advance(_event_kind(has_container), "StateChange")
            log.warning("ignoring unknown NRI event %d", req.event)
            return b""
        _check_container(event, has_container)
        self.advance(_event_kind(has_container), "StateChange")
        container = convert.container_from_pb(req.container) if has_container else None
        pod = self.pods.convert(req.pod)
        self.host.notify(event, pod, container)
        if event is Event.REMOVE_POD_SANDBOX:
            self.pods.forget(pod.id)
        return b""

    def background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def push_restored(self, updates: list[Update]) -> None:
        """Re-assert restored cpusets; containers the runtime rejects are gone."""
        await self.registered.wait()
        try:
            failed = await self.update_containers(updates)
        except (TtrpcError, Disconnected) as exc:
            log.error("failed to re-assert restored containers: %s", exc)
            return
        gone = [u.container_id for u in failed]
        if gone:
            self.host.forget_containers(gone)

    # -- Runtime service -----------------------------------------------------

    async def register(self) -> None:
        req = pb.RegisterPluginRequest(plugin_name=self.opts.name, plugin_idx=self.opts.index)
        self.advance_own(LifecycleEvent.REGISTER)
        # the runtime admits plugins one at a time: we may wait behind another
        await self.call("RegisterPlugin", req, pb.Empty, self.opts.register_timeout)
        self.advance_own(LifecycleEvent.REGISTERED)

    async def update_containers(self, updates: list[Update]) -> list[Update]:
        self.advance_own(LifecycleEvent.UPDATE_CONTAINERS)
        req = pb.UpdateContainersRequest()
        for u in updates:
            convert.update_to_pb(u, req.update.add())
        resp = await self.call("UpdateContainers", req, pb.UpdateContainersResponse)
        failed: Any = resp
        return [convert.update_from_pb(u) for u in failed.failed]


#: the events by their number on the wire (a lookup, not an enum call per event)
_EVENTS = {event.value: event for event in Event}
#: the events of a container (:attr:`Event.of_container`)
_OF_CONTAINER = frozenset(event for event in Event if event.of_container)


def _check_container(event: Event, has_container: bool) -> None:
    """A container's event without its container is malformed (answered
    INVALID_ARGUMENT; no hook is called, the lifecycle does not move)."""
    if not has_container and event in _OF_CONTAINER:
        raise DecodeError(f"{event.name} event without its container")


def _event_kind(has_container: bool) -> LifecycleEvent:
    """Which lifecycle event a pod or container notification is."""
    return LifecycleEvent.CONTAINER_EVENT if has_container else LifecycleEvent.POD_EVENT


class PluginStub:
    """Runs sessions with the runtime until stopped; reconnects in external mode.

    Between connection attempts it waits ``backoff_initial`` seconds, doubling
    up to ``backoff_max`` while attempts fail; a connection that registered
    (the runtime was there and took us) starts the doubling over. ``pause``
    does the waiting (default: until the delay passed or :meth:`stop`). A
    socket that cannot be connected to is one line naming the path and the
    chart's volume, repeated rarely (:mod:`nri_framework.startup`)."""

    def __init__(self, host: PolicyHost, opts: StubOptions, *, pause: Pause | None = None) -> None:
        opts.validate()
        self.host = host
        self.opts = opts
        self.session: Session | None = None
        self.stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self.pause: Pause = pause or self._pause
        #: the last session got as far as a successful RegisterPlugin
        self.registered = False
        #: why the runtime's socket cannot be connected to (``/healthz`` says it)
        self.obstacle: Obstacle | None = None
        self.reporter = Reporter(log)
        #: NRI request handling time, kept across reconnects (``/metrics``)
        self.latency = RequestLatency()

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), delay)

    async def _open(self) -> tuple[TrunkReader, asyncio.StreamWriter]:
        if self.opts.fd is not None:
            sock = socket.socket(
                family=socket.AF_UNIX, type=socket.SOCK_STREAM, fileno=self.opts.fd
            )
            return await open_trunk(sock=sock)
        return await open_trunk(self.opts.socket_path)

    async def run_session(self) -> str:
        self.registered = False
        reader, writer = await self._open()
        session = Session(self.host, self.opts, reader, writer, self.latency)
        self.session = session
        self.host.set_update_sender(session.update_containers)
        reading = asyncio.create_task(session.read_loop())
        try:
            await session.register()
            self.registered = True
            self.obstacle = None
            self.reporter.cleared(f"NRI runtime socket {self.opts.socket_path} reachable again")
            log.info("registered as %s-%s", self.opts.index, self.opts.name)
            self.connected.set()
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({reading, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if self.stopping.is_set():
                return "stopped"
            return session.closed_reason or "connection closed"
        except (TtrpcError, Disconnected) as exc:
            return f"registration failed: {exc}"
        finally:
            self.connected.clear()
            self.host.set_update_sender(None)
            self.session = None
            reading.cancel()
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def run(self) -> int:
        """Serve until stopped. Returns the process exit code."""
        backoff = Backoff(self.opts.backoff_initial, self.opts.backoff_max)
        while not self.stopping.is_set():
            try:
                reason = await self.run_session()
            except OSError as exc:  # no socket, nobody listening, not ours to write, ...
                obstacle = nri_socket_obstacle(self.opts.socket_path, exc)
                if self.opts.fd is not None:
                    obstacle = Obstacle(f"fd {self.opts.fd}", f"is unusable ({exc})", "")
                if not self.opts.reconnect:
                    log.error("cannot connect to NRI runtime: %s", obstacle)
                    return 1
                self.obstacle = obstacle
                self.reporter.failed(f"NRI runtime not reachable: {obstacle}")
                log.debug("NRI runtime not reachable (%s), retrying in %.2fs", exc, backoff.delay)
            else:
                if self.stopping.is_set():
                    return 0
                if not self.opts.reconnect:
                    log.error("lost NRI runtime: %s; exiting", reason)
                    return 1
                if self.registered:  # it served: a new outage, not the old one going on
                    backoff.reset()
                log.warning("lost NRI runtime: %s; reconnecting in %.1fs", reason, backoff.delay)
            await self.pause(backoff.next())
        return 0

    def stop(self) -> None:
        self.stopping.set()

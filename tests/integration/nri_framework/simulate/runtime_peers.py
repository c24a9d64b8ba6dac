"""The plugin peers the runtime simulator is tested against, over real unix sockets.

Two kinds of plugin peers:

* :class:`RawPlugin` -- hand-driven, built on ``NriConnection(Role.PLUGIN)``:
  it answers exactly as a test says (or never), and records every request;
* the project's real plugin side: ``PluginStub`` + ``PolicyHost`` with an
  in-test policy object whose hooks are ``@hookimpl`` methods.

Behaviour and texts checked here are containerd 1.7 / NRI 0.6.1's (see
shared/reference/nri-protocol.md, A3-A5), plus the v0.7+/v0.12 features the
simulator emulates on request (paging, NRI_version, dedicated RPCs).
The runtime simulator's integration tests: :mod:`test_runtime_registration`
(registration and Configure), :mod:`test_runtime_synchronize` (Synchronize and its
paging), :mod:`test_runtime_containers` (CreateContainer, UpdateContainer, unsolicited
updates), :mod:`test_runtime_events` (lifecycle events, the v0.12 RPCs, stop); the
plugin peers are in :mod:`runtime_peers`, the fixtures (``sock_dir``,
``make_runtime``) in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nri_framework.hookspecs import hookimpl
from nri_framework.host import PolicyHost
from nri_framework.model import (
    Adjustment,
    Container,
    CpuResources,
    CreateResult,
    Event,
    Pod,
    Resources,
    Update,
    cpu_pin,
)
from nri_framework.nri.connection import NriConnection, Role
from nri_framework.nri.ttrpc import Code, RequestReceived, ResponseReceived, TtrpcError
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.runtime import SimulatedRuntime
from nri_framework.stub import PluginStub, StubOptions

ALL_V06 = 0x7FF
NS_MD = (("containerd-namespace-ttrpc", "k8s.io"),)


MakeRuntime = Callable[..., Awaitable[SimulatedRuntime]]


# --- a hand-driven plugin ---------------------------------------------------------

Handler = Callable[[bytes], Awaitable[bytes | None]]


@dataclass
class Seen:
    method: str
    payload: bytes
    metadata: tuple[tuple[str, str], ...]
    at: float
    timeout_nano: int = 0

    @property
    def label(self) -> str:
        if self.method == "StateChange":
            return Event(pb.StateChangeEvent.FromString(self.payload).event).name
        return self.method


class RawPlugin:
    """An NRI plugin driven by the test, on ``NriConnection(Role.PLUGIN)``.

    A handler returns the response payload, raises :class:`TtrpcError` for an
    error status, or returns ``None`` to never answer.
    """

    def __init__(
        self, socket_path: Path, *, name: str = "raw", index: str = "50", events: int = 0
    ) -> None:
        self.socket_path = socket_path
        self.name, self.index, self.events = name, index, events
        self.conn = NriConnection(Role.PLUGIN)
        self.seen: list[Seen] = []
        self.closed = asyncio.Event()
        self.handlers: dict[str, Handler] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "StateChange": answer_empty,
            "CreateContainer": answer_empty,
            "UpdateContainer": answer_empty,
            "StopContainer": answer_empty,
        }
        self._calls: dict[int, asyncio.Future[tuple[int, str, bytes]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def _configure(self, payload: bytes) -> bytes:
        return pb.ConfigureResponse(events=self.events).SerializeToString()

    async def _synchronize(self, payload: bytes) -> bytes:
        more = pb.SynchronizeRequest.FromString(payload).more
        return pb.SynchronizeResponse(more=more).SerializeToString()

    async def start(self, *, register: bool = True) -> tuple[int, str]:
        self.reader, self.writer = await asyncio.open_unix_connection(str(self.socket_path))
        self._reading = asyncio.create_task(self._read())
        if not register:
            return 0, ""
        req = pb.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
        code, message, _ = await self.call("RegisterPlugin", req.SerializeToString())
        return code, message

    async def call(self, method: str, payload: bytes) -> tuple[int, str, bytes]:
        sid = self.conn.send_request(method, payload)
        fut: asyncio.Future[tuple[int, str, bytes]] = asyncio.get_running_loop().create_future()
        self._calls[sid] = fut
        self.writer.write(self.conn.data_to_send())
        return await asyncio.wait_for(fut, 5)

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await self.reader.read(65536):
                for ev in self.conn.receive_data(data):
                    if isinstance(ev, RequestReceived):
                        self.seen.append(
                            Seen(ev.method, ev.payload, ev.metadata, loop_now(), ev.timeout_nano)
                        )
                        task = asyncio.create_task(self._serve(ev))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                    elif isinstance(ev, ResponseReceived):
                        self._calls.pop(ev.stream_id).set_result((ev.code, ev.message, ev.payload))
        self.writer.close()
        self.closed.set()

    async def _serve(self, ev: RequestReceived) -> None:
        handler = self.handlers.get(ev.method)
        try:
            if handler is None:
                raise TtrpcError(Code.UNIMPLEMENTED, f"method {ev.method}")
            payload = await handler(ev.payload)
        except TtrpcError as exc:
            self.conn.send_response(ev.stream_id, code=exc.code, message=exc.message)
        else:
            if payload is None:
                return
            self.conn.send_response(ev.stream_id, payload)
        if not self.writer.is_closing():
            self.writer.write(self.conn.data_to_send())

    def labels(self) -> list[str]:
        return [s.label for s in self.seen]

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
        await self.closed.wait()


def loop_now() -> float:
    return asyncio.get_running_loop().time()


async def answer_empty(payload: bytes) -> bytes:
    return b""


async def answer_never(payload: bytes) -> bytes | None:
    return None


# --- a real plugin: stub + host + in-test policy ------------------------------------


class PinPolicy:
    """Pins every new container to ``cpus``; optionally re-asserts on UpdateContainer."""

    def __init__(
        self,
        cpus: str = "1",
        *,
        reassert: bool = False,
        sync_update: str = "",
        decorate: bool = True,
    ) -> None:
        self.cpus = cpus
        self.decorate = decorate
        self.reassert = reassert
        self.sync_update = sync_update
        self.synced: tuple[list[Pod], list[Container]] | None = None
        self.created: list[str] = []
        self.other_update: Update | None = None

    @hookimpl
    def nri_synchronize(
        self, pods: list[Pod], containers: list[Container], saved_state: Any
    ) -> list[Update]:
        self.synced = (pods, containers)
        if self.sync_update and containers:
            return [Update(container_id=containers[0].id, resources=cpu_pin(self.sync_update))]
        return []

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.created.append(container.id)
        updates = [self.other_update] if self.other_update else []
        return CreateResult(
            adjustment=Adjustment(
                resources=cpu_pin(self.cpus, "0"),
                annotations={"pinned-by": "pin-policy"} if self.decorate else {},
                env={"PINNED_CPUS": self.cpus} if self.decorate else {},
            ),
            updates=updates,
        )

    @hookimpl
    def nri_update_container(
        self, pod: Pod, container: Container, resources: Resources
    ) -> list[Update]:
        if not self.reassert:
            return []
        return [Update(container_id=container.id, resources=cpu_pin(self.cpus))]


@contextlib.asynccontextmanager
async def stub_plugin(
    rt: SimulatedRuntime, policy: object, *, name: str = "pin", index: str = "10", wait: bool = True
) -> AsyncIterator[PolicyHost]:
    host = PolicyHost(name, policy)
    opts = StubOptions(name=name, index=index, socket_path=str(rt.socket_path), reconnect=False)
    stub = PluginStub(host, opts)
    task = asyncio.create_task(stub.run())
    try:
        if wait:
            await until(lambda: any(p.full_name == f"{index}-{name}" for p in rt.plugins))
        yield host
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = loop_now() + timeout
    while not cond():
        if loop_now() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.01)


def sample_pod(name: str = "pod0", uid: str = "") -> Pod:
    uid = uid or f"uid-{name}"
    return Pod(
        id="",
        name=name,
        uid=uid,
        namespace="default",
        cgroup_parent=f"/kubepods/pod{uid}",
        annotations={"note": "x" * 200},
    )


def sample_container(name: str = "c0", cpus: str = "") -> Container:
    return Container(
        id="",
        name=name,
        env=["PATH=/bin"],
        resources=Resources(cpu=CpuResources(shares=1024, quota=100000, period=100000, cpus=cpus)),
    )


async def created_pod(rt: SimulatedRuntime, n: int = 1) -> tuple[Pod, list[Container]]:
    pod = await rt.run_pod(sample_pod())
    ctrs = [await rt.create_container(pod.id, sample_container(f"c{i}")) for i in range(n)]
    return pod, ctrs

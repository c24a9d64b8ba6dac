"""The runtime simulator against plugins over real unix sockets.

Two kinds of plugin peers:

* :class:`RawPlugin` -- hand-driven, built on ``NriConnection(Role.PLUGIN)``:
  it answers exactly as a test says (or never), and records every request;
* the project's real plugin side: ``PluginStub`` + ``PolicyHost`` with an
  in-test policy object whose hooks are ``@hookimpl`` methods.

Behaviour and texts checked here are containerd 1.7 / NRI 0.6.1's (see
shared/reference/nri-protocol.md, A3-A5), plus the v0.7+/v0.12 features the
simulator emulates on request (paging, NRI_version, dedicated RPCs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
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
from nri_framework.simulate.emulation import CONTAINERD_1_7, NRI_V0_12, Emulation
from nri_framework.simulate.runtime import NriError, SimulatedRuntime
from nri_framework.stub import PluginStub, StubOptions

ALL_V06 = 0x7FF
NS_MD = (("containerd-namespace-ttrpc", "k8s.io"),)


# --- fixtures ---------------------------------------------------------------------


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for sockets (unix socket paths are limited to 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="nri-sim-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


MakeRuntime = Callable[..., Awaitable[SimulatedRuntime]]


@pytest.fixture
async def make_runtime(sock_dir: Path) -> AsyncIterator[MakeRuntime]:
    started: list[SimulatedRuntime] = []

    async def make(**kw: Any) -> SimulatedRuntime:
        rt = SimulatedRuntime(sock_dir / "nri.sock", **kw)
        await rt.start()
        started.append(rt)
        return rt

    yield make
    for rt in started:
        await rt.stop()


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
            "StateChange": _empty,
            "CreateContainer": _empty,
            "UpdateContainer": _empty,
            "StopContainer": _empty,
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
                            Seen(ev.method, ev.payload, ev.metadata, _now(), ev.timeout_nano)
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


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _empty(payload: bytes) -> bytes:
    return b""


async def _never(payload: bytes) -> bytes | None:
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
            await _until(lambda: any(p.full_name == f"{index}-{name}" for p in rt.plugins))
        yield host
    finally:
        stub.stop()
        await asyncio.wait_for(task, 5)


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = _now() + timeout
    while not cond():
        if _now() > deadline:
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


async def _created(rt: SimulatedRuntime, n: int = 1) -> tuple[Pod, list[Container]]:
    pod = await rt.run_pod(sample_pod())
    ctrs = [await rt.create_container(pod.id, sample_container(f"c{i}")) for i in range(n)]
    return pod, ctrs


# --- registration and Configure -----------------------------------------------------


async def test_registration_with_real_stub(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "nri_framework.simulate")
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy()):
        (info,) = await rt.wait_plugins(1, 5)
        assert (info.name, info.index, info.full_name) == ("pin", "10", "10-pin")
        assert info.pid == os.getpid()
        expected = 0
        for ev in (
            Event.CREATE_CONTAINER,
            Event.UPDATE_CONTAINER,
            Event.REMOVE_CONTAINER,
            Event.REMOVE_POD_SANDBOX,
        ):
            expected |= ev.bit
        assert info.events == expected
    assert f'plugin "external:10-pin[{os.getpid()}]" registered as "10-pin"' in caplog.text
    assert 'plugin "10-pin" connected' in caplog.text


@pytest.mark.parametrize("emulation", [CONTAINERD_1_7, NRI_V0_12], ids=["nri-0.6.1", "nri-0.12"])
async def test_configure_request_matches_emulation(
    make_runtime: MakeRuntime, emulation: Emulation
) -> None:
    rt = await make_runtime(emulation=emulation, registration_timeout=3.0, request_timeout=1.5)
    raw = RawPlugin(rt.socket_path)
    assert await raw.start() == (0, "")
    await rt.wait_plugins(1, 5)
    req = pb.ConfigureRequest.FromString(raw.seen[0].payload)
    assert raw.seen[0].method == "Configure" and raw.seen[0].metadata == ()
    assert (req.runtime_name, req.config) == ("containerd", "")
    if emulation is CONTAINERD_1_7:
        assert req.runtime_version == "1.7.24~ds1"
        assert (req.registration_timeout, req.request_timeout, req.NRI_version) == (0, 0, "")
        assert rt.plugins[0].events == ALL_V06  # events == 0: all valid events
    else:
        assert (req.registration_timeout, req.request_timeout) == (3000, 1500)
        assert req.NRI_version == "v0.12.0"
        assert rt.plugins[0].events == 0x3FFF
    await raw.close()


@pytest.mark.parametrize(
    ("emulation", "accepted"),
    [(CONTAINERD_1_7, False), (NRI_V0_12, True)],
    ids=["nri-0.6.1", "nri-0.12"],
)
async def test_event_mask_checked_against_version(
    make_runtime: MakeRuntime,
    emulation: Emulation,
    accepted: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = await make_runtime(emulation=emulation)
    raw = RawPlugin(rt.socket_path, events=0xFFF)
    await raw.start()
    if accepted:
        (info,) = await rt.wait_plugins(1, 5)
        assert info.events == 0xFFF
        await raw.close()
        return
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.plugins == []
    assert rt.failures == ["failed to start external plugin: invalid plugin events: 0x800"]
    assert "invalid plugin events: 0x800" in caplog.text


@pytest.mark.parametrize(
    ("name", "index", "message"),
    [
        ("raw", "1", 'invalid plugin index: invalid plugin index "1", must be 2 digits'),
        ("raw", "x1", 'invalid plugin index: invalid plugin index "x1" (not [0-9][0-9])'),
        (
            "bad name",
            "10",
            "invalid plugin name: invalid plugin name \"bad name\": contains invalid character ' '",
        ),
        ("", "10", "invalid plugin name: invalid plugin name: name is empty"),
    ],
)
async def test_invalid_registration_rejected(
    make_runtime: MakeRuntime, name: str, index: str, message: str
) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path, name=name, index=index)
    code, text = await raw.start()
    assert (code, text) == (Code.UNKNOWN, message)
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures[0].startswith("failed to start external plugin: failed to register plugin: ")
    assert rt.plugins == []


async def test_registration_timeout(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(registration_timeout=0.2)
    raw = RawPlugin(rt.socket_path)
    await raw.start(register=False)
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures == ["failed to start external plugin: plugin registration timed out"]


async def test_plugins_are_admitted_one_at_a_time(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    slow = RawPlugin(rt.socket_path, name="first", index="20")
    order: list[str] = []

    async def slow_sync(payload: bytes) -> bytes:
        await asyncio.sleep(0.3)  # the stimulus: a slow Synchronize
        order.append("first synchronized")
        return b""

    async def fast_configure(payload: bytes) -> bytes:
        order.append("second configured")
        return pb.ConfigureResponse().SerializeToString()

    slow.handlers["Synchronize"] = slow_sync
    fast = RawPlugin(rt.socket_path, name="second", index="10")
    fast.handlers["Configure"] = fast_configure
    await slow.start()
    await _until(lambda: "Synchronize" in slow.labels())  # the first is being admitted
    second = asyncio.create_task(fast.start())
    infos = await rt.wait_plugins(2, 5)
    await second
    # the second plugin is configured only after the first one is synchronized
    assert order == ["first synchronized", "second configured"]
    assert [p.full_name for p in infos] == ["10-second", "20-first"]  # invocation order by index
    await slow.close()
    await fast.close()


# --- Synchronize ----------------------------------------------------------------------


async def _populate(rt: SimulatedRuntime, pods: int, per_pod: int) -> list[str]:
    ids: list[str] = []
    for i in range(pods):
        pod = await rt.run_pod(sample_pod(f"pod{i}"))
        for j in range(per_pod):
            ids.append((await rt.create_container(pod.id, sample_container(f"c{j}"))).id)
    return ids


async def test_synchronize_pages_with_more(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12, max_message_size=4000)
    ids = await _populate(rt, pods=6, per_pod=3)
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await rt.wait_plugins(1, 5)
    chunks = [
        pb.SynchronizeRequest.FromString(s.payload) for s in raw.seen if s.method == "Synchronize"
    ]
    assert len(chunks) > 1
    assert [c.more for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert all(c.ByteSize() <= 4000 for c in chunks)
    assert sum(len(c.pods) for c in chunks) == 6
    assert sorted(ctr.id for c in chunks for ctr in c.containers) == sorted(ids)
    await raw.close()


async def test_real_stub_handles_paging_and_sync_updates_apply(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12, max_message_size=4000)
    ids = await _populate(rt, pods=6, per_pod=3)
    policy = PinPolicy(sync_update="3")
    async with stub_plugin(rt, policy):
        assert policy.synced is not None
        pods, containers = policy.synced
        assert len(pods) == 6 and len(containers) == 18
        assert rt.containers[containers[0].id].cpus == "3"
        assert {rt.containers[i].cpus for i in ids[1:]} == {""}


async def test_plugin_that_does_not_echo_more_is_closed(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12, max_message_size=4000)
    await _populate(rt, pods=6, per_pod=3)
    raw = RawPlugin(rt.socket_path)
    raw.handlers["Synchronize"] = _empty  # answers SynchronizeResponse{} even for more=true
    await raw.start()
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures == [
        "failed to synchronize plugin: plugin does not handle split sync requests"
    ]
    assert rt.plugins == []


async def test_nri_0_6_cannot_split_an_oversized_sync(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(max_message_size=4000)
    await _populate(rt, pods=6, per_pod=3)
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert rt.failures[0].startswith(
        "failed to synchronize plugin: rpc error: code = ResourceExhausted desc = message length "
    )
    assert not any(s.method == "Synchronize" for s in raw.seen)  # refused locally, like ttrpc


# --- CreateContainer ----------------------------------------------------------------


async def test_create_container_adjustment_applied(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    policy = PinPolicy("1")
    async with stub_plugin(rt, policy):
        pod, (first,) = await _created(rt)
        policy.other_update = Update(container_id=first.id, resources=cpu_pin("2-3"))
        second = await rt.create_container(pod.id, sample_container("c1"))
    assert second.cpus == "1"
    assert second.resources and second.resources.cpu
    assert second.resources.cpu.mems == "0"
    assert second.resources.cpu.shares == 1024  # untouched fields keep the kubelet's value
    assert second.annotations["pinned-by"] == "pin-policy"
    assert second.env == ["PATH=/bin", "PINNED_CPUS=1"]
    assert second.cgroups_path == f"/kubepods/poduid-pod0/{second.id}"
    table = rt.containers
    assert table[second.id] == second
    assert table[first.id].cpus == "2-3"  # the update of the other container was applied
    assert policy.created == [first.id, second.id]


@pytest.mark.parametrize(
    ("decorate", "field"), [(False, "CPU pinning"), (True, "annotation pinned-by")]
)
async def test_two_plugins_setting_one_field_is_an_error(
    make_runtime: MakeRuntime, decorate: bool, field: str
) -> None:
    rt = await make_runtime()
    pod = await rt.run_pod(sample_pod())
    async with (
        stub_plugin(rt, PinPolicy("1", decorate=decorate), name="a", index="50"),
        stub_plugin(rt, PinPolicy("2", decorate=decorate), name="b", index="60"),
    ):
        with pytest.raises(NriError) as err:
            await rt.create_container(pod.id, sample_container())
        assert len(rt.plugins) == 2
    assert str(err.value) == (
        "failed to get NRI adjustment for container: "
        f'plugins "60-b" and "50-a" both tried to set {field}'
    )
    assert rt.containers == {}


async def test_plugin_error_fails_creation(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path)

    async def refuse(payload: bytes) -> bytes:
        raise TtrpcError(Code.UNKNOWN, "no CPUs left")

    raw.handlers["CreateContainer"] = refuse
    await raw.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    with pytest.raises(NriError, match="rpc error: code = Unknown desc = no CPUs left"):
        await rt.create_container(pod.id, sample_container())
    assert len(rt.plugins) == 1  # a non-fatal error keeps the plugin
    await raw.close()


async def test_update_of_the_container_being_created_is_an_error(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path, name="upd", index="40")

    async def update_self(payload: bytes) -> bytes:
        cid = pb.CreateContainerRequest.FromString(payload).container.id
        rpl = pb.CreateContainerResponse()
        rpl.update.add(container_id=cid).linux.resources.cpu.cpus = "0"
        return rpl.SerializeToString()

    raw.handlers["CreateContainer"] = update_self
    await raw.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    with pytest.raises(
        NriError, match=r'plugin "40-upd" asked update of "[0-9a-f]{64}" during creation'
    ):
        await rt.create_container(pod.id, sample_container())
    await raw.close()


async def test_slow_plugin_is_dropped_and_creation_goes_on(
    make_runtime: MakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = await make_runtime(request_timeout=0.3)
    slow = RawPlugin(rt.socket_path, name="slow", index="20")
    slow.handlers["CreateContainer"] = _never
    await slow.start()
    await rt.wait_plugins(1, 5)
    async with stub_plugin(rt, PinPolicy("1"), name="pin", index="30"):
        pod = await rt.run_pod(sample_pod())
        t0 = _now()
        # a liveness bound: the creation finishes at all (it waits 0.3 s for the slow one)
        created = await asyncio.wait_for(rt.create_container(pod.id, sample_container()), 10)
        elapsed = _now() - t0
        assert [p.full_name for p in rt.plugins] == ["30-pin"]
    assert elapsed > 0.25  # it waited for the deadline (a lower bound: no speed claim)
    assert created.cpus == "1"  # the other plugin's adjustment, without the slow one's
    await asyncio.wait_for(slow.closed.wait(), 5)
    assert (
        "closing plugin 20-slow, failed to handle CreateContainer request: "
        "context deadline exceeded" in caplog.text
    )
    # the request carried the deadline, like containerd's 2 s context: the 0.3 s budget
    create_req = next(s for s in slow.seen if s.method == "CreateContainer")
    assert create_req.metadata == NS_MD
    assert 0.25e9 < create_req.timeout_nano <= 0.3e9


async def test_slow_plugin_without_others_leaves_container_unadjusted(
    make_runtime: MakeRuntime,
) -> None:
    rt = await make_runtime(request_timeout=0.2)
    slow = RawPlugin(rt.socket_path, name="slow", index="20")
    slow.handlers["CreateContainer"] = _never
    await slow.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    created = await rt.create_container(pod.id, sample_container(cpus="0-3"))
    assert created.cpus == "0-3"
    assert rt.plugins == []


# --- UpdateContainer ----------------------------------------------------------------


@pytest.mark.parametrize(("reassert", "expected"), [(True, "1"), (False, "0-3")])
async def test_update_container_reassert_or_kubelet_wins(
    make_runtime: MakeRuntime, reassert: bool, expected: str
) -> None:
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy("1", reassert=reassert)):
        _, (ctr,) = await _created(rt)
        assert ctr.cpus == "1"
        await rt.start_container(ctr.id)
        kubelet = Resources(cpu=CpuResources(shares=2048, quota=200000, period=100000, cpus="0-3"))
        updated = await rt.update_container(ctr.id, kubelet)
    assert updated.cpus == expected
    assert updated.resources and updated.resources.cpu
    assert (updated.resources.cpu.shares, updated.resources.cpu.quota) == (2048, 200000)


async def test_update_without_cpuset_keeps_the_pinning(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy("1")):
        _, (ctr,) = await _created(rt)
        updated = await rt.update_container(ctr.id, Resources(cpu=CpuResources(shares=512)))
    assert (updated.cpus, updated.resources.cpu.shares) == ("1", 512)  # type: ignore[union-attr]


# --- unsolicited updates ----------------------------------------------------------------


async def test_unsolicited_update_containers(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    async with stub_plugin(rt, PinPolicy("1")) as host:
        _, (ctr,) = await _created(rt)
        failed = await host.update_containers(
            [
                Update(container_id=ctr.id, resources=cpu_pin("2", "0")),
                Update(container_id="no-such-container", resources=cpu_pin("3")),
            ]
        )
        assert [u.container_id for u in failed] == ["no-such-container"]
        assert rt.containers[ctr.id].cpus == "2"
        ok = await host.update_containers([Update(container_id=ctr.id, resources=cpu_pin("0"))])
        assert ok == []
        assert rt.containers[ctr.id].cpus == "0"


# --- lifecycle events ------------------------------------------------------------------


async def _lifecycle(rt: SimulatedRuntime) -> None:
    pod = await rt.run_pod(sample_pod())
    ctr = await rt.create_container(pod.id, sample_container())
    await rt.start_container(ctr.id)
    await rt.update_container(ctr.id, Resources(cpu=CpuResources(shares=512)))
    await rt.stop_container(ctr.id)
    await rt.remove_container(ctr.id)
    await rt.stop_pod(pod.id)
    await rt.remove_pod(pod.id)


async def test_lifecycle_events_in_containerd_1_7_order(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await rt.wait_plugins(1, 5)
    await _lifecycle(rt)
    assert raw.labels() == [
        "Configure",
        "Synchronize",
        "RUN_POD_SANDBOX",
        "CreateContainer",
        "POST_CREATE_CONTAINER",
        "START_CONTAINER",
        "POST_START_CONTAINER",
        "UpdateContainer",
        "POST_UPDATE_CONTAINER",
        "StopContainer",
        "REMOVE_CONTAINER",
        "STOP_POD_SANDBOX",
        "REMOVE_POD_SANDBOX",
    ]
    by_label = {s.label: s for s in raw.seen}
    assert by_label["StopContainer"].metadata == ()
    assert by_label["START_CONTAINER"].metadata == NS_MD
    states = {
        label: pb.StateChangeEvent.FromString(by_label[label].payload).container
        for label in ("POST_CREATE_CONTAINER", "START_CONTAINER", "POST_START_CONTAINER")
    }
    assert states["POST_CREATE_CONTAINER"].state == pb.CONTAINER_CREATED
    assert (
        states["START_CONTAINER"].pid > 0
        and states["START_CONTAINER"].state == pb.CONTAINER_CREATED
    )
    assert states["POST_START_CONTAINER"].state == pb.CONTAINER_RUNNING
    assert rt.containers == {} and rt.pods == {}
    await raw.close()


async def test_only_subscribed_events_are_sent(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path, events=Event.CREATE_CONTAINER.bit | Event.STOP_POD_SANDBOX.bit)
    await raw.start()
    await rt.wait_plugins(1, 5)
    await _lifecycle(rt)
    assert raw.labels() == ["Configure", "Synchronize", "CreateContainer", "STOP_POD_SANDBOX"]
    await raw.close()


async def test_v0_12_dedicated_rpcs_fall_back_to_state_change(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12)
    raw = RawPlugin(rt.socket_path)
    raw.handlers["RunPodSandbox"] = _empty  # implemented; PostCreateContainer is not
    await raw.start()
    await rt.wait_plugins(1, 5)
    pod = await rt.run_pod(sample_pod())
    ctr = await rt.create_container(pod.id, sample_container())
    await rt.start_container(ctr.id)
    assert raw.labels()[2:] == [
        "RunPodSandbox",
        "CreateContainer",
        "PostCreateContainer",  # UNIMPLEMENTED ...
        "POST_CREATE_CONTAINER",  # ... so StateChange, and from now on only StateChange
        "START_CONTAINER",
        "POST_START_CONTAINER",
    ]
    assert len(rt.plugins) == 1
    await raw.close()


async def test_real_stub_under_v0_12(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime(emulation=NRI_V0_12)
    async with stub_plugin(rt, PinPolicy("1")) as host:
        await _lifecycle(rt)
        assert len(rt.plugins) == 1
        assert host.cache.containers == {}  # the cache saw RemoveContainer/RemovePodSandbox


async def test_stop_closes_plugins(make_runtime: MakeRuntime) -> None:
    rt = await make_runtime()
    raw = RawPlugin(rt.socket_path)
    await raw.start()
    await rt.wait_plugins(1, 5)
    await rt.stop()
    await asyncio.wait_for(raw.closed.wait(), 5)
    assert not rt.socket_path.exists()

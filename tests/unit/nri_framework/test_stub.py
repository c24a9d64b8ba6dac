"""The stub's Session over a real socket pair: the lifecycle gate and the dedicated RPCs.

The runtime end is the sans-IO codec (:class:`NriConnection` with
:attr:`Role.RUNTIME`) on the other end of a ``socketpair``; the plugin end is
the real :class:`Session` with a real :class:`PolicyHost` and a small policy of
ours that records what it was asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.message import Message
from nri_framework.hookspecs import hookimpl
from nri_framework.host import PolicyHost
from nri_framework.model import Container, CreateResult, Pod
from nri_framework.nri.connection import NriConnection, Role
from nri_framework.nri.lifecycle import LifecycleState
from nri_framework.nri.ttrpc import Code, RequestReceived, ResponseReceived
from nri_framework.pb import nri_pb2 as pb
from nri_framework.stub import KEPT_MAX, Session, StubOptions, TrunkReader, open_trunk

# Every v0.12 dedicated event RPC (reference nri-protocol.md A4).
DEDICATED = (
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PostUpdatePodSandbox",
    "PostCreateContainer",
    "StartContainer",
    "PostStartContainer",
    "PostUpdateContainer",
    "RemoveContainer",
)


class Recorder:
    """Wants CreateContainer and StartContainer, nothing else; a create
    leaves ``later`` (when set) for after its reply."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.host: Any = None
        self.later: Callable[[], None] | None = None

    @hookimpl
    def policy_start(self, host: Any) -> None:
        self.host = host

    @hookimpl
    def nri_create_container(self, pod: Pod, container: Container) -> CreateResult:
        self.calls.append(("create", container.id))
        if self.later is not None:
            self.host.after_reply(self.later)
        return CreateResult()

    @hookimpl
    def nri_start_container(self, pod: Pod, container: Container) -> None:
        self.calls.append(("start", container.id))


@dataclass
class Trunk:
    session: Session
    policy: Recorder
    conn: NriConnection
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def accept_registration(self) -> None:
        registering = asyncio.create_task(self.session.register())
        while True:
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            assert data, "the plugin closed the trunk"
            reqs = [e for e in self.conn.receive_data(data) if isinstance(e, RequestReceived)]
            if reqs:
                assert reqs[0].method == "RegisterPlugin"
                self.conn.send_response(reqs[0].stream_id, b"")
                self.writer.write(self.conn.data_to_send())
                await asyncio.wait_for(registering, 5)
                return

    async def call(self, method: str, payload: bytes = b"") -> ResponseReceived:
        """Call ``method`` of the plugin's service and read its answer."""
        sid = self.conn.send_request(method, payload)
        self.writer.write(self.conn.data_to_send())
        while True:
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            assert data, "the plugin closed the trunk"
            for ev in self.conn.receive_data(data):
                if isinstance(ev, ResponseReceived) and ev.stream_id == sid:
                    return ev


@pytest.fixture
async def trunk() -> AsyncIterator[Trunk]:
    plugin_end, runtime_end = socket.socketpair()
    policy = Recorder()
    host = PolicyHost("recorder", policy)
    p_reader, p_writer = await open_trunk(sock=plugin_end)
    r_reader, r_writer = await asyncio.open_unix_connection(sock=runtime_end)
    session = Session(host, StubOptions(), p_reader, p_writer)
    reading = asyncio.create_task(session.read_loop())
    try:
        trunk = Trunk(session, policy, NriConnection(Role.RUNTIME), r_reader, r_writer)
        await trunk.accept_registration()
        assert session.registered.is_set() and not session.configured.is_set()
        yield trunk
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        for w in (p_writer, r_writer):
            w.close()


def create_request(cid: str) -> bytes:
    req = pb.CreateContainerRequest()
    req.pod.id = "p"
    req.container.id = cid
    req.container.pod_sandbox_id = "p"
    return bytes(req.SerializeToString())


def container_request(req_type: type[Message], cid: str) -> bytes:
    """A dedicated RPC's request: the pod, and the container where the type has one."""
    req: Any = req_type()
    req.pod.id = "p"
    if "container" in req_type.DESCRIPTOR.fields_by_name:
        req.container.id = cid
    return bytes(req.SerializeToString())


async def synchronize(trunk: Trunk) -> None:
    configure = pb.ConfigureRequest(runtime_name="containerd", runtime_version="2.2.1")
    assert (await trunk.call("Configure", configure.SerializeToString())).code == 0
    assert (await trunk.call("Synchronize")).code == 0
    assert trunk.session.lifecycle.state is LifecycleState.SYNCHRONIZED


async def test_create_before_configure_is_a_protocol_error(trunk: Trunk) -> None:
    early = await trunk.call("CreateContainer", create_request("c0"))
    assert (early.code, early.message) == (
        Code.FAILED_PRECONDITION,
        "CreateContainer is not allowed in state registered",
    )
    assert trunk.policy.calls == []  # the policy was not asked
    # the trunk lives: the runtime goes on as it should
    await synchronize(trunk)
    assert trunk.session.configured.is_set() and trunk.session.synchronized.is_set()
    created = await trunk.call("CreateContainer", create_request("c1"))
    assert created.code == 0
    assert trunk.policy.calls == [("create", "c1")]


async def test_create_between_configure_and_synchronize(trunk: Trunk) -> None:
    configure = pb.ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24")
    assert (await trunk.call("Configure", configure.SerializeToString())).code == 0
    assert trunk.session.configured.is_set() and not trunk.session.synchronized.is_set()
    for method, payload in (
        ("CreateContainer", create_request("c0")),
        ("StartContainer", container_request(pb.StartContainerRequest, "c0")),
        ("StateChange", pb.StateChangeEvent(event=pb.RUN_POD_SANDBOX).SerializeToString()),
    ):
        early = await trunk.call(method, payload)
        assert (early.code, early.message) == (
            Code.FAILED_PRECONDITION,
            f"{method} is not allowed in state configured",
        )
    assert trunk.policy.calls == []


async def test_split_synchronize_takes_no_event_between_parts(trunk: Trunk) -> None:
    configure = pb.ConfigureRequest(runtime_name="containerd", runtime_version="2.0.0")
    assert (await trunk.call("Configure", configure.SerializeToString())).code == 0
    part = await trunk.call("Synchronize", pb.SynchronizeRequest(more=True).SerializeToString())
    assert part.code == 0 and pb.SynchronizeResponse.FromString(part.payload).more
    early = await trunk.call("CreateContainer", create_request("c0"))
    assert (early.code, early.message) == (
        Code.FAILED_PRECONDITION,
        "CreateContainer is not allowed in state synchronizing",
    )
    assert (await trunk.call("Synchronize")).code == 0
    assert (await trunk.call("CreateContainer", create_request("c0"))).code == 0
    assert trunk.policy.calls == [("create", "c0")]


async def test_configure_twice_is_refused(trunk: Trunk) -> None:
    await synchronize(trunk)
    again = await trunk.call("Configure", pb.ConfigureRequest().SerializeToString())
    assert (again.code, again.message) == (
        Code.FAILED_PRECONDITION,
        "Configure is not allowed in state synchronized",
    )


async def test_dedicated_rpcs_no_hook_wants_are_unimplemented(trunk: Trunk) -> None:
    """v0.12 falls back to StateChange only on UNIMPLEMENTED: an empty OK would
    swallow the event. The host's cache wants the removals; the policy wants
    StartContainer; every other dedicated RPC must be UNIMPLEMENTED."""
    await synchronize(trunk)
    served = {"StartContainer", "RemoveContainer", "RemovePodSandbox"}
    for method in DEDICATED:
        req_type = getattr(pb, f"{method}Request")
        answer = await trunk.call(method, container_request(req_type, "c0"))
        if method in served:
            assert answer.code == 0, (method, answer.message)
        else:
            assert (answer.code, answer.message) == (Code.UNIMPLEMENTED, f"method {method}")
    assert trunk.policy.calls == [("start", "c0")]


@pytest.mark.parametrize("method", ["StartContainer", "RemoveContainer"])
async def test_a_container_event_without_its_container_is_malformed(
    trunk: Trunk, method: str
) -> None:
    """A dedicated RPC or a StateChange of a container's event that carries no
    container is INVALID_ARGUMENT (not a hook called with a missing argument,
    answered UNKNOWN); nothing is called and the session goes on."""
    await synchronize(trunk)
    req: Any = getattr(pb, f"{method}Request")()
    req.pod.id = "p"
    answer = await trunk.call(method, req.SerializeToString())
    event = "START_CONTAINER" if method == "StartContainer" else "REMOVE_CONTAINER"
    assert (answer.code, answer.message) == (
        Code.INVALID_ARGUMENT,
        f"{method}: {event} event without its container",
    )
    change = pb.StateChangeEvent(event=int(getattr(pb, event)))
    change.pod.id = "p"
    answer = await trunk.call("StateChange", change.SerializeToString())
    assert (answer.code, answer.message) == (
        Code.INVALID_ARGUMENT,
        f"StateChange: {event} event without its container",
    )
    assert trunk.policy.calls == []
    assert trunk.session.lifecycle.state is LifecycleState.SYNCHRONIZED
    ok = await trunk.call(method, container_request(getattr(pb, f"{method}Request"), "c1"))
    assert ok.code == 0, ok.message
    assert trunk.policy.calls == ([("start", "c1")] if method == "StartContainer" else [])


async def test_resent_pods_converted_once_forgotten_at_removal(trunk: Trunk) -> None:
    await synchronize(trunk)

    def create(cid: str, value: str) -> bytes:
        req = pb.CreateContainerRequest()
        req.pod.id, req.pod.annotations["a"] = "p", value
        req.container.id, req.container.pod_sandbox_id = cid, "p"
        return bytes(req.SerializeToString())

    assert (await trunk.call("CreateContainer", create("c1", "1"))).code == 0
    pod = trunk.session.host.cache.pods["p"]
    assert (await trunk.call("CreateContainer", create("c2", "1"))).code == 0
    assert trunk.session.host.cache.pods["p"] is pod  # resent unchanged: converted once
    assert (await trunk.call("CreateContainer", create("c3", "2"))).code == 0
    assert trunk.session.host.cache.pods["p"].annotations == {"a": "2"}  # changed: anew
    assert len(trunk.session.pods) == 1
    removed = pb.StateChangeEvent(event=pb.REMOVE_POD_SANDBOX)
    removed.pod.id = "p"
    assert (await trunk.call("StateChange", removed.SerializeToString())).code == 0
    assert len(trunk.session.pods) == 0 and "p" not in trunk.session.host.cache.pods


async def test_a_call_after_the_reply_runs_once_it_is_written_before_the_next_request(
    trunk: Trunk,
) -> None:
    """What a create leaves for after its reply (balloons: the helper's
    commit) runs once the answer is on the runtime's socket, and before the
    request that came behind it (the container's StartContainer) is
    dispatched: the runtime does not wait for it, and the start does."""
    await synchronize(trunk)
    runtime_end = socket.socket(fileno=os.dup(trunk.writer.get_extra_info("socket").fileno()))

    def later() -> None:
        try:  # the runtime's socket holds the create's answer already
            waiting = runtime_end.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            waiting = b""
        trunk.policy.calls.append(("after reply", "answer written" if waiting else "not yet"))

    trunk.policy.later = later
    with runtime_end:
        create = trunk.conn.send_request("CreateContainer", create_request("c1"))
        start = trunk.conn.send_request(
            "StartContainer", container_request(pb.StartContainerRequest, "c1")
        )
        trunk.writer.write(trunk.conn.data_to_send())  # both in one write
        codes: dict[int, int] = {}
        while len(codes) < 2:
            data = await asyncio.wait_for(trunk.reader.read(65536), 5)
            assert data, "the plugin closed the trunk"
            for ev in trunk.conn.receive_data(data):
                if isinstance(ev, ResponseReceived):
                    codes[ev.stream_id] = ev.code
    assert codes == {create: 0, start: 0}
    assert trunk.policy.calls == [
        ("create", "c1"),
        ("after reply", "answer written"),
        ("start", "c1"),
    ]


# --- TrunkReader: what arrives goes to the session in the read callback ------


@pytest.fixture
async def trunk_pair() -> AsyncIterator[tuple[TrunkReader, socket.socket]]:
    plugin_end, runtime_end = socket.socketpair()
    reader, writer = await open_trunk(sock=plugin_end)
    runtime_end.setblocking(False)
    try:
        yield reader, runtime_end
    finally:
        writer.close()
        runtime_end.close()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_trunk_keeps_what_arrives_without_a_sink_and_hands_it_first(
    trunk_pair: tuple[TrunkReader, socket.socket],
) -> None:
    reader, peer = trunk_pair
    got: list[bytes] = []
    peer.send(b"one")
    await settle()
    reader.hand_to(got.append)
    peer.send(b"two")
    await settle()
    reader.hand_to(None)
    peer.send(b"three")
    await settle()
    reader.hand_to(got.append)
    assert b"".join(got) == b"onetwothree" and got[1] == b"two"


async def test_trunk_stops_reading_past_its_bound_until_a_sink_comes(
    trunk_pair: tuple[TrunkReader, socket.socket],
) -> None:
    reader, peer = trunk_pair
    sent = 0
    with contextlib.suppress(BlockingIOError):
        while sent < 8 * KEPT_MAX:  # a peer writing without end before anyone reads
            sent += peer.send(b"x" * 4096)
            if sent % (KEPT_MAX // 2) == 0:
                await asyncio.sleep(0)
    await settle()
    assert len(reader._kept) <= KEPT_MAX + 4 * 65536  # stopped near the bound: not all of it
    assert reader._kept and len(reader._kept) < sent
    got: list[bytes] = []
    reader.hand_to(got.append)  # reading again: the rest comes
    for _ in range(200):
        if sum(map(len, got)) == sent:
            break
        await asyncio.sleep(0.01)
    assert sum(map(len, got)) == sent


async def test_trunk_drops_what_arrives_after_its_end(
    trunk_pair: tuple[TrunkReader, socket.socket],
) -> None:
    reader, peer = trunk_pair
    reader.finish("closing NRI connection: garbage")
    peer.send(b"late" * 1000)
    await settle()
    assert not reader._kept
    assert await reader.ended() == "closing NRI connection: garbage"


async def test_trunk_ends_at_eof(trunk_pair: tuple[TrunkReader, socket.socket]) -> None:
    reader, peer = trunk_pair
    reader.hand_to(lambda data: None)
    peer.shutdown(socket.SHUT_WR)
    assert await asyncio.wait_for(reader.ended(), 5) == "runtime closed the connection"

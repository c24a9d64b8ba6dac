"""The runtime side of NRI in Python: a containerd stand-in for tests and demos.

:class:`SimulatedRuntime` listens on a unix socket like containerd's NRI
adaptation, admits plugins one at a time (RegisterPlugin, Configure,
Synchronize), relays pod and container lifecycle events to them in index
order under one lock, merges their answers with per-field ownership and keeps
a container table that reflects what a real runtime would have applied.

Behaviour follows NRI's ``pkg/adaptation`` (v0.6.1 by default; see
:class:`~nri_framework.simulate.emulation.Emulation`) and containerd 1.7's
use of it, including timeouts (a plugin that does not answer in time is
closed and the event goes on without it) and upstream's log and error texts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from google.protobuf.message import Message

from nri_framework import convert
from nri_framework.convert import container_to_pb, pod_to_pb
from nri_framework.model import Container, Event, Pod, Resources
from nri_framework.nri.ttrpc import MAX_MESSAGE, Code
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.emulation import CONTAINERD_1_7, Emulation
from nri_framework.simulate.merge import CreateMerge, MergeError, Owners, Updates
from nri_framework.simulate.peer import (
    FatalPluginError,
    OversizedRequest,
    PluginError,
    PluginPeer,
    PluginStatusError,
    RegistrationError,
)
from nri_framework.simulate.wire import overlay_resources

log = logging.getLogger("nri_framework.simulate")

#: containerd puts its namespace into the ttrpc metadata of event RPCs.
NAMESPACE_KEY = "containerd-namespace-ttrpc"
#: Smallest number of objects per split SynchronizeRequest (upstream).
MIN_SYNC_OBJECTS = 8
FIRST_PID = 10_000

_DEDICATED: dict[Event, type[Message]] = {
    Event.RUN_POD_SANDBOX: pb.RunPodSandboxRequest,
    Event.STOP_POD_SANDBOX: pb.StopPodSandboxRequest,
    Event.REMOVE_POD_SANDBOX: pb.RemovePodSandboxRequest,
    Event.POST_CREATE_CONTAINER: pb.PostCreateContainerRequest,
    Event.START_CONTAINER: pb.StartContainerRequest,
    Event.POST_START_CONTAINER: pb.PostStartContainerRequest,
    Event.POST_UPDATE_CONTAINER: pb.PostUpdateContainerRequest,
    Event.REMOVE_CONTAINER: pb.RemoveContainerRequest,
}


class NriError(Exception):
    """An NRI step failed the runtime operation (the CRI call would fail with this text)."""


class AdmissionError(Exception):
    """A connecting plugin was refused."""


@dataclass(frozen=True)
class PluginInfo:
    """A connected plugin."""

    name: str
    index: str
    events: int
    pid: int = 0

    @property
    def full_name(self) -> str:
        return f"{self.index}-{self.name}"

    @property
    def mask(self) -> int:
        """The subscribed events (an alias of ``events``)."""
        return self.events


class SimulatedRuntime:
    """A containerd-like NRI runtime on ``socket_path``.

    ``emulation`` selects the runtime identity and NRI version behaviour;
    ``registration_timeout``/``request_timeout`` are in seconds (upstream
    defaults 5 s and 2 s); ``max_message_size`` is the ttrpc message limit
    a Synchronize must fit in (4 MiB like ttrpc; lower it to test paging).
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        *,
        emulation: Emulation = CONTAINERD_1_7,
        registration_timeout: float = 5.0,
        request_timeout: float = 2.0,
        max_message_size: int = MAX_MESSAGE,
        plugin_config: str = "",
        namespace: str = "k8s.io",
    ) -> None:
        self.socket_path = Path(socket_path)
        self.emulation = emulation
        self.registration_timeout = registration_timeout
        self.request_timeout = request_timeout
        self.max_message_size = max_message_size
        self.plugin_config = plugin_config
        self.metadata = ((NAMESPACE_KEY, namespace),)
        #: why plugins were refused or dropped, newest last
        self.failures: list[str] = []
        self._pods: dict[str, pb.PodSandbox] = {}
        self._containers: dict[str, pb.Container] = {}
        self._plugins: list[PluginPeer] = []
        self._peers: set[PluginPeer] = set()
        self._all_peers: list[PluginPeer] = []
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._queue: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )
        self._server: asyncio.Server | None = None
        self._admitting: asyncio.Task[None] | None = None
        self._next_pid = FIRST_PID
        self._serial = 0

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Listen for plugins (the socket's directory is created with mode 0700)."""
        self.socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._on_connect, path=str(self.socket_path))
        self._admitting = asyncio.create_task(self._admit_loop())
        log.info(
            "runtime interface started on %s (emulating %s %s, NRI %s)",
            self.socket_path,
            self.emulation.runtime_name,
            self.emulation.runtime_version,
            ".".join(map(str, self.emulation.nri)),
        )

    async def stop(self) -> None:
        """Stop listening and close every plugin connection (plugins just see EOF)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()  # stop listening; wait_closed() comes after the peers close
        if self._admitting is not None:
            self._admitting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._admitting
            self._admitting = None
        peers = list(self._peers)
        for peer in peers:
            peer.close()
        self._plugins.clear()
        self._peers.clear()
        while not self._queue.empty():
            self._queue.get_nowait()[1].close()
        for peer in peers:
            await peer.wait_closed()
        if server is not None:
            # since Python 3.12.1 this waits for every accepted connection too
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def __aenter__(self) -> SimulatedRuntime:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- views -------------------------------------------------------------------

    @property
    def plugins(self) -> list[PluginInfo]:
        """Connected plugins in invocation order."""
        return [PluginInfo(p.name, p.index, p.events, p.pid) for p in self._active()]

    @property
    def pods(self) -> dict[str, Pod]:
        return {pid: convert.pod_from_pb(p) for pid, p in self._pods.items()}

    @property
    def containers(self) -> dict[str, Container]:
        """The container table, as the runtime would report it now."""
        return {cid: convert.container_from_pb(c) for cid, c in self._containers.items()}

    def call_times(self, method: str) -> list[float]:
        """Seconds each answered ``method`` call took, over every plugin ever connected."""
        return [t for p in self._all_peers for t in p.call_times.get(method, ())]

    def container(self, container_id: str) -> Container:
        return convert.container_from_pb(self._container(container_id))

    async def wait_plugins(self, n: int = 1, timeout: float = 10.0) -> list[PluginInfo]:
        """Wait until at least ``n`` plugins are connected."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._active()) < n:
            self._changed.clear()
            remaining = deadline - loop.time()
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, remaining))
            except TimeoutError:
                why = f"; failures: {'; '.join(self.failures)}" if self.failures else ""
                raise TimeoutError(
                    f"{len(self._active())} of {n} plugin(s) connected after {timeout}s{why}"
                ) from None
        return self.plugins

    # -- admission ---------------------------------------------------------------

    def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._queue.put_nowait((reader, writer))

    async def _admit_loop(self) -> None:
        while True:
            reader, writer = await self._queue.get()
            await self._admit(reader, writer)

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = PluginPeer(
            reader,
            writer,
            on_updates=self._plugin_updates,
            max_message_size=self.max_message_size,
            nri_reported=self.emulation.dedicated_rpcs,
        )
        self._peers.add(peer)
        self._all_peers.append(peer)
        peer.start()
        try:
            await self._register(peer)
            await self._configure(peer)
            async with self._lock:
                await self._synchronize(peer)
                self._plugins.append(peer)
                self._drop_closed()
        except AdmissionError as exc:
            self._refuse(peer, f"failed to start external plugin: {exc}")
            return
        except (PluginError, MergeError) as exc:
            self._refuse(peer, f"failed to synchronize plugin: {exc}")
            return
        log.info("plugin %s connected", f'"{peer.full_name}"')
        self._changed.set()

    def _refuse(self, peer: PluginPeer, reason: str) -> None:
        log.error("%s", reason)
        self.failures.append(reason)
        peer.close()
        self._peers.discard(peer)
        self._changed.set()

    async def _register(self, peer: PluginPeer) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(peer.registered), self.registration_timeout)
        except TimeoutError:
            raise AdmissionError("plugin registration timed out") from None
        except RegistrationError as exc:
            raise AdmissionError(f"failed to register plugin: {exc}") from None
        except FatalPluginError:
            raise AdmissionError("failed to register plugin, connection closed") from None

    async def _configure(self, peer: PluginPeer) -> None:
        em = self.emulation
        req = pb.ConfigureRequest(
            config=self.plugin_config,
            runtime_name=em.runtime_name,
            runtime_version=em.runtime_version,
        )
        if em.sends_timeouts:
            req.registration_timeout = int(self.registration_timeout * 1000)
            req.request_timeout = int(self.request_timeout * 1000)
        if em.nri_version:
            req.NRI_version = em.nri_version
        try:
            rpl = await peer.call("Configure", req, pb.ConfigureResponse, deadline=self._deadline())
        except PluginError as exc:
            raise AdmissionError(f"failed to configure plugin: {exc}") from None
        events = rpl.events
        if events == 0:
            events = em.valid_events
        elif extra := events & ~em.valid_events:
            raise AdmissionError(f"invalid plugin events: 0x{extra:x}")
        peer.events = events

    async def _synchronize(self, peer: PluginPeer) -> None:
        """Send every pod and container; page with ``more`` when too big (v0.7+)."""
        log.info("synchronizing plugin %s", peer.full_name)
        pods, ctrs = list(self._pods.values()), list(self._containers.values())
        per_pods, per_ctrs = len(pods), len(ctrs)
        deadline = self._deadline()
        while True:
            more = len(pods) > per_pods or len(ctrs) > per_ctrs
            req = pb.SynchronizeRequest(pods=pods[:per_pods], containers=ctrs[:per_ctrs], more=more)
            try:
                rpl = await peer.call("Synchronize", req, pb.SynchronizeResponse, deadline=deadline)
            except OversizedRequest as exc:
                if not self.emulation.splits_sync:
                    raise
                per_pods, per_ctrs = _shrink(per_pods, per_ctrs, exc)
                continue
            if not more:
                break
            if rpl.update or not rpl.more:
                raise PluginError("plugin does not handle split sync requests")
            pods, ctrs = pods[per_pods:], ctrs[per_ctrs:]
            per_pods, per_ctrs = min(per_pods, len(pods)), min(per_ctrs, len(ctrs))
        self._apply_updates(list(rpl.update), peer.full_name)

    # -- plumbing ----------------------------------------------------------------

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.request_timeout

    def _active(self) -> list[PluginPeer]:
        return sorted((p for p in self._plugins if not p.closed), key=lambda p: p.index)

    def _drop_closed(self) -> None:
        gone = [p for p in self._plugins if p.closed]
        for peer in gone:
            self._peers.discard(peer)
            self.failures.append(f"plugin {peer.full_name} closed")
        self._plugins = self._active()
        if gone:
            self._changed.set()

    def _close_plugin(self, peer: PluginPeer, what: str, exc: Exception) -> None:
        log.error("closing plugin %s, failed to handle %s: %s", peer.full_name, what, exc)
        peer.close()

    def _container(self, container_id: str) -> pb.Container:
        try:
            return self._containers[container_id]
        except KeyError:
            raise KeyError(f"container {container_id!r} not found") from None

    def _pod(self, pod_id: str) -> pb.PodSandbox:
        try:
            return self._pods[pod_id]
        except KeyError:
            raise KeyError(f"pod sandbox {pod_id!r} not found") from None

    async def _request(
        self, peer: PluginPeer, method: str, req: Message, rtype: type[Message]
    ) -> Message | None:
        """One request/response RPC; ``None`` when the plugin had to be closed."""
        md = () if method == "StopContainer" else self.metadata
        try:
            return await peer.call(method, req, rtype, deadline=self._deadline(), metadata=md)
        except FatalPluginError as exc:
            self._close_plugin(peer, f"{method} request", exc)
            return None

    async def _for_each(self, event: Event, step: Callable[[PluginPeer], Awaitable[None]]) -> None:
        """Run ``step`` for every plugin subscribed to ``event``, in order, under the lock."""
        async with self._lock:
            try:
                for peer in self._active():
                    if peer.subscribed(event) and not peer.closed:
                        await step(peer)
            finally:
                self._drop_closed()

    # -- notifications -----------------------------------------------------------

    async def _notify(
        self, event: Event, pod: pb.PodSandbox, ctr: pb.Container | None = None
    ) -> None:
        """A StateChange-type event to every subscribed plugin; raises PluginStatusError."""

        async def step(peer: PluginPeer) -> None:
            try:
                await self._state_change(peer, event, pod, ctr)
            except FatalPluginError as exc:
                what = (
                    f"{self.emulation.event_name(event)} request"
                    if self.emulation.dedicated_rpcs
                    else f"event {int(event)}"
                )
                self._close_plugin(peer, what, exc)

        await self._for_each(event, step)

    async def _state_change(
        self, peer: PluginPeer, event: Event, pod: pb.PodSandbox, ctr: pb.Container | None
    ) -> None:
        deadline = self._deadline()
        if self.emulation.dedicated_rpcs and not peer.legacy_events and event in _DEDICATED:
            try:
                await self._dedicated(peer, event, pod, ctr, deadline)
                return
            except PluginStatusError as exc:
                if exc.code != Code.UNIMPLEMENTED:
                    raise
                peer.legacy_events = True
        req = pb.StateChangeEvent(event=int(event), pod=pod)  # type: ignore[arg-type]
        if ctr is not None:
            req.container.CopyFrom(ctr)
        await peer.call("StateChange", req, pb.Empty, deadline=deadline, metadata=self.metadata)

    async def _dedicated(
        self,
        peer: PluginPeer,
        event: Event,
        pod: pb.PodSandbox,
        ctr: pb.Container | None,
        deadline: float,
    ) -> None:
        req = _DEDICATED[event]()
        req.pod.CopyFrom(pod)  # type: ignore[attr-defined]
        if ctr is not None:
            req.container.CopyFrom(ctr)  # type: ignore[attr-defined]
        method = self.emulation.event_name(event)
        await peer.call(method, req, pb.Empty, deadline=deadline, metadata=self.metadata)

    async def _notify_logged(
        self, event: Event, pod: pb.PodSandbox, ctr: pb.Container | None = None
    ) -> None:
        """Like :meth:`_notify`, for events whose failure the runtime only logs."""
        try:
            await self._notify(event, pod, ctr)
        except PluginStatusError as exc:
            log.warning("NRI %s notification failed: %s", event.name, exc)

    # -- updates -----------------------------------------------------------------

    async def _plugin_updates(
        self, peer: PluginPeer, updates: list[pb.ContainerUpdate]
    ) -> list[pb.ContainerUpdate]:
        """Runtime.UpdateContainers from a plugin: applied under the event lock."""
        async with self._lock:
            return self._apply_updates(updates, peer.full_name)

    def _apply_updates(
        self, updates: list[pb.ContainerUpdate], source: str
    ) -> list[pb.ContainerUpdate]:
        """Apply updates to the table; returns the ones that failed."""
        failed: list[pb.ContainerUpdate] = []
        for u in updates:
            ctr = self._containers.get(u.container_id)
            if ctr is None:
                log.warning("update of unknown container %s from %s failed", u.container_id, source)
                if not u.ignore_failure:
                    failed.append(u)
                continue
            overlay_resources(ctr.linux.resources, u.linux.resources)
            log.info(
                "%s updated container %s/%s: %s",
                source,
                ctr.id,
                ctr.name,
                convert.resources_from_pb(u.linux.resources),
            )
        return failed

    # -- pods --------------------------------------------------------------------

    async def run_pod(self, pod: Pod) -> Pod:
        """RunPodSandbox: the pod gets an id (when it has none) and a pid."""
        p = pod_to_pb(pod)
        if not p.id:
            p.id = hashlib.sha256(
                f"sandbox:{p.uid or p.namespace + '/' + p.name}".encode()
            ).hexdigest()
        if p.id in self._pods:
            raise ValueError(f"pod sandbox {p.id} already exists")
        p.pid = self._new_pid()
        self._pods[p.id] = p
        try:
            await self._notify(Event.RUN_POD_SANDBOX, p)
        except PluginStatusError as exc:
            del self._pods[p.id]
            raise NriError(f"NRI RunPodSandbox failed: {exc}") from None
        return convert.pod_from_pb(p)

    async def stop_pod(self, pod_id: str) -> None:
        """StopPodSandbox: stops the pod's running containers first."""
        pod = self._pod(pod_id)
        for ctr in self._pod_containers(pod_id):
            if ctr.state != pb.CONTAINER_STOPPED:
                await self.stop_container(ctr.id)
        await self._notify_logged(Event.STOP_POD_SANDBOX, pod)

    async def remove_pod(self, pod_id: str) -> None:
        """RemovePodSandbox: removes the pod's containers first."""
        pod = self._pod(pod_id)
        for ctr in self._pod_containers(pod_id):
            await self.remove_container(ctr.id)
        await self._notify_logged(Event.REMOVE_POD_SANDBOX, pod)
        self._pods.pop(pod_id, None)

    def _pod_containers(self, pod_id: str) -> list[pb.Container]:
        return [c for c in self._containers.values() if c.pod_sandbox_id == pod_id]

    def _new_pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    # -- containers --------------------------------------------------------------

    async def create_container(self, pod_id: str, container: Container) -> Container:
        """CreateContainer with every subscribed plugin's adjustment merged in.

        Raises :class:`NriError` ("failed to get NRI adjustment for container:
        ...") when a plugin fails the request or two plugins set the same field.
        """
        pod = self._pod(pod_id)
        ctr = self._new_container(pod, container)
        req = pb.CreateContainerRequest(pod=pod, container=ctr)
        merge = CreateMerge(req)

        async def step(peer: PluginPeer) -> None:
            rpl = await self._request(peer, "CreateContainer", req, pb.CreateContainerResponse)
            if isinstance(rpl, pb.CreateContainerResponse):
                merge.apply(rpl, peer.full_name)

        try:
            await self._for_each(Event.CREATE_CONTAINER, step)
        except (PluginStatusError, MergeError) as exc:
            raise NriError(f"failed to get NRI adjustment for container: {exc}") from None
        created = merge.container
        created.state = pb.CONTAINER_CREATED
        self._containers[created.id] = created
        self._apply_updates(merge.updates.others(), "CreateContainer")
        await self._notify_logged(Event.POST_CREATE_CONTAINER, pod, created)
        return self.container(created.id)

    def _new_container(self, pod: pb.PodSandbox, container: Container) -> pb.Container:
        ctr = container_to_pb(container)
        ctr.pod_sandbox_id = pod.id
        ctr.state = pb.CONTAINER_UNKNOWN
        if not ctr.id:
            self._serial += 1
            ctr.id = hashlib.sha256(f"{pod.id}/{ctr.name}/{self._serial}".encode()).hexdigest()
        if ctr.id in self._containers:
            raise ValueError(f"container {ctr.id} already exists")
        if not ctr.linux.cgroups_path and pod.linux.cgroup_parent:
            ctr.linux.cgroups_path = f"{pod.linux.cgroup_parent}/{ctr.id}"
        return ctr

    async def start_container(self, container_id: str) -> Container:
        ctr = self._container(container_id)
        if ctr.state != pb.CONTAINER_CREATED:
            raise ValueError(f"container {container_id} is not in created state")
        pod = self._pod(ctr.pod_sandbox_id)
        ctr.pid = self._new_pid()
        try:
            await self._notify(Event.START_CONTAINER, pod, ctr)
        except PluginStatusError as exc:
            raise NriError(f"NRI container start failed: {exc}") from None
        ctr.state = pb.CONTAINER_RUNNING
        await self._notify_logged(Event.POST_START_CONTAINER, pod, ctr)
        return self.container(container_id)

    async def update_container(self, container_id: str, resources: Resources) -> Container:
        """UpdateContainerResources from the kubelet.

        A plugin's update of this same container replaces the kubelet's
        request (merged over it); otherwise the kubelet's values win, cpuset
        included.
        """
        ctr = self._container(container_id)
        pod = self._pod(ctr.pod_sandbox_id)
        req = pb.UpdateContainerRequest(pod=pod, container=ctr)
        req.linux_resources.SetInParent()
        convert.resources_to_pb(resources, req.linux_resources)
        updates = Updates(Owners(), requested=(ctr.id, req.linux_resources))

        async def step(peer: PluginPeer) -> None:
            rpl = await self._request(peer, "UpdateContainer", req, pb.UpdateContainerResponse)
            if isinstance(rpl, pb.UpdateContainerResponse):
                updates.apply(rpl.update, peer.full_name)

        try:
            await self._for_each(Event.UPDATE_CONTAINER, step)
        except (PluginStatusError, MergeError) as exc:
            raise NriError(f"NRI container update failed: {exc}") from None
        overlay_resources(ctr.linux.resources, req.linux_resources)
        self._apply_updates(updates.others(), "UpdateContainer")
        await self._notify_logged(Event.POST_UPDATE_CONTAINER, pod, ctr)
        return self.container(container_id)

    async def stop_container(self, container_id: str) -> Container:
        ctr = self._container(container_id)
        pod = self._pod(ctr.pod_sandbox_id)
        ctr.state = pb.CONTAINER_STOPPED
        ctr.pid = 0
        req = pb.StopContainerRequest(pod=pod, container=ctr)
        updates = Updates(Owners())

        async def step(peer: PluginPeer) -> None:
            rpl = await self._request(peer, "StopContainer", req, pb.StopContainerResponse)
            if isinstance(rpl, pb.StopContainerResponse):
                updates.apply(rpl.update, peer.full_name)

        try:
            await self._for_each(Event.STOP_CONTAINER, step)
        except (PluginStatusError, MergeError) as exc:
            log.warning("NRI stop container request failed: %s", exc)
        self._apply_updates(updates.others(), "StopContainer")
        return self.container(container_id)

    async def remove_container(self, container_id: str) -> None:
        """RemoveContainer (stopping it first, as the kubelet does)."""
        ctr = self._container(container_id)
        if ctr.state != pb.CONTAINER_STOPPED:
            await self.stop_container(container_id)
        await self._notify_logged(Event.REMOVE_CONTAINER, self._pod(ctr.pod_sandbox_id), ctr)
        self._containers.pop(container_id, None)


def _shrink(pods: int, ctrs: int, exc: OversizedRequest) -> tuple[int, int]:
    """Upstream's ``recalcObjsPerSyncMsg``: fewer objects per sync message."""
    if pods + ctrs <= MIN_SYNC_OBJECTS:
        raise PluginError("failed to synchronize plugin with split messages") from exc
    factor = min(0.9, exc.maximum / exc.length)
    pods, ctrs = int(pods * factor), int(ctrs * factor)
    if pods + ctrs < MIN_SYNC_OBJECTS:
        pods = ctrs = MIN_SYNC_OBJECTS // 2
    return pods, ctrs

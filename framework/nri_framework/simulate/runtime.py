"""The runtime side of NRI in Python: a containerd stand-in for tests and demos.

:class:`SimulatedRuntime` listens on a unix socket like containerd's NRI
adaptation, admits plugins one at a time (RegisterPlugin, Configure,
Synchronize), relays pod and container lifecycle events to them in index
order under one lock, merges their answers with per-field ownership and keeps
a container table that reflects what a real runtime would have applied.

The plugin side of it (admission, the fan-out of events, plugin updates) is
:class:`~nri_framework.simulate.adaptation.Adaptation`; this module is the pod
and container store and the CRI-like operations (run a pod, create, start,
update, stop and remove a container) that drive it.

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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Unpack

from nri_framework import convert
from nri_framework.convert import container_to_pb, pod_to_pb
from nri_framework.model import Container, Event, IOPriority, Pod, Resources, Scheduler
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.adaptation import Adaptation, Options
from nri_framework.simulate.merge import CreateMerge, MergeError, Owners, Updates
from nri_framework.simulate.peer import PluginPeer, PluginStatusError
from nri_framework.simulate.wire import overlay_resources

log = logging.getLogger("nri_framework.simulate")

FIRST_PID = 10_000


class NriError(Exception):
    """An NRI step failed the runtime operation (the CRI call would fail with this text)."""


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


class SimulatedRuntime(Adaptation):
    """A containerd-like NRI runtime on ``socket_path``.

    ``emulation`` selects the runtime identity and NRI version behaviour;
    ``registration_timeout``/``request_timeout`` are in seconds (upstream
    defaults 5 s and 2 s); ``max_message_size`` is the ttrpc message limit
    a Synchronize must fit in (4 MiB like ttrpc; lower it to test paging).
    The keywords are :class:`~nri_framework.simulate.adaptation.Options`.
    """

    def __init__(self, socket_path: str | os.PathLike[str], **options: Unpack[Options]) -> None:
        super().__init__(**options)
        self.socket_path = Path(socket_path)
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

    def scheduling(self, container_id: str) -> tuple[Scheduler | None, IOPriority | None]:
        """The container's scheduling policy (``linux.scheduler``) and I/O
        priority (``linux.io_priority``) as the plugins' adjustments left them:
        what a runtime applies to the container's process (``sched_setattr``,
        ``ioprio_set``). The simulator runs no process, so this is where they
        are read back."""
        linux = self._container(container_id).linux
        adj = pb.ContainerAdjustment()
        if linux.HasField("scheduler"):
            adj.linux.scheduler.CopyFrom(linux.scheduler)
        if linux.HasField("io_priority"):
            adj.linux.io_priority.CopyFrom(linux.io_priority)
        got = convert.adjustment_from_pb(adj)
        return got.scheduler, got.io_priority

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

    # -- pods --------------------------------------------------------------------

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
        # a runtime of an older NRI does not know these fields and drops them
        if self.emulation.nri < (0, 11):
            created.linux.ClearField("scheduler")
        if self.emulation.nri < (0, 10):
            created.linux.ClearField("io_priority")
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

"""The NRI side of the simulated runtime: plugin admission and the fan-out of events.

:class:`Adaptation` is what NRI's ``pkg/adaptation`` does inside containerd:
it admits plugins one at a time (RegisterPlugin, Configure, Synchronize, paged
with ``more`` when too big), relays each pod and container event to the
subscribed plugins in index order under one lock, closes a plugin that fails
fatally (a timeout, a closed trunk) and goes on without it, and applies the
updates plugins send. :class:`~nri_framework.simulate.runtime.SimulatedRuntime`
builds the pod and container store and the CRI-like operations on top of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypedDict, Unpack

from google.protobuf.message import Message

from nri_framework import convert
from nri_framework.model import Event
from nri_framework.nri.ttrpc import MAX_MESSAGE, Code
from nri_framework.pb import nri_pb2 as pb
from nri_framework.simulate.emulation import CONTAINERD_1_7, Emulation
from nri_framework.simulate.merge import MergeError
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


class AdmissionError(Exception):
    """A connecting plugin was refused."""


class Options(TypedDict, total=False):
    """How the runtime treats its plugins; every key is optional (defaults below)."""

    #: the runtime identity and NRI version behaviour (containerd 1.7, NRI 0.6.1)
    emulation: Emulation
    #: seconds (upstream default 5 s)
    registration_timeout: float
    #: seconds (upstream default 2 s)
    request_timeout: float
    #: the ttrpc message limit a Synchronize must fit in (4 MiB; lower it to test paging)
    max_message_size: int
    #: the text pre-launched plugins get in ConfigureRequest.config ("")
    plugin_config: str
    #: containerd's namespace in the event RPCs' metadata ("k8s.io")
    namespace: str


class Adaptation:
    """The plugins of one runtime: admission, event fan-out, their updates.

    Holds the pod and container tables the plugins are synchronized with
    and whose resources their updates change.
    """

    def __init__(self, **options: Unpack[Options]) -> None:
        self.emulation = options.get("emulation", CONTAINERD_1_7)
        self.registration_timeout = options.get("registration_timeout", 5.0)
        self.request_timeout = options.get("request_timeout", 2.0)
        self.max_message_size = options.get("max_message_size", MAX_MESSAGE)
        self.plugin_config = options.get("plugin_config", "")
        self.metadata = ((NAMESPACE_KEY, options.get("namespace", "k8s.io")),)
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


def _shrink(pods: int, ctrs: int, exc: OversizedRequest) -> tuple[int, int]:
    """Upstream's ``recalcObjsPerSyncMsg``: fewer objects per sync message."""
    if pods + ctrs <= MIN_SYNC_OBJECTS:
        raise PluginError("failed to synchronize plugin with split messages") from exc
    factor = min(0.9, exc.maximum / exc.length)
    pods, ctrs = int(pods * factor), int(ctrs * factor)
    if pods + ctrs < MIN_SYNC_OBJECTS:
        pods = ctrs = MIN_SYNC_OBJECTS // 2
    return pods, ctrs

"""The kubelet's pod-resources API (v1) as a cache kept off the NRI reply path.

The kubelet serves ``PodResourcesLister`` (``List``, ``Get`` since 1.27,
``GetAllocatableResources``) on a unix socket, by default
:data:`DEFAULT_SOCKET`; the messages are our own ``proto/nri_framework/pb/
podresources.proto``. :class:`PodResourcesClient` runs one asyncio task that
keeps a :class:`PodResourcesCache` current: a ``List`` at start and every
``list_interval`` seconds (it replaces the cache: the kubelet's answer is the
whole truth), and a ``Get`` for each pod :meth:`~PodResourcesClient.want`
names (the plugin asks at RunPodSandbox; a kubelet without ``Get`` is served
by ``List`` instead, with upstream's warnings). A decision reads only the
cache (:meth:`PodResourcesCache.devices`): nothing on the reply path waits
for the kubelet, and a pod whose answer has not arrived yet has no devices
(``None``).

Bounded against a hostile, huge or slow peer: every call has a deadline
(``timeout``), a reply larger than ``max_reply`` bytes is refused by gRPC
(``grpc.max_receive_message_length``, upstream's 16 MiB), at most
``MAX_PENDING`` pods wait for a ``Get``, and the conversion of a reply runs in
a worker thread. A failure (socket missing, no answer, refused reply) is one
warning naming the socket until the next success; the task then retries with
a doubling delay on a fresh channel, so a socket that appears later is found.

Framework-neutral (the kubelet's API, not a policy's): a policy builds the
client, starts it on the event loop and reads the cache.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc  # type: ignore[import-untyped]
import msgspec

from nri_framework.pb import podresources_pb2 as pb
from nri_framework.pb import podresources_pb2_grpc

log = logging.getLogger("nri_framework.podresources")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves the API (relative to the host root)."""
MAX_REPLY = 16 * 1024 * 1024
"""Bytes of one reply at most (upstream's ``maxSize``)."""
CALL_TIMEOUT = 2.0
"""Seconds one call may take."""
LIST_INTERVAL = 30.0
"""Seconds between two ``List`` calls while the API answers."""
RETRY_MIN = 0.5
RETRY_MAX = 30.0
"""Seconds between attempts while the API fails (doubling)."""
MAX_PENDING = 256
"""Pods waiting for a ``Get`` at most; beyond it the next ``List`` serves them."""
GET_DISABLED = "pod resource API Get method disabled"
"""The kubelet's error text for a ``Get`` behind its feature gate."""


class DeviceAssignment(msgspec.Struct, frozen=True):
    """Device instances of one resource assigned to a container, and their NUMA nodes."""

    resource: str
    ids: tuple[str, ...] = ()
    numa: tuple[int, ...] = ()


PodKey = tuple[str, str]
"""(namespace, pod name)"""
PodDevices = dict[str, tuple[DeviceAssignment, ...]]
"""container name -> its device assignments"""


class PodResourcesCache:
    """What the kubelet last said, per pod: read on the reply path, written by
    the client's task alone."""

    def __init__(self) -> None:
        self._pods: dict[PodKey, PodDevices] = {}

    def devices(
        self, namespace: str, pod: str, container: str
    ) -> tuple[DeviceAssignment, ...] | None:
        """The devices assigned to ``container``; ``None`` while the pod is unknown."""
        got = self._pods.get((namespace, pod))
        if got is None:
            return None
        return got.get(container, ())

    def known(self, namespace: str, pod: str) -> bool:
        return (namespace, pod) in self._pods

    def put(self, key: PodKey, devices: PodDevices) -> None:
        self._pods[key] = devices

    def replace(self, pods: Mapping[PodKey, PodDevices]) -> None:
        self._pods = dict(pods)

    def forget(self, key: PodKey) -> None:
        self._pods.pop(key, None)

    def __len__(self) -> int:
        return len(self._pods)


class CallFailed(Exception):
    """A call that did not give an answer; ``kind`` groups the warnings."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind


def _pod_devices(pod: Any) -> PodDevices:
    return {
        c.name: tuple(
            DeviceAssignment(
                resource=d.resource_name,
                ids=tuple(d.device_ids),
                numa=tuple(n.ID for n in d.topology.nodes),
            )
            for d in c.devices
        )
        for c in pod.containers
    }


def _list_reply(reply: Any) -> dict[PodKey, PodDevices]:
    return {(p.namespace, p.name): _pod_devices(p) for p in reply.pod_resources}


class PodResourcesClient:
    """The background task that keeps :attr:`cache` current (see the module).

    ``on_update(namespace, pod)`` is called on the event loop after a pod's
    answer lands in the cache (``Get``) and with ``("", "")`` after a ``List``.
    ``clock`` and ``sleep`` are injectable for tests."""

    def __init__(
        self,
        socket: str,
        *,
        timeout: float = CALL_TIMEOUT,
        max_reply: int = MAX_REPLY,
        list_interval: float = LIST_INTERVAL,
        retry_min: float = RETRY_MIN,
        retry_max: float = RETRY_MAX,
        on_update: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket = socket
        self.timeout = timeout
        self.max_reply = max_reply
        self.list_interval = list_interval
        self.retry_min = retry_min
        self.retry_max = retry_max
        self.on_update = on_update
        self.clock = clock
        self.cache = PodResourcesCache()
        self.no_get = False
        self._pending: collections.OrderedDict[PodKey, None] = collections.OrderedDict()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._channel: Any = None
        self._stub: Any = None
        self._failing = ""
        self._list_due = 0.0

    # -- the event loop's side --------------------------------------------------------

    def start(self) -> None:
        """Start the background task (on the running loop); idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def want(self, namespace: str, pod: str) -> None:
        """Ask for ``pod``'s resources in the background (never waits)."""
        key = (namespace, pod)
        if key in self._pending:
            return
        if len(self._pending) >= MAX_PENDING:
            self._pending.popitem(last=False)  # the next List serves it
            self._list_due = 0.0
        self._pending[key] = None
        self._wake.set()

    def forget(self, namespace: str, pod: str) -> None:
        """``pod`` is gone: drop its cached resources and any pending ``Get``."""
        self._pending.pop((namespace, pod), None)
        self.cache.forget((namespace, pod))

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._drop_channel()

    def stop(self) -> None:
        """Cancel the task from synchronous code (the channel closes with it)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    # -- the task ---------------------------------------------------------------------

    async def _run(self) -> None:
        delay = self.retry_min
        try:
            while True:
                try:
                    if self.no_get and self._pending:
                        self._pending.clear()  # a List serves them all
                        self._list_due = 0.0
                    if self.clock() >= self._list_due:
                        await self._list()
                        self._list_due = self.clock() + self.list_interval
                    while self._pending and not self.no_get:
                        key = next(iter(self._pending))
                        await self._get(key)
                        self._pending.pop(key, None)
                    if self.no_get and self._pending:
                        continue
                except CallFailed as exc:
                    self._warn(exc)
                    await self._drop_channel()
                    self._list_due = 0.0  # resynchronize once it answers again
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_max)
                    continue
                if self._failing:
                    log.info("pod-resources API at %s answers again", self.socket)
                    self._failing = ""
                delay = self.retry_min
                self._wake.clear()
                wait = max(0.0, self._list_due - self.clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
        finally:
            await self._drop_channel()

    def _warn(self, exc: CallFailed) -> None:
        if exc.kind != self._failing:
            log.warning(
                "pod-resources API at %s: %s; podresourceapi: device hints are dropped "
                "until it answers (retrying in the background)",
                self.socket,
                exc,
            )
        self._failing = exc.kind

    def _connect(self) -> Any:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix:{self.socket}",
                options=[
                    ("grpc.max_receive_message_length", self.max_reply),
                    ("grpc.max_send_message_length", 64 * 1024),
                    ("grpc.enable_retries", 0),
                ],
            )
            self._stub = podresources_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    async def _drop_channel(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close(grace=None)

    async def _call(self, method: str, request: Any) -> Any:
        stub = self._connect()
        try:
            reply = await getattr(stub, method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise _failure(method, exc, self.timeout, self.max_reply) from None
        if reply is None:  # grpc's answer to bytes that do not parse (it logs why)
            raise CallFailed("malformed", f"{method} reply is not a valid protobuf message")
        return reply

    async def _list(self) -> None:
        reply = await self._call("List", pb.ListPodResourcesRequest())
        pods = await asyncio.to_thread(_list_reply, reply)
        self.cache.replace(pods)
        log.debug("pod-resources: List gave %d pods", len(pods))
        if self.on_update is not None:
            self.on_update("", "")

    async def _get(self, key: PodKey) -> None:
        namespace, pod = key
        request = pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        try:
            reply = await self._call("Get", request)
        except CallFailed as exc:
            if exc.kind == "get-disabled":
                log.warning("PodResources API Get() disabled, falling back to List()...")
                log.warning("You can enable Get() by passing this feature gate setting to kubelet:")
                log.warning("  --feature-gates=KubeletPodResourcesGet=true")
                self.no_get = True
                self._list_due = 0.0  # the List serves this pod
                return
            if exc.kind == "not-found":
                log.debug("pod-resources: %s/%s: %s", namespace, pod, exc)
                return
            raise
        self._store(key, await asyncio.to_thread(_pod_devices, reply.pod_resources))

    def _store(self, key: PodKey, devices: PodDevices) -> None:
        self.cache.put(key, devices)
        log.debug(
            "pod-resources of pod %s/%s: %s",
            *key,
            {c: [d.resource for d in devs] for c, devs in devices.items()},
        )
        if self.on_update is not None:
            self.on_update(*key)


def _failure(method: str, exc: Any, timeout: float, max_reply: int) -> CallFailed:
    code = exc.code()
    details = exc.details() or ""
    if GET_DISABLED in details or (method == "Get" and code == grpc.StatusCode.UNIMPLEMENTED):
        return CallFailed("get-disabled", f"{method}: {details}")
    if code == grpc.StatusCode.NOT_FOUND:
        return CallFailed("not-found", f"{method}: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CallFailed("slow", f"{method} got no answer within {timeout:g} s")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return CallFailed(
            "huge", f"{method} reply refused: larger than {max_reply} bytes ({details})"
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return CallFailed("unavailable", f"{method}: not reachable ({details})")
    return CallFailed(str(code), f"{method} failed: {code.name}: {details}")


def socket_path(host_root: str, flag: str) -> str:
    """The socket to use: ``flag`` when given (as it is), else
    :data:`DEFAULT_SOCKET` under ``host_root``."""
    if flag:
        return flag
    return host_root.rstrip("/") + DEFAULT_SOCKET


__all__: Sequence[str] = [
    "DEFAULT_SOCKET",
    "MAX_REPLY",
    "DeviceAssignment",
    "PodResourcesCache",
    "PodResourcesClient",
    "socket_path",
]

"""A stand-in for the kubelet's pod-resources API (no kubelet can run here).

Ours and small: a real gRPC server (grpcio's asyncio server) serving
``v1.PodResourcesLister`` from our own ``podresources.proto`` on a unix
socket in a temp dir, with the device assignments a test gives it, the way
upstream test24's fake device plugins make the kubelet assign them. Faults a
test can ask for: ``hang`` (a call never answers), ``pad`` (a reply grown by
that many bytes of device IDs), ``get_disabled`` (``Get`` refused with the
kubelet's feature-gate error, or answered ``UNIMPLEMENTED`` as a kubelet
older than 1.27 does), ``malformed`` (every reply is bytes that do not parse:
a truncated length-delimited field).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from nri_framework.pb import podresources_pb2 as pb
from nri_framework.pb import podresources_pb2_grpc as pb_grpc

GET_DISABLED = "pod resource API Get method disabled"


@dataclass
class Assigned:
    """One device instance of ``resource`` given to a container, on ``numa`` nodes."""

    resource: str
    device: str
    numa: tuple[int, ...]


@dataclass
class Kubelet(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """``pods[(namespace, pod)][container] = [Assigned, ...]``; ``calls`` counts them."""

    socket: Path
    pods: dict[tuple[str, str], dict[str, list[Assigned]]] = field(default_factory=dict)
    hang: bool = False
    pad: int = 0
    get_disabled: str = ""  # "" | "gate" | "unimplemented"
    malformed: bool = False
    calls: list[str] = field(default_factory=list)
    _server: Any = None

    def assign(self, namespace: str, pod: str, container: str, *devices: Assigned) -> None:
        self.pods.setdefault((namespace, pod), {})[container] = list(devices)

    def _pod(self, key: tuple[str, str]) -> Any:
        containers = []
        for name, devices in self.pods[key].items():
            devs = [
                pb.ContainerDevices(
                    resource_name=d.resource,
                    device_ids=[d.device],
                    topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in d.numa]),
                )
                for d in devices
            ]
            if self.pad:
                pad = pb.ContainerDevices(resource_name="pad/pad", device_ids=["x" * self.pad])
                devs.append(pad)
            containers.append(pb.ContainerResources(name=name, devices=devs))
        return pb.PodResources(namespace=key[0], name=key[1], containers=containers)

    async def _enter(self, method: str) -> None:
        self.calls.append(method)
        if self.hang:
            await asyncio.Event().wait()  # never answers (the client's deadline ends it)

    async def List(self, request: Any, context: Any) -> Any:
        await self._enter("List")
        return pb.ListPodResourcesResponse(pod_resources=[self._pod(k) for k in self.pods])

    async def Get(self, request: Any, context: Any) -> Any:
        await self._enter("Get")
        if self.get_disabled == "gate":
            await context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        if self.get_disabled == "unimplemented":
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method Get")
        key = (request.pod_namespace, request.pod_name)
        if key not in self.pods:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )
        return pb.GetPodResourcesResponse(pod_resources=self._pod(key))

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        await self._enter("GetAllocatableResources")
        return pb.AllocatableResourcesResponse()

    async def start(self) -> Kubelet:
        self._server = grpc.aio.server()
        if self.malformed:
            self._server.add_generic_rpc_handlers((self._garbage(),))
        else:
            pb_grpc.add_PodResourcesListerServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix:{self.socket}")
        await self._server.start()
        return self

    def _garbage(self) -> Any:
        async def reply(request: bytes, context: Any) -> bytes:
            self.calls.append("malformed")
            return b"\x0a\xff\xff\xff\x0f"  # field 1, length 4 GiB, no bytes

        handler = grpc.unary_unary_rpc_method_handler(
            reply, request_deserializer=None, response_serializer=None
        )
        methods = ("List", "Get", "GetAllocatableResources")
        return grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", dict.fromkeys(methods, handler)
        )

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    async def __aenter__(self) -> Kubelet:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def devices(*items: tuple[str, str, Iterable[int]]) -> list[Assigned]:
    return [Assigned(r, d, tuple(n)) for r, d, n in items]

"""The host's pod/container cache: what the runtime told us, by id, with the
cpusets our decisions gave them, and what changed since the last journal
record (:mod:`nri_framework.journal`)."""

from __future__ import annotations

import msgspec

from nri_framework.hookspecs import hookimpl
from nri_framework.journal import Decision
from nri_framework.model import Container, ContainerState, CpuResources, Pod, Resources


def with_cpuset(res: Resources | None, cpus: str, mems: str) -> Resources:
    """``res`` with the cpuset fields that are non-empty replaced."""
    res = res or Resources()
    cpu = res.cpu or CpuResources()
    cpu = msgspec.structs.replace(cpu, cpus=cpus or cpu.cpus, mems=mems or cpu.mems)
    return msgspec.structs.replace(res, cpu=cpu)


class Cache:
    """Pods and containers the runtime told us about, by id, with the
    cpusets our decisions gave them.

    Registered with the plugin manager so that the subscription always
    includes the removal events the cache needs to forget things.
    """

    def __init__(self) -> None:
        self.pods: dict[str, Pod] = {}
        self.containers: dict[str, Container] = {}
        #: what changed since the last journal record (ids), or everything
        self.dirty_pods: set[str] = set()
        self.dirty_containers: set[str] = set()
        self.dirty_all = False
        #: container id -> (the container, what is stored of it): a container
        #: unchanged since (the same object) is not copied again
        self._stored_of: dict[str, tuple[Container, Container]] = {}
        #: pod id -> the ids of its containers in ``containers``: a pod's
        #: removal visits its own containers, not the node's
        self._of_pod: dict[str, set[str]] = {}

    def replace(self, pods: list[Pod], containers: list[Container]) -> None:
        """Everything the runtime reported (Synchronize)."""
        self.pods = {p.id: p for p in pods}
        self.containers = {c.id: c for c in containers}
        self._of_pod = {}
        for c in self.containers.values():
            self._of_pod.setdefault(c.pod_sandbox_id, set()).add(c.id)
        self.dirty_all = True

    def put_pod(self, pod: Pod) -> None:
        """Cache ``pod``; a change for the journal unless the cache holds it
        already as it is (the runtime sends the pod with every container
        request and event: a record holds what changed, not what was resent)."""
        old = self.pods.get(pod.id)
        self.pods[pod.id] = pod
        if old is None or (old is not pod and old != pod):
            self.dirty_pods.add(pod.id)

    def put_container(self, container: Container) -> None:
        old = self.containers.get(container.id)
        if old is None or old.pod_sandbox_id != container.pod_sandbox_id:
            if old is not None:
                self._unindex(old)
            self._of_pod.setdefault(container.pod_sandbox_id, set()).add(container.id)
        self.containers[container.id] = container
        self.dirty_containers.add(container.id)

    def _unindex(self, c: Container) -> None:
        ids = self._of_pod.get(c.pod_sandbox_id)
        if ids is not None:
            ids.discard(c.id)
            if not ids:
                del self._of_pod[c.pod_sandbox_id]

    def record(self, container_id: str, resources: Resources | None) -> None:
        """Remember the cpuset/memset a decision gave ``container_id``."""
        c = self.containers.get(container_id)
        if c is None or resources is None or resources.cpu is None:
            return
        cpu = resources.cpu
        if cpu.cpus or cpu.mems:
            resources = with_cpuset(c.resources, cpu.cpus, cpu.mems)
            self.containers[container_id] = msgspec.structs.replace(c, resources=resources)
            self.dirty_containers.add(container_id)

    def set_state(self, container_id: str, state: ContainerState) -> None:
        c = self.containers.get(container_id)
        if c is not None:
            self.containers[container_id] = msgspec.structs.replace(c, state=state)
            self.dirty_containers.add(container_id)

    def _stored(self, c: Container) -> Container:
        """What is persisted of ``c``: all but the bulky argv and environment
        (kept while ``c`` is the cache's entry: snapshots copy what changed)."""
        known = self._stored_of.get(c.id)
        if known is not None and known[0] is c:
            return known[1]
        stored = msgspec.structs.replace(c, args=[], env=[]) if c.args or c.env else c
        self._stored_of[c.id] = (c, stored)
        return stored

    def snapshot(self) -> tuple[dict[str, Pod], dict[str, Container]]:
        """What to persist: everything but the bulky argv and environment."""
        containers = {cid: self._stored(c) for cid, c in self.containers.items()}
        if len(self._stored_of) > len(containers):  # forget the containers gone
            self._stored_of = {cid: self._stored_of[cid] for cid in containers}
        return dict(self.pods), containers

    def take_changes(self, seq: int) -> Decision:
        """A journal record of what changed since the last one (and forget it)."""
        if self.dirty_all:
            pods, containers = self.snapshot()
            d = Decision(seq=seq, reset=True, pods=dict(pods), containers=dict(containers))
        else:
            d = Decision(
                seq=seq,
                pods={pid: self.pods.get(pid) for pid in self.dirty_pods},
                containers={
                    cid: self._stored(c) if (c := self.containers.get(cid)) else None
                    for cid in self.dirty_containers
                },
            )
        self.clear_changes()
        return d

    @property
    def dirty(self) -> bool:
        """Something changed since the last journal record."""
        return self.dirty_all or bool(self.dirty_pods) or bool(self.dirty_containers)

    def clear_changes(self) -> None:
        self.dirty_pods.clear()
        self.dirty_containers.clear()
        self.dirty_all = False

    @hookimpl(trylast=True)
    def nri_remove_container(self, pod: Pod, container: Container) -> None:
        old = self.containers.pop(container.id, None)
        if old is not None:
            self._unindex(old)
        self.dirty_containers.add(container.id)

    @hookimpl(trylast=True)
    def nri_remove_pod_sandbox(self, pod: Pod) -> None:
        self.pods.pop(pod.id, None)
        self.dirty_pods.add(pod.id)
        for cid in self._of_pod.pop(pod.id, ()):
            self.containers.pop(cid, None)
            self.dirty_containers.add(cid)

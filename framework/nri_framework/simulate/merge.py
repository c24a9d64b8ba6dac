"""Merging the answers of several plugins, as NRI's ``pkg/adaptation/result.go``.

Plugins answer one after another in index order. Each field of a container
(an annotation key, an env variable, the CPU pinning, the memory limit, ...)
may be set by one plugin only; a second one is an error that fails the whole
request with upstream's text::

    plugins "60-b" and "50-a" both tried to set CPU pinning

(the later plugin first). Later plugins see the container as adjusted by the
earlier ones. Everything works on protobuf, like upstream, so that fields
the domain model does not carry (mounts, hooks, devices, rlimits) merge too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nri_framework.pb import nri_pb2 as pb

_MEM = (
    ("limit", "memory limit"),
    ("reservation", "memory reservation"),
    ("swap", "memory swap limit"),
    ("kernel", "memory kernel limit"),
    ("kernel_tcp", "memory TCP limit"),
    ("swappiness", "memory swappiness"),
    ("disable_oom_killer", "memory disable OOM killer"),
    ("use_hierarchy", "memory 'UseHierarchy'"),
)
_CPU = (
    ("shares", "CPU shares"),
    ("quota", "CPU quota"),
    ("period", "CPU period"),
    ("realtime_runtime", "CPU realtime runtime"),
    ("realtime_period", "CPU realtime period"),
)


class MergeError(Exception):
    """The plugins' answers cannot be combined; the request fails."""


def _marked(key: str) -> tuple[str, bool]:
    """NRI's removal marker: a leading ``-`` on a key."""
    return (key[1:], True) if key.startswith("-") else (key, False)


class Owners:
    """Which plugin set which field of which container during one request."""

    def __init__(self) -> None:
        self._owner: dict[tuple[str, str], str] = {}

    def claim(self, container_id: str, subject: str, plugin: str) -> None:
        other = self._owner.get((container_id, subject))
        if other is not None:
            raise MergeError(f'plugins "{plugin}" and "{other}" both tried to set {subject}')
        self._owner[(container_id, subject)] = plugin

    def clear(self, container_id: str, subject: str) -> None:
        self._owner.pop((container_id, subject), None)


# --- resources --------------------------------------------------------------------


def merge_resources(
    owners: Owners, cid: str, plugin: str, src: pb.LinuxResources, dst: pb.LinuxResources
) -> None:
    """Copy every field ``src`` sets into ``dst``, claiming each for ``plugin``."""
    if src.HasField("memory"):
        for name, subject in _MEM:
            if src.memory.HasField(name):
                owners.claim(cid, subject, plugin)
                getattr(dst.memory, name).CopyFrom(getattr(src.memory, name))
    if src.HasField("cpu"):
        _merge_cpu(owners, cid, plugin, src.cpu, dst.cpu)
    for limit in src.hugepage_limits:
        owners.claim(cid, f"hugepage limit of size {limit.page_size}", plugin)
        dst.hugepage_limits.append(limit)
    for key, val in src.unified.items():
        owners.claim(cid, f"unified resource {key}", plugin)
        dst.unified[key] = val
    if src.HasField("blockio_class"):
        owners.claim(cid, "block I/O class", plugin)
        dst.blockio_class.CopyFrom(src.blockio_class)
    if src.HasField("rdt_class"):
        owners.claim(cid, "RDT class", plugin)
        dst.rdt_class.CopyFrom(src.rdt_class)
    if src.HasField("pids"):
        owners.claim(cid, "pids pinning", plugin)
        dst.pids.CopyFrom(src.pids)


def _merge_cpu(owners: Owners, cid: str, plugin: str, src: pb.LinuxCPU, dst: pb.LinuxCPU) -> None:
    for name, subject in _CPU:
        if src.HasField(name):
            owners.claim(cid, subject, plugin)
            getattr(dst, name).CopyFrom(getattr(src, name))
    if src.cpus:
        owners.claim(cid, "CPU pinning", plugin)
        dst.cpus = src.cpus
    if src.mems:
        owners.claim(cid, "memory pinning", plugin)
        dst.mems = src.mems


# --- updates of other containers --------------------------------------------------


class Updates:
    """The ``update`` lists of all plugins' answers to one request, merged per container.

    ``creating``: the container being created (plugins may not update it).
    ``requested``: for UpdateContainer, the container and the resources the
    kubelet asked for; a plugin's update of it starts from those.
    """

    def __init__(
        self,
        owners: Owners,
        *,
        creating: str = "",
        requested: tuple[str, pb.LinuxResources] | None = None,
    ) -> None:
        self.owners = owners
        self.creating = creating
        self.requested = requested
        self.by_id: dict[str, pb.ContainerUpdate] = {}

    def apply(self, updates: Iterable[pb.ContainerUpdate], plugin: str) -> None:
        for u in updates:
            if u.container_id == self.creating:
                raise MergeError(
                    f'plugin "{plugin}" asked update of "{u.container_id}" during creation'
                )
            merged = self._entry(u)
            try:
                self._merge(merged, u, plugin)
            except MergeError:
                if not u.ignore_failure:
                    raise

    def _entry(self, u: pb.ContainerUpdate) -> pb.ContainerUpdate:
        merged = self.by_id.get(u.container_id)
        if merged is None:
            merged = pb.ContainerUpdate(
                container_id=u.container_id, ignore_failure=u.ignore_failure
            )
            self.by_id[u.container_id] = merged
        else:
            merged.ignore_failure = merged.ignore_failure and u.ignore_failure
        return merged

    def _merge(self, merged: pb.ContainerUpdate, u: pb.ContainerUpdate, plugin: str) -> None:
        if not (u.HasField("linux") and u.linux.HasField("resources")):
            return
        cid = u.container_id
        is_requested = self.requested is not None and self.requested[0] == cid
        work = pb.LinuxResources()
        if is_requested and self.requested is not None:
            work.CopyFrom(self.requested[1])
        else:
            work.CopyFrom(merged.linux.resources)
        merge_resources(self.owners, cid, plugin, u.linux.resources, work)
        merged.linux.resources.CopyFrom(work)
        if is_requested and self.requested is not None:
            self.requested[1].CopyFrom(work)

    def requested_update(self) -> pb.ContainerUpdate | None:
        """A plugin's (merged) update of the UpdateContainer target, if any."""
        if self.requested is None:
            return None
        return self.by_id.get(self.requested[0])

    def others(self) -> list[pb.ContainerUpdate]:
        target = self.requested[0] if self.requested else None
        return [u for cid, u in self.by_id.items() if cid != target]


# --- CreateContainer adjustments --------------------------------------------------


class CreateMerge:
    """Folds each plugin's CreateContainerResponse into the container being created."""

    def __init__(self, request: pb.CreateContainerRequest) -> None:
        self.request = request
        self.container = request.container
        self.owners = Owners()
        self.updates = Updates(self.owners, creating=request.container.id)

    def apply(self, rpl: pb.CreateContainerResponse, plugin: str) -> None:
        if rpl.HasField("adjust"):
            self._adjust(rpl.adjust, plugin)
        self.updates.apply(rpl.update, plugin)

    def _adjust(self, adj: pb.ContainerAdjustment, plugin: str) -> None:
        self._annotations(adj.annotations, plugin)
        self._mounts(adj.mounts, plugin)
        self._env(adj.env, plugin)
        if adj.HasField("hooks"):
            self.container.hooks.MergeFrom(adj.hooks)
        if adj.HasField("linux"):
            self._linux(adj.linux, plugin)
        for rl in adj.rlimits:
            self.owners.claim(self.container.id, f"rlimit {rl.type}", plugin)
            self.container.rlimits.append(rl)

    def _annotations(self, annotations: Mapping[str, str], plugin: str) -> None:
        cid, mine = self.container.id, self.container.annotations
        for key, val in annotations.items():
            name, removal = _marked(key)
            if removal:
                self.owners.clear(cid, f"annotation {name}")
                mine.pop(name, None)
                continue
            self.owners.claim(cid, f"annotation {name}", plugin)
            mine[name] = val

    def _mounts(self, mounts: Iterable[pb.Mount], plugin: str) -> None:
        cid, mine = self.container.id, self.container.mounts
        for m in mounts:
            dest, removal = _marked(m.destination)
            kept = [x for x in mine if x.destination != dest]
            del mine[:]
            mine.extend(kept)
            if removal:
                self.owners.clear(cid, f"mount {dest}")
                continue
            self.owners.claim(cid, f"mount {dest}", plugin)
            mine.append(m)

    def _env(self, env: Iterable[pb.KeyValue], plugin: str) -> None:
        cid, mine = self.container.id, self.container.env
        for kv in env:
            name, removal = _marked(kv.key)
            kept = [e for e in mine if e.partition("=")[0] != name]
            del mine[:]
            mine.extend(kept)
            if removal:
                self.owners.clear(cid, f"env {name}")
                continue
            self.owners.claim(cid, f"env {name}", plugin)
            mine.append(f"{name}={kv.value}")

    def _linux(self, linux: pb.LinuxContainerAdjustment, plugin: str) -> None:
        cid, mine = self.container.id, self.container.linux
        for dev in linux.devices:
            path, removal = _marked(dev.path)
            if removal:
                self.owners.clear(cid, f"device {path}")
                continue
            self.owners.claim(cid, f"device {path}", plugin)
            mine.devices.append(dev)
        if linux.HasField("resources"):
            merge_resources(self.owners, cid, plugin, linux.resources, mine.resources)
        if linux.cgroups_path:
            self.owners.claim(cid, "cgroups path", plugin)
            mine.cgroups_path = linux.cgroups_path
        if linux.HasField("oom_score_adj"):
            self.owners.claim(cid, "oom score adj", plugin)
            mine.oom_score_adj.CopyFrom(linux.oom_score_adj)
        if linux.HasField("scheduler"):
            self.owners.claim(cid, "scheduling policy", plugin)
            mine.scheduler.CopyFrom(linux.scheduler)
        if linux.HasField("io_priority"):
            self.owners.claim(cid, "IO priority", plugin)
            mine.io_priority.CopyFrom(linux.io_priority)

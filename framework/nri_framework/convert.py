"""protobuf <-> domain model, at the edge between the NRI stub and the host.

Everything a policy sees passes through here once; nothing else in the host
or the policies imports :mod:`nri_framework.pb`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from nri_framework.memo import RecentAnswers
from nri_framework.model import (
    Adjustment,
    Container,
    ContainerState,
    CpuResources,
    CreateResult,
    IOPriority,
    MemoryResources,
    Pod,
    Resources,
    RuntimeInfo,
    Scheduler,
    Update,
)
from nri_framework.pb import nri_pb2 as pb

_CPU_OPT = ("shares", "quota", "period", "realtime_runtime", "realtime_period")
_MEM_OPT = (
    "limit",
    "reservation",
    "swap",
    "kernel",
    "kernel_tcp",
    "swappiness",
    "disable_oom_killer",
    "use_hierarchy",
)


_STATES = {s.value: s for s in ContainerState}


def resources_from_pb(r: pb.LinuxResources) -> Resources:
    # a HasField per field: with upb a HasField costs a few tens of ns, a
    # ListFields (a list of descriptor pairs) some microseconds; Synchronize
    # converts 1000 containers
    cpu = memory = blockio_class = rdt_class = pids_limit = None
    if r.HasField("cpu"):
        c = r.cpu
        has = c.HasField
        cpu = CpuResources(
            shares=c.shares.value if has("shares") else None,
            quota=c.quota.value if has("quota") else None,
            period=c.period.value if has("period") else None,
            realtime_runtime=c.realtime_runtime.value if has("realtime_runtime") else None,
            realtime_period=c.realtime_period.value if has("realtime_period") else None,
            cpus=c.cpus,
            mems=c.mems,
        )
    if r.HasField("memory"):
        m = r.memory
        if m.ByteSize():
            memory = MemoryResources(**{n: getattr(m, n).value for n in _MEM_OPT if m.HasField(n)})
        else:
            memory = MemoryResources()  # the usual empty one: no field to look at
    if r.HasField("blockio_class"):
        blockio_class = r.blockio_class.value
    if r.HasField("rdt_class"):
        rdt_class = r.rdt_class.value
    if r.HasField("pids"):
        pids_limit = r.pids.limit
    return Resources(
        cpu=cpu,
        memory=memory,
        blockio_class=blockio_class,
        rdt_class=rdt_class,
        unified=dict(r.unified) if r.unified else {},
        pids_limit=pids_limit,
    )


#: Conversions :func:`recent_resources` remembers (the most recently used), and
#: the largest serialized resources it remembers: at most 256 KiB of keys, what
#: a hostile runtime's many different or huge ones cost besides their conversion.
RECENT_RESOURCES = 256
RECENT_RESOURCES_BYTES = 1024


@functools.lru_cache(maxsize=RECENT_RESOURCES)
def _resources_of(data: bytes) -> Resources:
    return resources_from_pb(pb.LinuxResources.FromString(data))


def recent_resources(r: pb.LinuxResources) -> Resources:
    """:func:`resources_from_pb` for the resources a runtime sends again and
    again (every event of a container carries them, and containers of one kind
    ask alike): a recent conversion of the same serialized bytes (an equal
    message; a :class:`Resources` is frozen) is handed out again. Serializing
    costs about a tenth of converting. Resources over
    :data:`RECENT_RESOURCES_BYTES` serialized are converted each time."""
    data: bytes = r.SerializeToString()
    if len(data) > RECENT_RESOURCES_BYTES:
        return resources_from_pb(r)
    return _resources_of(data)


def resources_to_pb(res: Resources, out: pb.LinuxResources) -> None:
    """Fill ``out`` with the fields of ``res`` that are set."""
    c = res.cpu
    if c is not None:
        # a pin (cpus and mems alone) is what most replies carry: the optional
        # fields are looked at one by one only when one of them is set
        opt = not (
            c.shares is None
            and c.quota is None
            and c.period is None
            and c.realtime_runtime is None
            and c.realtime_period is None
        )
        if opt or c.cpus or c.mems:  # else nothing to set: the cpu field stays absent
            oc = out.cpu
            if opt:
                for name in _CPU_OPT:
                    v = getattr(c, name)
                    if v is not None:
                        getattr(oc, name).value = v
            if c.cpus:
                oc.cpus = c.cpus
            if c.mems:
                oc.mems = c.mems
    if res.memory is not None:
        for name in _MEM_OPT:
            v = getattr(res.memory, name)
            if v is not None:
                getattr(out.memory, name).value = v
    if res.blockio_class is not None:
        out.blockio_class.value = res.blockio_class
    if res.rdt_class is not None:
        out.rdt_class.value = res.rdt_class
    if res.unified:
        for k, v in res.unified.items():
            out.unified[k] = v
    if res.pids_limit is not None:
        out.pids.limit = res.pids_limit


def pod_from_pb(p: pb.PodSandbox) -> Pod:
    linux = p.linux
    has_linux = p.HasField("linux")
    return Pod(
        id=p.id,
        name=p.name,
        uid=p.uid,
        namespace=p.namespace,
        labels=dict(p.labels) if p.labels else {},
        annotations=dict(p.annotations) if p.annotations else {},
        runtime_handler=p.runtime_handler,
        cgroup_parent=linux.cgroup_parent,
        cgroups_path=linux.cgroups_path,
        pod_overhead=resources_from_pb(linux.pod_overhead)
        if has_linux and linux.HasField("pod_overhead")
        else None,
        pod_resources=resources_from_pb(linux.pod_resources)
        if has_linux and linux.HasField("pod_resources")
        else None,
        resources=resources_from_pb(linux.resources)
        if has_linux and linux.HasField("resources")
        else None,
        pid=p.pid,
        ips=list(p.ips) if p.ips else [],
    )


#: Serialized bytes of the pods :class:`ResentPods` keeps, at most (and each
#: pod at most a sixteenth of it): a hostile runtime's huge or endless pods
#: cost no more than this besides their conversion.
RESENT_PODS_BYTES = 1 << 20


class ResentPods:
    """:func:`pod_from_pb` for a runtime that resends the same pod with every
    event of its containers (the create, the update, the stop, the removals):
    the last conversion of each pod id is reused while the pod's serialized
    bytes are the same (a serialization costs a tenth of a conversion; equal
    bytes are an equal message, and a :class:`Pod` is frozen). Bounded by
    :data:`RESENT_PODS_BYTES`, the least recently converted forgotten first."""

    def __init__(self, max_bytes: int = RESENT_PODS_BYTES) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._pods: dict[str, tuple[bytes, Pod]] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def convert(self, p: pb.PodSandbox) -> Pod:
        data: bytes = p.SerializeToString()
        known = self._pods.get(p.id)
        if known is not None and known[0] == data:
            return known[1]
        pod = pod_from_pb(p)
        self.forget(pod.id)
        if len(data) <= self.max_bytes >> 4:
            self._pods[pod.id] = (data, pod)
            self.size += len(data)
            while self.size > self.max_bytes:
                self.forget(next(iter(self._pods)))
        return pod

    def forget(self, pod_id: str) -> None:
        known = self._pods.pop(pod_id, None)
        if known is not None:
            self.size -= len(known[0])


#: Distinct resources :func:`synchronize_from_pb` remembers at most (the oldest
#: forgotten first): a hostile runtime's many different ones cost no more.
SYNC_RESOURCES_MAX = 1024


def synchronize_from_pb(
    pods: Iterable[pb.PodSandbox], containers: Iterable[pb.Container]
) -> tuple[list[Pod], list[Container]]:
    """A Synchronize's pods and containers in one pass: containers with equal
    resources (equal serialized bytes: an equal message) share one conversion
    of them (a :class:`Resources` is frozen), most of a node's containers
    asking alike (at most :data:`SYNC_RESOURCES_MAX` kept)."""
    known: RecentAnswers[bytes, Resources] = RecentAnswers(SYNC_RESOURCES_MAX)

    def resources(r: pb.LinuxResources) -> Resources:
        data: bytes = r.SerializeToString()
        res = known.get(data)
        if res is None:
            res = resources_from_pb(r)
            known.keep(data, res)
        return res

    return [pod_from_pb(p) for p in pods], [container_from_pb(c, resources) for c in containers]


def container_from_pb(
    c: pb.Container, resources: Callable[[pb.LinuxResources], Resources] = recent_resources
) -> Container:
    # an empty map or list is not copied (a new empty one is cheaper)
    linux = c.linux
    has_res = c.HasField("linux") and linux.HasField("resources")
    state = _STATES.get(c.state, ContainerState.UNKNOWN)
    return Container(
        id=c.id,
        pod_sandbox_id=c.pod_sandbox_id,
        name=c.name,
        state=state,
        labels=dict(c.labels) if c.labels else {},
        annotations=dict(c.annotations) if c.annotations else {},
        args=list(c.args) if c.args else [],
        env=list(c.env) if c.env else [],
        resources=resources(linux.resources) if has_res else None,
        cgroups_path=linux.cgroups_path,
        pid=c.pid,
    )


def update_to_pb(u: Update, out: pb.ContainerUpdate) -> None:
    out.container_id = u.container_id
    resources_to_pb(u.resources, out.linux.resources)
    if u.ignore_failure:
        out.ignore_failure = True


def update_from_pb(u: pb.ContainerUpdate) -> Update:
    return Update(
        container_id=u.container_id,
        resources=resources_from_pb(u.linux.resources),
        ignore_failure=u.ignore_failure,
    )


def adjustment_to_pb(a: Adjustment, out: pb.ContainerAdjustment) -> None:
    if a.annotations:
        for k, v in a.annotations.items():
            out.annotations[k] = v
    if a.env:
        for k, v in a.env.items():
            out.env.add(key=k, value=v)
    if a.resources is not None:
        resources_to_pb(a.resources, out.linux.resources)
    if a.scheduler is not None:
        sch = a.scheduler
        ps: Any = out.linux.scheduler  # protobuf enums are ints on the wire
        ps.policy = pb.LinuxSchedulerPolicy.Value(sch.policy or "SCHED_NONE")
        ps.nice, ps.priority = sch.nice, sch.priority
        ps.flags.extend(pb.LinuxSchedulerFlag.Value(f) for f in sch.flags)
        ps.runtime, ps.deadline, ps.period = sch.runtime, sch.deadline, sch.period
    if a.io_priority is not None:
        prio = out.linux.io_priority
        setattr(prio, "class", pb.IOPrioClass.Value(a.io_priority.io_class))
        prio.priority = a.io_priority.priority


def adjustment_from_pb(a: pb.ContainerAdjustment) -> Adjustment:
    linux = a.linux if a.HasField("linux") else None
    scheduler = None
    if linux is not None and linux.HasField("scheduler"):
        ps = linux.scheduler
        scheduler = Scheduler(
            policy=pb.LinuxSchedulerPolicy.Name(ps.policy),
            nice=ps.nice,
            priority=ps.priority,
            flags=[pb.LinuxSchedulerFlag.Name(f) for f in ps.flags],
            runtime=ps.runtime,
            deadline=ps.deadline,
            period=ps.period,
        )
    io_priority = None
    if linux is not None and linux.HasField("io_priority"):
        io = linux.io_priority
        io_priority = IOPriority(
            io_class=pb.IOPrioClass.Name(getattr(io, "class")), priority=io.priority
        )
    return Adjustment(
        annotations=dict(a.annotations),
        env={kv.key: kv.value for kv in a.env},
        resources=resources_from_pb(a.linux.resources)
        if linux is not None and a.linux.HasField("resources")
        else None,
        scheduler=scheduler,
        io_priority=io_priority,
    )


def create_result_to_pb(r: CreateResult) -> pb.CreateContainerResponse:
    resp = pb.CreateContainerResponse()
    if r.adjustment is not None:
        adjustment_to_pb(r.adjustment, resp.adjust)
    if r.updates:
        add = resp.update.add
        for u in r.updates:
            update_to_pb(u, add())
    for e in r.evictions:
        resp.evict.add(container_id=e.container_id, reason=e.reason)
    return resp


def runtime_from_pb(req: pb.ConfigureRequest) -> RuntimeInfo:
    return RuntimeInfo(
        name=req.runtime_name,
        version=req.runtime_version,
        nri_version=req.NRI_version,
        registration_timeout_ms=req.registration_timeout,
        request_timeout_ms=req.request_timeout,
    )


# --- the runtime side sends pods and containers (the simulator) -------------


def _resources_into(res: Resources | None, out: pb.LinuxResources) -> None:
    if res is not None:
        resources_to_pb(res, out)


def pod_to_pb(pod: Pod) -> pb.PodSandbox:
    p = pb.PodSandbox(
        id=pod.id,
        name=pod.name,
        uid=pod.uid,
        namespace=pod.namespace,
        labels=pod.labels,
        annotations=pod.annotations,
        runtime_handler=pod.runtime_handler,
        pid=pod.pid,
        ips=pod.ips,
    )
    p.linux.cgroup_parent = pod.cgroup_parent
    p.linux.cgroups_path = pod.cgroups_path
    if pod.pod_overhead is not None:
        _resources_into(pod.pod_overhead, p.linux.pod_overhead)
    if pod.pod_resources is not None:
        _resources_into(pod.pod_resources, p.linux.pod_resources)
    if pod.resources is not None:
        _resources_into(pod.resources, p.linux.resources)
    return p


def container_to_pb(c: Container) -> pb.Container:
    out = pb.Container(
        id=c.id,
        pod_sandbox_id=c.pod_sandbox_id,
        name=c.name,
        state=int(c.state),  # type: ignore[arg-type]
        labels=c.labels,
        annotations=c.annotations,
        args=c.args,
        env=c.env,
        pid=c.pid,
    )
    out.linux.cgroups_path = c.cgroups_path
    out.linux.resources.SetInParent()
    _resources_into(c.resources, out.linux.resources)
    return out

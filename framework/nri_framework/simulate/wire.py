"""Domain model -> NRI protobuf for the runtime side, and containerd's way of
applying new resources to a container.

:mod:`nri_framework.convert` covers the plugin side (protobuf in, answers
out); the simulator also has to *send* pods and containers.
"""

from __future__ import annotations

from nri_framework import convert
from nri_framework.model import Container, Pod, Resources
from nri_framework.pb import nri_pb2 as pb

_MEM_INTS = ("limit", "reservation", "swap", "kernel", "kernel_tcp", "swappiness")
_MEM_BOOLS = ("disable_oom_killer", "use_hierarchy")
_CPU_INTS = ("shares", "quota", "period", "realtime_runtime", "realtime_period")


def _resources_into(res: Resources | None, out: pb.LinuxResources) -> None:
    if res is not None:
        convert.resources_to_pb(res, out)


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


def overlay_resources(dst: pb.LinuxResources, src: pb.LinuxResources) -> None:
    """Apply ``src`` onto ``dst`` as containerd's ``WithResources`` does.

    Only values that are set *and* non-zero (non-empty for cpusets) replace
    the container's: an update without a cpuset leaves the cpuset alone.
    """
    if src.HasField("memory"):
        m = src.memory
        for name in _MEM_INTS:
            if m.HasField(name) and getattr(m, name).value:
                getattr(dst.memory, name).value = getattr(m, name).value
        for name in _MEM_BOOLS:
            if m.HasField(name):
                getattr(dst.memory, name).value = getattr(m, name).value
    if src.HasField("cpu"):
        c = src.cpu
        for name in _CPU_INTS:
            if c.HasField(name) and getattr(c, name).value:
                getattr(dst.cpu, name).value = getattr(c, name).value
        if c.cpus:
            dst.cpu.cpus = c.cpus
        if c.mems:
            dst.cpu.mems = c.mems
    _overlay_misc(dst, src)


def _overlay_misc(dst: pb.LinuxResources, src: pb.LinuxResources) -> None:
    for limit in src.hugepage_limits:
        kept = [h for h in dst.hugepage_limits if h.page_size != limit.page_size]
        del dst.hugepage_limits[:]
        dst.hugepage_limits.extend([*kept, limit])
    for key, val in src.unified.items():
        dst.unified[key] = val
    if src.HasField("blockio_class"):
        dst.blockio_class.value = src.blockio_class.value
    if src.HasField("rdt_class"):
        dst.rdt_class.value = src.rdt_class.value
    if src.HasField("pids") and src.pids.limit:
        dst.pids.limit = src.pids.limit

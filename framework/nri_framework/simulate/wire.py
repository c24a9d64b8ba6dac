"""containerd's way of applying new resources to a container (runtime side)."""

from __future__ import annotations

from nri_framework.pb import nri_pb2 as pb

_MEM_INTS = ("limit", "reservation", "swap", "kernel", "kernel_tcp", "swappiness")
_MEM_BOOLS = ("disable_oom_killer", "use_hierarchy")
_CPU_INTS = ("shares", "quota", "period", "realtime_runtime", "realtime_period")


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

"""Facts about a container the balloons policy derives from the domain model:
its CPU request and limit in mCPU, its QoS class.

:func:`qos_class` is the Kubernetes QoS class of a container's pod, as
upstream's cache computes it: from the pod's cgroup parent, which the kubelet
names after the class (``/kubepods/burstable/pod<uid>``,
``kubepods-besteffort-pod<uid>.slice``; Guaranteed pods sit directly under
``kubepods``). A pod without a cgroup parent (a runtime that does not send
one) falls back to the container's own resources, read the way the kubelet
writes them (see ``nri_framework.simulate.podspec``): CPU shares from the
request (2 for no request), CFS quota from the CPU limit, the memory limit.
"""

from __future__ import annotations

from nri_framework.kubelet_cpu import (
    MIN_SHARES,
    QOSClass,
    cpu_shares,
    quota_to_milli_cpu,
    shares_to_milli_cpu,
)
from nri_framework.model import Container, Pod

__all__ = ["QOSClass", "limit_milli", "qos_class", "request_milli"]


def _qos_from_cgroup_parent(parent: str) -> QOSClass:
    if "besteffort" in parent:
        return QOSClass.BEST_EFFORT
    if "burstable" in parent:
        return QOSClass.BURSTABLE
    return QOSClass.GUARANTEED


def _qos_from_resources(container: Container) -> QOSClass:
    res = container.resources
    cpu = res.cpu if res else None
    mem = res.memory if res else None
    shares = cpu.shares if cpu and cpu.shares else 0
    quota = cpu.quota if cpu and cpu.quota and cpu.quota > 0 else 0
    period = cpu.period if cpu and cpu.period else 100_000
    mem_limit = mem.limit if mem and mem.limit and mem.limit > 0 else 0
    if shares <= MIN_SHARES and not quota and not mem_limit:
        return QOSClass.BEST_EFFORT
    if quota and mem_limit and shares == cpu_shares(quota * 1000 // period):
        return QOSClass.GUARANTEED
    return QOSClass.BURSTABLE


def qos_class(pod: Pod | None, container: Container | None = None) -> QOSClass:
    """The QoS class of ``container`` (of ``pod``).

    From ``pod.cgroup_parent`` when the pod has one; otherwise estimated from
    the container's resources (a single container cannot see its siblings, and
    a memory *request* leaves no trace in them). With neither, Guaranteed, as
    upstream defaults an unknown cgroup parent.
    """
    if pod is not None and pod.cgroup_parent:
        return _qos_from_cgroup_parent(pod.cgroup_parent)
    if container is not None:
        return _qos_from_resources(container)
    return QOSClass.GUARANTEED


def request_milli(container: Container) -> int:
    """The CPU request in mCPU, from the CFS shares the kubelet derived from it."""
    cpu = container.resources.cpu if container.resources else None
    return shares_to_milli_cpu(cpu.shares or 0) if cpu else 0


def limit_milli(container: Container) -> int:
    cpu = container.resources.cpu if container.resources else None
    return quota_to_milli_cpu(cpu.quota or 0, cpu.period or 0) if cpu else 0


def pretty_name(pod: Pod, container: Container) -> str:
    """``namespace/pod/container``, as upstream's log lines name a container."""
    return f"{pod.namespace}/{pod.name}/{container.name}"

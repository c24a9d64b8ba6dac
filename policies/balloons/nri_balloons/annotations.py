"""The balloons policy's annotations and their container/pod scoping.

Upstream looks an annotation up as ``<key>/container.<name>`` first, then
``<key>/pod``, then ``<key>``, all among the pod's annotations (the kubelet
copies pod annotations to the container).
"""

from __future__ import annotations

from nri_framework.model import Container, Pod

BALLOON = "balloon.balloons.resource-policy.nri.io"
CPU_PRESERVE = "cpu.preserve.resource-policy.nri.io"
MEMORY_PRESERVE = "memory.preserve.resource-policy.nri.io"
HIDE_HYPERTHREADS = "hide-hyperthreads.resource-policy.nri.io"
MEMORY_TYPE = "memory-type.resource-policy.nri.io"
SCHEDULING_CLASS = "scheduling-class.resource-policy.nri.io"


def effective(key: str, pod: Pod | None, container: Container) -> str | None:
    """The value of annotation ``key`` for ``container``, or ``None``."""
    own = container.annotations
    pods = pod.annotations if pod is not None else None
    if not own and not pods:
        return None  # nothing to look up (no candidate made)
    for candidate in (f"{key}/container.{container.name}", f"{key}/pod", key):
        if pods and candidate in pods:  # the pod's first
            return pods[candidate]
        if own and candidate in own:
            return own[candidate]
    return None


def parse_bool(text: str | None) -> bool | None:
    """Go's ``strconv.ParseBool``; ``None`` for absent or invalid values."""
    if text is None:
        return None
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def memory_preserved(pod: Pod | None, container: Container) -> bool:
    """Upstream ``PreserveMemoryResources``: ``memory.preserve`` is true for
    ``container`` (its own ``cpuset.mems`` stay; an invalid value is false)."""
    return parse_bool(effective(MEMORY_PRESERVE, pod, container)) is True

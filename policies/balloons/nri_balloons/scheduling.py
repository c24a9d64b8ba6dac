"""Scheduling classes (reference §10): Linux scheduling policy, priority, flags,
nice and I/O priority for the containers of a balloon type.

The annotation ``scheduling-class.resource-policy.nri.io`` (container/pod
scoping) overrides the type's ``schedulingClass``; an unknown class name in the
annotation is ignored, as upstream does. The values reach the runtime through
the NRI adjustment (NRI v0.11+ for the scheduler, v0.10+ for I/O priority).
"""

from __future__ import annotations

import logging

from nri_framework.model import Container, IOPriority, Pod, Scheduler

from nri_balloons import annotations as ann
from nri_balloons.config import BalloonType, SchedulingClass

log = logging.getLogger("policy")


def effective_class(
    classes: list[SchedulingClass], bdef: BalloonType, pod: Pod, container: Container
) -> SchedulingClass | None:
    name = bdef.scheduling_class
    override = ann.effective(ann.SCHEDULING_CLASS, pod, container)
    if override is not None:
        found = _named(classes, override)
        if found is not None:
            log.debug(
                "container %s overrides balloon scheduling class %r with annotation %r",
                container.name,
                name,
                override,
            )
            return found if override else None  # a class named "": no name
    return _named(classes, name) if name else None


def _named(classes: list[SchedulingClass], name: str) -> SchedulingClass | None:
    """The class called ``name``, the last one of that name (as a mapping by
    name keeps it), without building that mapping per container."""
    for sc in reversed(classes):
        if sc.name == name:
            return sc
    return None


def adjustments(sc: SchedulingClass) -> tuple[Scheduler | None, IOPriority | None]:
    """The NRI scheduler and I/O priority adjustments of a scheduling class."""
    scheduler = None
    if sc.policy or sc.priority is not None or sc.nice is not None or sc.flags:
        scheduler = Scheduler(
            policy=f"SCHED_{sc.policy.upper()}" if sc.policy else "",
            priority=sc.priority or 0,
            nice=sc.nice or 0,
            flags=[f"SCHED_FLAG_{f.upper().replace('-', '_')}" for f in sc.flags],
            runtime=sc.runtime or 0,
            deadline=sc.deadline or 0,
            period=sc.period or 0,
        )
    io = None
    if sc.io_class:
        io = IOPriority(
            io_class=f"IOPRIO_CLASS_{sc.io_class.upper()}", priority=sc.io_priority or 0
        )
    return scheduler, io

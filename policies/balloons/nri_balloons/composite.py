"""Composite balloons (reference §7): a balloon made of component balloons, one
per component type or, with ``componentCreation: balance-balloons``, of the least
used one; its CPUs are the union of theirs, and a resize shares the mCPU equally
among them. The functions work on the policy's running placement."""

from __future__ import annotations

import functools
import logging
import operator
from typing import TYPE_CHECKING

from nri_balloons import balloonclass
from nri_balloons.balloon import Balloon
from nri_balloons.config import BalloonType
from nri_balloons.errors import BalloonsError
from nri_balloons.gofmt import quote

if TYPE_CHECKING:
    from nri_balloons.policy import BalloonsPolicy

log = logging.getLogger("policy")

__all__ = ["including_components", "new_composite", "resize_composite"]


def new_composite(policy: BalloonsPolicy, bdef: BalloonType, instance: int) -> Balloon:
    """A composite balloon (upstream ``newCompositeBalloon``): one component
    balloon per component type (``componentCreation`` ``""``/``all``), or only
    the component type with the fewest instances (``balance-balloons``).
    Component balloons live only in the composite's ``components``."""
    comp_defs: list[BalloonType] = []
    for comp in bdef.components:
        comp_def = policy.types.get(comp.balloon_type)
        if comp_def is None:
            raise BalloonsError(
                f"unknown balloon definition {quote(comp.balloon_type)} in composite "
                f"balloon {quote(bdef.name)}"
            )
        comp_defs.append(comp_def)
    if bdef.component_creation == "balance-balloons":
        counts = [len(including_components(policy, d)) for d in comp_defs]
        log.debug("instance-components of composite balloon %s: %s", bdef.name, counts)
        comp_defs = [comp_defs[counts.index(min(counts))]]
    elif bdef.component_creation not in ("", "all"):
        raise BalloonsError(
            f"unknown ComponentCreation mode {quote(bdef.component_creation)} in "
            f"composite balloon {quote(bdef.name)}"
        )
    bln = Balloon(bdef=bdef, instance=instance)
    for comp_def in comp_defs:
        try:
            part = policy.new_balloon(comp_def)
        except BalloonsError as exc:
            policy.delete(bln)
            raise BalloonsError(
                f"failed to create component balloon {quote(comp_def.name)} for composite "
                f"balloon {quote(bdef.name)}: {exc}"
            ) from None
        bln.components.append(part)
        bln.cpus |= part.cpus
        log.debug("created component balloon %s of composite balloon %s", part.name, bdef.name)
    try:
        policy.resize(bln, bdef.min_cpus * 1000)
    except BalloonsError:
        policy.delete(bln)
        raise
    return bln


def including_components(policy: BalloonsPolicy, bdef: BalloonType) -> list[Balloon]:
    """Balloons, top-level or components, of ``bdef`` or of any type in its
    components, recursively (upstream ``balloonsByDefIncludingComponents``)."""
    names: set[str] = set()
    todo = [bdef]
    while todo:
        d = todo.pop()
        names.add(d.name)
        for comp in d.components:
            sub = policy.types.get(comp.balloon_type)
            if sub is not None and sub.name not in names:
                todo.append(sub)
    return [b for top in policy.balloons for b in top.walk() if b.bdef.name in names]


def resize_composite(policy: BalloonsPolicy, bln: Balloon, milli: int, exclude: int) -> None:
    """Upstream ``resizeCompositeBalloon``: every component gets an equal
    (integer) share of ``milli``; the composite's own min/maxCPUs do not
    clamp it. All or nothing: a failing component rolls every one back."""
    per_component = milli // len(bln.components)
    saved_free = policy.free
    saved = [(b, b.cpus) for b in bln.walk()]
    try:
        for comp in bln.components:
            policy.resize(comp, per_component, exclude)
    except BalloonsError as exc:
        taken = functools.reduce(operator.or_, (b.cpus for b, _ in saved), 0)
        policy.free = saved_free
        for b, cpus in saved:
            b.cpus = cpus
        balloonclass.forget(policy.cpu_classes, taken & saved_free)
        balloonclass.use(policy.cpu_classes, bln)
        raise BalloonsError(f"resize composite balloon {bln.name}: {exc}") from None
    cpus = 0
    for comp in bln.components:
        cpus |= comp.cpus
    bln.cpus = cpus

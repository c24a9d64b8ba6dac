"""Extended resources of the balloons policy (upstream ``GetExtendedResources``,
reference §13.5): the capacity of PCT cpuClasses the node advertises."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nri_balloons.gofmt import quote

if TYPE_CHECKING:
    from nri_balloons.policy import BalloonsPolicy

log = logging.getLogger("policy")

EXT_RESOURCE_DOMAIN = "cpuclass.balloons.nri.io"

__all__ = ["EXT_RESOURCE_DOMAIN", "extended_resources"]


def extended_resources(policy: BalloonsPolicy) -> dict[str, int | None] | None:
    """Upstream ``GetExtendedResources`` (§13.5): the ownership key of the
    ``cpuclass.balloons.nri.io`` domain, and for every PCT class with
    ``publishExtendedResource`` its capacity (CPUs held by balloons of
    other classes do not count). ``None`` (no opinion: leave the node as it
    is) while PCT waits for the SST helper."""
    out: dict[str, int | None] = {f"{EXT_RESOURCE_DOMAIN}/*": None}
    pct = policy.cpu_classes.pct
    if policy.config is None:
        return out
    if pct.wanted_mode and (pct.degraded or pct.need_program):
        return None
    if not pct.active:
        return out
    for cc in policy.config.spec.cpu_classes:
        if not cc.publish_extended_resource:
            continue
        if not cc.is_pct:
            log.warning("ignoring publishExtendedResource on non-PCT cpuClass %s", quote(cc.name))
            continue
        held = 0
        for bln in policy.balloons:
            if policy.balloon_class(bln.bdef) != cc.name:
                held |= bln.cpus
        out[f"{EXT_RESOURCE_DOMAIN}/{cc.name}"] = max(pct.free_class_capacity(cc.name, held), 0)
    return out

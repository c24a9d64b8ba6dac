"""Configuration features that cannot take effect as configured.

Every upstream feature is implemented (the README's feature table); what is
left here is a configuration asking for one without what it needs, e.g.
pod-resources hints with the pod-resources API off. Each gets a clear
warning in the log (never silence).
"""

from __future__ import annotations

from nri_balloons.config import BalloonsPolicySpec
from nri_balloons.devices import PODRES_PREFIX


def unimplemented(spec: BalloonsPolicySpec) -> list[str]:
    """One warning per feature the configuration uses that cannot take effect."""
    out: list[str] = []
    for bt in spec.balloon_types:
        podres = [d for d in bt.prefer_close_to_devices if d.startswith(PODRES_PREFIX)]
        if podres and not spec.agent.pod_resource_api:
            out.append(
                f"balloon type {bt.name!r}: pod-resources device hints {podres} need "
                "agent.podResourceAPI: true (the kubelet's pod-resources API); they are dropped"
            )
    return out

"""Configuration features that parse and validate but are not implemented yet.

A configuration that uses one gets a clear warning in the log (never silence);
the README's feature table lists the same items.
"""

from __future__ import annotations

from nri_balloons.config import BalloonsPolicySpec
from nri_balloons.devices import PODRES_PREFIX


def unimplemented(spec: BalloonsPolicySpec) -> list[str]:
    """One warning per unimplemented feature the configuration uses."""
    out: list[str] = []
    for bt in spec.balloon_types:
        podres = [d for d in bt.prefer_close_to_devices if d.startswith(PODRES_PREFIX)]
        if podres and not spec.agent.pod_resource_api:
            out.append(
                f"balloon type {bt.name!r}: pod-resources device hints {podres} need "
                "agent.podResourceAPI: true (the kubelet's pod-resources API); they are dropped"
            )
    return out

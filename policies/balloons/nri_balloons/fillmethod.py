"""Fill methods: how a container chooses among the instances of its balloon type
(upstream ``fillmethod.go``, reference §6).

A type's fill chain (:func:`fill_chain`) lists the methods to try in order; the
first one that suggests an instance wins. The names are upstream's, as they appear
in log lines (``fill method 'same-pod' not applicable``).
"""

from __future__ import annotations

import enum

from nri_balloons.config import BalloonType

__all__ = ["FILL_METHOD_NAMES", "FillMethod", "fill_chain"]


class FillMethod(enum.IntEnum):
    """A way to find a balloon instance for a container."""

    BALANCED = 1
    """An instance with enough free mCPU; the most free first."""
    BALANCED_INFLATE = 2
    """An instance that can grow to fit; the most room to grow first."""
    SAME_GROUP = 3
    """An instance holding a container of the same ``groupBy`` group."""
    SAME_POD = 4
    """An instance holding a container of the same pod."""
    SAME_NAMESPACE = 5
    """An instance holding a container of the same namespace."""
    NEW_BALLOON = 6
    """An empty pre-created instance, or a new one."""

    def __str__(self) -> str:
        return FILL_METHOD_NAMES[self]


FILL_METHOD_NAMES: dict[FillMethod, str] = {
    FillMethod.BALANCED: "balanced",
    FillMethod.BALANCED_INFLATE: "balanced-inflate",
    FillMethod.SAME_GROUP: "same-group",
    FillMethod.SAME_POD: "same-pod",
    FillMethod.SAME_NAMESPACE: "same-namespace",
    FillMethod.NEW_BALLOON: "new-balloon",
}


def fill_chain(bdef: BalloonType) -> list[FillMethod]:
    """The methods a container of ``bdef`` tries, in order (upstream ``fillChain``)."""
    chain: list[FillMethod] = []
    if bdef.group_by:
        chain.append(FillMethod.SAME_GROUP)
    if not bdef.prefer_spreading_pods:
        chain.append(FillMethod.SAME_POD)
    if bdef.prefer_per_namespace_balloon:
        chain += [FillMethod.SAME_NAMESPACE, FillMethod.NEW_BALLOON]
    if bdef.prefer_new_balloons:
        chain += [FillMethod.NEW_BALLOON, FillMethod.BALANCED, FillMethod.BALANCED_INFLATE]
    else:
        chain += [FillMethod.BALANCED, FillMethod.BALANCED_INFLATE, FillMethod.NEW_BALLOON]
    return chain

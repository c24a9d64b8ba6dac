"""NodeResourceTopology zones, as policies describe them and the agent publishes them.

Quantities are strings already formatted as Kubernetes formats them
(``"16"``, ``"1500m"``); :func:`milli_quantity` makes one from mCPU.
"""

from __future__ import annotations

import msgspec


class ZoneResource(msgspec.Struct, kw_only=True):
    name: str
    capacity: str
    allocatable: str
    available: str


class ZoneAttribute(msgspec.Struct, kw_only=True):
    name: str
    value: str


class Zone(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    type: str
    parent: str = ""
    resources: list[ZoneResource] = []
    attributes: list[ZoneAttribute] = []


def milli_quantity(milli: int) -> str:
    """mCPU as Kubernetes formats a CPU quantity: whole CPUs plain, else ``Nm``."""
    if milli % 1000 == 0:
        return str(milli // 1000)
    return f"{milli}m"

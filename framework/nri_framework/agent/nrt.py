"""The NodeResourceTopology publisher (reference k8s.md §5, balloons §14).

One cluster-scoped ``topology.node.k8s.io/v1alpha2`` object per node, named
after it: ``attributes: [{name: TopologyPolicy, value: <policy>}]`` and the
policy's zones (:func:`~nri_framework.hookspecs.policy_topology_zones`),
replaced wholesale. Written with GET then PUT (carrying ``resourceVersion``),
or POST when it does not exist; never deleted. Changes are coalesced: while
one write is in flight any number of changes make one more write, of the
state at that time. A failed write is retried with a growing delay.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from nri_framework.agent.kube import NRT_GROUP, NRT_VERSION, KubeClient, KubeError, Obj
from nri_framework.quantity import QuantityError, format_quantity, parse_quantity
from nri_framework.zones import Zone

log = logging.getLogger("nri_framework.agent")

KIND = "NodeResourceTopology"
TOPOLOGY_POLICY = "TopologyPolicy"
RETRY_MIN = 1.0
RETRY_MAX = 30.0
#: Tries of one write when the object changed between our GET and PUT (409).
CONFLICT_TRIES = 3


def canonical_quantity(text: str) -> str:
    """``text`` as Kubernetes would print it (``"4000m"`` -> ``"4"``); unparsable
    text is kept (the API server then says what is wrong)."""
    try:
        return format_quantity(parse_quantity(text))
    except QuantityError:
        return text


def zone_object(zone: Zone) -> Obj:
    """One entry of ``zones``: ``parent``, ``resources`` and ``attributes`` only
    when set, quantities in Kubernetes' canonical form."""
    obj: Obj = {"name": zone.name, "type": zone.type}
    if zone.parent:
        obj["parent"] = zone.parent
    if zone.resources:
        obj["resources"] = [
            {
                "name": r.name,
                "capacity": canonical_quantity(r.capacity),
                "allocatable": canonical_quantity(r.allocatable),
                "available": canonical_quantity(r.available),
            }
            for r in zone.resources
        ]
    if zone.attributes:
        obj["attributes"] = msgspec.to_builtins(zone.attributes)
    return obj


def nrt_object(node: str, policy: str, zones: Sequence[Zone], current: Obj | None = None) -> Obj:
    """The object to write: ``current`` (as read, with its ``resourceVersion``)
    with ``attributes`` and ``zones`` replaced, or a new one."""
    obj: Obj
    if current is None:
        obj = {
            "apiVersion": f"{NRT_GROUP}/{NRT_VERSION}",
            "kind": KIND,
            "metadata": {"name": node},
        }
    else:
        obj = copy.deepcopy(current)
        obj.setdefault("apiVersion", f"{NRT_GROUP}/{NRT_VERSION}")
        obj.setdefault("kind", KIND)
    obj["attributes"] = [{"name": TOPOLOGY_POLICY, "value": policy}]
    obj["zones"] = [zone_object(z) for z in zones]
    return obj


def write_nrt(client: KubeClient, node: str, policy: str, zones: Sequence[Zone]) -> str:
    """Blocking: create or replace the node's object; ``"created"``/``"updated"``."""
    for attempt in range(1, CONFLICT_TRIES + 1):
        try:
            current: Obj | None = client.get_nrt(node)
        except KubeError as exc:
            if not exc.not_found:
                raise KubeError(
                    exc.status,
                    f"failed to look up current node resource topology CR: {exc.message}",
                ) from None
            current = None
        try:
            if current is None:
                client.create_nrt(nrt_object(node, policy, zones))
                return "created"
            client.replace_nrt(node, nrt_object(node, policy, zones, current))
            return "updated"
        except KubeError as exc:
            # Someone else changed (409) or created (409 AlreadyExists) it: read again.
            if not exc.conflict or attempt == CONFLICT_TRIES:
                raise
    raise AssertionError("unreachable")


IO = Callable[..., Any]


class NrtPublisher:
    """Keeps the node's NodeResourceTopology object current, when enabled
    (``agent.nodeResourceTopology`` of the configuration)."""

    def __init__(
        self,
        *,
        node: str,
        policy: str,
        client: KubeClient,
        io: IO,
        zones: Callable[[], list[Zone] | None],
    ) -> None:
        self.node = node
        self.policy = policy
        self.client = client
        self.io = io
        self.zones = zones
        self.enabled = False
        self.writes = 0
        self._kick = asyncio.Event()

    def set_enabled(self, enabled: bool) -> None:
        if enabled != self.enabled:
            log.info("%s NRT client", "enabling" if enabled else "disabling")
            self.enabled = enabled
        if enabled:
            self._kick.set()

    def changed(self) -> None:
        if self.enabled:
            self._kick.set()

    async def run(self) -> None:
        delay = RETRY_MIN
        while True:
            await self._kick.wait()
            self._kick.clear()
            if not self.enabled:
                continue
            try:
                zones = self.zones()
            except Exception:
                log.exception("policy failed to describe its topology zones")
                continue
            if not zones:
                continue
            log.info("updating topology zones...")
            try:
                how = await self.io(write_nrt, self.client, self.node, self.policy, zones)
            except Exception as exc:
                log.error("failed to update topology CR: %s (retrying in %.0fs)", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                self._kick.set()
                continue
            delay = RETRY_MIN
            self.writes += 1
            log.debug("%s NodeResourceTopology %s: %d zone(s)", how, self.node, len(zones))

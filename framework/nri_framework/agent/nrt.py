"""The NodeResourceTopology publisher (reference k8s.md §5, balloons §14).

One cluster-scoped ``topology.node.k8s.io/v1alpha2`` object per node, named
after it: ``attributes: [{name: TopologyPolicy, value: <policy>}]`` and the
policy's zones (:func:`~nri_framework.hookspecs.policy_topology_zones`),
replaced wholesale; never deleted.

What it sends, and how often (issue #16, README "The agent and the API server"):

* The first publication after start, and the first after every configuration
  change, goes out at once; every other change waits until one *window*
  (``agent.nodeResourceTopologyWindow``, default 10 s) has passed since the last
  write, so any number of changes in between make one write of the state at
  that time: at most one write per window.
* At most one write is in flight; nothing is written when the object would
  not change (compared with what this process last wrote).
* PUT carries the ``resourceVersion`` of the object the last write returned:
  no GET before a PUT. A GET happens only at start (is there one already?),
  after a 409 (someone else changed it: one re-read, one more PUT, no loop)
  and a 404 makes one POST. What was read is not written again when it already
  says the same (a restarted agent on an unchanged node writes nothing).
* A failed write is retried with a growing delay (1 s to 30 s): changes made
  meanwhile merge into that one retry, so an API server that is slow or down
  sees one request per delay, and its recovery one write.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
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
#: Seconds between two ordinary writes (``agent.nodeResourceTopologyWindow``).
WINDOW = 10.0


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


def _content(policy: str, zones: Sequence[Zone]) -> Obj:
    """What this process writes (``attributes`` and ``zones``): the change test."""
    return {
        "attributes": [{"name": TOPOLOGY_POLICY, "value": policy}],
        "zones": [zone_object(z) for z in zones],
    }


def _content_of(obj: Obj) -> Obj:
    return {"attributes": obj.get("attributes"), "zones": obj.get("zones")}


def write_nrt(
    client: KubeClient, node: str, policy: str, zones: Sequence[Zone], last: Obj | None
) -> Obj:
    """Blocking: create or replace the node's object; the object the server returned.

    ``last`` is what the previous write returned (``None``: nothing known, read
    it first). A 409 is answered by one re-read and one more PUT (at most one
    read per call); a 404 by one POST; anything else raises :class:`KubeError`.
    An object read that already says what we would write is not written again.
    """

    def read() -> Obj | None:
        try:
            return client.get_nrt(node)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise KubeError(
                exc.status, f"failed to look up current node resource topology CR: {exc.message}"
            ) from None

    def put_or_post(current: Obj | None) -> Obj:
        if current is None:
            return client.create_nrt(nrt_object(node, policy, zones))
        if current is not last and _content_of(current) == _content(policy, zones):
            return current  # as read, it already says this (a restart): nothing to write
        return client.replace_nrt(node, nrt_object(node, policy, zones, current))

    current = read() if last is None else last
    try:
        return put_or_post(current)
    except KubeError as exc:
        if exc.not_found and current is not None:
            return put_or_post(None)  # deleted by someone: create it again, once
        if not exc.conflict or last is None:  # one read per try: the back-off retries
            raise
    # someone else changed it (409) or created it (409 AlreadyExists): read once, write once
    return put_or_post(read())


IO = Callable[..., Any]


class Clock:
    """Monotonic time and sleeping, injectable: tests advance a fake one."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


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
        window: float = WINDOW,
        clock: Clock | None = None,
    ) -> None:
        self.node = node
        self.policy = policy
        self.client = client
        self.io = io
        self.zones = zones
        self.window = window
        self.clock = clock or Clock()
        self.enabled = False
        self.writes = 0
        #: What the last successful write returned (its ``resourceVersion`` goes into the next PUT).
        self.last: Obj | None = None
        #: What this process last wrote (``attributes`` and ``zones``).
        self.written: Obj | None = None
        self._last_write = float("-inf")
        self._urgent = asyncio.Event()
        self._kick = asyncio.Event()

    def set_enabled(self, enabled: bool) -> None:
        """A configuration was accepted: the next write goes out at once."""
        if enabled != self.enabled:
            log.info("%s NRT client", "enabling" if enabled else "disabling")
            self.enabled = enabled
        if enabled:
            self._urgent.set()
            self._kick.set()

    def set_window(self, window: float) -> None:
        self.window = window

    def changed(self) -> None:
        if self.enabled:
            self._kick.set()

    async def _coalesce(self) -> None:
        """Wait until one window has passed since the last write, or a configuration
        change makes the write urgent; changes meanwhile merge into this write."""
        wait = self._last_write + self.window - self.clock.now()
        if wait <= 0 or self._urgent.is_set():
            return
        urgent = asyncio.ensure_future(self._urgent.wait())
        sleep = asyncio.ensure_future(self.clock.sleep(wait))
        try:
            await asyncio.wait({urgent, sleep}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            urgent.cancel()
            sleep.cancel()

    async def run(self) -> None:
        delay = RETRY_MIN
        while True:
            await self._kick.wait()
            if not self.enabled:
                self._kick.clear()
                continue
            await self._coalesce()
            self._kick.clear()
            self._urgent.clear()
            if not self.enabled:
                continue
            try:
                zones = self.zones()
            except Exception:
                log.exception("policy failed to describe its topology zones")
                continue
            if not zones:
                continue
            content = _content(self.policy, zones)
            if content == self.written:
                log.debug("topology zones unchanged: nothing to write")
                continue
            log.info("updating topology zones...")
            try:
                obj = await self.io(
                    write_nrt, self.client, self.node, self.policy, zones, self.last
                )
            except Exception as exc:
                log.error("failed to update topology CR: %s (retrying in %.0fs)", exc, delay)
                if isinstance(exc, KubeError) and exc.conflict:
                    self.last = None  # read it afresh next time
                await self.clock.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                self._kick.set()  # the retry is the write that was due
                continue
            delay = RETRY_MIN
            self.last = obj
            self.written = content
            self._last_write = self.clock.now()
            self.writes += 1
            log.debug("wrote NodeResourceTopology %s: %d zone(s)", self.node, len(zones))

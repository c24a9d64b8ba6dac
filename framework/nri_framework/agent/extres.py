"""Node extended resources (reference k8s.md §6, balloons §13.5).

The policy states the *complete* desired map
(:func:`~nri_framework.hookspecs.policy_extended_resources`): a count
publishes, ``None`` under an exact name removes, ``None`` under a name ending
in ``/*`` claims the domain (every key in it that is not published goes).
Only names matching ``*.nri.io/*`` are ever touched: ``example.com/x`` is
never published nor removed, whatever the policy says.

One loop reconciles: diff the Node's ``status.capacity`` against the desired
map, one JSON merge patch of ``/status`` (``null`` removes a key; a no-op for
a key already gone). The capacity comes from the agent's watch of its Node
(:meth:`ExtendedResources.on_node`) and from what each patch returns, so a
reconciliation that finds nothing to change sends nothing: with no class
publishing and nothing owned on the Node the agent never reads the Node for
this. A GET happens only when the watch has not told the capacity yet, and on
the periodic resync (every few minutes, jittered per node, only when this
process publishes something). It runs after changes (coalesced), on the watch's
changes of the Node (what others did) and after a failure with a growing delay
(5 s to 60 s). Only ``capacity`` is patched: the kubelet derives ``allocatable``
from it. Nothing is removed on exit; losing the effective configuration (the
BalloonsPolicy deleted) removes everything owned.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nri_framework.agent.kube import KubeClient, Obj, single_object
from nri_framework.agent.options import RESYNC, RETRY
from nri_framework.quantity import format_quantity

log = logging.getLogger("nri_framework.agent")

#: Agent-wide guard: the only names ever published or removed.
OWNED_PATTERN = "*.nri.io/*"
PATCH_TIMEOUT = 5.0
#: Longest delay between the tries after failures (the first is ``retry``).
RETRY_MAX = 60.0
#: The resync period is ``resync`` times a factor drawn in this range, per node and round.
JITTER = (0.75, 1.25)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Go ``path.Match`` for ``*``: any run of characters but ``/``."""
    return re.compile("^" + "[^/]*".join(re.escape(p) for p in pattern.split("*")) + "$")


_GUARD = glob_regex(OWNED_PATTERN)


def _q(text: str) -> str:
    """Go's ``%q`` for the names at hand."""
    return json.dumps(text)


def may_touch(name: str) -> bool:
    return bool(_GUARD.match(name))


@dataclass
class Plan:
    """What one reconciliation changes."""

    #: The merge patch of ``status.capacity`` (empty: nothing to do).
    capacity: dict[str, str | None] = field(default_factory=dict)
    published: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    #: Entries of the desired map refused by the guard, as messages.
    refused: list[str] = field(default_factory=list)

    @property
    def patch(self) -> Obj:
        return {"status": {"capacity": dict(self.capacity)}}


def plan(capacity: Mapping[str, Any], desired: Mapping[str, int | None]) -> Plan:
    """Diff the node's ``status.capacity`` against the desired map."""
    result = Plan()
    want: dict[str, str] = {}
    remove: set[str] = set()
    globs: list[re.Pattern[str]] = []
    for name, value in desired.items():
        if value is not None and "*" in name:
            result.refused.append(
                f"ignoring extended resource {_q(name)}: wildcards are only allowed on owned "
                "(nil-valued) keys"
            )
        elif not may_touch(name):
            verb = "publish" if value is not None else "remove"
            result.refused.append(
                f"refusing to {verb} extended resource {_q(name)}: name does not match "
                f"{_q(OWNED_PATTERN)}"
            )
        elif value is not None:
            want[name] = format_quantity(value)
        elif "*" in name:
            globs.append(glob_regex(name))
        else:
            remove.add(name)
    for name, text in sorted(want.items()):
        if str(capacity.get(name)) != text or name not in capacity:
            result.capacity[name] = text
            result.published[name] = text
    for name in sorted(capacity):
        if name in want or not may_touch(name):
            continue
        if name in remove or any(g.match(name) for g in globs):
            result.capacity[name] = None
            result.removed.append(name)
    return result


def capacity_of(node: Obj) -> dict[str, Any]:
    return dict((node.get("status") or {}).get("capacity") or {})


def reconcile(
    client: KubeClient,
    node: str,
    desired: Mapping[str, int | None],
    capacity: Mapping[str, Any] | None,
) -> tuple[Plan, dict[str, Any]]:
    """Blocking: diff ``capacity`` (``None``: read the node first), patch what
    differs; the plan that was applied and the capacity now."""
    if capacity is None:
        capacity = capacity_of(client.get_node(node))
    p = plan(capacity, desired)
    if p.capacity:
        return p, capacity_of(client.patch_node_status(node, p.patch, timeout=PATCH_TIMEOUT))
    return p, dict(capacity)


class ExtendedResources:
    """The reconciliation loop. ``desired()`` asks the policy (on the event
    loop); :meth:`set_in_force` says whether a configuration is in force: without
    one (the custom resource deleted) only removals stay in the desired map."""

    def __init__(
        self,
        *,
        node: str,
        client: KubeClient,
        io: Callable[..., Any],
        desired: Callable[[], dict[str, int | None] | None],
        resync: float = RESYNC,
        retry: float = RETRY,
    ) -> None:
        self.node = node
        self.client = client
        self.io = io
        self.policy_desired = desired
        self.resync = resync
        self.retry = retry
        self.in_force: bool | None = None
        #: Names this process published (removed when no longer wanted).
        self.published: set[str] = set()
        self.rounds = 0
        #: The Node's ``status.capacity`` as last seen (watch or patch reply); ``None``: unknown.
        self.capacity: dict[str, Any] | None = None
        self._rng = random.Random(node)
        self._kick = asyncio.Event()
        self._refused_logged: set[str] = set()

    def on_node(self, kind: str, payload: Any) -> None:
        """The agent's Node watch (on the event loop): keep its capacity, reconcile."""
        node = single_object(kind, payload)
        capacity = None if node is None else capacity_of(node)
        if capacity != self.capacity:
            self.capacity = capacity
            self._kick.set()

    def next_resync(self) -> float:
        """Seconds to the next resync: ``resync`` jittered per node and round."""
        return self.resync * self._rng.uniform(*JITTER)

    def set_in_force(self, in_force: bool) -> None:
        self.in_force = in_force
        self._kick.set()

    def changed(self) -> None:
        self._kick.set()

    def desired(self) -> dict[str, int | None]:
        try:
            wanted = dict(self.policy_desired() or {})
        except Exception:
            log.exception("policy failed to state its extended resources")
            wanted = {}
        if not self.in_force:
            wanted = {k: None for k, v in wanted.items() if v is None}
        for name in self.published:
            wanted.setdefault(name, None)
        return wanted

    async def run(self) -> None:
        delay = self.next_resync()
        failures = 0
        while True:
            resync = False
            try:
                await asyncio.wait_for(self._kick.wait(), delay)
            except TimeoutError:
                resync = failures == 0  # else it is the retry's delay
            self._kick.clear()
            if self.in_force is None:  # not decided yet: do not flap at start-up
                delay = self.next_resync()
                continue
            desired = self.desired()
            # a resync reads the Node again only when we publish something (a stale
            # watch would hide what others removed); otherwise the watch suffices
            if resync and any(v is not None for v in desired.values()):
                self.capacity = None
            seen = self.capacity
            try:
                p, capacity = await self.io(reconcile, self.client, self.node, desired, seen)
            except Exception as exc:
                failures += 1
                delay = min(self.retry * 2 ** (failures - 1), RETRY_MAX)
                log.error("failed to reconcile extended resources: %s", exc)
                continue
            if self.capacity is seen:  # else the watch told something newer meanwhile
                self.capacity = capacity
            failures = 0
            delay = self.next_resync()
            self.rounds += 1
            for message in p.refused:
                if message not in self._refused_logged:
                    self._refused_logged.add(message)
                    log.error("%s", message)
            if p.published:
                log.info(
                    "published node extended resources: %s",
                    ", ".join(f"{k}={v}" for k, v in p.published.items()),
                )
            if p.removed:
                log.info("removed node extended resources: %s", ", ".join(p.removed))
            self.published |= set(p.published)
            self.published -= set(p.removed)
            self.published &= {k for k, v in desired.items() if v is not None}

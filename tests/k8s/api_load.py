"""The agent's load on the API server, as the API server itself counts it.

:func:`request_counts` reads ``apiserver_request_total`` from the apiserver's own
``/metrics`` (https, the stack's admin certificate: not through the node proxy,
and not our own counters), summed by ``(verb, resource)`` for the resources the
agent uses (Nodes, served by the ``core.fake`` stand-in, NodeResourceTopology
and BalloonsPolicy); the server's own bookkeeping (CRDs, leases...) is left out.
:class:`Churn` is issue #16's load: one pod created and one removed every
``period`` seconds on each node, then idle. :func:`report` prints the figures per
node and second, and extrapolated to 5,000 nodes.

Timing is scaled by :data:`SCALE` (``$NRI_K8S_BENCH_SCALE``, default 0.5): the
churn period, the idle time and the agent's NRT window all shrink by it, so the
ratios between them stay those of the issue (5 s churn, 10 s window, 64 s in
all), and every count is reported per *scenario* second (real seconds / SCALE).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack import Stack

#: Real seconds per scenario second (see the module docstring).
SCALE = float(os.environ.get("NRI_K8S_BENCH_SCALE", "0.5"))
#: The issue's scenario, in scenario seconds.
CHURN_PERIOD = 5.0
WINDOW = 10.0
TOTAL = 64.0
#: Churn for the first half, then idle.
CHURN_FOR = 32.0
NODES_AT_SCALE = 5000

AGENT_GROUPS = ("core.fake", "topology.node.k8s.io", "config.nri")
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_VERBS = frozenset({"GET", "LIST"})

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Key = tuple[str, str]  # (verb, resource[/subresource])


def parse_request_total(text: str) -> Counter[Key]:
    """``apiserver_request_total`` of the agent's groups, by verb and resource."""
    out: Counter[Key] = Counter()
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group("labels")))
        if labels.get("group") not in AGENT_GROUPS:
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        out[(labels.get("verb", ""), resource)] += int(float(m.group("value")))
    return out


def request_counts(st: Stack) -> Counter[Key]:
    """The apiserver's own counts now (``/metrics``, admin certificate)."""
    status, body = st._get(f"{st.apiserver_url}/metrics", st._client_ssl())
    assert status == 200, (status, body[:200])
    return parse_request_total(body.decode(errors="replace"))


def writes(c: Counter[Key]) -> int:
    return sum(n for (verb, _), n in c.items() if verb in WRITE_VERBS)


def reads(c: Counter[Key]) -> int:
    return sum(n for (verb, _), n in c.items() if verb in READ_VERBS)


def lists(c: Counter[Key]) -> int:
    return sum(n for (verb, _), n in c.items() if verb == "LIST")


@dataclass
class Phase:
    """Requests of ``nodes`` agents over ``seconds`` scenario seconds."""

    name: str
    nodes: int
    seconds: float
    counts: Counter[Key] = field(default_factory=Counter)

    def per_node_second(self, n: int) -> float:
        return n / self.nodes / self.seconds

    @property
    def write_rate(self) -> float:
        return self.per_node_second(writes(self.counts))

    @property
    def read_rate(self) -> float:
        return self.per_node_second(reads(self.counts))


def report(phase: Phase, targets: tuple[float, float]) -> str:
    """The figures, printed: by verb and resource, per node and second, at 5,000 nodes."""
    lines = [
        f"[api-load] {phase.name}: {phase.nodes} node(s), {phase.seconds:.0f} scenario s "
        f"(time scale {SCALE})"
    ]
    for (verb, resource), n in sorted(phase.counts.items()):
        rate = phase.per_node_second(n)
        lines.append(
            f"[api-load]   {verb:6} {resource:32} {n:5d} requests  {rate:.4f}/s per node  "
            f"{rate * NODES_AT_SCALE:8.1f}/s at {NODES_AT_SCALE} nodes"
        )
    w, r = phase.write_rate, phase.read_rate
    lines.append(
        f"[api-load]   writes {w:.4f}/s per node (target <= {targets[0]}), "
        f"{w * NODES_AT_SCALE:.1f}/s at {NODES_AT_SCALE} nodes; reads {r:.4f}/s per node "
        f"(target <= {targets[1]}), {r * NODES_AT_SCALE:.1f}/s at {NODES_AT_SCALE} nodes; "
        f"LIST {lists(phase.counts)}"
    )
    return "\n".join(lines)


def rss_kib(pid: int) -> int:
    """The resident set of process ``pid`` (``VmRSS`` of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


class Churn:
    """One pod created and the oldest removed every ``period`` real seconds on
    each node (``run(name)`` / ``delete(name)`` of :class:`agent_node.PluginNode`)."""

    def __init__(self, nodes: Sequence[Any], period: float) -> None:
        self.nodes = nodes
        self.period = period
        self.made = 0
        #: seconds each container creation took (the NRI round trip through the plugin)
        self.create_seconds: list[float] = []

    async def _step(self, node: Any, i: int) -> None:
        name = f"churn-{i}"
        t0 = time.monotonic()
        await node.run(name, millicpu=200)
        self.create_seconds.append(time.monotonic() - t0)
        older = sorted(
            (p for p in node.pods if p.startswith("churn-")), key=lambda p: int(p.split("-")[1])
        )
        if len(older) > 2:
            await node.delete(older[0])

    async def run_for(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            self.made += 1
            await asyncio.gather(*(self._step(n, self.made) for n in self.nodes))
            await asyncio.sleep(max(0.0, min(self.period, end - loop.time())))

"""Priority Core Turbo costs at most one helper round trip per decision
(issue #14): the balloons plugin and the SST helper (sim backend, the Xeon
6776P model) as real processes over their real socket, the spec's
BalloonsPolicy and pods through the runtime simulator. The helper's debug log
(``serve -v``) names every request it takes and the peer (connection) that
sent it: the reply path's blocking session is one peer, the background's
(the periodic probe) another."""

from __future__ import annotations

import re

from sst_node import Node, node
from test_pct_helper import EXAMPLES, SPEC

REQUEST = re.compile(r"nri-sst-helper: request (.+) from peer ([0-9a-f]+)$")
PROBE = "GetAssociation"
"""The background's periodic probe (PROBE_INTERVAL): no decision's request."""


def requests(n: Node, since: int) -> list[tuple[str, str]]:
    """(what, peer) of every request the helper took since byte ``since`` of its log."""
    with n.helper.log.open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [(g[1], g[2]) for line in text.splitlines() if (g := REQUEST.search(line))]


def decision_requests(n: Node, since: int) -> list[tuple[str, str]]:
    """:func:`requests` less the background's probes."""
    return [(what, peer) for what, peer in requests(n, since) if what != PROBE]


def mark(n: Node) -> int:
    return n.helper.log.stat().st_size


async def test_one_round_trip_per_decision_and_none_for_cores_on_their_clos() -> None:
    async with node(SPEC, topology="xeon-6776p", helper_args=("-v",)) as n:
        await n.plugin.wait_output("balloons policy started", timeout=20)
        # an HP pod: its 2 CPUs to CLOS 0 and their C-states, in one request
        for i in (1, 2):
            since = mark(n)
            cpus = await n.create_from(f"pct-hp-{i}", EXAMPLES / f"pod-hp-{i}.yaml")
            assert len(cpus) == 2
            sent = decision_requests(n, since)
            assert [what for what, _ in sent] == ["Apply(AssociateCpus, SetCstates)"], sent
        # an LP pod: its cores are on the LP CLOS already, the idle CPUs'
        # C-states are the LP class's: nothing to send
        since = mark(n)
        lp = await n.create_from("pct-lp", EXAMPLES / "pod-lp.yaml")
        assert len(lp) == 8
        assert decision_requests(n, since) == []
        # each step of an HP pod's removal: at most one request
        pod = n.pods.pop("pct-hp-1")
        for step in (n.rt.stop_pod, n.rt.remove_pod):
            since = mark(n)
            await step(pod)
            sent = decision_requests(n, since)
            assert len(sent) <= 1, sent
        # the probe goes on its own session, the decisions on the reply path's
        peers = {peer for what, peer in requests(n, 0) if what.startswith("Apply")}
        assert len(peers) == 1

"""Upstream e2e balloons/n4c16/test04-groupby: ``groupBy`` expressions put
containers of equal groups in the same balloon instance.

Skipped: the ``groups`` label of the Prometheus metrics (no metrics yet);
the same grouping is asserted through the balloon instances instead.
"""

from __future__ import annotations

from balloons_e2e import disjoint, node

TEST = "test04-groupby"


async def test_groupby() -> None:
    async with node(TEST, "balloons.yaml") as n:
        # groupBy: ${pod/namespace}-${pod/labels/balloon-instance}
        for f in ("pod0.yaml", "pod1.yaml", "pod2.yaml", "pod3.yaml"):
            await n.create(f)
        assert n.cpus("pod0c0") == n.cpus("pod2c0")
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod1c0"), n.cpus("pod3c0"))
        assert n.balloon("pod0c0") == n.balloon("pod2c0")
        assert len({n.balloon(c) for c in ("pod0c0", "pod1c0", "pod3c0")}) == 3
        # the two pre-created (minBalloons: 2) instances are used first
        assert {n.balloon("pod0c0"), n.balloon("pod1c0")} == {
            "grouped-by-label[0]",
            "grouped-by-label[1]",
        }
        assert n.balloon("pod3c0") == "grouped-by-label[2]"

        # default type, groupBy: ns=$pod/namespace
        for f in ("pod4.yaml", "pod5.yaml", "pod6.yaml", "pod7.yaml"):
            await n.create(f)
        assert n.cpus("pod4c0") == n.cpus("pod7c0")
        assert n.cpus("pod5c0") == n.cpus("pod6c0")
        assert disjoint(n.cpus("pod4c0"), n.cpus("pod5c0"))
        assert n.balloon("pod4c0") == n.balloon("pod7c0")
        assert n.balloon("pod5c0") == n.balloon("pod6c0")
        assert n.balloon("pod4c0") != n.balloon("pod5c0")
        assert n.balloon("pod4c0").startswith("default[")

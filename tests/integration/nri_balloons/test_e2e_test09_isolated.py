"""Upstream e2e balloons/n4c16/test09-isolated: minBalloons pre-creation, empty
pre-created balloons reused before new ones even with preferNewBalloons,
per-container balloons.

The ``balloon="..."`` Prometheus metric checks (no metrics yet) are replaced by
the balloon instances of the plugin's assignment log lines.
"""

from __future__ import annotations

from balloons_e2e import disjoint, node

TEST = "test09-isolated"


async def test_isolated() -> None:
    async with node(TEST, "balloons.yaml") as n:
        await n.plugin.wait_output("balloons policy balloons:")
        out = n.plugin.output()
        assert "isolated-pods[0]" in out and "isolated-pods[1]" in out
        assert "isolated-pods[2]" not in out

        # pod0: BestEffort, in a pre-created balloon
        await n.create("pod0.yaml")
        assert len(n.cpus("pod0c0")) == 1
        assert n.cpus("pod0c0") == n.cpus("pod0c1")
        assert n.balloon("pod0c0") == "isolated-pods[0]"
        # pod1: Guaranteed 2 x 600m, the other pre-created balloon
        await n.create("pod1.yaml")
        assert len(n.cpus("pod0c0")) == 1
        assert len(n.cpus("pod1c0")) == 2
        assert n.cpus("pod1c0") == n.cpus("pod1c1")
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod1c0"))
        assert n.balloon("pod1c0") == "isolated-pods[1]"
        assert "isolated-pods[2]" not in n.plugin.output()
        # pod2: Burstable, now a new balloon
        await n.create("pod2.yaml")
        assert len(n.cpus("pod2c0")) == 1
        assert n.cpus("pod2c0") == n.cpus("pod2c1")
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod1c0"), n.cpus("pod2c0"))
        assert n.balloon("pod2c0") == "isolated-pods[2]"
        # pod3: one isolated-ctrs balloon per container (2 pre-created, 2 new)
        await n.create("pod3.yaml")
        pod3 = [n.cpus(f"pod3c{i}") for i in range(4)]
        assert all(len(c) == 1 for c in pod3)
        assert disjoint(n.cpus("pod0c0"), n.cpus("pod1c0"), n.cpus("pod2c0"), *pod3)
        assert len(n.cpus("pod1c0")) == 2
        assert sorted(n.balloon(f"pod3c{i}") for i in range(4)) == [
            f"isolated-ctrs[{i}]" for i in range(4)
        ]
        assert "isolated-pods[3]" not in n.plugin.output()
